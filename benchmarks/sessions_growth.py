"""How a step's cost grows with the sessions held (issue 60: "benchmarks that catch growth").

``levels`` sessions of ``env`` are opened and reset, all held at once; then every session takes
one step in turn, ``rounds`` times (a session whose episode ended is reset between rounds, not
timed). Per level: the median step time of the in-process runtime (the same steps through
:func:`envfactory.step_many`, and one by one through ``Episode.step``), the resident memory each
held session adds, and, with ``docker=True`` (a Docker engine running), the same over containers
through ``step_many``. The fitted growth is the log-log slope of the median step time against the
sessions held (0: flat; 1: linear), and each level's ratio to the smallest.

Run: ``python -m benchmarks.sessions_growth [--docker] [--levels 100,500,1000,2000]`` or
``envfactory bench --only sessions``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import time
from typing import Any

__all__ = ["bench_sessions", "growth_exponent"]


def growth_exponent(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ``log y`` on ``log x``: how ``y`` grows with ``x``."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den if den else 0.0


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _play(episodes: list[Any], task: Any, action: str, rounds: int, many: bool) -> list[float]:
    """Per-step seconds of each round (each session one step)."""
    import envfactory

    out = []
    for _ in range(rounds):
        for e in episodes:
            if e.status.terminated or e.status.truncated:
                e.reset(task.id)
        gc.collect()
        t0 = time.perf_counter()
        if many:
            envfactory.step_many([(e, action) for e in episodes])
        else:
            for e in episodes:
                e.step(action)
        out.append((time.perf_counter() - t0) / len(episodes))
    return out


def _level(n: int, env: str, runtime: str, rounds: int) -> dict[str, Any]:
    import envfactory

    spec = envfactory.registry.spec(env)
    task = spec.get_tasks()[0]
    action = task.solution[0].to_hermes()
    gc.collect()
    rss0 = _rss_kb()
    t0 = time.perf_counter()
    episodes = [envfactory.make(env, runtime=runtime) for _ in range(n)]
    for e in episodes:
        e.reset(task.id)
    opened = time.perf_counter() - t0
    gc.collect()
    rss1 = _rss_kb()
    try:
        row = {"open_reset_s": round(opened, 2), "kb_per_session": round((rss1 - rss0) / n, 1)}
        many = _play(episodes, task, action, rounds, True)
        row["step_many_us"] = round(statistics.median(many) * 1e6, 2)
        if runtime == "local":
            row["step_us"] = round(statistics.median(_play(episodes, task, action, rounds, False)) * 1e6, 2)
        return row
    finally:
        for e in episodes:
            e.close()


def bench_sessions(levels: tuple[int, ...] = (100, 250, 500, 1000, 2000), env: str = "Counter-v0",
                   rounds: int = 5, docker: bool = False) -> dict[str, Any]:
    """Step cost against sessions held (see the module): per runtime and level, and the fitted
    growth exponent of each figure."""
    out: dict[str, Any] = {"sessions_env": env, "sessions_levels": list(levels),
                           "sessions_loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    for runtime in ("local", "docker") if docker else ("local",):
        rows = {n: _level(n, env, runtime, rounds) for n in levels}
        for key in rows[levels[0]]:
            ys = [float(rows[n][key]) for n in levels]
            out[f"sessions_{runtime}_{key}"] = dict(zip(map(str, levels), ys))
            if key.endswith("_us"):
                out[f"sessions_{runtime}_{key}_vs_{levels[0]}_ratio"] = {
                    str(n): round(y / ys[0], 3) for n, y in zip(levels, ys)}
                out[f"sessions_{runtime}_{key}_growth_exponent"] = round(growth_exponent(list(map(float, levels)), ys), 3)
    out["sessions_loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="100,250,500,1000,2000")
    p.add_argument("--env", default="Counter-v0")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--docker", action="store_true", help="also over containers (needs a Docker engine)")
    a = p.parse_args()
    levels = tuple(int(x) for x in a.levels.split(","))
    print(json.dumps(bench_sessions(levels, a.env, a.rounds, a.docker), indent=1))


if __name__ == "__main__":
    main()
