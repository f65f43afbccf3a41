"""The Docker runtime's commands: ``envfactory image build`` and ``envfactory gc``."""

from __future__ import annotations

import argparse

from . import Command, CommandError, Result

__all__ = ["IMAGE", "GC"]



def _image_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["build"], help="'build': build (or find) the images")
    p.add_argument("names", nargs="*", help="environments (or --all)")
    p.add_argument("--all", action="store_true", help="every registered environment (one agent or a team)")
    p.add_argument("--rebuild", action="store_true", help="build even if the content hash is unchanged")


def _image_run(args: argparse.Namespace) -> Result:
    from ..runtime.images import ImageError, build_images
    from .environments import _chosen

    if not args.all and not args.names:
        raise CommandError("name the environments to build images for, or pass --all")
    chosen = _chosen([] if args.all else args.names)
    try:
        rows = build_images(chosen, rebuild=args.rebuild)
    except (ImageError, RuntimeError) as exc:
        raise CommandError(str(exc), code=1) from None
    lines = [f"{r['name']:<24}{r['image']:<36}{'built' if r['built'] else 'up to date':<12}{r['seconds']:.1f}s"
             for r in rows]
    return 0, {"images": rows}, "\n".join(lines)


def _gc_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--everything", "--all", dest="everything", action="store_true",
                   help="also remove containers of envfactory processes that are still running, and those "
                        "of other hosts (by default only what this host can prove dead is removed)")


def _gc_run(args: argparse.Namespace) -> Result:
    from ..runtime.pool import gc

    try:
        rows = gc(everything=args.everything)
    except RuntimeError as exc:
        raise CommandError(str(exc), code=1) from None
    text = "\n".join(f"removed {r['name']} ({r['env']}, owner {r['owner']})" for r in rows)
    return 0, {"removed": rows}, text or "nothing to remove"


IMAGE = Command("Docker images: 'image build [NAME...|--all]' (offline, content-hashed tags)", _image_args,
                _image_run, "envfactory image build Bank-v0 Counter-v0\nenvfactory image build --all --rebuild")
GC = Command("remove Docker containers that exited envfactory processes left behind", _gc_args, _gc_run,
             "envfactory gc\nenvfactory gc --everything --json")
