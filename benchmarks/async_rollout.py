"""``envfactory bench`` section ``async_rollout``: the rollout without a barrier against the lock-step loop.

The same episodes of ``SlowTools-v0`` (:mod:`benchmarks.slow_tool_env`: ``wait_for`` sleeps
where the world runs) are played by :func:`agents.rollout.rollout` (sync: every tick waits for
the slowest tool of the batch) and :func:`agents.async_rollout.rollout_async` (the policy plays
whichever episodes are ready), on the local runtime and on the Docker runtime, the two arms
interleaved ``repeats`` times in one run (the one going first alternates). The policy is a
scripted role policy (no model time: the figure is the loop's): each episode makes ``calls``
tool calls, then answers; on turn ``k`` episode ``i``'s call takes ``slow_ms`` when
``(i + k) % slow_every == 0``, else ``fast_ms``, so every tick of the sync loop holds a slow call
while each episode waits for only its own. The sync arm steps every episode of a tick in its own
thread (``env_threads`` = the episode count: the best the lock-step loop does); the episodes are
made and reset once before timing (container start-up is not in the figure).

Reported per runtime: episodes/s of each arm (median, and min/median/max over the repeats), the
per-repeat ratio async over sync (min/median/max), and the machine's load at the start and end.
The arms' trajectories are checked equal (a deterministic policy) before anything is reported.
``python -m benchmarks.async_rollout [--out FILE]`` runs it alone.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["bench_async_rollout", "SlowScript"]


def _slow_env_module() -> Any:
    """:mod:`benchmarks.slow_tool_env` as the top-level module ``slow_tool_env`` (so the Docker
    runtime copies it into the image, as any user's environment module)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import slow_tool_env

    return slow_tool_env


class SlowScript:
    """A role policy: ``calls`` ``wait_for`` calls, then an answer; see the module docstring for
    which calls are slow. ``order`` maps each episode (by ``id``) to its index."""

    name = "slow-script"

    def __init__(self, order: dict[int, int], calls: int, slow_ms: int, fast_ms: int, slow_every: int) -> None:
        self.order, self.calls, self.slow_ms, self.fast_ms, self.every = order, calls, slow_ms, fast_ms, slow_every

    def act(self, episode: Any, agent: str, seed: int) -> str:
        k = episode.status.turns_taken(agent)
        if k >= self.calls:
            return "All jobs are done."
        ms = self.slow_ms if (self.order[id(episode)] + k) % self.every == 0 else self.fast_ms
        return '<tool_call>{"name": "wait_for", "arguments": {"job": "job-%d", "ms": %d}}</tool_call>' % (k, ms)


def _spread(xs: list[float], nd: int = 3) -> dict[str, float]:
    xs = sorted(xs)
    return {"min": round(xs[0], nd), "median": round(statistics.median(xs), nd), "max": round(xs[-1], nd)}


def _records(rollouts: list[Any]) -> list[Any]:
    return [(r.error, r.success, [t.to_json() for t in r.trajectories.values()]) for r in rollouts]


def _measure_runtime(runtime: str, episodes: int, calls: int, slow_ms: int, fast_ms: int, slow_every: int,
                     repeats: int, tokenizer: Any) -> dict[str, Any]:
    import envfactory
    from agents.async_rollout import rollout_async
    from agents.rollout import rollout

    env_module = _slow_env_module()
    tasks = [t.id for t in env_module.SPEC.get_tasks()]
    envs = [envfactory.make(env_module.NAME, runtime=runtime) for _ in range(episodes)]
    try:
        for e in envs:  # sessions (containers) started before timing
            e.reset(tasks[0])
        policy = SlowScript({id(e): i for i, e in enumerate(envs)}, calls, slow_ms, fast_ms, slow_every)

        def pairs() -> list[tuple[Any, str]]:
            return [(e, tasks[i % len(tasks)]) for i, e in enumerate(envs)]

        arms = {"sync": lambda: rollout(policy, pairs(), tokenizer=tokenizer, env_threads=episodes),
                "async": lambda: rollout_async(policy, pairs(), tokenizer=tokenizer)}
        rates: dict[str, list[float]] = {a: [] for a in arms}
        seen: dict[str, Any] = {}
        for r in range(repeats):
            for arm in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
                t0 = time.perf_counter()
                done = arms[arm]()
                dt = time.perf_counter() - t0
                failed = [x.error or x.ended_by for x in done if x.error or not x.success]
                if failed:
                    raise RuntimeError(f"async_rollout ({runtime}, {arm}): episodes failed: {failed[:3]}")
                seen[arm] = _records(done)
                rates[arm].append(episodes / dt)
        if seen["sync"] != seen["async"]:
            raise RuntimeError(f"async_rollout ({runtime}): the two loops gave different trajectories")
    finally:
        for e in envs:
            e.close()
    ratios = [a / s for a, s in zip(rates["async"], rates["sync"])]
    p = f"async_rollout_{runtime}"
    return {f"{p}_sync_episodes_per_s": round(statistics.median(rates["sync"]), 3),
            f"{p}_async_episodes_per_s": round(statistics.median(rates["async"]), 3),
            f"{p}_sync_episodes_per_s_min_median_max": _spread(rates["sync"]),
            f"{p}_async_episodes_per_s_min_median_max": _spread(rates["async"]),
            f"{p}_async_vs_sync_ratio": round(statistics.median(ratios), 3),
            f"{p}_async_vs_sync_ratio_min_median_max": _spread(ratios)}


def bench_async_rollout(episodes: int = 32, calls: int = 4, slow_ms: int = 400, fast_ms: int = 20,
                        slow_every: int = 4, repeats: int = 3) -> dict[str, Any]:
    """``async_rollout_{local,docker}_{sync,async}_episodes_per_s`` and their ``_async_vs_sync_ratio``
    (see the module docstring); an ``async_rollout_docker_error`` note when no Docker engine answers."""
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    out: dict[str, Any] = {"async_rollout_episodes": episodes, "async_rollout_calls_per_episode": calls,
                           "async_rollout_slow_ms": slow_ms, "async_rollout_fast_ms": fast_ms,
                           "async_rollout_slow_every": slow_every, "async_rollout_repeats": repeats,
                           "async_rollout_load_1m_start": round(os.getloadavg()[0], 2),
                           "async_rollout_cpus": os.cpu_count()}
    # what each loop would take if only the sleeps counted: every tick's slowest call, or each
    # episode's own calls (the slowest episode's)
    out["async_rollout_sleep_bound_ratio"] = round(
        calls * slow_ms / max(sum(slow_ms if (i + k) % slow_every == 0 else fast_ms for k in range(calls))
                              for i in range(episodes)), 3)
    out |= _measure_runtime("local", episodes, calls, slow_ms, fast_ms, slow_every, repeats, tokenizer)
    try:
        from envfactory.runtime.pool import docker_client

        docker_client()
    except RuntimeError as exc:
        out["async_rollout_docker_error"] = str(exc)
    else:
        out |= _measure_runtime("docker", episodes, calls, slow_ms, fast_ms, slow_every, repeats, tokenizer)
    out["async_rollout_load_1m_end"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="also write the figures (JSON) here")
    args = ap.parse_args()
    doc = bench_async_rollout(episodes=args.episodes, repeats=args.repeats)
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
