"""What forking the world buys ARPO: branches over forked worlds against the same branches made by
replaying the prefix's calls on a fresh world (issue 64).

ARPO branches a rollout mid-trajectory: ``Z`` continuations share the prefix. With forks
(:meth:`envfactory.Episode.fork`) a branch starts from a copy of the live episode, world included.
A framework without forks must rebuild the prefix instead: a fresh episode of the same task, then
every action of the prefix played again (``reset`` + ``step`` per action). Both give the same
branches only if the world is deterministic, and the replay's cost grows with the prefix.

For each environment (a long reference task of a family whose writes cannot be undone: Hotel-v1's
longest task books, cancels and charges through 27 calls), for each branch point at a quarter,
half and three quarters of the reference, the run makes ``Z`` branches both ways and

* checks that the two ways give identical branches: each branch then plays a continuation (the
  rest of the reference for branch 0; the rest with one call dropped, or the next call repeated,
  for the others) and the transcripts, final state hashes and rewards must be equal;
* times the branch-making alone (fork, against reset + replayed prefix), interleaved per repeat,
  and reports the per-branch medians and the ratio replay / fork of the same repeat.

Runtimes: ``local`` (in-process) always; ``docker`` with ``--docker`` (an engine and the base
image: ``scripts/docker-engine.sh``, ``scripts/base-image.sh``), where a fork copies the world in
its container and a replay round-trips every prefix call.

Run: ``python -m benchmarks.fork_vs_replay [--repeats N] [--docker] [--out FILE]``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

__all__ = ["bench_fork_vs_replay"]

FAMILIES = ("Hotel-v1", "RetailOrders-v1")
Z = 4


def _continuations(rest: list[str], answer: str) -> list[list[str]]:
    """``Z`` continuations of a branch: the reference's rest, then variants (one call dropped, the
    next call made twice), each ending with the answer."""
    out = [rest + [answer]]
    for i in range(1, Z):
        if rest and i % 2:
            k = (i * 7) % len(rest)
            out.append(rest[:k] + rest[k + 1:] + [answer])
        else:
            out.append(rest[:1] + rest + [answer])
    return out


def _play(ep: Any, actions: list[str]) -> tuple[str, str, float]:
    for a in actions:
        if ep.done:
            break
        ep.step(a)
    return json.dumps(ep.transcript(), sort_keys=True), ep.state.hash(), float(ep.rewards[ep.agents[0]])


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def bench_fork_vs_replay(runtime: str = "local", repeats: int = 5,
                         families: tuple[str, ...] = FAMILIES) -> dict[str, Any]:
    """``{family: {point: {fork_ms, replay_ms, ratio, identical}}}`` for one runtime."""
    import envfactory
    from envfactory.checks.scripted import OraclePolicy

    out: dict[str, Any] = {}
    for name in families:
        spec = envfactory.spec(name)
        task = max(spec.get_tasks(), key=lambda t: len(t.solution))
        actions = OraclePolicy.actions(task)  # the reference's calls, one per turn, then the answer
        calls, answer = actions[:-1], actions[-1]
        n = len(calls)
        fam: dict[str, Any] = {"task": task.id, "calls": n,
                               "writes": sum(not spec.all_tools[c.name].read_only for c in task.solution)}
        parent = envfactory.make(name, runtime=runtime, split="all")
        spare = [envfactory.make(name, runtime=runtime, split="all") for _ in range(Z)]
        try:
            for point in sorted({max(1, n // 4), n // 2, (3 * n) // 4}):
                prefix, rest = calls[:point], calls[point:]
                fork_ms: list[float] = []
                replay_ms: list[float] = []
                identical = True
                for rep in range(repeats):
                    parent.reset(task.id)
                    for a in prefix:
                        parent.step(a)
                    order = ("fork", "replay") if rep % 2 == 0 else ("replay", "fork")  # interleaved
                    made: dict[str, list[Any]] = {}
                    for how in order:
                        t0 = time.perf_counter_ns()
                        if how == "fork":
                            made[how] = [parent.fork() for _ in range(Z)]
                        else:
                            for ep in spare:
                                ep.reset(task.id)
                                for a in prefix:
                                    ep.step(a)
                            made[how] = spare
                        (fork_ms if how == "fork" else replay_ms).append(_ms(t0) / Z)
                    if rep == 0:  # once per point, untimed: both ways branch alike
                        for i, cont in enumerate(_continuations(rest, answer)):
                            if _play(made["fork"][i], cont) != _play(made["replay"][i], cont):
                                identical = False
                    for ep in made["fork"]:
                        ep.close()
                ratios = [r / f for r, f in zip(replay_ms, fork_ms)]
                fam[f"prefix_{point}"] = {
                    "fork_ms_per_branch": round(statistics.median(fork_ms), 3),
                    "replay_ms_per_branch": round(statistics.median(replay_ms), 3),
                    "replay_over_fork_median": round(statistics.median(ratios), 2),
                    "replay_over_fork_min_max": [round(min(ratios), 2), round(max(ratios), 2)],
                    "identical_branches": identical,
                }
        finally:
            parent.close()
            for ep in spare:
                ep.close()
        out[name] = fam
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--docker", action="store_true", help="also the docker runtime")
    p.add_argument("--out", help="write the results here as JSON")
    args = p.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc: dict[str, Any] = {"benchmark": "fork_vs_replay", "commit": commit, "host": platform.processor() or
                           platform.machine(), "cpus": os.cpu_count(), "branches_per_point": Z,
                           "repeats": args.repeats, "load_before": [round(x, 2) for x in os.getloadavg()]}
    for runtime in ("local", "docker") if args.docker else ("local",):
        doc[runtime] = bench_fork_vs_replay(runtime, args.repeats)
        print(json.dumps({runtime: doc[runtime]}, indent=1), flush=True)
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    if not all(v["identical_branches"] for r in ("local", "docker") if r in doc
               for fam in doc[r].values() for k, v in fam.items() if k.startswith("prefix_")):
        print("fork_vs_replay: the two ways gave different branches", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
