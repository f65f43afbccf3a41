"""Worlds: where an episode's state lives and its tool calls run.

The referee (:class:`~envfactory.episode.Episode`, always on the host) owns the
rules: turns, rounds, permissions, the end of an episode and the reward. A
:class:`World` owns the state: it starts it from a task, runs tool calls that
the referee has already parsed and allowed, and forks, dumps and loads it. It
never sees the rules, so nothing is judged twice and a world in a container
cannot award itself anything.

Two worlds ship: :class:`LocalWorld` (in-process, the fast path) and the
container world of the Docker runtime
(:class:`envfactory.runtime.docker.ContainerWorld`). Look runtimes up by name
with :func:`envfactory.registry.make`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Sequence, cast

from . import quotas
from .mail import MultiState
from .state import State, copy_state
from .task import Task, ToolCall
from .tooling import ToolOutcome

if TYPE_CHECKING:
    from .definition import ToolEnvSpec

__all__ = ["World", "LocalWorld", "RunBatch", "WorldGone", "WorldLost", "WorldTimeout"]


class WorldGone(RuntimeError):
    """The world cannot go on: the referee ends the episode as truncated, with the
    message as the error observation of the calls it did not run (nothing is judged)."""


class WorldTimeout(WorldGone, TimeoutError):
    """A batch of tool calls overran the world's deadline; the world is gone
    (``info["timeout"]``, ``ended_by == "timeout"``)."""


class WorldLost(WorldGone):
    """The world's host was lost (its container or engine died) and it could not be
    resumed elsewhere (``info["world_lost"]``, ``ended_by == "world_lost"``)."""


class World(ABC):
    """The state of one episode and the tools that act on it."""

    spec: "ToolEnvSpec"

    @abstractmethod
    def start(self, task: Task) -> None:
        """Set the state to a fresh copy of ``task``'s start state."""

    @abstractmethod
    def run(self, agent: str, round: int, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        """Run ``calls`` (already parsed and allowed for ``agent``) in order; one outcome each.

        Raises:
            WorldTimeout: the batch overran the deadline (the world is then unusable).
        """

    @abstractmethod
    def state(self) -> State:
        """The current state (for a remote world, a validated copy)."""

    @abstractmethod
    def fork(self) -> "World":
        """An independent world with an equal state."""

    @abstractmethod
    def dump(self) -> Any:
        """The state as JSON data (for snapshots)."""

    @abstractmethod
    def load(self, task: Task, state: Any) -> None:
        """Continue from a dumped state of an episode of ``task``."""

    def close(self) -> None:
        """Release what the world holds (containers, sessions). Idempotent."""

    # -- a batch in two halves (for step_many: many worlds' batches in flight together) ---------
    def run_begin(self, agent: str, round: int, calls: Sequence[ToolCall], batch: RunBatch | None = None) -> Any:
        """Send ``calls`` to a remote world and return what :meth:`run_end` needs; ``None`` when this
        world does not split a batch (in-process worlds) or not this one: then call :meth:`run`.
        ``batch``: the turns begun together; a world may stage its calls there instead of sending
        them, to go out with others over a shared channel at :meth:`RunBatch.send`. Raises what
        :meth:`run` raises for a batch that never got under way."""
        return None

    def run_wait(self, pending: Any) -> tuple[Any, float]:
        """``(what to wait on, the monotonic deadline after which :meth:`run_end` raises the timeout)``:
        a file descriptor that is readable once the outcomes are in, or a shared channel (an object
        with ``fileno()``, readable once some reply is in, and ``pump()``, which reads what is in
        and returns the pending turns now answered)."""
        raise NotImplementedError

    def run_end(self, pending: Any, ready: bool = False) -> list[ToolOutcome]:
        """The outcomes of a batch :meth:`run_begin` sent: what :meth:`run` would have returned
        (or raised). Call it once for each ``run_begin``, before anything else on this world;
        ``ready``: its :meth:`run_wait` descriptor was seen readable (the read will not wait), or
        its shared channel's ``pump`` returned it."""
        raise NotImplementedError


class RunBatch:
    """The turns :func:`envfactory.step_many` begins together. A world whose calls go over a
    channel shared with other worlds (the Docker runtime's batch channel, one per container)
    stages them on that channel, which it holds for this batch (``hold``); :meth:`send` sends
    every channel's staged turns, :meth:`release` lets the channels go once every turn is read."""

    def __init__(self) -> None:
        self._held: dict[int, Any] = {}

    def holds(self, channel: Any) -> bool:
        return id(channel) in self._held

    def hold(self, channel: Any) -> None:
        self._held[id(channel)] = channel

    def send(self) -> None:
        for channel in self._held.values():
            channel.send()

    def release(self) -> None:
        held, self._held = self._held, {}
        for channel in held.values():
            channel.release()


class LocalWorld(World):
    """The state in this process; tool calls are function calls."""

    def __init__(self, spec: "ToolEnvSpec") -> None:
        self.spec = spec
        self._state: State | None = None
        self._tools = spec.all_tools
        self._team = spec.multi_agent

    def start(self, task: Task) -> None:
        self._state = self.spec.start_state(task)
        if not self._team:  # (a team's state is copied before each writing call instead)
            quotas.track(self._state, task.initial_state)

    def run(self, agent: str, round: int, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        """Run ``calls`` in order within the session's quotas (:mod:`envfactory.quotas`): a call
        that would take the state past ``MAX_STATE_BYTES`` is its error and leaves the state as it
        was; the batch's observations are cut at ``MAX_OBSERVATION_CHARS``."""
        state, tools = self.state(), self._tools
        if self._team:
            team = cast(MultiState, state)  # a team's state is a MultiState
            team.acting, team.round = agent, round
        outs = []
        try:
            for c in calls:
                out, state = quotas.invoke_within_quota(tools[c.name], state, c.arguments)
                outs.append(out)
        finally:
            self._state = state
            if self._team:
                cast(MultiState, state).acting = ""
        return quotas.cut_outcomes(outs, quotas.MAX_OBSERVATION_CHARS)[0]

    def state(self) -> State:
        if self._state is None:
            raise RuntimeError(f"{self.spec.name}: the world has no state yet; start(task) first")
        return self._state

    def fork(self) -> "LocalWorld":
        new = LocalWorld.__new__(LocalWorld)
        new.spec, new._tools, new._team = self.spec, self._tools, self._team
        parent = self.state()
        new._state = copy_state(parent)
        if not self._team:
            quotas.track_fork(new._state, parent)
        return new

    def dump(self) -> Any:
        return self.state().model_dump(mode="json")

    def load(self, task: Task, state: Any) -> None:
        self._state = self.spec.state_type.model_validate(state)
        if not self._team:
            quotas.track(self._state)
