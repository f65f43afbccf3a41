"""The one environment interface every runtime implements.

An :class:`Environment` is a live episode of a tool-use environment. Its one
implementation is :class:`envfactory.episode.Episode` (the referee), over any
world (in-process or a container), so code written against it (agents, the
verifier, the Gymnasium adapter, tests) runs against every runtime.

Episode protocol:

1. ``reset(task)`` returns the opening messages (system, user instruction) of
   the agent who moves first.
2. ``step(action)`` takes the sole agent's assistant turn (model text, an
   assistant message with ``tool_calls``, or tool calls), runs the calls and
   returns a :class:`StepResult` whose ``messages`` are the tool responses.
   A team plays with ``act(agent, action)`` (one turn) or
   ``step_round({agent: action})`` (simultaneous moves) instead; ``step`` and
   ``messages`` on a team raise :class:`EpisodeError` naming them.
3. The episode terminates when the agent answers without calling a tool (or
   calls ``finish``); it is truncated after ``max_turns`` assistant turns.
   ``reward`` is 0 until the end, then 1.0 if the task succeeded, judged from
   the true final state, never from the agent's claims.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .definition import ToolEnvSpec
    from .state import State
    from .task import Task

__all__ = ["Environment", "StepResult", "EpisodeError", "SnapshotError", "Message"]

Message = dict[str, Any]


class EpisodeError(RuntimeError):
    """The environment was used out of protocol (step before reset, step after the end)."""


class SnapshotError(ValueError):
    """``restore()`` refuses a snapshot: not one, of another environment, edited (its seal does
    not match), a referee field of the wrong type or a verdict contradicting the ending, or a
    world state that cannot be loaded (see :mod:`envfactory.snapshots`)."""


@dataclass(slots=True)
class StepResult:
    """What one assistant turn produced.

    Attributes:
        messages: The new messages, in order: tool responses (``role: tool``),
            including error observations for malformed or failing calls.
        reward: Sparse: 0.0 during the episode; at the end 1.0 on success, else 0.0.
        terminated: The agent finished (answered without a tool call, or called ``finish``).
        truncated: The turn limit was reached first.
        info: ``turn`` (this agent's), ``round``, ``tool_calls``, ``tool_errors``,
            ``parse_errors``, ``task_id``; at the end also ``success``, ``answer``
            and ``ended_by``.
        agent: Who acted (``agent_0`` in a single-agent environment).
        rewards: Every agent's reward (for one agent, ``{agent: reward}``).
    """

    messages: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)
    agent: str = "agent_0"
    rewards: dict[str, float] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def to_json(self) -> dict[str, Any]:
        return {"agent": self.agent, "messages": self.messages, "reward": self.reward, "rewards": self.rewards,
                "terminated": self.terminated, "truncated": self.truncated, "info": self.info}


class Environment(ABC):
    """A live episode of one registered environment, in some runtime."""

    spec: "ToolEnvSpec"

    @abstractmethod
    def reset(self, task: "str | int | Task | None" = None, *, seed: int | None = None) -> list[Message]:
        """Start an episode; return the opening messages (system, then user) of the agent
        who moves first (the sole agent; a team's first).

        Args:
            task: A task id, index or :class:`Task`. ``None`` picks one from
                ``seed`` (deterministically), or at random when ``seed`` is ``None``.
            seed: Seeds the task choice when ``task`` is ``None``.
        """

    @abstractmethod
    def step(self, action: Any) -> StepResult:
        """Play the sole agent's assistant turn. Never raises on model output.

        Raises:
            EpisodeError: no episode is running (call :meth:`reset`), or this is a team.
            envfactory.parsing.ActionTypeError: ``action`` is of no accepted type.
        """

    @abstractmethod
    def fork(self) -> "Environment":
        """An independent copy of this live episode: same messages, same state;
        later actions on either copy do not affect the other."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """The whole episode as JSON-serializable data, for :meth:`restore`."""

    @abstractmethod
    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue exactly from ``snapshot`` (taken from an environment of the same spec)."""

    @property
    @abstractmethod
    def messages(self) -> list[Message]:
        """The sole agent's episode so far, as OpenAI-style messages (a team raises)."""

    @property
    @abstractmethod
    def state(self) -> "State":
        """The current world state (for a remote runtime, a copy fetched from it)."""

    @property
    @abstractmethod
    def task(self) -> "Task | None":
        """The task of the running episode."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """Whether the episode has ended."""

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of the tools the agent may call."""
        return self.spec.tool_schemas()

    def close(self) -> None:
        """Release resources (containers, sessions). Idempotent."""

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
