"""Teams of scripted role policies, and playing an episode with a team.

A role policy answers ``act(episode, agent, seed) -> action`` for the agent
whose turn it is. Scripted policies may read the live episode (the oracle
follows the task's joint plan by looking at which steps were done); model
policies (:mod:`envfactory.multi.llm`) only read ``episode.messages(agent)``.

* ``oracle``: plays its own steps of the joint reference solution when they are
  next, passes otherwise, and calls ``finish`` once the plan is complete;
* ``noop``: always passes;
* ``random``: schema-typed random calls with its own tools, then passes;
* :class:`ScriptPolicy`: a fixed list of calls (verification plays the whole
  joint solution with one role alone through it).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..agents_scripted import random_actions
from ..task import ToolCall
from .episode import MultiEpisode

__all__ = ["RolePolicy", "OraclePolicy", "NoopPolicy", "RandomPolicy", "ScriptPolicy", "TeamOutcome",
           "play", "plan_progress", "scripted_policy", "SCRIPTED", "MODES"]

MODES = ("aec", "parallel")
PASS = "I have nothing to do this turn."


class RolePolicy(Protocol):
    name: str

    def act(self, episode: MultiEpisode, agent: str, seed: int) -> Any:
        """The action of ``agent`` for its turn now."""


def plan_progress(episode: MultiEpisode) -> int:
    """How many leading steps of the task's joint solution were done successfully, in order."""
    plan, k = episode.task.solution, 0
    for e in episode.log:
        if k < len(plan) and e["ok"]:
            step = plan[k]
            if e["agent"] == step.agent and e["name"] == step.call.name and e["arguments"] == step.call.arguments:
                k += 1
    return k


def _finish(episode: MultiEpisode) -> str:
    answer = "Done. " + " ".join(episode.task.answer_facts)
    return ToolCall("finish", {"answer": answer.strip()}).to_hermes()


class OraclePolicy:
    """Plays the agent's steps of the joint reference solution as they come up."""

    name = "oracle"

    def act(self, episode: MultiEpisode, agent: str, seed: int) -> Any:
        plan = episode.task.solution
        k = plan_progress(episode)
        if k == len(plan):
            return _finish(episode)
        return plan[k].call.to_hermes() if plan[k].agent == agent else PASS


class NoopPolicy:
    """Always passes."""

    name = "noop"

    def act(self, episode: MultiEpisode, agent: str, seed: int) -> Any:
        return PASS


class RandomPolicy:
    """Schema-typed random calls with the agent's own tools (a few turns), then passes."""

    name = "random"

    def __init__(self, turns: int = 4) -> None:
        self.turns = turns

    def act(self, episode: MultiEpisode, agent: str, seed: int) -> Any:
        s = zlib.crc32(f"{episode.task.id}/{agent}/{seed}".encode()) & 0x7FFFFFFF
        actions = random_actions(episode.task, episode.tool_schemas(agent), s, self.turns)
        i = episode.turns_taken(agent)
        return actions[i] if i < len(actions) else PASS


@dataclass
class ScriptPolicy:
    """Plays ``calls`` one per turn, then ``finish`` (or passes, with ``finish=False``)."""

    calls: list[ToolCall]
    finish: bool = True
    name: str = "script"

    def act(self, episode: MultiEpisode, agent: str, seed: int) -> Any:
        i = episode.turns_taken(agent)
        if i < len(self.calls):
            return self.calls[i].to_hermes()
        return _finish(episode) if self.finish and i == len(self.calls) else PASS


SCRIPTED = ("oracle", "random", "noop")


def scripted_policy(name: str) -> RolePolicy:
    """A scripted role policy by name: ``oracle``, ``random`` or ``noop``."""
    if name == "oracle":
        return OraclePolicy()
    if name == "noop":
        return NoopPolicy()
    if name == "random":
        return RandomPolicy()
    raise KeyError(f"no scripted policy {name!r}; choose one of {', '.join(SCRIPTED)}")


@dataclass
class TeamOutcome:
    """One team episode, summarised for evaluation."""

    env: str
    task_id: str
    mode: str
    success: bool
    rewards: dict[str, float]
    rounds: int
    ended_by: str
    messages: int
    calls: int
    errors: dict[str, int] = field(default_factory=dict)
    redundant: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self, *, with_log: bool = False) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "log"}
        if with_log:
            d["log"] = self.log
        return d


def redundant_calls(log: list[dict[str, Any]]) -> int:
    """Successful calls that repeat an earlier successful call (same tool and arguments, by anyone)."""
    seen, n = set(), 0
    for e in log:
        if not e["ok"] or e["name"] in (None, "send_message", "read_messages", "finish"):
            continue
        key = (e["name"], repr(sorted(e["arguments"].items())))
        n += key in seen
        seen.add(key)
    return n


def play(episode: MultiEpisode, team: dict[str, RolePolicy], task: Any, *, mode: str = "aec",
         seed: int = 0) -> TeamOutcome:
    """Reset ``episode`` on ``task`` and play it to the end with ``team`` (a policy per agent).

    ``mode`` is ``aec`` (turn order: each agent decides after the previous one
    acted) or ``parallel`` (every agent decides on the same information).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    missing = set(episode.agents) - set(team)
    if missing:
        raise KeyError(f"the team has no policy for {sorted(missing)}")
    episode.reset(task)
    while not episode.done:
        if mode == "aec":
            a = episode.next_agent
            episode.act(a, team[a].act(episode, a, seed))
        else:
            episode.step({a: team[a].act(episode, a, seed) for a in episode.agents})
    log = list(episode.log)
    errors: dict[str, int] = {}
    for e in log:
        if not e["ok"]:
            errors[e["kind"]] = errors.get(e["kind"], 0) + 1
    return TeamOutcome(
        env=episode.spec.name, task_id=episode.task.id, mode=mode, success=bool(episode.success),
        rewards=episode.rewards, rounds=episode.round, ended_by=episode.ended_by or "",
        messages=len(episode.state.mail.letters), calls=sum(e["name"] is not None for e in log),
        errors=errors, redundant=redundant_calls(log), log=log)
