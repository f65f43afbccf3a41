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

import json
import json.encoder
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Sequence, cast

from pydantic import BaseModel

from . import quotas
from .mail import MultiState
from .state import State, class_hook, copy_state
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

    def view(self) -> State:
        """The current state, to read and never to change (the referee's checks): :meth:`state`
        unless a world can give it without a copy (:class:`LocalWorld`)."""
        return self.state()

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


_OWN_COPY: dict[type, bool] = {}  # state class -> whether it brings its own (copy-on-write) copier


def _copies_itself(cls: type) -> bool:
    own = _OWN_COPY.get(cls)
    if own is None:
        own = _OWN_COPY[cls] = class_hook(cls, "__state_copy__") is not None
    return own


class _Shared:
    """The box of a state that several :class:`LocalWorld` s hold since a fork: the ``id`` of each
    holder (``set.add``/``set.discard`` are atomic, so threads stepping the holders lose no
    update; a world not in the set, a shallow copy of a holder, is taken for one more holder).
    A copied or pickled box is a box of unknown holders: every one of them copies."""

    __slots__ = ("holders",)

    def __init__(self, holders: set[int]) -> None:
        self.holders = holders

    def __reduce__(self) -> tuple[Any, ...]:
        return _Shared, ({-1, -2},)  # (never an id: nobody is ever its last holder)


class LocalWorld(World):
    """The state in this process; tool calls are function calls.

    A fork is copy-on-write at the state's granularity: the child holds the parent's state object,
    both in one :class:`_Shared` box, and the first call that may write (a tool not ``read_only``,
    any call of a team, a caller given the state by :meth:`state`) on either side copies the state
    for that side first (:meth:`_own`), which leaves the box; the last holder writes in place.
    Reads (read-only tools, the referee's judgment and checks, :meth:`view`, :meth:`dump`,
    snapshots, hashes) never copy. A state given to a caller by :meth:`state` may be changed by them
    at any time, so a fork of it copies at once (as every fork did before), for the child."""

    def __init__(self, spec: "ToolEnvSpec") -> None:
        self.spec = spec
        self._state: State | None = None
        self._tools = spec.all_tools
        self._team = spec.multi_agent
        self._box: _Shared | None = None  # set while the state is shared with forks
        self._handed = 0  # id() of the state last given to a caller by state() (0: none)

    _lazy_fork: ClassVar[bool] = True  # whether fork() shares the state (see the class)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # a subclass (an MCP server's world, whose reads are told apart by name) forks by a copy,
        # as before, unless it says otherwise; one with its own state() is read through it
        super().__init_subclass__(**kwargs)
        if "_lazy_fork" not in cls.__dict__:
            cls._lazy_fork = False
        if cls.state is not LocalWorld.state and cls.view is LocalWorld.view:
            cls.view = World.view  # type: ignore[method-assign]

    def start(self, task: Task) -> None:
        if self._box is not None:
            self._leave()
        self._state = self.spec.start_state(task)
        if not self._team:  # (a team's state is copied before each writing call instead)
            quotas.track(self._state, task.initial_state)

    def run(self, agent: str, round: int, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        """Run ``calls`` in order within the session's quotas (:mod:`envfactory.quotas`): a call
        that would take the state past ``MAX_STATE_BYTES`` is its error and leaves the state as it
        was; the batch's observations are cut at ``MAX_OBSERVATION_CHARS``."""
        state, tools = self.view(), self._tools
        if self._team:
            if self._box is not None:  # (every batch of a team writes who is acting)
                state = self._own()
            team = cast(MultiState, state)  # a team's state is a MultiState
            team.acting, team.round = agent, round
        outs = []
        try:
            for c in calls:
                t = tools[c.name]
                if self._box is not None and not t.read_only:
                    state = self._own()
                out, state = quotas.invoke_within_quota(t, state, c.arguments)
                outs.append(out)
        finally:
            self._state = state
            if self._team:
                cast(MultiState, state).acting = ""
        return quotas.cut_outcomes(outs, quotas.MAX_OBSERVATION_CHARS)[0]

    def state(self) -> State:
        """The current state, the world's own object: a caller may change it (so a state shared
        with a fork is copied for this world first, and a later fork copies it at once)."""
        s = self._state
        if s is None:
            raise RuntimeError(f"{self.spec.name}: the world has no state yet; start(task) first")
        if self._box is not None:
            s = self._own()
        self._handed = id(s)
        return s

    def view(self) -> State:
        """The current state to read, never to change (it may be shared with forks): no copy."""
        s = self._state
        if s is None:
            raise RuntimeError(f"{self.spec.name}: the world has no state yet; start(task) first")
        return s

    def fork(self) -> "LocalWorld":
        """O(1) in the state: the child shares the state until either side writes (see the class)."""
        parent = self.view()
        new = LocalWorld.__new__(LocalWorld)
        new.spec, new._tools, new._team, new._handed = self.spec, self._tools, self._team, 0
        # copied now: a state a caller holds (they may change it), one with its own copier (a
        # copy-on-write class's copy is cheap already, and its read-only calls may record results),
        # or a subclass's (see _lazy_fork)
        if self._handed == id(parent) or not self._lazy_fork or _copies_itself(parent.__class__):
            new._state, new._box = copy_state(parent), None
            if not self._team:
                quotas.track_fork(new._state, parent)
            return new
        box = self._box
        if box is None:
            box = self._box = _Shared({id(self), id(new)})
        else:
            box.holders.add(id(new))
        new._state, new._box = parent, box
        return new

    def _own(self) -> State:
        """Make the shared state this world's own before a write: a copy while another world holds
        it too (its undo journal follows: :func:`~envfactory.quotas.track_fork`), the state itself
        for the last holder. Leaves the box."""
        box, shared, me = self._box, self._state, id(self)
        assert box is not None and shared is not None
        holders = box.holders
        if len(holders) > 1 or me not in holders:
            mine = copy_state(shared)  # (copied before this world leaves: no other holder writes meanwhile)
            if not self._team:
                quotas.track_fork(mine, shared)
            self._state = mine
        self._box = None
        holders.discard(me)
        return self._state  # type: ignore[return-value]

    def _leave(self) -> None:
        """Give up a shared state without copying it (the state is replaced, or the world closed)."""
        box, self._box = self._box, None
        if box is not None:
            box.holders.discard(id(self))

    def __del__(self) -> None:  # a dropped fork lets the others' last holder write in place
        box = self.__dict__.get("_box")
        if box is not None:
            box.holders.discard(id(self))

    def dump(self) -> Any:
        return self.view().model_dump(mode="json")

    def dump_json(self) -> bytes | None:
        """:meth:`dump`'s JSON, written straight from the state, with no Python copy of it first: by
        pydantic, or where it cannot (a lone surrogate) by Python's encoder over the state's own
        containers (plain models as their fields); ``None`` where neither writes what :meth:`dump`
        would (a class with its own serializer, a set, a datetime, an infinity...: then
        :meth:`dump`). A state of many small containers shared many times is within the quota as
        JSON yet many times that as Python objects: one of 24 MiB took 511 MiB to :meth:`dump` (issue 63: the container that
        answered with it was OOM-killed and its bystanders resumed); this takes about its size."""
        s = self.view()
        deco = type(s).__pydantic_decorators__
        if deco.model_serializers or deco.field_serializers:
            return None
        try:
            raw = type(s).__pydantic_serializer__.to_json(s)
            if b"\xef\xbf\xbd" not in raw:  # (U+FFFD: maybe a lone surrogate pydantic replaced in a key)
                return raw
        except Exception:  # noqa: BLE001 - PydanticSerializationError: a lone surrogate, which UTF-8 cannot hold
            pass
        if _ENCODE is None:  # (no C accelerator)
            return None
        try:  # Python's encoder over the state itself, surrogates passed through as the wire does
            return "".join(_ENCODE(s, 0)).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError, RecursionError):  # a value beyond plain JSON and plain models
            return None

    def load(self, task: Task, state: Any) -> None:
        new = self.spec.state_type.model_validate(state)
        if self._box is not None:
            self._leave()
        self._state = new
        if not self._team:
            quotas.track(self._state)


