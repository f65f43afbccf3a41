"""The Docker runtime: a world served from a hardened container.

``envfactory.make(name, runtime="docker")`` is an :class:`~envfactory.episode.Episode`
(the referee, on this host) over a :class:`ContainerWorld`, for one agent or a
team alike. The container (:mod:`envfactory.serve`) holds the state and runs
the tool calls the referee has already parsed and allowed, a batch per step;
it never sees an action, a turn count or a reward.

What the host checks: every reply has the right shape (one outcome per call,
each ``{"content": str, "ok": bool, "kind": ...}`` with a kind a tool can
produce), and every state it uses (for the reward, the mail of a team, a
snapshot) is validated into the environment's state type here. A reply that
breaks the protocol is a container fault: :class:`ContainerError`, and the
container is removed.

What the host sends: a call whose arguments cannot be encoded as JSON (a set,
an object, a cycle, an int over the conversion limit, or too large for a frame)
is that call's ``invalid_arguments`` outcome, and the other calls of the batch
run (in order, in as many requests as the frame cap needs); it is never a
container fault.

Faults: a container that dies raises :class:`ContainerError` naming the
environment, the session and the container, which is removed (the pool
replaces it); a batch that overruns ``step_timeout`` raises
:class:`~envfactory.world.WorldTimeout` (the container is recycled), and the
referee ends the episode as truncated with an error observation.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from ..definition import ToolEnvSpec
from ..env import EpisodeError
from ..state import State, copy_state
from ..task import Task, ToolCall
from ..tooling import ToolOutcome
from ..world import World, WorldTimeout
from .container import Container, ContainerError, Limits
from .docker_session import SessionLink
from .pool import Pool, get_pool, in_background
from . import wire
from .wire import FrameEncodeError, encode_frame

__all__ = ["ContainerWorld", "ContainerError", "Limits"]

_KINDS = frozenset(("ok", "invalid_arguments", "tool_error", "exception"))  # what Tool.invoke produces


def _unsendable(call: ToolCall, exc: Exception) -> ToolOutcome:
    return ToolOutcome(f"Error: invalid arguments for tool '{call.name}': they cannot be sent as JSON ({exc}).",
                       False, "invalid_arguments")


def _close_dropped(link: SessionLink) -> None:
    if link.container is not None:
        in_background(link.drop)


class ContainerWorld(World):
    """The state of one episode, in a container (see the module docstring).

    Args:
        spec: The environment definition.
        step_timeout: Seconds one batch of calls (or any request) may take
            before the container is recycled.
        pool: The container pool (default: the process-wide pool of ``spec``).
        image: Image tag to use instead of the content-hashed build.
        **pool_options: ``warm``, ``sessions_per_container``, ``limits``
            (a :class:`~envfactory.runtime.container.Limits`), used when the
            process-wide pool is created.
    """

    def __init__(self, spec: ToolEnvSpec, *, step_timeout: float = 30.0, pool: Pool | None = None,
                 image: str | None = None, **pool_options: Any) -> None:
        self.spec = spec
        self.step_timeout = step_timeout
        self.pool = pool or get_pool(spec, image, **pool_options)
        self._link = SessionLink(self.pool, spec.name, step_timeout)
        # Dropped without close(): its session is closed (its container, if its own, removed)
        # when the world is collected, on a background worker, never on the collecting thread.
        # At interpreter exit the pools remove everything at once instead.
        weakref.finalize(self, _close_dropped, self._link).atexit = False
        # A team's referee reads the mail every turn, and a ``terminal`` rule the
        # state after every turn: then each reply carries the state, else it is
        # fetched when asked for (at the end of an episode).
        self._with_state = spec.multi_agent or spec.terminal is not None
        self._validate = spec.state_type.model_validate
        self._task: Task | None = None
        self._state: State | None = None  # the last state fetched and validated; None when stale

    # -- the World interface ----------------------------------------------
    def start(self, task: Task) -> None:
        self._check_registered(task)
        self._state = None
        req: dict[str, Any] = {"op": "start", "task": task.id}
        if self._with_state:
            req["state"] = True
        reply = self._link.request_with_retry(req)
        self._task = task
        if self._with_state:
            self._state = self._checked_state(reply)

    def run(self, agent: str, round: int, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        return self._run(agent, round, calls, True)

    def _run(self, agent: str, round: int, calls: Sequence[ToolCall], split: bool) -> list[ToolOutcome]:
        req = {"op": "run", "agent": agent, "round": round,
               "calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}
        if self._with_state:
            req["state"] = True
        try:
            reply = self._link.request(req, overrun=WorldTimeout)
        except FrameEncodeError as exc:  # nothing was sent: find the calls at fault
            if split:
                return self._run_encodable(agent, round, calls)
            return [_unsendable(c, exc) for c in calls]
        except WorldTimeout:
            # The world is gone; what the referee still shows (a team's mail) comes
            # from the last state seen here, before this batch.
            raise
        except BaseException:
            self._state = None
            raise
        self._state = None
        outs = reply.get("outcomes")
        if outs.__class__ is not list or len(outs) != len(calls):
            raise self._link.untrustworthy(
                f"{len(outs) if isinstance(outs, list) else 'no'} outcomes for {len(calls)} calls")
        result = []
        for o in outs:
            try:
                content, ok, kind = o["content"], o["ok"], o["kind"]
            except (TypeError, KeyError):
                raise self._link.untrustworthy(f"malformed outcome {o!r}") from None
            if (content.__class__ is not str or ok.__class__ is not bool or kind.__class__ is not str
                    or kind not in _KINDS or ok != (kind == "ok")):
                raise self._link.untrustworthy(f"malformed outcome {o!r}")
            result.append(ToolOutcome(content, ok, kind))
        if self._with_state:
            self._state = self._checked_state(reply)
        return result

    def _run_encodable(self, agent: str, round: int, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        """Run a batch the wire could not carry whole: a call whose arguments cannot be
        encoded is its own ``invalid_arguments`` outcome; the others run in order, in
        requests that stay under the frame cap."""
        limit = wire.MAX_FRAME // 2  # room for the request around the calls
        result: list[ToolOutcome | None] = []
        chunk: list[ToolCall] = []
        where: list[int] = []
        size = 0
        pending: list[tuple[list[ToolCall], list[int]]] = []
        for c in calls:
            try:
                n = len(encode_frame({"name": c.name, "arguments": c.arguments}))
                if n > limit:
                    raise FrameEncodeError(f"{n} bytes of arguments, over the {limit}-byte limit of one call")
            except FrameEncodeError as exc:
                result.append(_unsendable(c, exc))
                continue
            if chunk and size + n > limit:
                pending.append((chunk, where))
                chunk, where, size = [], [], 0
            chunk.append(c)
            where.append(len(result))
            size += n
            result.append(None)
        if chunk:
            pending.append((chunk, where))
        for chunk, where in pending:
            for i, out in zip(where, self._run(agent, round, chunk, False)):
                result[i] = out
        return result  # type: ignore[return-value]

    def state(self) -> State:
        """The current state, fetched from the container and validated here (cached until
        the next call). After a timeout: the last state seen, before the batch that overran."""
        if self._state is None:
            if self._task is None:
                raise EpisodeError(f"{self.spec.name}: no state before reset()")
            self._state = self._checked_state(self._link.request({"op": "state"}))
        return self._state

    def fork(self) -> "ContainerWorld":
        """A new session in the same container when it is shared and has room, else
        a session elsewhere (a container of its own) that loads this state."""
        if self._task is None or self._link.container is None:
            raise EpisodeError(f"{self.spec.name}: nothing to fork (no live session); call reset() first")
        child = ContainerWorld(self.spec, step_timeout=self.step_timeout, pool=self.pool)
        if self._link.fork_into(child._link):
            child._task = self._task
            child._state = None if self._state is None else copy_state(self._state)
        else:
            child.load(self._task, self.dump())
        return child

    def dump(self) -> Any:
        return self.state().model_dump(mode="json")

    def load(self, task: Task, state: Any) -> None:
        self._check_registered(task)
        checked = self._validate(state)  # a ValidationError (ValueError) before anything moves
        self._state = None
        self._link.request_with_retry({"op": "load", "task": task.id, "state": checked.model_dump(mode="json")})
        self._task, self._state = task, checked

    def close(self) -> None:
        self._link.drop()
        self._state = None

    # -- helpers ---------------------------------------------------------------
    def _check_registered(self, task: Task) -> None:
        """The container builds tasks from the registered definition: only those can run there."""
        try:
            registered = self.spec.task(task.id)
        except KeyError:
            registered = None
        if registered is not task:
            raise ValueError(f"{self.spec.name}: the docker runtime runs registered tasks only; "
                             f"task {task.id!r} is not one of them (register it in the ToolEnvSpec)")

    def _checked_state(self, reply: dict[str, Any]) -> State:
        try:
            return self._validate(reply["state"])
        except (KeyError, ValueError, TypeError, RecursionError) as exc:
            raise self._link.untrustworthy(f"its state is not a valid {self.spec.state_type.__name__} "
                                           f"({type(exc).__name__}: {str(exc)[:300]})") from None

    # -- views -------------------------------------------------------------------
    @property
    def container(self) -> Container | None:
        """The container serving the current session (``None`` before ``start`` and after a fault)."""
        return self._link.container

    @property
    def session(self) -> str | None:
        """The server's id of the current session."""
        return self._link.session

    def __repr__(self) -> str:
        tid = self._task.id if self._task else None
        return f"<ContainerWorld {self.spec.name} task={tid} {self._link.container!r}>"
