"""One agent in place of a team: does a task really need the team?

:func:`merged_spec` turns a team environment into the same world played by one agent,
``merged_0``, that holds every role's tools and every role's private notes (nothing to
relay, no one to wait for), under the same turn budget (rounds). A second role,
``idle_0``, has no tools and always passes; it is there only so that the world runs
as a team's would (``acting`` and ``round`` are set for every call).

:class:`GreedyMergedPolicy` is the strongest play such an agent has on a task whose
joint reference solution is known: every turn it sends *all* the reference's remaining
non-message calls at once, in order, and sends again next turn whatever the world
refused; it stops when nothing is left. If that agent fails within the budget, a team
is needed for the task's *budget*, not only for its permissions or its notes (one
clerk does one job per round, and the job count exceeds the rounds).
"""

from __future__ import annotations

import json
from typing import Any

from ..definition import Role, ToolEnvSpec
from ..task import Task, ToolCall
from .scripted import PASS

__all__ = ["MERGED", "IDLE", "merged_spec", "merged_task", "GreedyMergedPolicy", "MESSAGE_TOOLS"]

MERGED, IDLE = "merged_0", "idle_0"
MESSAGE_TOOLS = ("send_message", "read_messages")


def merged_task(spec: ToolEnvSpec, task: Task, **state_update: Any) -> Task:
    """``task`` for one agent: every role's notes are its notes, the reference's calls (messages
    left out) are its calls; ``state_update`` changes fields of the initial state (e.g. lifting
    a deadline, to show the agent can do the work given the time)."""
    notes = [f"Notes of {a}: {task.private[a]}" for a in spec.agent_ids if task.private.get(a)]
    solution = [ToolCall(c.name, dict(c.arguments), agent=MERGED) for c in task.solution
                if c.name not in MESSAGE_TOOLS]
    state = task.initial_state.model_copy(update=state_update) if state_update else task.initial_state
    return task.model_copy(update={"private": {MERGED: " ".join(notes)} if notes else {}, "solution": solution,
                                   "initial_state": state})


def merged_spec(spec: ToolEnvSpec, tasks: list[Task] | None = None, **state_update: Any) -> ToolEnvSpec:
    """``spec`` played by one agent holding every role's tools and notes (see the module
    docstring), with ``tasks`` (default: all of the spec's) turned by :func:`merged_task`."""
    if not spec.multi_agent:
        raise TypeError(f"{spec.name} is a single-agent environment already")
    tools: dict[str, Any] = {}
    for role in spec.roles:
        for t in role.tools:
            tools.setdefault(t.name, t)
    chosen = list(tasks if tasks is not None else spec.get_tasks())
    name = spec.name.replace("-v", "Merged-v", 1)
    return ToolEnvSpec(
        name=name, domain=spec.domain, state_type=spec.state_type, tools=list(spec.tools),
        tasks=lambda: [merged_task(spec, t, **state_update) for t in chosen],
        roles=[Role(MERGED, "you hold every role of the team: all its tools and all its private notes",
                    list(tools.values())),
               Role(IDLE, "you have nothing to do; pass", [])],
        description=f"{spec.name} played by one agent holding every tool and note.",
        max_turns=spec.max_turns, finish_tool=spec.finish_tool, terminal=spec.terminal, payoff=spec.payoff,
        metadata={"merged_from": spec.name})


class GreedyMergedPolicy:
    """Sends every remaining reference call (messages left out) each turn, resending what was
    refused, until every call has succeeded; the idle role passes."""

    name = "greedy-merged"
    stochastic = False

    def act(self, episode: Any, agent: str, seed: int) -> Any:
        if agent != MERGED:
            return PASS
        done: list[tuple[str, str]] = [(e["name"], json.dumps(e["arguments"], sort_keys=True))
                                       for e in episode.status.log if e["ok"] and e["agent"] == MERGED]
        left = []
        for c in episode.task.solution:
            key = (c.name, json.dumps(json.loads(json.dumps(c.arguments, default=str)), sort_keys=True))
            if key in done:
                done.remove(key)
            else:
                left.append(c)
        if not left:
            return PASS
        return "".join(ToolCall(c.name, c.arguments).to_hermes() for c in left)
