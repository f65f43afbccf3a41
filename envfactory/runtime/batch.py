"""The host's end of a container's batch channel (see :mod:`envfactory.runtime.wire`).

:func:`envfactory.step_many` plays one turn in each of many episodes. Over per-session channels
each turn costs the host a send, a receive and a selector registration, and the container a
thread hand-off and two system calls; on 2 cores those, not the worlds, bound 1,000 sessions.
Here the turns bound for one container go out as one frame and come back as a few, the server
playing them one after another on one thread.

A :class:`BatchChannel` is opened once per container (:meth:`Container.batch_channel`) and
used by one :class:`~envfactory.world.RunBatch` (one ``step_many`` call) at a time; a turn
that finds it taken by another thread's call goes over its session's own channel instead. What
can go wrong is what goes wrong on a session's channel, and ends the same way
(:meth:`ContainerWorld.run_end <envfactory.runtime.docker.ContainerWorld.run_end>` maps it):

* a turn whose reply has not come by its deadline is abandoned (its session closed, the op
  stopped in the container), and a late reply for it is dropped;
* the channel breaks: the container is asked whether it lives (a health request, as for a
  session's channel). One that does not is dead, and each of its turns resumes its world on a
  fresh container; one that does is kept, and each turn resumes its world on a fresh session
  (the op may or may not have run: the world is rebuilt from its origin and journal either way)
  and sends its calls again. The next ``step_many`` opens a new batch channel;
* a frame that breaks the protocol: the container is removed as untrustworthy.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from typing import Any

from .wire import FrameDecodeError, FrameError, encode_body, join_frames, split_frames

__all__ = ["BatchChannel", "Staged"]

_tags = itertools.count(1)


class Staged:
    """One turn staged on a batch channel: ``reply`` once it is in, or ``failure`` (why the
    channel failed it, ``untrusted`` when the container broke the protocol); ``turn``: what the
    world that staged it needs to finish it."""

    __slots__ = ("channel", "tag", "part", "size", "timeout", "deadline", "reply", "failure", "untrusted", "turn")

    def __init__(self, channel: "BatchChannel", tag: int, part: bytes, size: int, timeout: float) -> None:
        self.channel, self.tag, self.part, self.size, self.timeout = channel, tag, part, size, timeout
        self.deadline = float("inf")  # set when it is sent
        self.reply: Any = None
        self.failure: str | None = None
        self.untrusted = False
        self.turn: Any = None


class BatchChannel:
    """A container's batch channel, on the host (see the module docstring).

    Args:
        container: The container (marked dead when the channel breaks).
        sock: The connected channel, past its handshake.
    """

    def __init__(self, container: Any, sock: socket.socket) -> None:
        self.container = container
        self.sock = sock
        self.lock = threading.Lock()  # held by the one RunBatch staging on it
        self.frames_sent = 0  # batch frames sent (what a test or a benchmark can read)
        self._staged: list[Staged] = []
        self._waiting: dict[int, Staged] = {}
        self._buf = bytearray()
        self._broken: str | None = None
        self._untrusted = False

    # -- staging, for one RunBatch at a time -----------------------------------
    def stage(self, batch: Any, session: str, body: bytes, timeout: float) -> Staged | None:
        """Stage ``body`` (a ``run`` request's JSON) for ``session`` in ``batch`` (the channel is then
        ``batch``'s until it is released); ``None`` when the channel is broken or another batch holds it."""
        if self._broken is not None:
            return None
        if not batch.holds(self):
            if not self.lock.acquire(blocking=False):
                return None
            batch.hold(self)
        tag = next(_tags)
        st = Staged(self, tag, b"[%d,%s,%s]" % (tag, encode_body(session), body), len(body), timeout)
        self._staged.append(st)
        return st

    def send(self) -> None:
        """Send every staged turn (frames within the cap); each one's deadline runs from now. A
        channel that fails here is broken: its turns fail (see :meth:`pump`)."""
        staged, self._staged = self._staged, []
        if not staged:
            return
        now = time.monotonic()
        for st in staged:
            st.deadline = now + st.timeout
            self._waiting[st.tag] = st
        if self._broken is not None:
            return
        try:
            self.sock.settimeout(max(1.0, min(st.timeout for st in staged)))
            for frame in join_frames(b'{"op":"batch","items":[', [st.part for st in staged], b"]}"):
                self.sock.sendall(frame)
                self.frames_sent += 1
        except OSError as exc:  # a timeout included: a container that reads no frame is not alive
            self._break(f"its batch channel failed on send ({type(exc).__name__}: {exc})")

    def fileno(self) -> int:
        return self.sock.fileno()

    def pump(self) -> list[Staged]:
        """Read what has arrived, without waiting; the turns now answered (or failed: every one
        still waiting, once the channel broke)."""
        done: list[Staged] = []
        if self._broken is None:
            fd = self.sock.fileno()
            try:
                while True:
                    chunk = os.read(fd, 1 << 20)  # the socket is non-blocking (it has a timeout)
                    if not chunk:
                        raise FrameError("the container closed its batch channel")
                    self._buf += chunk
                    if len(chunk) < 1 << 20:
                        break
            except BlockingIOError:
                pass
            except (OSError, FrameError) as exc:
                self._break(f"its batch channel broke ({type(exc).__name__}: {exc})")
            try:
                for frame in split_frames(self._buf):
                    replies = frame.get("replies") if frame.__class__ is dict else None
                    if replies.__class__ is not list:
                        raise FrameError(f"a batch reply frame without replies ({str(frame)[:200]})")
                    for r in replies:
                        if r.__class__ is not list or len(r) != 2 or r[0].__class__ is not int:
                            raise FrameError(f"a malformed batch reply ({str(r)[:200]})")
                        st = self._waiting.pop(r[0], None)
                        if st is not None:  # else one given up on (its deadline passed): dropped
                            st.reply = r[1]
                            done.append(st)
            except (FrameError, FrameDecodeError) as exc:
                self._break(f"its batch channel broke the protocol: {exc}", untrusted=True)
        if self._broken is not None:
            for st in self._waiting.values():
                st.failure, st.untrusted = self._broken, self._untrusted
                done.append(st)
            self._waiting.clear()
        return done

    def forget(self, st: Staged) -> None:
        """Give up on ``st`` (its deadline passed): a reply that comes later is dropped."""
        self._waiting.pop(st.tag, None)

    def release(self) -> None:
        """The batch that held the channel is done with it."""
        self._staged.clear()
        self._waiting.clear()
        if self._broken is not None:
            self.close()
        self.lock.release()

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def _break(self, why: str, *, untrusted: bool = False) -> None:
        if self._broken is None:
            self._broken, self._untrusted = why, untrusted
            # dead only on evidence from the container (an error on the host's own side is none):
            # then its sessions resume elsewhere; one that answers keeps its other sessions
            if not untrusted and not self.container.answers():
                self.container.dead = True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
