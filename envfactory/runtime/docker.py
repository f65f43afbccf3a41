"""The Docker runtime: a world served from a hardened container.

``envfactory.make(name, runtime="docker")`` is an :class:`~envfactory.episode.Episode`
(the referee, on this host) over a :class:`ContainerWorld`, for one agent or a
team alike. The container (:mod:`envfactory.runtime.serve`) holds the state and runs
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

A world that runs agent code (``isolation="container"``: one container per session) is
**snapshotted at every step boundary** instead of journaled: agent code need not be
deterministic, and the files it writes are not in the state. Each ``run`` reply carries the
state and a tar.gz of the container's work folder, ``/tmp`` (its only writable folder but
``/dev/shm``, which is not carried): folders, regular files, symbolic and hard links, with
modes and times (fifos and sockets hold no data and are left out), or "unchanged" when no
entry's name, inode, size, mtime or ctime changed since the last archive (one round trip;
a folder changed within the last 0.1 s, where a coarse file clock could hide a rewrite, is
archived again). The archive is capped at ``Limits.work_archive_mb`` (default 8 MiB,
compressed; 24 MiB at most, half a reply frame); a new episode (``start``) starts with an
empty folder. Resuming such a world is: a fresh container, the last snapshot loaded there
(state and files), and the lost batch re-sent once; nothing is replayed. :meth:`ContainerWorld.fork`
gives the fork the parent's files (in a container of its own: later writes on either side stay
there), and :meth:`~ContainerWorld.dump_with_files` holds them (``{"state": ..., WORK_FILES:
...}`` when the folder is not empty, else the plain state), which :meth:`~ContainerWorld.load`
takes back (``dump()`` stays the plain state: the referee and the Ray runtime read it as the
state, so ``Episode.snapshot`` does not carry the files); so does a world with ``resume=False``,
whose snapshot is then taken when asked for. A folder over the cap is never dropped silently:
the world cannot be resumed while it is over (a resume then ends the episode as lost, the
message naming the cap), and ``fork`` and ``dump_with_files`` raise
:class:`~envfactory.env.EpisodeError` naming it; once a later step's folder fits again, all
three work again. Cost (``python -m benchmarks.docker_runtime snapshots``): a
step that leaves the folder unchanged, about 50 us; one that rewrote it, the archive (zlib level
1: about 1 ms per MiB of text, 16 ms per MiB of incompressible data, plus about 3 ms per MiB sent).

Faults: a container that dies mid-episode (killed, crashed, its channel reset or
closed) is removed, and the world is **resumed** on a fresh session from the
pool, once per failed request: the world keeps its origin (the task, or the
last state loaded or snapshotted) and a journal of every batch of calls sent
since (a world that runs agent code: its last step boundary's snapshot, files
included, and no journal, see above), starts (or loads) the origin there, replays the journal (checking that
every replayed batch gives the outcomes it gave the first time: tools are
deterministic given the state, whose RNG lives in the state), and re-sends the
request that failed. A batch whose reply was lost died with its container's
state, so replaying the journal (which does not hold it) and re-sending it runs
it exactly once. The journal is bounded: every :data:`SNAPSHOT_EVERY` batches the
world's state is fetched and becomes the new origin. Resumes are counted
(``world.resumed``, :func:`stats`) and logged. When the resume fails too (or is
turned off: ``resume=False``), or the second attempt dies again, the request
raises :class:`~envfactory.runtime.container.ContainerLost` naming the environment,
the session and the container, which is removed (the pool replaces it); raised
from a step, the referee ends the episode as truncated with that message as the
error observation (``info["world_lost"]``, ``ended_by == "world_lost"``), so a lost
container or engine never hangs a rollout or crashes a training run. A reply that breaks the
protocol is never resumed (the container is untrustworthy: :class:`ContainerError`);
a batch that overruns ``step_timeout`` raises
:class:`~envfactory.world.WorldTimeout`, and the referee ends the episode as truncated with
an error observation. Only that session fails: in a shared container the server abandons
its call (:meth:`~envfactory.runtime.docker_session.SessionLink.abandon`) and the container
and its other sessions go on; a container of the session's own is removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
import weakref
from typing import Any, Sequence

from pydantic import ValidationError

from ..definition import ToolEnvSpec
from ..env import EpisodeError
from ..state import State, copy_state
from ..task import Task, ToolCall
from ..tooling import ToolOutcome
from ..world import RunBatch, World, WorldTimeout
from .container import Container, ContainerError, ContainerLost, Limits
from .docker_session import ContainerDied, SessionLink
from .pool import Pool, get_pool, in_background
from . import wire
from .batch import Staged
from .wire import FrameEncodeError, FrameError, encode_frame, state_json

__all__ = ["ContainerWorld", "ContainerError", "ContainerLost", "ContainerDied", "Limits", "SNAPSHOT_EVERY",
           "WORK_FILES", "stats"]

log = logging.getLogger(__name__)

SNAPSHOT_EVERY = 64
"""Batches journaled before the world's state is snapshotted and the journal restarted from it."""
SNAPSHOT_BYTES = 8 << 20
"""Bytes of journaled requests (their frames) past which the state is snapshotted too."""
WORK_FILES = "_envf_work_files"
"""The key of a work folder's archive in :meth:`ContainerWorld.dump_with_files` (no state field can
start with ``_``)."""

