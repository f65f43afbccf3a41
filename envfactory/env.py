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
   ``step_round({agent: action})`` (simultaneous moves) instead; ``step`` on a
   team raises :class:`EpisodeError` naming them.
3. The episode terminates when the agent answers without calling a tool (or
   calls ``finish``); it is truncated after ``max_turns`` assistant turns.
   ``reward`` is 0 until the end, then 1.0 if the task succeeded, judged from
   the true final state, never from the agent's claims.

Every blocking call has an awaitable twin for asyncio code under the episode's ``aio``
(:class:`~envfactory.episode.AsyncEpisode`: ``await episode.aio.step(action)``): the same
call, run on a bounded thread pool shared by the process (:func:`async_executor`), so many
episodes are in flight on one event loop and a slow tool holds only its own episode. Each
returns or raises exactly what its blocking twin does (a world that fails or overruns is an
error observation, never an exception). One episode takes one call at a time: a second async
call on it while one is running raises :class:`EpisodeError`. Cancelling the awaiting task
does not undo a call already running: the episode ends up as that call leaves it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from .definition import ToolEnvSpec
    from .state import State
    from .task import Task

__all__ = ["Environment", "StepResult", "EpisodeError", "SnapshotError", "Message", "async_executor"]

Message = dict[str, Any]
T = TypeVar("T")

ASYNC_THREADS = 64  # default size of the async methods' thread pool (ENVFACTORY_ASYNC_THREADS)
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
_in_flight: set[int] = set()  # id() of every environment with an async call running


def async_executor() -> ThreadPoolExecutor:
    """The process-wide pool the async methods run their blocking calls on: at most
    ``ENVFACTORY_ASYNC_THREADS`` (default 64) calls run at once; more wait for a thread.

    A thread, not a native non-blocking path: a container step is one framed request on a
    Unix socket, but around it sit the pool's locks, the container's death and resumption
    (journal replay) and the deadline; run in a thread, all of that stays the one code path
    the blocking API uses, and a thread blocked on its socket (or a sleeping tool) releases
    the GIL, so the steps really overlap."""
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                n = int(os.environ.get("ENVFACTORY_ASYNC_THREADS") or ASYNC_THREADS)
                if n < 1:
                    raise ValueError(f"ENVFACTORY_ASYNC_THREADS must be at least 1, got {n}")
                _executor = ThreadPoolExecutor(n, thread_name_prefix="envfactory-async")
    return _executor


async def _offload(env: object, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on :func:`async_executor` (with the caller's context variables),
    awaited; one call per environment at a time."""
    key = id(env)
    if key in _in_flight:
        what = getattr(getattr(env, "spec", None), "name", type(env).__name__)
        raise EpisodeError(f"{what}: another async call on this episode is still running; "
                           "await it before the next (one episode plays one turn at a time)")
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    _in_flight.add(key)
    try:
        done = async_executor().submit(functools.partial(ctx.run, fn, *args, **kwargs))
    except BaseException:
        _in_flight.discard(key)
        raise
    # released when the call itself ends (not when its awaiter is cancelled): a cancelled
    # astep must not let the next call run beside the one still running
    done.add_done_callback(lambda _: _in_flight.discard(key))
    return await asyncio.wrap_future(done, loop=loop)


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

    @abstractmethod
    def transcript(self, agent: str | None = None) -> list[Message]:
        """``agent``'s episode so far, as OpenAI-style messages (``None``: the sole agent; a
        team must say which agent)."""

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
