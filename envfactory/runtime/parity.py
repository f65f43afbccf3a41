"""The ``parity`` verification check: ``local`` and ``docker`` agree exactly.

For every task, the reference solution and a seeded random agent are played in
both runtimes; messages, rewards, end flags, info and final-state hashes must
be identical.
"""

from __future__ import annotations

import json
from typing import Any

from ..agents_scripted import oracle_actions, random_actions

__all__ = ["parity_failures"]


def _play(env: Any, task_id: str, actions: list[Any]) -> list[Any]:
    trace: list[Any] = [env.reset(task_id)]
    for a in list(actions) + [""]:
        r = env.step(a)
        trace.append((r.messages, r.reward, r.terminated, r.truncated, r.info))
        if r.done:
            break
    trace.append((json.dumps(env.messages, sort_keys=True), env.state.hash()))
    return trace


def parity_failures(spec: Any, seed: int = 0) -> list[tuple[str, str]]:
    """``[(task id, what differed)]`` between the local and Docker runtimes of ``spec``."""
    from ..registry import make

    local, docker = make(spec.name), make(spec.name, runtime="docker")
    out = []
    try:
        schemas = local.tool_schemas()
        for k, task in enumerate(spec.get_tasks()):
            for agent, actions in (("reference", oracle_actions(task)),
                                   ("random", random_actions(task, schemas, seed + k))):
                a, b = _play(local, task.id, actions), _play(docker, task.id, actions)
                if a != b:
                    where = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) if len(a) == len(b) else "length"
                    out.append((task.id, f"{agent} episode differs between local and docker at turn {where}"))
    finally:
        docker.close()
    return out