_PLAIN: dict[type, bool] = {}


def _plain(cls: type) -> bool:
    """Whether a model class dumps (``model_dump(mode="json")``) as its ``__dict__``: no serializer,
    computed field, excluded field, extra fields or dump by alias of its own."""
    known = _PLAIN.get(cls)
    if known is None:
        deco = cls.__pydantic_decorators__  # type: ignore[attr-defined]
        known = _PLAIN[cls] = not (deco.model_serializers or deco.field_serializers or deco.computed_fields
                                   or any(f.exclude for f in cls.model_fields.values())  # type: ignore[attr-defined]
                                   or cls.model_config.get("extra") == "allow"  # type: ignore[attr-defined]
                                   or cls.model_config.get("serialize_by_alias"))  # type: ignore[attr-defined]
    return known


def _fields(o: Any) -> Any:
    """The JSON encoder's hook: a plain model is its fields; anything else is not plain JSON."""
    if isinstance(o, BaseModel) and _plain(type(o)):
        return o.__dict__
    raise TypeError(f"{type(o).__name__} is not plain JSON")


# (no table of containers: a shared one is written at each place, as a dump does; a cycle is a
# RecursionError; NaN and infinities are refused, as model_dump(mode="json") writes them as null)
_MAKE = getattr(json.encoder, "c_make_encoder", None)
_ENCODE = None if _MAKE is None else _MAKE(None, _fields, json.encoder.encode_basestring, None, ":", ",",
                                           False, False, False)
