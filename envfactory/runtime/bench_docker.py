"""``envfactory bench`` section ``docker``: the Docker runtime against same-run baselines.

Every episode is ``envfactory.make("Counter-v0", runtime=...)``: the same referee
over a local or a container world. Reports step round trip p50/p99 and their
ratio to the local runtime (steps interleaved in rounds so drift hits both), warm acquire+reset (shared and
per-session containers), cold start, throughput of 32 concurrent sessions
(against 32 local sessions), and the same counter served by OpenEnv
(``openenv-core``, WebSocket ``EnvClient``) with the ratio.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["bench_docker"]

ACTION = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))] / 1000.0


def _steps(env: Any, n: int) -> list[float]:
    clock, step, out = time.perf_counter_ns, env.step, []
    for _ in range(n):
        t0 = clock()
        step(ACTION)
        out.append(clock() - t0)
    return out


def _throughput(make: Any, sessions: int, seconds: float) -> float:
    envs = [make() for _ in range(sessions)]
    for e in envs:
        e.reset(0)
    counts = [0] * sessions
    stop = threading.Event()

    def run(i: int) -> None:
        e = envs[i]
        while not stop.is_set():
            e.step(ACTION)
            counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    for e in envs:
        e.close()
    return sum(counts) / seconds


def _openenv(n: int) -> dict[str, Any]:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "openenv_counter.py"
    try:
        import openenv  # noqa: F401
    except ImportError:
        return {"openenv_error": "openenv-core is not installed (pip install openenv-core)"}
    r = subprocess.run([sys.executable, str(script), "bench", str(n)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"openenv_error": r.stderr[-500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_docker(n: int = 4000) -> dict[str, Any]:
    from ..registry import make, spec
    from .pool import Pool

    s = spec("Counter-v0")
    out: dict[str, Any] = {}
    pool = Pool(s, sessions_per_container=16)

    def docker(p: Pool = pool, **kw: Any) -> Any:
        return make("Counter-v0", runtime="docker", pool=p, **kw)

    try:
        # cold start: a new container until its first reset returned
        colds = []
        for _ in range(3):
            t0 = time.perf_counter_ns()
            c = pool.start_container()
            with pool._cond:
                pool._live.append(c)
            e = docker()
            e.reset(0)
            colds.append(time.perf_counter_ns() - t0)
            e.close()
        out["docker_cold_start_ms"] = round(_pct(colds, 0.5) / 1000, 1)

        # step round trip, interleaved with the local runtime
        local = make("Counter-v0", max_turns=10**9)
        dock = docker(max_turns=10**9)
        local.reset(0)
        dock.reset(0)
        _steps(dock, 200)
        ls, ds = [], []
        for _ in range(n // 50):
            ls += _steps(local, 50)
            ds += _steps(dock, 50)
        dock.close()
        p50, p50l = _pct(ds, 0.5), _pct(ls, 0.5)
        out.update({
            "docker_step_p50_us": round(p50, 1), "docker_step_p99_us": round(_pct(ds, 0.99), 1),
            "local_step_p50_us": round(p50l, 1), "local_step_p99_us": round(_pct(ls, 0.99), 1),
            "docker_step_p50_vs_local_ratio": round(p50 / p50l, 2),
            "docker_step_p99_vs_local_ratio": round(_pct(ds, 0.99) / _pct(ls, 0.99), 2),
        })

        # warm acquire + reset: a shared container already running
        warm = []
        for _ in range(50):
            t0 = time.perf_counter_ns()
            e = docker()
            e.reset(0)
            warm.append(time.perf_counter_ns() - t0)
            e.close()
        out["docker_warm_acquire_reset_ms"] = round(_pct(warm, 0.5) / 1000, 2)

        # throughput, 32 concurrent sessions (two shared containers) vs 32 local sessions
        tl = _throughput(lambda: make("Counter-v0", max_turns=10**9), 32, 2.0)
        td = _throughput(lambda: docker(max_turns=10**9), 32, 3.0)
        out.update({"docker_throughput_32_sessions_steps_per_s": round(td),
                    "local_throughput_32_sessions_steps_per_s": round(tl),
                    "docker_throughput_vs_local_ratio": round(td / tl, 3)})
    finally:
        pool.shutdown()

    # warm acquire + reset with a container per session (isolation="container")
    per = Pool(dataclasses.replace(s, isolation="container"), warm=1)
    try:
        samples = []
        for _ in range(8):
            per.prewarm(1)
            t0 = time.perf_counter_ns()
            e = make("Counter-v0", runtime="docker", pool=per)
            e.reset(0)
            samples.append(time.perf_counter_ns() - t0)
            e.close()
        out["docker_warm_acquire_reset_per_session_container_ms"] = round(_pct(samples, 0.5) / 1000, 2)
    finally:
        per.shutdown()

    oe = _openenv(2000)
    if "p50_us" in oe:
        out.update({"openenv_step_p50_us": round(oe["p50_us"], 1), "openenv_step_p99_us": round(oe["p99_us"], 1),
                    "docker_step_p50_vs_openenv_ratio": round(p50 / oe["p50_us"], 3)})
    else:
        out.update(oe)
    return out