_stats = {"resumed": 0, "resume_failed": 0, "replayed_batches": 0, "snapshots": 0}
_stats_lock = threading.Lock()


def stats() -> dict[str, int]:
    """This process's resume counters (every ContainerWorld): ``resumed`` (worlds rebuilt
    after their container died), ``resume_failed``, ``replayed_batches``, ``snapshots``."""
    with _stats_lock:
        return dict(_stats)


def _count(key: str, n: int = 1) -> None:
    with _stats_lock:
        _stats[key] += n


def _digest(outcomes: Any) -> bytes:
    """A batch's outcomes, as the server sent them (any JSON value), hashed for the journal: a
    replay must give the same. ``repr`` of the decoded value (a third of ``json.dumps``'s cost on
    every step): the same server build writes the same keys in the same order, and only the same
    build (the pool's image) replays a journal."""
    return hashlib.blake2b(repr(outcomes).encode("utf-8", "surrogatepass"), digest_size=16).digest()


SHORT_OUTCOMES = 1024
"""Characters of a batch's observations (all of them, with their kinds) up to which the journal keeps
them as they are, compared as they are on a replay, instead of their digest (hashing them was a fifth
of the host's share of a Docker step)."""


def _record(outs: Any) -> Any:
    """What the journal keeps of a batch's outcomes (the ``outcomes`` of the server's reply, decoded),
    for a replay to be checked against: short ones as they are, a tuple of ``(content, ok, kind)``
    (each outcome an object of exactly those three keys, of exactly those types), anything else its
    :func:`_digest`. Two replies' records are equal exactly when their outcomes are (the same function
    decides which form both take; a tuple never equals a digest)."""
    if outs.__class__ is list:
        rec = []
        size = 0
        for o in outs:
            if o.__class__ is not dict or len(o) != 3:
                break
            content, ok, kind = o.get("content"), o.get("ok"), o.get("kind")
            if content.__class__ is not str or ok.__class__ is not bool or kind.__class__ is not str:
                break
            size += len(content) + len(kind)
            if size > SHORT_OUTCOMES:
                break
            rec.append((content, ok, kind))
        else:
            return tuple(rec)
    return _digest(outs)


_KINDS = frozenset(("ok", "invalid_arguments", "tool_error", "exception", "quota"))  # Tool.invoke, quotas


def _unsendable(call: ToolCall, exc: Exception) -> ToolOutcome:
    return ToolOutcome(f"Error: invalid arguments for tool '{call.name}': they cannot be sent as JSON ({exc}).",
                       False, "invalid_arguments")


def _faithful(v: Any) -> bool:
    """Whether JSON carries ``v`` unchanged: strings, numbers, booleans, ``None``, lists and
    dicts with string keys (a tuple would arrive a list, an int key a string)."""
    c = v.__class__
    if c is str or c is int or c is float or c is bool or v is None:
        return True
    if c is dict:
        for k, x in v.items():
            if k.__class__ is not str or not _faithful(x):
                return False
        return True
    if c is list:
        for x in v:
            if not _faithful(x):
                return False
        return True
    return False


def _carried(v: Any) -> bool:
    try:
        return _faithful(v)
    except RecursionError:
        return False


def _close_dropped(link: SessionLink) -> None:
    if link.container is not None:
        in_background(link.drop)


