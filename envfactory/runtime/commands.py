"""The Docker runtime's CLI commands: ``envfactory image build`` and ``envfactory gc``."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["image_args", "image_run", "gc_args", "gc_run"]

Result = tuple[int, Any, str]


def image_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["build"], help="'build': build (or find) the images")
    p.add_argument("names", nargs="*", help="environments (or --all)")
    p.add_argument("--all", action="store_true", help="every registered environment (one agent or a team)")
    p.add_argument("--rebuild", action="store_true", help="build even if the content hash is unchanged")


def image_run(args: argparse.Namespace) -> Result:
    from .. import spec, specs
    from .images import ImageError, build_images

    if not args.all and not args.names:
        return 2, {"error": "name environments or pass --all"}, "error: name environments or pass --all"
    try:
        chosen = specs() if args.all else [spec(n) for n in args.names]
        rows = build_images(chosen, rebuild=args.rebuild)
    except KeyError as exc:
        return 2, {"error": str(exc.args[0])}, f"error: {exc.args[0]}"
    except (ImageError, RuntimeError) as exc:
        return 1, {"error": str(exc)}, f"error: {exc}"
    lines = [f"{r['name']:<24}{r['image']:<36}{'built' if r['built'] else 'up to date':<12}{r['seconds']:.1f}s"
             for r in rows]
    return 0, {"images": rows}, "\n".join(lines)


def gc_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--everything", "--all", dest="everything", action="store_true",
                   help="also remove containers of envfactory processes that are still running, and those "
                        "of other hosts (by default only what this host can prove dead is removed)")


def gc_run(args: argparse.Namespace) -> Result:
    from .pool import gc

    try:
        rows = gc(everything=args.everything)
    except RuntimeError as exc:
        return 1, {"error": str(exc)}, f"error: {exc}"
    text = "\n".join(f"removed {r['name']} ({r['env']}, owner {r['owner']})" for r in rows)
    return 0, {"removed": rows}, text or "nothing to remove"
