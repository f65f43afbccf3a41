"""One server session in a pooled container, as the host holds it.

A :class:`SessionLink` owns the session's container slot (taken from a
:class:`~envfactory.runtime.pool.Pool`), its framed channel and its HTTP
control calls, and turns every container fault into a
:class:`~envfactory.runtime.container.ContainerError` that names the
environment, the session and the container, after removing the container
(the pool replaces it). :class:`~envfactory.runtime.docker.ContainerWorld`
decides what a reply means; this module only moves frames, and checks their
envelope: one deadline covers sending a request and every ``recv`` of its reply,
and a reply that is not JSON, not a dict, or whose ``ok`` / ``error`` / ``kind``
have the wrong types is a protocol break (:meth:`SessionLink.untrustworthy`).
A request the host cannot encode raises
:class:`~envfactory.runtime.wire.FrameEncodeError` before anything is sent: the
caller's error, never a container fault.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from ..env import EpisodeError
from .container import MAX_ABANDONED_RUNNING, Container, ContainerBusy, ContainerError, ContainerLost
from .pool import Pool
from .wire import FrameDecodeError, FrameError, encode_frame, recv_frame

__all__ = ["SessionLink", "ContainerDied", "MAX_ABANDONED_RUNNING", "PLACE_TRIES"]

PLACE_TRIES = 4
"""Containers a new session is offered to (each that refuses it for being full is skipped)."""


class ContainerDied(ContainerLost):
    """The container stopped answering mid-request (it died, was killed, or its channel
    broke: EOF, a reset connection, a broken frame), as opposed to an overrun deadline or
    a reply that breaks the protocol. The container was removed; a
    :class:`~envfactory.runtime.docker.ContainerWorld` resumes its world elsewhere.
    ``detail``: where it happened and how the container exited, without the advice."""

    detail = ""


_SMALL_FRAME = 16 << 10  # a request this small fits the socket's buffer: its send does not wait
_SEND_SLACK = 0.001  # seconds a send may take before the reply's recv is armed for what is left
_ERRORS = {"KeyError": KeyError, "ValueError": ValueError, "TypeError": TypeError}


class SessionLink:
    """A session of ``env`` in a container of ``pool``.

    Args:
        pool: Where containers come from and go back to.
        env: The environment's name (for messages).
        timeout: Seconds one framed request may take.
    """

    def __init__(self, pool: Pool, env: str, timeout: float) -> None:
        self.pool, self.env, self.timeout = pool, env, timeout
        self.container: Container | None = None
        self.session: str | None = None
        self._chan: socket.socket | None = None
        self.sent_bytes = 0  # the size of the last request's frame

    def where(self) -> str:
        c = self.container
        return f"{self.env} session {self.session} (container {c.name if c else '?'})"

    def attach(self, container: Container, session: str) -> None:
        self.container, self.session = container, session
        self._chan = container.open_channel(session, self.timeout)

    def ensure(self) -> None:
        """Hold a live session (a new one, on a pooled container, if there is none)."""
        if self.container is not None and not self.container.dead:
            return
        self.drop()
        refused: list[Container] = []
        for attempt in range(PLACE_TRIES):
            c = self.pool.acquire(exclude=refused)
            sid = None
            try:
                sid = c.call("POST", "/sessions").get("session")
                if sid.__class__ is not str:
                    c.dead = True
                    raise ContainerError(f"{self.env}: container {c.name} answered no session id ({sid!r}); "
                                         "it was removed as untrustworthy")
                self.attach(c, sid)
                return
            except ContainerBusy:  # full (sessions or connections): the next container, a new one if need be
                self.container = self.session = None
                if sid.__class__ is str:
                    self._delete_quietly(c, sid)
                self.pool.release(c)
                refused.append(c)
                if attempt == PLACE_TRIES - 1:
                    raise
            except BaseException:
                self.container = self.session = None
                if c.dead:
                    self.pool.discard(c)
                else:
                    self.pool.release(c)
                raise

    @staticmethod
    def _delete_quietly(c: Container, sid: str) -> None:
        try:
            c.call("DELETE", f"/sessions/{sid}")
        except (ContainerError, KeyError, ValueError, TypeError):
            pass

    def drop(self, *, remove: bool = False) -> None:
        """End the session; with ``remove`` (or a dead container) remove its container. Idempotent."""
        c, self.container = self.container, None
        if self._chan is not None:
            self._chan.close()
            self._chan = None
        if c is None:
            return
        if remove or c.dead:
            self.pool.discard(c)
        else:
            try:
                c.call("DELETE", f"/sessions/{self.session}")
            except ContainerError:
                pass
            self.pool.release(c)
        self.session = None

    def request(self, req: dict[str, Any], *, overrun: type[Exception] = ContainerError) -> dict[str, Any]:
        """One framed request. A dead or overrunning container is removed and
        :class:`ContainerError` raised (``overrun`` instead when the request ran
        past the timeout, one deadline for the whole exchange); so is one whose reply
        breaks the protocol. An error the server reports is raised as its own kind
        (``KeyError``, ``ValueError``, ``TypeError``; ``ContainerError`` otherwise).
        A request that cannot be encoded raises ``FrameEncodeError`` and sends nothing."""
        return self.receive(req, self.send(req, overrun=overrun), overrun=overrun)

    def send(self, req: dict[str, Any], *, overrun: type[Exception] = ContainerError) -> tuple[float, bool]:
        """:meth:`request`'s first half: send ``req``; return what :meth:`receive` needs (the
        exchange's deadline, and whether the socket's timeout already bounds the first ``recv``).
        Raises as :meth:`request` does (``FrameEncodeError``: nothing sent)."""
        chan = self._chan
        if chan is None:
            raise EpisodeError(f"{self.env}: no live session (its container was removed); call reset()")
        frame = encode_frame(req)  # FrameEncodeError: the caller's; nothing sent, the channel is fine
        self.sent_bytes = len(frame)
        timeout = self.timeout
        deadline = time.monotonic() + timeout
        try:
            # A small frame's send returns at once (the socket buffer takes it), so the socket's
            # timeout, when it is already this session's, ends the first recv at the deadline (late
            # by the send's time, under _SEND_SLACK): no settimeout (a system call, and a GIL hand-off)
            # on the usual step. After a large frame or a slow send the recv is armed for what is
            # left (and the next request sets the session's timeout again).
            if chan.gettimeout() != timeout:
                chan.settimeout(timeout)
            chan.sendall(frame)
        except BaseException as exc:
            self.failed(exc, req, overrun)
            raise
        # (a send that waited, a full socket buffer, leaves the recv armed for what is left)
        return deadline, len(frame) <= _SMALL_FRAME and time.monotonic() + timeout - deadline <= _SEND_SLACK

    def receive(self, req: dict[str, Any], sent: tuple[float, bool], *,
                overrun: type[Exception] = ContainerError) -> dict[str, Any]:
        """:meth:`request`'s second half: the reply to ``req``, which :meth:`send` sent (``sent``:
        what it returned). Raises as :meth:`request` does."""
        chan = self._chan
        if chan is None:
            raise EpisodeError(f"{self.env}: no live session (its container was removed); call reset()")
        deadline, armed = sent
        try:
            reply = recv_frame(chan, deadline, armed=armed)
        except BaseException as exc:
            self.failed(exc, req, overrun)
            raise
        return self.checked(reply)

    def checked(self, reply: Any) -> dict[str, Any]:
        """``reply``, a request's reply, when its envelope is right and it says ``ok``; the error it
        reports raised as its own kind; a broken envelope removes the container (untrustworthy)."""
        if reply.__class__ is not dict:
            raise self.untrustworthy(f"its reply is a {type(reply).__name__}, not an object")
        ok = reply.get("ok")
        if ok is True:
            return reply
        err, kind = reply.get("error"), reply.get("kind")
        if ok is not False or err.__class__ is not str or not (kind is None or kind.__class__ is str):
            raise self.untrustworthy(f"malformed reply envelope (ok={ok!r}, error of type {type(err).__name__}, "
                                     f"kind of type {type(kind).__name__})")
        raise _ERRORS.get(kind or "", ContainerError)(f"{self.where()}: {err}")

    @property
    def channel_fd(self) -> int:
        """The session channel's descriptor (readable once a reply is in), ``-1`` without one."""
        chan = self._chan
        return -1 if chan is None else chan.fileno()

    def failed(self, exc: BaseException, req: dict[str, Any], overrun: type[Exception]) -> None:
        """What a failed exchange raises (the session and container dealt with as :meth:`request`
        says); returns, for the caller to re-raise ``exc`` itself, when it is none of these."""
        if isinstance(exc, socket.timeout):
            where = self.where()
            what = "the step" if req.get("op") == "run" else f"the {req.get('op')} request"
            if self.abandon():
                raise overrun(f"{what} did not finish within {self.timeout}s; this session was abandoned and "
                              f"ended, the other sessions of its shared container go on ({where}); call "
                              "reset() to start a new episode") from None
            raise overrun(f"{what} did not finish within {self.timeout}s; the environment's container was "
                          f"stopped and recycled ({where}); call reset() to start a new episode") from None
        if isinstance(exc, FrameDecodeError):
            raise self.untrustworthy(f"its reply is not JSON ({exc})") from None
        if isinstance(exc, (FrameError, OSError, ValueError)):
            where, c = self.where(), self.container
            if c is not None and not c.dead and c.answers():
                # The channel broke (the host's own descriptor or pipe, or the server closed this
                # session's channel) but the container answers: only this session is lost.
                self.drop()
                died = ContainerDied(
                    f"{where}: this session's channel broke mid-episode ({exc}); the container still answers "
                    "and was kept, with its other sessions. This episode is lost: call reset() to start a new one.")
                died.detail = f"{where}: its channel broke, the container answers; {exc}"
                raise died from None
            exit_info = c.describe_exit() if c else ""
            self.drop(remove=True)
            died = ContainerDied(
                f"{where}: the container stopped answering mid-episode ({exit_info}; {exc}). It was removed "
                "and the pool replaces it; this episode is lost: call reset() to start a new one.")
            died.detail = f"{where}: {exit_info}; {exc}"
            raise died from None

    def abandon(self) -> bool:
        """Give up on this session after a request overran its deadline, keeping a shared container:
        its channel is closed and the server ends the session, stopping the op it still runs
        (``DELETE /sessions/{id}``); the other sessions there never notice. ``True`` when the
        container was kept. A container that does not answer that call (evidence from the
        container itself: it is stuck), or one of the session's own (``isolation="container"``,
        where agent processes may still run), is removed instead (``False``). A container left with
        :data:`MAX_ABANDONED_RUNNING` abandoned ops still running (each blocked where nothing can
        stop it, holding a server thread) takes no new session and is removed once its last one ends."""
        c, sid = self.container, self.session
        if c is None or getattr(self.pool.spec, "isolation", None) != "session":
            self.drop(remove=True)
            return False
        if self._chan is not None:
            self._chan.close()
            self._chan = None
        try:
            reply = c.call("DELETE", f"/sessions/{sid}")
        except (ContainerError, KeyError, ValueError, TypeError):
            c.dead = True
            self.drop(remove=True)
            return False
        self.container = self.session = None
        running = reply.get("abandoned_running")
        if running.__class__ is int:
            c.abandoned_running = running
            if running >= MAX_ABANDONED_RUNNING:
                c.retire()
        self.pool.release(c)
        return True

    def untrustworthy(self, what: str) -> ContainerError:
        """Remove the container, whose reply broke the protocol; the error to raise."""
        where = self.where()
        self.drop(remove=True)
        return ContainerError(f"{where}: {what}; the container was removed as untrustworthy "
                              "(call reset() to start a new episode)")

    def leave_if_retiring(self) -> None:
        """Before an episode starts: measure the container's memory (now and then,
        :meth:`~envfactory.runtime.container.Container.check_memory`), and leave it when it is
        retiring (past its memory mark, or near its lifetime's end), so that it drains and is
        removed while its sessions go on elsewhere; the next request opens a session on another
        container. Nothing of the old episode is carried: a new one starts."""
        c = self.container
        if c is None or c.dead:
            return
        if c.check_memory():
            self.pool.note_retired(c)
        if c.retiring:
            self.drop()

    def request_with_retry(self, req: dict[str, Any]) -> dict[str, Any]:
        """A request that starts an episode (on a container that is not retiring): on a dead
        container, once more on the pool's replacement."""
        self.leave_if_retiring()
        for attempt in (0, 1):
            self.ensure()
            try:
                return self.request(req)
            except ContainerError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def fork_into(self, other: "SessionLink") -> bool:
        """Fork this session inside its own container into ``other`` when the
        container is shared and has room; ``False`` when it is not (the caller
        then carries the episode over as a snapshot)."""
        c, pool = self.container, self.pool
        if c is None or pool.spec.isolation != "session":
            return False
        with pool._cond:  # take the slot first: other sessions acquire the same container
            if c.sessions >= pool.per_container or c.retiring:
                return False
            c.sessions += 1
        sid = None
        try:
            sid = c.call("POST", f"/sessions/{self.session}/fork").get("session")
            if sid.__class__ is not str:
                raise self.untrustworthy(f"fork answered no session id ({sid!r})")
            other.attach(c, sid)
        except ContainerBusy:  # full: the fork goes elsewhere, as a snapshot
            other.container = other.session = None
            if sid.__class__ is str:
                self._delete_quietly(c, sid)
            pool.release(c)
            return False
        except BaseException:
            pool.release(c)
            raise
        return True
