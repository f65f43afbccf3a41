"""The ``envfactory`` command line. Every command takes ``--json`` for scripts.

Subcommands live in :data:`COMMANDS` as ``name -> (help, add_arguments, run)``;
subsystems (Docker images, evaluation, training) add theirs there. ``run``
returns ``(exit_code, json_document, human_text)``; the CLI prints one of them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

__all__ = ["main", "COMMANDS"]

Result = tuple[int, Any, str]


# -- list ------------------------------------------------------------------
def _list_args(p: argparse.ArgumentParser) -> None:
    pass


def _list_run(args: argparse.Namespace) -> Result:
    from . import specs

    rows = [s.describe() for s in specs()]
    lines = [f"{'name':<24}{'domain':<14}{'agents':<8}{'tasks':>6}{'tools':>6}  description"]
    for r in rows:
        lines.append(
            f"{r['name']:<24}{r['domain']:<14}{'multi' if r['multi_agent'] else 'single':<8}"
            f"{r['tasks']:>6}{r['tools']:>6}  {r.get('description', '')}"
        )
    return 0, rows, "\n".join(lines)


# -- verify ----------------------------------------------------------------
def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", help="environments to verify (default: all)")
    p.add_argument("--all", action="store_true", help="verify every registered environment")
    p.add_argument("--runtime", default="local", help="runtime to verify in (local or docker)")


def _verify_run(args: argparse.Namespace) -> Result:
    from . import spec, specs
    from .verify import verify_many

    try:
        chosen = specs() if (args.all or not args.names) else [spec(n) for n in args.names]
    except KeyError as exc:
        return 2, {"error": str(exc.args[0])}, f"error: {exc.args[0]}"
    doc = verify_many(chosen, runtime=args.runtime)
    lines = []
    for r in doc["environments"]:
        mark = "PASS" if r["verified"] else "FAIL"
        lines.append(f"{mark}  {r['name']:<24}{r['domain']:<14}{r['tasks']:>4} tasks  {r['seconds']:.2f}s")
        for f in r["failures"][:10]:
            where = f" [{f['task']}]" if "task" in f else ""
            lines.append(f"      {f['check']}{where}: {f['detail']}")
        if len(r["failures"]) > 10:
            lines.append(f"      ... {len(r['failures']) - 10} more failures")
    t = doc["totals"]
    lines.append(
        f"{t['verified']}/{t['environments']} verified, {t['domains']} domains, {t['tasks']} tasks, "
        f"mean reference solution {t['mean_solution_length']} calls, {t['seconds']:.1f}s"
    )
    code = 0 if t["verified"] == t["environments"] else 1
    return code, doc, "\n".join(lines)


# -- bench -----------------------------------------------------------------
def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", action="append", help="run only this section (repeatable)")


def _bench_run(args: argparse.Namespace) -> Result:
    from .bench import SECTIONS, run_bench

    if args.only:
        unknown = [s for s in args.only if s not in SECTIONS]
        if unknown:
            msg = f"unknown bench section(s) {unknown}; choose from {sorted(SECTIONS)}"
            return 2, {"error": msg}, "error: " + msg
    doc = run_bench(args.only)
    width = max(len(k) for k in doc)
    return 0, doc, "\n".join(f"{k:<{width}}  {v}" for k, v in doc.items())


# -- quickstart (the main job) --------------------------------------------
def _quickstart_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--episodes", type=int, default=3, help="episodes per environment to play")


def _quickstart_run(args: argparse.Namespace) -> Result:
    """List, verify and play episodes of the built-in environments with scripted agents."""
    from . import make, specs
    from .agents_scripted import oracle_actions, random_actions, run_episode
    from .verify import verify_many

    start = time.perf_counter()
    out: list[str] = []
    code, rows, text = _list_run(args)
    out += ["== environments", text]
    doc = verify_many(specs())
    t = doc["totals"]
    out += ["== verification", f"{t['verified']}/{t['environments']} environments verified "
            f"({t['tasks']} tasks) in {t['seconds']:.1f}s"]
    played = []
    out.append("== episodes (scripted agents: the reference 'oracle' and a seeded 'random')")
    for s in specs():
        if getattr(s, "multi_agent", False):
            continue
        env = make(s.name)
        schemas = env.tool_schemas()
        for i, task in enumerate(s.get_tasks()[: args.episodes]):
            for agent, actions in (("oracle", oracle_actions(task)),
                                   ("random", random_actions(task, schemas, seed=i))):
                res = run_episode(env, task.id, actions)
                played.append({"env": s.name, "task": task.id, "agent": agent, "reward": res.reward,
                               "turns": res.turns})
                out.append(f"{s.name:<16} {task.id:<12} {agent:<7} reward={res.reward:.0f} "
                           f"turns={res.turns}")
        if s.name == specs()[0].name:
            out.append("   transcript of the last episode:")
            for m in env.messages[1:]:
                out.append(f"   [{m['role']}] {str(m.get('content'))[:110]!r}")
    summary = {
        "environments": rows,
        "verification": t,
        "episodes": played,
        "oracle_success": _mean(p["reward"] for p in played if p["agent"] == "oracle"),
        "random_success": _mean(p["reward"] for p in played if p["agent"] == "random"),
        "seconds": round(time.perf_counter() - start, 2),
    }
    out.append(f"oracle success {summary['oracle_success']:.2f}, random success "
               f"{summary['random_success']:.2f}, {summary['seconds']}s")
    ok = t["verified"] == t["environments"] and summary["oracle_success"] == 1.0
    return (0 if ok else 1), summary, "\n".join(out)


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def _generate_args(p: argparse.ArgumentParser) -> None:
    from .factory.commands import generate_args

    generate_args(p)


def _generate_run(args: argparse.Namespace) -> Result:
    from .factory.commands import generate_run

    return generate_run(args)


def _tasks_args(p: argparse.ArgumentParser) -> None:
    from .factory.commands import tasks_args

    tasks_args(p)


def _tasks_run(args: argparse.Namespace) -> Result:
    from .factory.commands import tasks_run

    return tasks_run(args)


def _image_args(p: argparse.ArgumentParser) -> None:
    from .runtime.commands import image_args

    image_args(p)


def _image_run(args: argparse.Namespace) -> Result:
    from .runtime.commands import image_run

    return image_run(args)


def _gc_args(p: argparse.ArgumentParser) -> None:
    from .runtime.commands import gc_args

    gc_args(p)


def _gc_run(args: argparse.Namespace) -> Result:
    from .runtime.commands import gc_run

    return gc_run(args)


def _eval_team_args(p: argparse.ArgumentParser) -> None:
    from .multi.eval import cli_args

    cli_args(p)


def _eval_team_run(args: argparse.Namespace) -> Result:
    from .multi.eval import cli_run

    return cli_run(args)


def _eval_args(p: argparse.ArgumentParser) -> None:
    from agents.eval_cli import eval_args  # agents is imported only when the command runs

    eval_args(p)


def _eval_run(args: argparse.Namespace) -> Result:
    from .multi.eval import eval_team_from_eval_args, team_names

    team = team_names(args.env)  # multi-agent environments (or "multi"): team evaluation
    if team is not None:
        return eval_team_from_eval_args(args, team)
    from agents.eval_cli import eval_run

    return eval_run(args)


# -- training: quickstart and train (agents is imported lazily) ---------------
def _train_quickstart_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (one run each)")
    p.add_argument("--steps", type=int, default=None, help="ARPO steps per seed")
    p.add_argument("--out", default="runs/quickstart", help="report folder")


def _train_quickstart_run(args: argparse.Namespace) -> Result:
    """Tiny model -> SFT on reference solutions -> ARPO on held-out tasks; success before/after per seed."""
    from agents.quickstart import QuickstartConfig, run_quickstart

    cfg = QuickstartConfig(seeds=list(args.seeds), output_dir=args.out)
    if args.steps is not None:
        cfg.rl_steps = args.steps
    doc = run_quickstart(cfg, log=lambda m: print(m, file=sys.stderr))
    text = (f"success on held-out tasks per seed {doc['seeds']}:\n"
            + "\n".join(f"  {k:<7}{[round(x, 3) for x in v]}" for k, v in doc["success"].items())
            + f"\nARPO - SFT mean {doc['arpo_minus_sft_mean']:+.3f}, seed spread {doc['seed_spread']:.3f}; "
            f"report {args.out}/report.md; {doc['seconds']}s")
    return 0, doc, text


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a JSON or YAML training config (see agents/train_config.py)")


def _train_run(args: argparse.Namespace) -> Result:
    from agents.train_config import load_config, train_from_config

    try:
        cfg = load_config(args.config)
    except (OSError, ValueError) as exc:
        return 2, {"error": str(exc)}, f"error: {exc}"
    doc = train_from_config(cfg)
    return 0, doc, json.dumps(doc, indent=2, default=str)


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], Result]]] = {
    "list": ("list registered environments", _list_args, _list_run),
    "verify": ("run the verification suite", _verify_args, _verify_run),
    "bench": ("measure speed against same-run baselines", _bench_args, _bench_run),
    "generate": ("build and verify an environment from a prompt (LLM) or a spec file",
                 _generate_args, _generate_run),
    "tasks": ("task tools: 'tasks synth NAME --n N --seed S'", _tasks_args, _tasks_run),
    "image": ("Docker images: 'image build [NAME...|--all]' (offline, content-hashed tags)",
              _image_args, _image_run),
    "gc": ("remove Docker containers that exited envfactory processes left behind", _gc_args, _gc_run),
    "eval-team": ("evaluate teams of policies on the multi-agent environments (JSON + markdown report)",
                  _eval_team_args, _eval_team_run),
    "eval": ("evaluate a model or a scripted baseline on environments (success with 95%% CIs; --report DIR)",
             _eval_args, _eval_run),
    "quickstart": ("the main job: tiny model, SFT, ARPO on held-out tasks, success before/after (report)",
                   _train_quickstart_args, _train_quickstart_run),
    "train": ("train a policy with GRPO/ARPO: 'train --config FILE' (JSON or YAML)", _train_args, _train_run),
    "play": ("list, verify and play the built-in environments with scripted agents", _quickstart_args,
             _quickstart_run),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="envfactory", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_, add_args, _run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        add_args(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _, _, run = COMMANDS[args.command]
    code, doc, text = run(args)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
