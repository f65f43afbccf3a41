"""The ``parity`` verification check: ``local`` and ``docker`` agree exactly.

Both runtimes are the same referee (:class:`~envfactory.episode.Episode`) over
different worlds, so every episode must come out identical. For every task, the
scripted agents of :mod:`envfactory.checks.scripted` play it on both: the
(joint) reference solution, a passive agent or team and seeded random ones; a
team in turn order (AEC) and in simultaneous rounds (Parallel). Everything
observable (:func:`~envfactory.checks.scripted.episode_trace`: results,
observations, transcripts, rewards, end flags, info, call logs, final states)
must be identical.
"""

from __future__ import annotations

from typing import Any

from .scripted import MODES, NoopPolicy, OraclePolicy, RandomPolicy, RolePolicy, episode_trace

__all__ = ["parity_failures"]


def _differs(a: list[Any], b: list[Any]) -> Any:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), "the end (different lengths)")


def parity_failures(spec: Any, seed: int = 0, random_seeds: int = 2) -> list[tuple[str, str]]:
    """``[(task id, what differed)]`` between the local and Docker runtimes of ``spec``."""
    from ..registry import make

    local, docker = make(spec.name), make(spec.name, runtime="docker")
    policies: list[tuple[str, RolePolicy, int]] = [("oracle", OraclePolicy(), 0), ("noop", NoopPolicy(), 0)]
    policies += [("random", RandomPolicy(), seed + r) for r in range(random_seeds)]
    modes = MODES if spec.multi_agent else MODES[:1]
    out = []
    try:
        for task in spec.get_tasks():
            for mode in modes:
                for name, policy, s in policies:
                    where = _differs(episode_trace(local, policy, task.id, mode, s),
                                     episode_trace(docker, policy, task.id, mode, s))
                    if where is not None:
                        out.append((task.id, f"{name} (seed {s}, {mode}) differs between local and docker "
                                             f"at move {where}"))
    finally:
        docker.close()
    return out
