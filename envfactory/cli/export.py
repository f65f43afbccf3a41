"""``envfactory export NAME --openenv DIR``: an environment as an OpenEnv Space (a directory that
``openenv validate`` accepts and ``openenv push`` publishes; :mod:`envfactory.faces.openenv_space`).
``envfactory export NAME --verifiers DIR``: an environment as a verifiers 0.4 environment package
(``pip install DIR``; :func:`envfactory.faces.verifiers.export_verifiers_package`)."""

from __future__ import annotations

import argparse

from . import Command, CommandError, Result

__all__ = ["EXPORT"]


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a registered single-agent environment")
    p.add_argument("--openenv", metavar="DIR",
                   help="write an OpenEnv Space layout here (openenv.yaml, Dockerfile, server/app.py, README.md, "
                        "pyproject.toml, envfactory's source)")
    p.add_argument("--verifiers", metavar="DIR",
                   help="write a verifiers 0.4 environment package here (pyproject.toml, README.md, a module "
                        "exporting its taskset, harness and env; taskset id envfactory-<name>, e.g. "
                        "envfactory-counter-v0): pip install DIR, then vf-eval or vf.load_environment")
    p.add_argument("--split", default=None,
                   help="the tasks served: train (sft and rl; the Space's default), sft, rl (the verifiers "
                        "package's default), eval, all")
    p.add_argument("--force", action="store_true", help="write into a directory that is not empty")


def _run(args: argparse.Namespace) -> Result:
    if (args.openenv is None) == (args.verifiers is None):
        raise CommandError("name one format and its directory: --openenv DIR | --verifiers DIR")
    if args.verifiers is not None:
        return _run_verifiers(args)
    from ..faces.openenv_space import export_openenv_space

    args.split = args.split or "train"

    try:
        out = export_openenv_space(args.name, args.openenv, split=args.split, force=args.force)
    except KeyError as exc:
        raise CommandError(exc.args[0] if exc.args else str(exc)) from None
    except (ValueError, FileNotFoundError) as exc:
        raise CommandError(str(exc)) from None
    counts = ", ".join(f"{k} {v}" for k, v in out["tasks"].items())
    text = (f"wrote the OpenEnv Space of {out['name']} to {out['dir']} (tasks: {counts}; tools: "
            f"{', '.join(out['tools'])})\n"
            f"check it: openenv validate {out['dir']} --skip-build\n"
            f"publish it: openenv push {out['dir']}  (needs a Hugging Face login)")
    return 0, out, text


def _run_verifiers(args: argparse.Namespace) -> Result:
    from ..faces.verifiers import export_verifiers_package

    try:
        out = export_verifiers_package(args.name, args.verifiers, split=args.split or "rl", force=args.force)
    except KeyError as exc:
        raise CommandError(exc.args[0] if exc.args else str(exc)) from None
    except (ValueError, TypeError, FileExistsError) as exc:
        raise CommandError(str(exc)) from None
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    dist = next(line.split('"')[1] for line in (out / "pyproject.toml").read_text().splitlines()
                if line.startswith("name = "))
    doc = {"name": args.name, "dir": str(out), "taskset_id": dist, "files": files}
    text = (f"wrote the verifiers package of {args.name} to {out} ({', '.join(files)})\n"
            f"install it: pip install {out}  (beside envfactory)\n"
            f"run it: vf-eval {dist}  (or vf.load_environment with taskset id {dist})")
    return 0, doc, text


EXPORT = Command(
    help="write an environment as an OpenEnv Space (--openenv) or a verifiers environment package (--verifiers)",
    add_arguments=_args, run=_run,
    example="envfactory export Counter-v0 --openenv spaces/counter\n"
            "envfactory export FileSystem-v0 --openenv spaces/fs --split all\n"
            "envfactory export Counter-v0 --verifiers envfactory-counter-v0")
