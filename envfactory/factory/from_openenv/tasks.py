"""OpenEnv tasks: an instruction, ``reset`` keyword arguments, setup calls, a reference solution
and a :class:`RewardCheck` (the environment's own reward). See :mod:`envfactory.factory.from_openenv`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envfactory.factory.from_mcp import _SETUPS, _journal_key
from envfactory.task import Task, ToolCall

from .sessions import OpenEnvState

__all__ = ["RewardCheck", "openenv_task"]


# -- tasks ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardCheck:
    """Success: the environment's own last reward is at least ``min_reward`` (with ``done``: and it
    reported the episode done)."""

    min_reward: float = 1.0
    done: bool = False

    def __call__(self, state: OpenEnvState) -> bool:
        if self.done and not state.done:
            return False
        return state.reward is not None and state.reward >= self.min_reward

    def describe(self) -> dict[str, Any]:
        return {"min_reward": self.min_reward, "done": self.done}


def openenv_task(id: str, instruction: str, solution: Sequence[ToolCall], *, reset: dict[str, Any] | None = None,
                 setup: Sequence[ToolCall] = (), min_reward: float = 1.0, done: bool = False,
                 answer_facts: Sequence[str] = (), metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task for :func:`from_openenv`: ``reset`` is passed to the environment's ``reset`` (its seed,
    task id, ...), ``setup`` calls follow it (the initial state), ``solution`` is the reference,
    success is the environment's own reward reaching ``min_reward`` (with ``done``: and the
    environment having ended the episode) and the answer holding ``answer_facts``."""
    return {"id": id, "instruction": instruction, "solution": list(solution), "reset": dict(reset or {}),
            "setup": list(setup), "check": RewardCheck(float(min_reward), bool(done)),
            "answer_facts": list(answer_facts), "metadata": dict(metadata or {})}


def _build_tasks(raw: Sequence[dict[str, Any]]) -> list[Task]:
    out = []
    for d in raw:
        setup = [{"name": c.name, "arguments": dict(c.arguments)} for c in d["setup"]]
        _SETUPS.add(_journal_key(setup))
        check = d["check"]
        out.append(Task(id=d["id"], instruction=d["instruction"],
                        initial_state=OpenEnvState(calls=setup, reset_kwargs=d["reset"]), solution=d["solution"],
                        answer_facts=d["answer_facts"], check=check,
                        metadata={**d["metadata"], "check": check.describe(), "reset": d["reset"]}))
    return out
