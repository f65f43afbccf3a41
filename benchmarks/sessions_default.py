"""Many sessions on one Docker engine with the default settings (issue 28: "2,000 sessions on one
engine with the default settings open and finish with 0 errors and 0 ``world_lost``").

Every session is ``envfactory.make(ENV, runtime="docker")`` with nothing else given (the default
pool, its default ``sessions_per_container`` and limits). All are opened and reset first, so they
are held at once; then each plays its task's reference solution and final answer, a few
sessions at a time from ``--threads`` threads; then all are closed. Counted: exceptions (at
open, reset, step, close), episodes ended ``world_lost``, episodes not solved, resumes, and the
containers the pool started. Timings are wall time with the load average recorded.

Run: ``python -m benchmarks.sessions_default [--sessions 2000] [--env Counter-v0]`` (needs Docker).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import Counter
from typing import Any

__all__ = ["bench_sessions"]


def bench_sessions(sessions: int = 2000, env: str = "Counter-v0", threads: int = 8) -> dict[str, Any]:
    import envfactory
    from envfactory.checks.scripted import OraclePolicy

    out: dict[str, Any] = {"sessions": sessions, "env": env, "threads": threads,
                           "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    errors: Counter[str] = Counter()
    examples: dict[str, str] = {}

    def note(where: str, exc: BaseException) -> None:
        key = f"{where}: {type(exc).__name__}"
        errors[key] += 1
        examples.setdefault(key, str(exc)[:300])

    t0 = time.perf_counter()
    eps: list[Any] = []
    for i in range(sessions):
        try:
            ep = envfactory.make(env, runtime="docker")
        except Exception as exc:  # noqa: BLE001 - counted, the run goes on
            note("open", exc)
            continue
        try:
            tasks = ep.spec.tasks_in("train")  # the tasks make()'s episode draws from
            ep.reset(i % len(tasks) if tasks else 0)
        except Exception as exc:  # noqa: BLE001
            note("reset", exc)
        eps.append(ep)
    out["open_and_reset_s"] = round(time.perf_counter() - t0, 2)
    pools = {id(ep._world.pool): ep._world.pool for ep in eps if getattr(ep._world, "pool", None) is not None}
    out["pools"] = len(pools)
    out["containers_held"] = len({id(ep._world.container) for ep in eps if getattr(ep._world, "container", None)})
    out["sessions_per_container"] = sorted({p.per_container for p in pools.values()})

    ended: Counter[str] = Counter()
    solved = 0
    resumes = 0
    lock = threading.Lock()
    nxt = iter(range(len(eps)))

    def play() -> None:
        nonlocal solved, resumes
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            ep = eps[i]
            if ep.task is None:  # its reset failed (counted)
                continue
            try:
                r = None
                for action in OraclePolicy.actions(ep.task):
                    r = ep.step(action)
                    if r.done:
                        break
                with lock:
                    ended[str(r.info.get("ended_by")) if r is not None else "none"] += 1
                    solved += bool(r is not None and r.info.get("success"))
                    resumes += getattr(ep._world, "resumed", 0) or 0
            except Exception as exc:  # noqa: BLE001
                with lock:
                    note("step", exc)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=play) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out["play_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    for ep in eps:
        try:
            ep.close()
        except Exception as exc:  # noqa: BLE001
            note("close", exc)
    for p in pools.values():
        p.shutdown()
    out["close_s"] = round(time.perf_counter() - t0, 2)
    out.update(errors=sum(errors.values()), error_kinds=dict(errors), error_examples=examples,
               world_lost=ended.get("world_lost", 0), ended_by=dict(ended), solved=solved, resumes=resumes,
               loadavg_after=[round(x, 2) for x in os.getloadavg()])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=2000)
    p.add_argument("--env", default="Counter-v0")
    p.add_argument("--threads", type=int, default=8)
    a = p.parse_args()
    print(json.dumps(bench_sessions(a.sessions, a.env, a.threads), indent=1))


if __name__ == "__main__":
    main()
