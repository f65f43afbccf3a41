"""The ``parity`` verification check: ``local`` and ``docker`` agree exactly.

Both runtimes are the same referee (:class:`~envfactory.episode.Episode`) over
different worlds, so every episode must come out identical. For every task:
one agent plays the reference solution and a seeded random agent; a team plays
the joint reference solution, a seeded random team and a passive team, in turn
order (AEC) and in simultaneous rounds (Parallel). Messages, observations,
rewards, end flags, info, call logs and final states must be identical.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from ..agents_scripted import oracle_actions, random_actions
from ..task import ToolCall

__all__ = ["parity_failures", "single_trace", "team_trace", "TeamScript", "plan_progress", "MODES"]

MODES = ("aec", "parallel")
PASS = "I have nothing to do this turn."


def single_trace(env: Any, task_id: str, actions: list[Any]) -> list[Any]:
    """Everything observable of one single-agent episode playing ``actions`` (then an empty answer)."""
    trace: list[Any] = [env.reset(task_id)]
    for a in list(actions) + [""]:
        r = env.step(a)
        trace.append((r.messages, r.reward, r.terminated, r.truncated, r.info))
        if r.done:
            break
    trace.append((json.dumps(env.messages, sort_keys=True), env.state.hash()))
    return trace


def plan_progress(ep: Any) -> int:
    """How many leading calls of the task's joint solution were made successfully, in order."""
    plan, k = ep.task.solution, 0
    for e in ep.log:
        if k < len(plan) and e["ok"]:
            step = plan[k]
            if step.agent in (None, e["agent"]) and e["name"] == step.name and e["arguments"] == step.arguments:
                k += 1
    return k


class TeamScript:
    """A scripted team, stateless (it reads the episode, so it plays forks too):
    ``oracle`` (each call of the joint reference solution by its agent when it is
    next, then ``finish``), ``random`` (seeded schema-typed calls with each
    agent's own tools, then passes) or ``noop`` (always passes)."""

    def __init__(self, policy: str, task: Any, seed: int = 0, turns: int = 4) -> None:
        if policy not in ("oracle", "random", "noop"):
            raise ValueError(f"no scripted team {policy!r}")
        self.policy, self.task, self.seed, self.turns = policy, task, seed, turns

    def act(self, ep: Any, agent: str) -> str:
        if self.policy == "oracle":
            plan = self.task.solution
            k = plan_progress(ep)
            if k == len(plan):
                answer = ("Done. " + " ".join(self.task.answer_facts)).strip()
                return ToolCall("finish", {"answer": answer}).to_hermes()
            return plan[k].to_hermes() if plan[k].agent in (None, agent) else PASS
        if self.policy == "random":
            s = zlib.crc32(f"{self.task.id}/{agent}/{self.seed}".encode()) & 0x7FFFFFFF
            actions = random_actions(self.task, ep.tool_schemas(agent), s, self.turns)
            i = ep.turns_taken(agent)
            return actions[i] if i < len(actions) else PASS
        return PASS


def team_trace(ep: Any, task_id: str, mode: str, policy: str, seed: int = 0) -> list[Any]:
    """Everything observable of one team episode, turn by turn (``aec``) or round by
    round (``parallel``): results, whose turn, the round, every agent's observation,
    conversation and turn count; at the end rewards, success, answer, how it ended,
    the call log and the final state. Equal traces mean equal episodes."""
    team = TeamScript(policy, ep.spec.task(task_id), seed)
    agents = ep.agents
    out: list[Any] = [ep.reset(task_id), {a: ep.transcript(a) for a in agents}]
    while not ep.done:
        if mode == "aec":
            a = ep.next_agent
            results = {a: ep.act(a, team.act(ep, a))}
        else:
            results = ep.step({a: team.act(ep, a) for a in agents})
        out.append(({a: r.to_json() for a, r in results.items()}, ep.next_agent, ep.round,
                    {a: ep.observation(a) for a in agents}, {a: ep.transcript(a) for a in agents},
                    {a: ep.turns_taken(a) for a in agents}))
    out.append((ep.rewards, ep.success, ep.answer, ep.ended_by, ep.terminated, ep.truncated,
                json.dumps(ep.log, sort_keys=True, default=str), ep.state.model_dump(mode="json"), ep.state.hash()))
    return out


def _differs(a: list[Any], b: list[Any]) -> Any:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), "the end (different lengths)")


def parity_failures(spec: Any, seed: int = 0, random_seeds: int = 2) -> list[tuple[str, str]]:
    """``[(task id, what differed)]`` between the local and Docker runtimes of ``spec``."""
    from ..registry import make

    local, docker = make(spec.name), make(spec.name, runtime="docker")
    out = []
    try:
        for k, task in enumerate(spec.get_tasks()):
            if not spec.multi_agent:
                schemas = local.tool_schemas()
                for agent, actions in (("reference", oracle_actions(task)),
                                       ("random", random_actions(task, schemas, seed + k))):
                    where = _differs(single_trace(local, task.id, actions), single_trace(docker, task.id, actions))
                    if where is not None:
                        out.append((task.id, f"{agent} episode differs between local and docker at turn {where}"))
                continue
            for mode in MODES:
                for policy, s in [("oracle", 0), ("noop", 0)] + [("random", seed + r) for r in range(random_seeds)]:
                    where = _differs(team_trace(local, task.id, mode, policy, s),
                                     team_trace(docker, task.id, mode, policy, s))
                    if where is not None:
                        out.append((task.id, f"{policy} team (seed {s}, {mode}) differs between local and "
                                             f"docker at step {where}"))
    finally:
        docker.close()
    return out
