"""``envfactory bench`` (measurements): the sections that installed packages announce (:data:`BENCH_GROUP`)."""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any, Callable

from . import Command, CommandError, Result

__all__ = ["BENCH", "BENCH_GROUP", "installed_sections", "run_bench"]

BENCH_GROUP = "envfactory.bench"  # the sections: benchmarks/ (and any package) announce theirs here


def installed_sections() -> dict[str, Callable[[], dict[str, Any]]]:
    """The ``envfactory bench`` sections that installed packages announce in :data:`BENCH_GROUP`
    (the project's own live in ``benchmarks/``, never inside the library)."""
    from importlib import metadata

    def section(ep: "metadata.EntryPoint") -> Callable[[], dict[str, Any]]:
        return lambda: ep.load()()

    return {ep.name: section(ep) for ep in metadata.entry_points(group=BENCH_GROUP)}


def run_bench(only: list[str] | None = None) -> dict[str, Any]:
    """Run the named sections (all by default) and merge their results. A section that fails
    reports ``<section>_error`` and the others still run: one failure never empties the report."""
    load = [round(os.getloadavg()[0], 2)]  # the machine's 1-minute load, at the start and at the end
    results: dict[str, Any] = {"bench_machine": machine(), "bench_load_1m": load}
    for name, fn in installed_sections().items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            results.update(fn())
        except Exception as exc:  # noqa: BLE001 - whatever broke, the other sections' figures stand
            results[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
        results[f"section_{name}_s"] = round(time.perf_counter() - t0, 3)
    load.append(round(os.getloadavg()[0], 2))
    return results


def machine() -> dict[str, Any]:
    """What the figures were measured on: the processor, its cores, the OS and Python."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "system": platform.platform(), "python": platform.python_version()}


def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", action="append", metavar="SECTION",
                   help="run only this section (repeatable): " + ", ".join(installed_sections()))


def _bench_run(args: argparse.Namespace) -> Result:
    from ..definition import did_you_mean

    known = installed_sections()
    if not known:
        raise CommandError("no bench sections are installed: they live in the benchmarks package "
                           "(pip install -e . from a checkout; scripts/setup.sh does)")
    for s in args.only or []:
        if s not in known:
            raise CommandError(f"no bench section {s!r}{did_you_mean(s, known)} "
                               f"(the sections: {', '.join(sorted(known))})")
    doc = run_bench(args.only)
    width = max((len(k) for k in doc), default=0)
    return 0, doc, "\n".join(f"{k:<{width}}  {v}" for k, v in doc.items())


BENCH = Command("measure speed against same-run baselines", _bench_args, _bench_run,
                "envfactory bench --only step --only fork\nenvfactory bench --json > bench.json")