class ContainerWorld(World):
    """The state of one episode, in a container (see the module docstring).

    Args:
        spec: The environment definition.
        step_timeout: Seconds one batch of calls (or any request) may take
            before the session is abandoned (see the module docstring).
        pool: The container pool (default: the process-wide pool of ``spec``).
        image: Image tag to use instead of the content-hashed build.
        resume: Rebuild the world on a fresh container when its container dies
            mid-episode (see the module docstring); ``False``: raise
            :class:`ContainerError` instead.
        **pool_options: ``warm``, ``sessions_per_container``, ``limits``
            (a :class:`~envfactory.runtime.container.Limits`), used when the
            process-wide pool is created.
    """

    def __init__(self, spec: ToolEnvSpec, *, step_timeout: float = 30.0, pool: Pool | None = None,
                 image: str | None = None, resume: bool = True, **pool_options: Any) -> None:
        self.spec = spec
        self.resume = resume
        self.resumed = 0  # times this world was rebuilt after its container died
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
        # What rebuilds the world: its origin (None: the task's start; else a state, as JSON)
        # and every batch sent since, with a digest of the outcomes it gave.
        self._origin: Any = None
        self._journal: list[tuple[dict[str, Any], Any]] = []  # (request, _record of its outcomes)
        self._journal_bytes = 0
        # Agent code (isolation="container") writes files that no journal replays faithfully:
        # such a world is snapshotted at every step boundary instead, state and work folder
        # together (one reply), and resumes from the last snapshot alone.
        self._files = spec.isolation == "container"
        self._origin_files: str | None = None  # the work folder archived with the origin (None, "": empty)
        self._unresumable: str | None = None  # why the last snapshot failed (over the cap)
        self._last_snap = False  # whether the origin is the world as of now (files included)

    # -- the World interface ----------------------------------------------
    def start(self, task: Task) -> None:
        self._check_registered(task)
        self._state = None
        req: dict[str, Any] = {"op": "start", "task": task.id}
        if self._with_state:
            req["state"] = True
        reply = self._link.request_with_retry(req)
        self._task, self._origin, self._journal, self._journal_bytes = task, None, [], 0
        self._origin_files = self._unresumable = None
        self._last_snap = True  # an empty folder
        if self._with_state:
            self._state = self._checked_state(reply)

    def run(self, agent: str, round: int, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        for c in calls:
            if not _carried(c.arguments):
                return self._run_validated(agent, round, calls)
        return self._run(agent, round, calls, True)

    def _run_validated(self, agent: str, round: int, calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        """A batch with arguments JSON would change on the way (a tuple, a key that is not a
        string, a set): each such call is validated here, as the in-process world would
        validate it, and is its own ``invalid_arguments`` outcome, or sent as its validated
        arguments (what the tool would have received), so both runtimes answer alike."""
        tools = self.spec.all_tools
        result: list[ToolOutcome | None] = []
        send: list[ToolCall] = []
        where: list[int] = []
        for c in calls:
            if not _carried(c.arguments):
                tool = tools.get(c.name)
                if tool is not None and not isinstance(c.arguments, dict):  # its error touches no state
                    result.append(tool.invoke(None, c.arguments))
                    continue
                if tool is not None:
                    try:
                        args = state_json(tool.args_model.model_validate(c.arguments))
                    except ValidationError as exc:
                        result.append(ToolOutcome(tool._describe_invalid(exc), False, "invalid_arguments"))
                        continue
                    except RecursionError as exc:
                        result.append(_unsendable(c, exc))
                        continue
                    c = dataclasses.replace(c, arguments=args)
            where.append(len(result))
            result.append(None)
            send.append(c)
        if send:
            for i, out in zip(where, self._run(agent, round, send, True)):
                result[i] = out
        return result  # type: ignore[return-value]

    def _run(self, agent: str, round: int, calls: Sequence[ToolCall], split: bool) -> list[ToolOutcome]:
        req = self._run_request(agent, round, calls)
        try:
            reply = self._request(req, overrun=WorldTimeout)
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
            self._last_snap = False
            raise
        return self._run_reply(agent, round, req, reply, calls)

    def run_begin(self, agent: str, round: int, calls: Sequence[ToolCall], batch: RunBatch | None = None) -> Any:
        """:meth:`run`'s first half (see :meth:`World.run_begin`): the batch sent on this world's
        session, or, with ``batch``, staged on its container's batch channel
        (:mod:`envfactory.runtime.batch`) when the container is shared, has one, and no other
        thread's batch holds it. ``None`` (nothing sent: :meth:`run` plays it whole) for a world
        snapshotted with its files at every step, arguments JSON would change, or a request that
        cannot be encoded; also after the container died at the send, once the world is resumed
        on a fresh one."""
        if self._files or not all(_carried(c.arguments) for c in calls):
            return None
        req = self._run_request(agent, round, calls)
        if batch is not None and self.spec.isolation == "session" and self._link.channel_fd >= 0:
            staged = self._stage(batch, req)
            if staged is not None:
                staged.turn = agent, round, calls, req
                return staged
        try:
            sent = self._link.send(req, overrun=WorldTimeout)
        except FrameEncodeError:
            return None
        except ContainerDied as exc:
            if not self.resume or self._task is None:
                self._state = None
                raise
            self._resume_after(exc)
            return None
        except WorldTimeout:
            raise
        except BaseException:
            self._state = None
            raise
        return agent, round, calls, req, sent

    def _stage(self, batch: RunBatch, req: dict[str, Any]) -> Staged | None:
        container, session = self._link.container, self._link.session
        if container is None or session is None:
            return None
        channel = container.batch_channel()
        if channel is None:
            return None
        try:
            body = wire.encode_body(req)
        except FrameEncodeError:
            return None
        return channel.stage(batch, session, body, self.step_timeout)

    def run_wait(self, pending: Any) -> tuple[Any, float]:
        if pending.__class__ is Staged:
            return pending.channel, pending.deadline
        return self._link.channel_fd, pending[4][0]

    def run_end(self, pending: Any, ready: bool = False) -> list[ToolOutcome]:
        """:meth:`run`'s second half: the reply to the batch :meth:`run_begin` sent, taken as
        :meth:`run` takes it (a container that died meanwhile: the world resumed on a fresh one
        and the batch sent again, once)."""
        sent: Any
        if pending.__class__ is Staged:
            (agent, round, calls, req), sent = pending.turn, pending
        else:
            agent, round, calls, req, sent = pending
        try:
            try:
                if sent.__class__ is Staged:
                    reply = self._staged_reply(req, sent)
                else:
                    # read later than the send: the first recv is armed for what is left of the
                    # deadline, unless the reply is known to be there (then it cannot wait)
                    reply = self._link.receive(req, (sent[0], ready), overrun=WorldTimeout)
            except ContainerDied as exc:
                if not self.resume or self._task is None:
                    raise
                self._resume_after(exc)
                reply = self._link.request(req, overrun=WorldTimeout)
        except WorldTimeout:
            raise
        except BaseException:
            self._state = None
            raise
        return self._run_reply(agent, round, req, reply, calls)

    def _staged_reply(self, req: dict[str, Any], st: Staged) -> dict[str, Any]:
        """The reply a batch channel brought for ``st``, checked as a session's channel's would be;
        what the session's channel raises for the same fault otherwise (see :mod:`~envfactory.runtime.batch`)."""
        link = self._link
        if st.reply is not None:
            link.sent_bytes = st.size
            return link.checked(st.reply)
        if st.failure is None:  # its deadline passed: abandoned, as on its own channel
            st.channel.forget(st)
            link.failed(TimeoutError("the deadline passed"), req, WorldTimeout)
        elif st.untrusted:
            raise link.untrustworthy(st.failure)
        else:  # the container is taken as dead: ContainerDied, and the world resumes
            link.failed(FrameError(st.failure), req, WorldTimeout)
        raise AssertionError("SessionLink.failed raised nothing")  # pragma: no cover

    def _run_request(self, agent: str, round: int, calls: Sequence[ToolCall]) -> dict[str, Any]:
        """A batch's request; when the journal is due for a snapshot, it asks for the state after
        the batch in the same reply (which :meth:`_run_reply` makes the new origin)."""
        req = {"op": "run", "agent": agent, "round": round,
               "calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}
        if self._with_state or self._snapshot_due():
            req["state"] = True
        if self._files:
            self._last_snap = False  # until this batch's snapshot is in
            if self.resume:
                req["snapshot"] = True
        return req

    def _run_reply(self, agent: str, round: int, req: dict[str, Any], reply: dict[str, Any],
                   calls: Sequence[ToolCall]) -> list[ToolOutcome]:
        """A batch's outcomes from its reply, checked; the state, snapshot or journal kept."""
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
        if "state" in req:
            self._state = self._checked_state(reply)
        if self._files and self.resume:
            self._take_snapshot(reply.get("snapshot"))
        elif self.resume and "state" in req and self._snapshot_due():
            # the state after this batch is the new origin (this batch is in it: not journaled)
            self._origin, self._journal, self._journal_bytes = state_json(self._state), [], 0
            _count("snapshots")
        elif self.resume:
            self._journal.append(({"op": "run", "agent": agent, "round": round, "calls": req["calls"]},
                                  _record(outs)))
            self._journal_bytes += self._link.sent_bytes
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
            self._state = self._checked_state(self._request({"op": "state"}))
        return self._state

    def fork(self) -> "ContainerWorld":
        """A new session in the same container when it is shared and has room, else
        a session elsewhere (a container of its own) that loads this state."""
        if self._task is None or self._link.container is None:
            raise EpisodeError(f"{self.spec.name}: nothing to fork (no live session); call reset() first")
        child = ContainerWorld(self.spec, step_timeout=self.step_timeout, pool=self.pool)
        child.resume = self.resume
        if self._fork_into(child):
            child._task, child._origin, child._journal = self._task, self._origin, list(self._journal)
            child._journal_bytes = self._journal_bytes
            child._origin_files, child._unresumable = self._origin_files, self._unresumable
            child._last_snap = self._last_snap
            child._state = None if self._state is None else copy_state(self._state)
        else:  # a container of its own: this state, and the work folder as of now
            try:
                state, files = self._dump_parts("fork")
                child._load(self._task, state, files)
            except BaseException:
                child.close()
                raise
        return child

    def _fork_into(self, child: "ContainerWorld") -> bool:
        """:meth:`SessionLink.fork_into`; when the container turns out dead, the world is resumed on a
        fresh one first (as a step's request is) and forked there."""
        try:
            return self._link.fork_into(child._link)
        except ContainerError as exc:
            c = self._link.container
            if not self.resume or c is None or not c.dead:
                raise
            died = ContainerDied(f"{self._link.where()}: the container stopped answering mid-episode ({exc})")
            died.detail = str(exc)
            self._resume_after(died)  # ContainerLost when that fails too
        return self._link.fork_into(child._link)

    def dump(self) -> Any:
        """The state as JSON (the :class:`~envfactory.world.World` contract: what the referee,
        the Ray runtime and ``Episode.snapshot`` read as the state); the work folder of a world
        that runs agent code is in :meth:`dump_with_files`."""
        return state_json(self.state())

    def dump_with_files(self) -> Any:
        """:meth:`dump`, and for a world that runs agent code whose work folder holds files,
        ``{"state": <the state>, WORK_FILES: <a tar.gz of the folder, base64>}`` (JSON; what
        :meth:`load` takes back, here or on any container). :class:`EpisodeError` when the folder
        could not be archived (over ``Limits.work_archive_mb``): its files are never left out."""
        state, files = self._dump_parts("dump")
        return state if files is None else {"state": state, WORK_FILES: files}

    def _dump_parts(self, why: str) -> tuple[Any, str | None]:
        """The state (as JSON) and the work folder (``None``: empty, or not a world with files)."""
        if not self._files:
            return state_json(self.state()), None
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: no state before reset()")
        if self.resume and self._last_snap:  # the snapshot of the last step boundary is current
            if self._unresumable is not None:
                raise EpisodeError(f"{self.spec.name}: cannot {why} this world: {self._unresumable}")
            return state_json(self.state()), self._origin_files or None
        snap = self._request({"op": "snapshot"}).get("snapshot")
        if snap.__class__ is not dict or not (snap.get("error").__class__ is str or (
                snap.get("files").__class__ is str and "state" in snap)):
            raise self._link.untrustworthy(f"a snapshot reply without a valid snapshot ({str(snap)[:200]})")
        if "error" in snap:
            raise EpisodeError(f"{self.spec.name}: cannot {why} this world: {snap['error']}")
        self._state = self._checked_state(snap)
        return state_json(self._state), snap["files"] or None

    def load(self, task: Task, state: Any) -> None:
        """Continue from ``state`` (from :meth:`dump_with_files`: a world's files come back too;
        a plain state, from :meth:`dump`, leaves the work folder empty)."""
        files = None
        if state.__class__ is dict and WORK_FILES in state:
            if not self._files:
                raise ValueError(f"{self.spec.name}: this dump carries a work folder's files, which only "
                                 "an environment with isolation='container' can hold")
            files = state[WORK_FILES]
            if files.__class__ is not str or "state" not in state:
                raise ValueError(f"{self.spec.name}: a malformed dump ({WORK_FILES} is not an archive)")
            state = state["state"]
        self._load(task, state, files or None)

    def _load(self, task: Task, state: Any, files: str | None) -> None:
        """Load ``state`` (and, with ``files``, a work folder the server archived)."""
        self._check_registered(task)
        checked = self._validate(state)  # a ValidationError (ValueError) before anything moves
        self._state = None
        dumped = state_json(checked)
        req: dict[str, Any] = {"op": "load", "task": task.id, "state": dumped}
        if files is not None:
            req["files"] = files
        self._link.request_with_retry(req)
        self._task, self._state, self._origin, self._journal = task, checked, dumped, []
        self._journal_bytes = 0
        self._origin_files, self._unresumable, self._last_snap = files, None, True

    def close(self) -> None:
        self._link.drop()
        self._state = None
        self._origin, self._journal, self._journal_bytes = None, [], 0

    # -- resuming after a dead container ----------------------------------------
    def _request(self, req: dict[str, Any], *, overrun: type[Exception] = ContainerError) -> dict[str, Any]:
        """One request of a started world; when its container died, the world is
        resumed on a fresh one and the request sent again, once."""
        try:
            return self._link.request(req, overrun=overrun)
        except ContainerDied as exc:
            if not self.resume or self._task is None:
                raise
            self._resume_after(exc)
        return self._link.request(req, overrun=overrun)  # a second death is this request's error

    def _resume_after(self, exc: ContainerDied) -> None:
        """Rebuild the world on a fresh session: its origin, then its journal, replayed
        (every batch must give the outcomes it gave before). :class:`ContainerError`
        (the first fault's message, and why the resume failed) if anything goes wrong."""
        t0 = time.monotonic()
        link, task = self._link, self._task
        assert task is not None
        try:
            if self._unresumable is not None:
                raise RuntimeError(f"its last snapshot failed: {self._unresumable}")
            link.ensure()
            if self._origin is None:
                link.request({"op": "start", "task": task.id})
            elif self._origin_files:
                link.request({"op": "load", "task": task.id, "state": self._origin, "files": self._origin_files})
            else:
                link.request({"op": "load", "task": task.id, "state": self._origin})
            for i, (req, record) in enumerate(self._journal):
                outs = link.request(req).get("outcomes")
                if _record(outs) != record:
                    raise link.untrustworthy(f"replaying batch {i + 1} of {len(self._journal)} gave other "
                                             "outcomes than the first time (a tool that is not deterministic "
                                             "given the state?)")
        except (ContainerError, EpisodeError, KeyError, ValueError, TypeError, RuntimeError) as why:
            link.drop(remove=True)
            self._state = None
            _count("resume_failed")
            log.warning("%s: resuming the world after its container died failed: %s", self.spec.name, why)
            raise ContainerLost(f"{exc} Resuming the world on a fresh container failed too "
                                f"({type(why).__name__}: {why}).") from None
        self.resumed += 1
        _count("resumed")
        _count("replayed_batches", len(self._journal))
        log.warning("%s: its container died mid-episode (%s); the world was resumed on %s "
                    "(%d batches replayed in %.2fs)", self.spec.name, exc.detail or str(exc)[:300], link.where(),
                    len(self._journal), time.monotonic() - t0)

    def _take_snapshot(self, snap: Any) -> None:
        """The step boundary's snapshot of a world running agent code: its state and work folder
        become the origin (nothing to replay); one over the archive cap makes it unresumable
        (until a later step's folder fits again)."""
        if snap.__class__ is not dict or not (snap.get("error").__class__ is str or ("state" in snap and (
                snap.get("files").__class__ is str
                or (snap.get("files_same") is True and self._origin_files is not None)))):
            raise self._link.untrustworthy(f"a run reply without a valid snapshot ({str(snap)[:200]})")
        self._journal, self._journal_bytes = [], 0
        self._last_snap = True
        if "error" in snap:
            self._origin, self._origin_files, self._unresumable = None, None, snap["error"]
        else:  # unchanged: the files last sent
            self._origin, self._unresumable = snap["state"], None
            self._origin_files = snap.get("files", self._origin_files)
            _count("snapshots")

    def _snapshot_due(self) -> bool:
        """The journal is long enough that the next batch's reply should bring the state, to
        restart the journal from (it bounds the journal, and what a resume replays)."""
        return self.resume and (len(self._journal) >= SNAPSHOT_EVERY or self._journal_bytes >= SNAPSHOT_BYTES)

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
