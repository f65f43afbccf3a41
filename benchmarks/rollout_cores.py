"""Both cores for HF rollouts: one process on one thread, one process on two threads, and two
processes of one thread each (half the episodes each), on the episodes of
:mod:`benchmarks.rollout`, timed wall-clock from a common start, twice each.

Prints one JSON line per run: the FLOPs of the work done (:func:`benchmarks.rollout.work_flops`)
per second against torch's matmul rate on the model's layer shapes at batch 512 on one and on
two threads, measured after each run. ``python -m benchmarks.rollout_cores``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from typing import Any


def worker(n: int, threads: int, q: Any, start: Any) -> None:
    """One sampling process: warm up, wait for the common start, play ``2 * n`` episodes."""
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model
    from benchmarks.rollout import _measure, work_flops

    hf = HFPolicy(build_tiny_model(), device="cpu", threads=threads)
    _measure(hf, 2, 8)  # warm
    hf.clear_cache()
    start.wait()
    t = time.perf_counter()
    m = _measure(hf, n, 64)
    q.put((time.perf_counter() - t, work_flops(hf.model, m), m["tokens"]))


def run(procs: int, n: int, threads: int) -> tuple[float, float, int]:
    """Wall seconds from the common start until every process is done, total FLOPs, sampled tokens."""
    ctx = mp.get_context("spawn")
    q, start = ctx.Queue(), ctx.Barrier(procs + 1)
    ps = [ctx.Process(target=worker, args=(n, threads, q, start)) for _ in range(procs)]
    for p in ps:
        p.start()
    start.wait()
    t = time.perf_counter()
    res = [q.get() for _ in ps]
    wall = time.perf_counter() - t
    for p in ps:
        p.join()
    return wall, sum(r[1] for r in res), sum(r[2] for r in res)


SETUPS = (("1 process, 1 thread, 32 episodes", 1, 16, 1),
          ("1 process, 2 threads, 32 episodes", 1, 16, 2),
          ("2 processes x 1 thread, 16 episodes each", 2, 8, 1))

if __name__ == "__main__":
    from transformers import AutoModelForCausalLM

    from agents.models.tiny import build_tiny_model
    from benchmarks.rollout import matmul_flops_per_s

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model())
    for _ in range(2):
        for name, procs, n, threads in SETUPS:
            wall, flops, tokens = run(procs, n, threads)
            p1, p2 = matmul_flops_per_s(model, 512, 1), matmul_flops_per_s(model, 512, 2)
            print(json.dumps({
                "setup": name, "wall_s": round(wall, 2), "gflops": round(flops / 1e9, 1), "sampled_tokens": tokens,
                "tokens_per_s": round(tokens / wall, 1), "gflops_per_s": round(flops / wall / 1e9, 2),
                "peak_1thread_gflops": round(p1 / 1e9, 1), "peak_2threads_gflops": round(p2 / 1e9, 1),
                "mfu_vs_one_core": round(flops / wall / p1, 3), "mfu_vs_both_cores": round(flops / wall / p2, 3),
                # the two-thread matmul rate swings run to run here; twice the one-thread rate is steadier
                "mfu_vs_2x_one_core": round(flops / wall / (2 * p1), 3),
                "load_1m": os.getloadavg()[0]}), flush=True)
