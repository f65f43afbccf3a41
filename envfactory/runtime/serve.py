"""``python -m envfactory.runtime.serve``: the server inside an environment's container.

It hosts worlds, nothing else: one :class:`~envfactory.world.LocalWorld` per
session, which starts a task's state, runs tool calls the host has already
parsed and allowed, and reports, forks and loads its state. The rules (parsing,
permissions, turns, the end of an episode, rewards) live on the host, in
:class:`~envfactory.episode.Episode`; this server never sees an action.

It answers on a Unix socket in a folder the host bind-mounts (the container has
no network). The wire format is in :mod:`envfactory.runtime.wire`: HTTP/1.1 for
control calls (sessions, fork), a length-prefixed JSON channel for the world's
operations (start, run, state, load), both on the same socket.

Configuration (environment variables, set by the host):

* ``ENVFACTORY_ENV``: the environment name; ``ENVFACTORY_MODULE``: the module that registers it;
* ``ENVFACTORY_TOKEN_FILE``: a file holding the secret every request must carry.
  The server reads and deletes it before it listens, and marks itself
  non-dumpable, so processes that agent code starts in the container (same
  uid, no capabilities) can read neither the file nor the server's memory, and
  cannot issue calls of their own;
* ``ENVFACTORY_SOCKET`` (default ``/run/envf/s``); ``ENVFACTORY_MAX_SESSIONS`` (default 256);
* ``ENVFACTORY_MAX_CONNECTIONS``: connections served at once (default: the sessions plus 64,
  at most half the container's pid limit). A thread serves each; a connection over the
  bound is refused with an error (HTTP 503, or a ``{"ok": false, "kind": "busy"}``
  frame), so the server never runs out of threads (pids) and never dies of a flood;
* ``ENVFACTORY_MAX_LIFETIME_S``: the server exits after this many seconds (the container
  stops with it), whoever still holds it: a container whose host process was killed
  does not run forever;
* ``ENVFACTORY_WORK_DIR`` (``/tmp`` in containers of ``isolation="container"`` environments):
  the folder agent code writes in. A new episode (``start``) empties it; a ``run`` asked
  for a ``snapshot`` (agent processes are reaped first, so the archive is final) answers
  the state and a tar.gz of the folder (folders, regular files, symbolic and hard links;
  ``files_same`` when no entry changed since the last archive of the session, see
  :meth:`Server._archive_work`), at most ``ENVFACTORY_WORK_ARCHIVE_MAX`` bytes (and half a frame),
  else an error naming the cap; the ``snapshot`` op answers the same, with the whole
  archive, at any time (a fork, a dump); a ``load`` with ``files`` restores them with the
  state (nothing is unpacked outside the folder or through a link), so a world resumed or
  forked on a fresh container has its files back;
* ``ENVFACTORY_REAP_AGENT_PROCESSES=1`` (containers of ``isolation="container"``
  environments, which run agent code in child processes): after each request on the
  session's channel (each ``run`` above all) every other process in the container is
  killed (``kill(-1, SIGKILL)``: all of them at once, however they detached, ``setsid``
  included, and a fork bomb cannot outrun it), so nothing an agent started outlives the
  call that started it (the server waits, at most 2 s, until they are gone and no longer
  hold pids). While a request runs there, every other process gets ``oom_score_adj`` 1000
  (:meth:`Server._guard_oom`), so the OOM killer takes agent code before the server.

The batch channel (one connection, no session of its own: :mod:`envfactory.runtime.wire`) carries
``run`` ops of many sessions at once for :func:`envfactory.step_many`. One thread reads its
batches; a runner thread plays the queued ops one after another, through the same code as a
session's channel (:meth:`Server._answer`), and sends their replies in a few frames; a watcher
moves the queue to a new runner when an op holds one past :data:`SLOW_OP_S`. Other ops (``state``,
``load``, the judge's) are refused there, item by item; a frame that is not a batch gets an error
frame, and the channel keeps serving.

A session ends when its framed channel closes (the host holds one channel per
session and never reopens it), as well as on ``DELETE /sessions/{id}``. A session closed while
one of its ops runs (the host gave up on it: it overran the step timeout) is *abandoned*: the
op is stopped at its next Python instruction (an exception raised in its thread), its reply is
never sent, and the reply to the ``DELETE`` says how many abandoned ops still run (blocked in C;
``GET /health`` says it too). The server and the other sessions go on.

A generated module (:mod:`envfactory.factory.contained`) also has a *judge* container,
whose one session never starts a world and answers the ops ``manifest``, ``judge``,
``terminal`` and ``payoff`` (the module's code the referee needs, on a final state the
host sends as JSON); they are refused on a session that holds a world.

Hostile input stays with the session that sent it: a request frame that is not
JSON, or a request that fails, gets an error reply on that session's channel,
which keeps serving; every reply is encoded with surrogates passed through (a lone
surrogate a tool echoes back cannot break it, nor do two in a row merge); a ``run``
reply over the frame cap has its observations cut to fit (each says how much was
cut), and any other reply that cannot be sent becomes an error reply. Other
sessions never notice. A state whose dict keys hold lone surrogates is sent with
them (:func:`~envfactory.runtime.wire.repair_state_keys`).
"""

from __future__ import annotations

import collections
import ctypes
import hmac
import importlib
import base64
import io
import json
import os
import secrets
import selectors
import signal
import socket
import shutil
import sys
import tarfile
import threading
import time
from typing import Any

from ..definition import ToolEnvSpec
from ..processes import start_memory_trimmer
from ..registry import spec as get_spec
from . import wire
from .wire import (MAGIC, TOKEN_HEADER, FrameDecodeError, FrameEncodeError, FrameError, encode_body, encode_frame,
                   frame_of, recv_frame, send_frame)
from ..task import ToolCall
from ..tooling import CallStopped
from ..world import LocalWorld

__all__ = ["Server", "main"]

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            409: "Conflict", 500: "Internal Server Error"}
_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode
_MAX_HTTP_BODY = 1 << 20  # no control call takes a body


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Session:
    __slots__ = ("world", "lock", "thread", "abandoned")

    def __init__(self, world: LocalWorld) -> None:
        self.world = world
        self.lock = threading.Lock()
        self.thread: int | None = None  # the thread running one of its ops now (guarded by Server._lock)
        self.abandoned = False  # closed by the host while an op ran: that op's result goes nowhere


class _Abandoned(CallStopped):
    """Raised (asynchronously) in the thread running an op of a session the host abandoned
    (it overran its step timeout): a tool looping in Python stops there. A BaseException, so
    that a tool's ``except Exception`` does not swallow it, and a :class:`CallStopped`, so that
    ``Tool.invoke`` (which answers any other ``BaseException`` as the call's error) lets it through."""


def _raise_in(thread: int, exc: type[BaseException] | None) -> None:
    """Schedule ``exc`` in ``thread`` at its next Python instruction (``None``: cancel one pending).
    A thread blocked in C (a ``sleep``) gets it when it returns to Python."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               None if exc is None else ctypes.py_object(exc))


class Server:
    """Worlds of one environment behind the socket protocol.

    Args:
        spec: The environment served.
        token: The secret every request must present.
        max_sessions: Sessions allowed at once (1 for per-session containers).
    """

    def __init__(self, spec: ToolEnvSpec, token: str, max_sessions: int = 256, *,
                 max_connections: int | None = None, reap: bool = False, work_dir: str | None = None,
                 work_archive_max: int = 8 << 20) -> None:
        self.spec = spec
        self.work_dir = work_dir  # agent code's writable folder: archived with each snapshot
        # base64 of the archive takes at most half a frame, whatever the setting (room for the rest)
        self.work_archive_max = min(work_archive_max, wire.MAX_FRAME // 2 // 4 * 3)
        self._token = token.encode()
        self.max_sessions = max_sessions
        self.max_connections = max_connections or _default_max_connections(max_sessions)
        self.reap = reap
        self.sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._abandoned_running: set[_Session] = set()  # abandoned sessions whose op still runs
        self._abandon_done = threading.Condition(self._lock)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        # Agent code runs only during an op: while one runs, its processes are marked first in
        # line for the OOM killer (see _guard_oom); between ops none is left (reap).
        self._op_running = threading.Event()
        if reap:
            threading.Thread(target=self._guard_oom, daemon=True, name="envf-oom-guard").start()
        start_memory_trimmer()  # what sessions free goes back to the kernel (issue 63)

    def _add(self, world: LocalWorld) -> str:
        with self._lock:
            if len(self.sessions) >= self.max_sessions:
                raise _HTTPError(409, f"this container holds at most {self.max_sessions} session(s)")
            sid = secrets.token_hex(6)
            self.sessions[sid] = _Session(world)
        return sid

    def _close_session(self, sid: str, wait: float = 0.5) -> int:
        """End session ``sid``. One whose op is still running (the host gave up on it: it overran
        the step timeout) is *abandoned*: its op is stopped at its next Python instruction
        (:class:`_Abandoned`), its reply goes nowhere, its channel closes, and no other session
        notices. Waits (at most ``wait`` seconds) for that op to stop; answers how many abandoned
        ops of this server still run (blocked in C, or swallowing the stop: each holds a thread
        until it returns)."""
        with self._lock:
            s = self.sessions.pop(sid, None)
            if s is not None and s.thread is not None:
                if not s.abandoned:
                    s.abandoned = True
                    self._abandoned_running.add(s)
                    _raise_in(s.thread, _Abandoned)
                self._abandon_done.wait_for(lambda: s not in self._abandoned_running, wait)
            return len(self._abandoned_running)

    def _run_op(self, s: _Session, req: Any) -> dict[str, Any] | bytes:
        """Run one op of session ``s`` on this thread, marked as running it (so that it can be
        abandoned: :meth:`_close_session`); :class:`_Abandoned` if it was. Its reply (:meth:`_op`)."""
        me = threading.get_ident()
        with self._lock:
            if s.abandoned:
                raise _Abandoned
            s.thread = me
        reply: dict[str, Any] | bytes = {}
        try:
            try:
                with s.lock:
                    try:
                        if self.reap:
                            self._op_running.set()
                        reply = self._op(s.world, req)
                    finally:
                        if self.reap:
                            _kill_other_processes()
                            self._op_running.clear()
            finally:
                abandoned = self._op_ended(s, me)
        except _Abandoned:  # the stop landed in the op, or on the way out of it
            abandoned = self._op_ended(s, me) or True
        if abandoned:
            raise _Abandoned
        return reply

    def _guard_oom(self, every: float = 0.005) -> None:
        """While an op runs (``reap``: a container whose agent code runs in child processes), give
        every process but this server and init ``oom_score_adj`` :data:`AGENT_OOM_SCORE_ADJ`, so that
        when the container runs out of memory the OOM killer takes agent code, never the server
        (whose own score it cannot lower: it has no capabilities; a new process inherits the
        server's score until this pass finds it, within ``every`` seconds). Writing another
        process's score needs no capability when raising it, only its owner's uid (agent code runs
        as the server's)."""
        me = os.getpid()
        marked: set[int] = set()
        while True:
            self._op_running.wait()
            try:
                pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}
            except OSError:
                pids = set()
            marked &= pids
            for pid in pids - marked - {1, me}:
                try:
                    with open(f"/proc/{pid}/oom_score_adj", "w") as f:
                        f.write(str(AGENT_OOM_SCORE_ADJ))
                    marked.add(pid)
                except OSError:  # gone already, or not ours to change
                    pass
            time.sleep(every)

    def _op_ended(self, s: _Session, me: int) -> bool:
        """This thread no longer runs an op of ``s`` (no stop can be sent to it from now on);
        ``True`` if ``s`` was abandoned (a stop still pending is cancelled). Idempotent."""
        with self._lock:
            s.thread = None
            if not s.abandoned:
                return False
            _raise_in(me, None)
            self._abandoned_running.discard(s)
            self._abandon_done.notify_all()
            return True

    def _authorized(self, token: Any) -> bool:
        if isinstance(token, str):
            token = token.encode()
        return isinstance(token, bytes) and hmac.compare_digest(token, self._token)

    # -- HTTP control calls ---------------------------------------------
    def route(self, method: str, path: str) -> Any:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if method == "GET" and parts == ["health"]:
            return {"ok": True, "env": self.spec.name, "sessions": len(self.sessions), "pid": os.getpid(),
                    "abandoned_running": len(self._abandoned_running)}
        if method == "POST" and parts == ["sessions"]:
            return {"session": self._add(LocalWorld(self.spec))}
        if method == "DELETE" and len(parts) == 2 and parts[0] == "sessions":
            return {"ok": True, "abandoned_running": self._close_session(parts[1])}
        if method == "POST" and len(parts) == 3 and parts[0] == "sessions" and parts[2] == "fork":
            s = self.sessions.get(parts[1])
            if s is None:
                raise _HTTPError(404, f"no session {parts[1]!r} in this container (closed, or never created)")
            with s.lock:
                child = s.world.fork()
            return {"session": self._add(child)}
        raise _HTTPError(404, f"no route {method} {path}")

    def _serve_http(self, conn: socket.socket) -> None:
        rf = conn.makefile("rb")
        while True:
            line = rf.readline(65537)
            if not line:
                return
            try:
                method, target, _ = line.decode("latin-1").split(" ", 2)
            except ValueError:
                return
            headers: dict[str, str] = {}
            while True:
                h = rf.readline(65537)
                if h in (b"\r\n", b"\n", b""):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length") or 0)
            if n < 0 or n > _MAX_HTTP_BODY:
                return
            if n:
                rf.read(n)  # no control call takes a body
            try:
                if not self._authorized(headers.get(TOKEN_HEADER.lower())):
                    raise _HTTPError(401, "missing or wrong token")
                status, doc = 200, self.route(method, target)
            except _HTTPError as exc:
                status, doc = exc.status, {"error": str(exc)}
            except Exception as exc:  # report, keep serving
                status, doc = 500, {"error": f"{type(exc).__name__}: {exc}"}
            payload = _dumps(doc).encode()
            conn.sendall(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode("latin-1") + payload
            )
            if headers.get("connection", "").lower() == "close":
                return

    # -- the framed channel: the world's operations ----------------------
    def _serve_frames(self, conn: socket.socket) -> None:
        conn.recv(len(MAGIC))
        hello = recv_frame(conn)
        if not isinstance(hello, dict) or not self._authorized(hello.get("token")):
            send_frame(conn, {"ok": False, "error": "missing or wrong token"})
            return
        if hello.get("batch") is True:
            b = _Batch(conn)
            try:
                threading.Thread(target=self._watch, args=(b,), daemon=True, name="envf-batch-watch").start()
            except RuntimeError:  # no thread to be had (the pid limit): the host uses the sessions' channels
                send_frame(conn, {"ok": False, "kind": "busy", "error": "no thread left for a batch channel"})
                return
            send_frame(conn, {"ok": True})
            self._serve_batch(b)
            return
        sid = hello.get("session")
        own = self.sessions.get(sid) if isinstance(sid, str) else None
        if own is None or not isinstance(sid, str):
            send_frame(conn, {"ok": False, "error": f"no session {sid!r} in this container"})
            return
        try:
            send_frame(conn, {"ok": True})
            self._serve_channel(conn, sid)
        finally:  # the channel was the session's only way in: the session ends with it
            with self._lock:
                if self.sessions.get(sid) is own:
                    del self.sessions[sid]

    def _serve_channel(self, conn: socket.socket, sid: str) -> None:
        try:
            self._serve_requests(conn, sid)
        except _Abandoned:  # the host gave up on this session: its channel ends here, nothing sent
            return

    def _serve_requests(self, conn: socket.socket, sid: str) -> None:
        while True:
            try:
                req = recv_frame(conn)
            except FrameDecodeError as exc:  # the whole frame was read: the channel is in step
                conn.sendall(encode_frame({"ok": False, "error": f"bad request: {exc}", "kind": "bad_request"}))
                continue
            conn.sendall(frame_of(self._answer(sid, req)))

    def _answer(self, sid: str, req: Any) -> bytes:
        """Run one request of session ``sid`` here; its reply's frame body (an error reply for a
        request that failed). :class:`_Abandoned` when the host abandoned the session meanwhile."""
        s = self.sessions.get(sid)
        try:
            if s is None:
                raise LookupError(f"session {sid!r} was closed")
            done = self._run_op(s, req)
            if isinstance(done, bytes):  # a plain run's reply, already its frame's body
                return done
            reply = done
        except (KeyError, ValueError, TypeError) as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "kind": type(exc).__name__}
        except _Abandoned:
            raise
        except BaseException as exc:  # noqa: BLE001 - (a dump's SystemExit): this request's error, the channel goes on
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "kind": "internal"}
        try:
            body = encode_body(reply)
            if b"\xef\xbf\xbd" in body and s is not None:  # U+FFFD: keys to repair
                if "state" in reply:
                    reply["state"] = wire.repair_state_keys(s.world._state, reply["state"])
                snap = reply.get("snapshot")
                if isinstance(snap, dict) and "state" in snap:
                    snap["state"] = wire.repair_state_keys(s.world._state, snap["state"])
                body = encode_body(reply)
        except FrameEncodeError as exc:
            if "snapshot" in reply and s is not None:  # the host will not hold what was archived
                self._forget_work(s.world)
            body = self._fallback(reply, exc)
        return body

    # -- the batch channel: many sessions' steps in one frame ------------------
    def _serve_batch(self, b: "_Batch") -> None:
        """The batch channel (see :mod:`envfactory.runtime.wire`): this thread reads batches and
        queues their ops; a runner thread plays them (:meth:`_drain`), a watcher thread (started
        with the channel) moves the queue to a new runner when an op runs past :data:`SLOW_OP_S`
        (:meth:`_watch`)."""
        conn = b.conn
        try:
            while True:
                try:
                    req = recv_frame(conn)
                except FrameDecodeError as exc:
                    b.send(encode_frame({"ok": False, "error": f"bad batch: {exc}", "kind": "bad_request"}))
                    continue
                items = req.get("items") if isinstance(req, dict) and req.get("op") == "batch" else None
                if not isinstance(items, list) or not all(
                        isinstance(it, list) and len(it) == 3 and it[0].__class__ is int and isinstance(it[1], str)
                        and isinstance(it[2], dict) for it in items):
                    b.send(encode_frame({"ok": False, "kind": "bad_request",
                                         "error": "bad batch: expected {\"op\": \"batch\", \"items\": "
                                                  "[[tag, session, request], ...]} (tag an int)"}))
                    continue
                with b.lock:
                    b.queue.extend(items)
                    start = b.runner == 0
                    if start:
                        b.generation += 1
                        b.runner = b.generation
                    b.work.set()
                if start:
                    self._start_runner(b, b.runner)
        finally:
            with b.lock:  # nobody reads the replies any more: what has not started never will
                b.closed = True
                b.queue.clear()
                b.work.set()

    def _start_runner(self, b: "_Batch", gen: int) -> None:
        try:
            threading.Thread(target=self._drain, args=(b, gen), daemon=True, name="envf-batch-run").start()
        except RuntimeError:  # no thread to be had (the pid limit): the next batch or the watcher tries again
            with b.lock:
                if b.runner == gen:
                    b.runner = 0

    def _drain(self, b: "_Batch", gen: int) -> None:
        """Play the queue's ops one after another while this runner is the batch's; replies are
        sent when the queue runs dry, when this runner hands over, or every :data:`_FLUSH_S`."""
        last = time.monotonic()
        while True:
            with b.lock:
                if b.runner != gen or not b.queue or b.closed:
                    if b.runner == gen:
                        b.runner = 0
                    break
                tag, sid, req = b.queue.popleft()
                b.since = time.monotonic()
            try:
                body = (self._answer(sid, req) if req.get("op") == "run" else encode_body(
                    {"ok": False, "kind": "ValueError", "error": "ValueError: the batch channel runs 'run' ops only"}))
            except _Abandoned:  # the host gave up on this session: no reply
                body = None
            except BaseException as exc:  # noqa: BLE001 - a tool's SystemExit: its own error; the runner goes on
                body = encode_body({"ok": False, "kind": "internal", "error": f"{type(exc).__name__}: {exc}"})
            if body is not None and len(body) > wire.MAX_FRAME - 64:  # no room for its tag in a frame
                body = encode_body({"ok": False, "kind": "reply_error", "error": "the reply could not be sent (over "
                                    "the frame cap with its tag); this session's world may have changed: start it again"})
            now = time.monotonic()
            with b.lock:
                if b.runner == gen:
                    b.since = None
                if body is not None:
                    b.add(b"[%d,%s]" % (tag, body))
                flush = not b.queue or b.runner != gen or now - last >= _FLUSH_S or b.out_bytes >= wire.MAX_FRAME // 2
            if flush:
                b.flush()
                last = now
        b.flush()

    def _watch(self, b: "_Batch") -> None:
        """While the batch channel has work, look every :data:`SLOW_OP_S` / 4: a runner on one op for
        longer than :data:`SLOW_OP_S` with ops queued behind it hands them to a new runner (it sends
        its own reply when its op ends, and stops); the replies it finished before go out now."""
        while True:
            b.work.wait()
            with b.lock:
                if b.closed:
                    return
                idle = b.runner == 0 and not b.queue
                if idle:
                    b.work.clear()
                    continue
                stuck = b.since is not None and time.monotonic() - b.since > SLOW_OP_S and bool(b.queue)
                start = stuck or (b.runner == 0 and bool(b.queue))  # (a runner that could not start)
                if start:
                    b.generation += 1
                    b.runner, b.since = b.generation, None
            if start:
                b.flush()
                self._start_runner(b, b.runner)
            time.sleep(SLOW_OP_S / 4)

    @staticmethod
    def _fallback(reply: dict[str, Any], err: FrameEncodeError) -> bytes:
        """A reply that could not be encoded: a ``run``'s snapshot replaced by an error saying so
        (the world stays as it is, only unresumable), then its observations cut to fit the frame
        cap, else an error for this session (its channel and every other go on)."""
        snap = reply.get("snapshot")
        if isinstance(snap, dict) and "error" not in snap:
            reply["snapshot"] = {"error": f"the snapshot (state and work folder) does not fit in a reply ({err})"}
            try:
                return encode_body(reply)
            except FrameEncodeError as exc:
                err = exc
        outs = reply.get("outcomes")
        if isinstance(outs, list) and outs:
            cap = wire.MAX_FRAME
            # an escaped character is at most 6 bytes; keep half the frame for the rest
            room = max(64, cap // 2 // (6 * len(outs)))
            for o in outs:
                content = o["content"]
                if len(content) > room:
                    o["content"] = (content[:room] + f"\n[truncated: {len(content) - room} more characters; "
                                    f"a reply is capped at {cap} bytes]")
            try:
                return encode_body(reply)
            except FrameEncodeError as exc:
                err = exc
        return encode_body({"ok": False, "kind": "reply_error",
                             "error": f"the reply could not be sent ({err}); this session's world may have "
                                      "changed: start it again"})

    def _archive_work(self, world: LocalWorld, full: bool = False) -> dict[str, Any]:
        """The work folder for a snapshot: ``{"files_same": True}`` when nothing in it changed since
        the last archive this session sent (and ``full`` is false), the same error when it is still
        the folder that was over the cap, else :func:`_archive`. "Changed" is judged from every
        entry's name, type, inode, size, mtime and ctime (ctime: no ``utime`` hides a rewrite), and
        only against a fingerprint taken when its newest change was older than :data:`_RACY_NS`
        (a coarse file clock may stamp two writes alike: then the folder is archived again)."""
        assert self.work_dir is not None
        taken = time.time_ns()
        fp = _fingerprint(self.work_dir)
        last = getattr(world, "_work_last", None)  # (fingerprint, answer) of the last settled archive
        if fp is not None and last is not None and last[0] == fp:
            if "error" in last[1]:
                return dict(last[1])
            if not full:
                return {"files_same": True}
        out = _archive(self.work_dir, self.work_archive_max)
        settled = fp is not None and fp[0] < taken - _RACY_NS
        remembered = (fp, {"error": out["error"]} if "error" in out else {}) if settled else None
        world._work_last = remembered  # type: ignore[attr-defined]
        return out

    @staticmethod
    def _forget_work(world: LocalWorld) -> None:
        world._work_last = None  # type: ignore[attr-defined]

    def _op(self, world: LocalWorld, req: dict[str, Any]) -> dict[str, Any] | bytes:
        """The reply to one request: a dict, or for a plain ``run`` (no state, no snapshot asked) the
        body of its frame, written at once (:func:`_plain_run_body`)."""
        op = req.get("op")
        if op == "run":
            outs = world.run(req["agent"], req["round"], [ToolCall(c["name"], c["arguments"]) for c in req["calls"]])
            if not req.get("state") and not (req.get("snapshot") and self.work_dir):
                body = _plain_run_body(outs)
                if body is not None:
                    return body
            reply = {"ok": True, "outcomes": [{"content": o.content, "ok": o.ok, "kind": o.kind} for o in outs]}
            if req.get("snapshot") and self.work_dir:  # the step boundary: state and files, one reply
                if self.reap:  # what agent code left running writes no more (the archive is final)
                    _kill_other_processes()
                reply["snapshot"] = {"state": world.dump(), **self._archive_work(world)}
        elif op == "snapshot":  # the state and the whole work folder, now (a fork, a dump)
            if not self.work_dir:
                raise ValueError("this container has no work folder (isolation is not 'container')")
            return {"ok": True, "snapshot": {"state": world.dump(), **self._archive_work(world, full=True)}}
        elif op == "start":
            if self.work_dir:  # a new episode starts with an empty work folder
                _clear(self.work_dir)
                self._forget_work(world)
            world.start(self.spec.task(req["task"]))
            reply = {"ok": True}
        elif op == "state":
            raw = _state_json(world)
            if raw is not None:
                return b'{"ok":true,"state":' + raw + b"}"
            return {"ok": True, "state": world.dump()}
        elif op == "load":
            files = req.get("files")
            if self.work_dir:  # the files go with the state they were archived with (none: empty)
                _clear(self.work_dir)
                self._forget_work(world)
                if files:
                    _restore(self.work_dir, files)
            elif files:
                raise ValueError("this container has no work folder to restore files into "
                                 "(isolation is not 'container')")
            world.load(self.spec.task(req["task"]), req["state"])
            return {"ok": True}
        elif op in _JUDGE_OPS:  # a generated module's judge session (envfactory.factory.contained)
            return _judge(self.spec, world, req)
        else:
            raise ValueError(f"unknown op {op!r}")
        if req.get("state"):
            raw = _state_json(world)
            if raw is not None:
                try:
                    head: bytes | None = encode_body(reply)
                except FrameEncodeError:  # (the reply is built whole below, and cut to fit as any other)
                    head = None
                if head is not None and len(head) + len(raw) + 16 <= wire.MAX_FRAME:
                    return head[:-1] + b',"state":' + raw + b"}"
            reply["state"] = world.dump()
        return reply

    # -- connections -----------------------------------------------------
    def _handle_in_slot(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        finally:
            self._slots.release()

    def _handle(self, conn: socket.socket) -> None:
        try:
            head = b""
            while len(head) < len(MAGIC):
                head = conn.recv(len(MAGIC), socket.MSG_PEEK)
                if not head:
                    return
                if len(head) < len(MAGIC) and not MAGIC.startswith(head):
                    break
            if head == MAGIC:
                self._serve_frames(conn)
            else:
                self._serve_http(conn)
        except (FrameError, OSError, ValueError):
            pass
        finally:
            conn.close()

    def serve_forever(self, path: str) -> None:
        """Listen on ``path`` (made visible atomically, once listening) and serve."""
        tmp = f"{path}.{os.getpid()}.tmp"
        for p in (tmp, path):
            if os.path.exists(p):
                os.unlink(p)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(tmp)
        srv.listen(256)
        os.rename(tmp, path)
        # One thread here accepts, starts a handler thread per connection while fewer than
        # ``max_connections`` are open, and answers the excess with an error (without a
        # thread: they wait in the selector until their first bytes say which protocol
        # they speak, at most _REFUSE_WAIT_S).
        sel = selectors.DefaultSelector()
        sel.register(srv, selectors.EVENT_READ, None)
        pending: dict[socket.socket, float] = {}
        while True:
            wait = None
            if pending:
                wait = max(0.0, min(pending.values()) - time.monotonic())
            for key, _ in sel.select(wait):
                if key.data is None:
                    try:
                        conn, _ = srv.accept()
                    except OSError:
                        continue
                    if self._start_handler(conn):
                        continue
                    if len(pending) >= _MAX_PENDING_REFUSALS:
                        conn.close()
                        continue
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ, "refuse")
                    pending[conn] = time.monotonic() + _REFUSE_WAIT_S
                else:
                    conn = key.fileobj  # type: ignore[assignment]
                    sel.unregister(conn)
                    del pending[conn]
                    self._refuse(conn)
            now = time.monotonic()
            for conn in [c for c, at in pending.items() if at <= now]:
                sel.unregister(conn)
                del pending[conn]
                conn.close()

    def _start_handler(self, conn: socket.socket) -> bool:
        """Serve ``conn`` on a thread of its own if a slot is free (and a thread can start)."""
        if not self._slots.acquire(blocking=False):
            return False
        try:
            threading.Thread(target=self._handle_in_slot, args=(conn,), daemon=True).start()
        except RuntimeError:  # no thread to be had (the pid limit): refuse, keep serving
            self._slots.release()
            return False
        return True

    def _refuse(self, conn: socket.socket) -> None:
        """Answer a connection over the bound with an error in its own protocol, and close it."""
        msg = (f"this container serves at most {self.max_connections} connections at once; "
               "try again when one closes")
        try:
            head = conn.recv(len(MAGIC), socket.MSG_PEEK)
            if head and MAGIC.startswith(head[:len(MAGIC)]):
                conn.sendall(encode_frame({"ok": False, "error": msg, "kind": "busy"}))
            elif head:
                payload = _dumps({"error": msg, "kind": "busy"}).encode()
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                             b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        except OSError:
            pass
        finally:
            conn.close()


AGENT_OOM_SCORE_ADJ = 1000
"""The ``oom_score_adj`` of agent code's processes (the most the kernel allows: killed first)."""

_JUDGE_OPS = frozenset(("manifest", "judge", "terminal", "payoff"))


def _judge(spec: ToolEnvSpec, world: LocalWorld, req: dict[str, Any]) -> dict[str, Any]:
    """The judge ops of a generated module (:func:`envfactory.runtime.generated.judge_op`): its
    manifest, and the success / ``terminal`` / payoff of a final state the host sends as JSON.
    They run only on a session of their own, one that never started a world, so nothing an
    agent's tool calls did in a session is part of a judgement."""
    if world._state is not None:
        raise ValueError(f"op {req.get('op')!r} runs on a judge session of its own, never on a world's session")
    from .generated import judge_op

    return judge_op(spec, req)


_encode_string = json.encoder.encode_basestring  # what the frame encoder writes a str with


def _state_json(world: LocalWorld) -> bytes | None:
    """The world's state as JSON for a reply, written without building its Python dump
    (:meth:`LocalWorld.dump_json`), when that can be done and fits a frame with room to spare;
    else ``None`` (the reply carries :meth:`LocalWorld.dump`, encoded as before)."""
    if type(world).dump is not LocalWorld.dump:  # a world with a dump of its own
        return None
    raw = world.dump_json()
    if raw is None or len(raw) > wire.MAX_FRAME - 4096:
        return None
    return raw


def _plain_run_body(outs: list[Any]) -> bytes | None:
    """The body :func:`~envfactory.runtime.wire.encode_body` gives ``{"ok": true, "outcomes": [{"content",
    "ok", "kind"}, ...]}`` (the reply to a ``run`` that asked for no state and no snapshot), written
    directly, byte for byte the same, at a quarter of the cost; ``None`` (the reply is then built and
    encoded as any other) when an outcome is not a ``str``, a ``bool`` and a ``str``, or the body is
    over the frame cap (whose observations are then cut to fit)."""
    parts = []
    for o in outs:
        content, ok, kind = o.content, o.ok, o.kind
        if (ok is not True and ok is not False) or not isinstance(content, str) or not isinstance(kind, str):
            return None
        parts.append('{"content":%s,"ok":%s,"kind":%s}' % (_encode_string(content), "true" if ok else "false",
                                                           _encode_string(kind)))
    body = ('{"ok":true,"outcomes":[' + ",".join(parts) + "]}").encode("utf-8", "surrogatepass")
    return body if len(body) <= wire.MAX_FRAME else None


SLOW_OP_S = 0.02
"""Seconds an op of the batch channel may hold its runner before the ops queued behind it move to
a new runner (a slow tool holds only its own session)."""
_FLUSH_S = 0.002  # a runner sends the replies it holds at least this often


class _Batch:
    """One batch channel's queue of ``[tag, session, request]`` items, its replies not yet sent, and
    which runner drains it (see :meth:`Server._serve_batch`)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.queue: collections.deque[list[Any]] = collections.deque()
        self.lock = threading.Lock()
        self.work = threading.Event()  # set while there may be work (the watcher sleeps on it)
        self.generation = 0
        self.runner = 0  # the generation of the runner that drains the queue (0: none)
        self.since: float | None = None  # when that runner began its op
        self.closed = False
        self._out: list[bytes] = []
        self.out_bytes = 0
        self._send = threading.Lock()

    def add(self, item: bytes) -> None:
        """A reply's ``[tag, reply]`` (the caller holds ``lock``)."""
        self._out.append(item)
        self.out_bytes += len(item) + 1

    def flush(self) -> None:
        """Send the replies held, one frame (lost when the host has gone: it no longer reads)."""
        with self.lock:
            out, self._out, self.out_bytes = self._out, [], 0
        for frame in wire.join_frames(b'{"replies":[', out, b"]}"):
            self.send(frame)

    def send(self, frame: bytes) -> None:
        with self._send:
            try:
                self.conn.sendall(frame)
            except OSError:
                pass


_REFUSE_WAIT_S = 2.0
_MAX_PENDING_REFUSALS = 256


# -- the work folder of agent code (isolation="container"), archived with each snapshot ----------
_RACY_NS = 100_000_000
"""A fingerprint whose newest change is younger than this (ns) does not prove a later one unchanged:
file clocks may be as coarse as a scheduler tick, so two writes can carry the same times."""


def _clear(root: str) -> None:
    """Empty ``root`` (folders agent code made read-only included: it owns nothing the server cannot)."""
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            try:
                os.chmod(os.path.join(dirpath, d), 0o700)
            except OSError:
                pass
    for name in os.listdir(root):
        path = os.path.join(root, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def _fingerprint(root: str) -> tuple[Any, ...] | None:
    """``(newest change (ns), entries)``: every entry under ``root`` (``root`` included) with its
    type, inode, size, mtime and ctime; None if unreadable."""
    out: list[tuple[Any, ...]] = []
    newest = 0
    try:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            st = os.lstat(dirpath)
            out.append((dirpath, st.st_mode, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
            newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
            for name in sorted(filenames):
                st = os.lstat(os.path.join(dirpath, name))
                out.append((dirpath, name, st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
                newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        return None
    return newest, tuple(out)


def _carried(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Folders, regular files, symbolic links and hard links (to a file archived before); not
    fifos, sockets or devices, which hold no data. Owned by nobody in particular."""
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return None
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


class _OverCap(Exception):
    pass


class _CappedBuffer(io.BytesIO):
    """A buffer that refuses to grow past ``cap`` bytes (the archive stops there, not at the end)."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def write(self, b: Any) -> int:
        if self.tell() + len(b) > self.cap:
            raise _OverCap
        return super().write(b)


def _archive(root: str, cap: int) -> dict[str, Any]:
    """``{"files": base64 of a tar.gz of root}`` (``""``: root is empty), or ``{"error": why}``
    (over ``cap`` bytes, or unreadable)."""
    names = sorted(os.listdir(root))
    if not names:
        return {"files": ""}
    buf = _CappedBuffer(cap)
    try:
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1, format=tarfile.PAX_FORMAT) as tar:
            for name in names:
                tar.add(os.path.join(root, name), arcname=name, filter=_carried)
    except _OverCap:
        return {"error": f"the work folder {root} archives to more than the {cap}-byte cap "
                         f"(Limits.work_archive_mb = {cap / (1 << 20):g} MiB): its files could not be "
                         "snapshotted, so this world cannot be resumed, forked or dumped until they shrink"}
    except OSError as exc:
        return {"error": f"the work folder {root} could not be archived ({type(exc).__name__}: {exc})"}
    return {"files": base64.b64encode(buf.getvalue()).decode("ascii")}


def _inside(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and ".." not in parts and "" not in parts[:-1]


def _restore(root: str, files: str) -> None:
    """Unpack an archive made by :func:`_archive` into ``root``: folders, regular files and hard
    links (to a file of the archive) each inside ``root``, never through a link; symbolic links
    last, whatever they point at (nothing is unpacked through them)."""
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(files, validate=True)), mode="r:gz") as tar:
        members = tar.getmembers()
        links = {m.name.rstrip("/") for m in members if m.issym()}
        files_seen: set[str] = set()
        for m in members:
            name = m.name.rstrip("/")
            parents = name.split("/")[:-1]
            if (not _inside(name) or _carried(m) is None
                    or any("/".join(parents[:i + 1]) in links for i in range(len(parents)))
                    or (m.islnk() and m.linkname not in files_seen)):
                raise ValueError(f"unsafe archive member {m.name!r}")
            if m.isfile():
                files_seen.add(name)
        dirs = []
        for m in members:
            if m.issym():
                continue
            if m.isdir():
                os.makedirs(os.path.join(root, m.name), exist_ok=True)
                dirs.append(m)
            else:
                tar.extract(m, root)
        for m in members:
            if m.issym():
                path = os.path.join(root, m.name.rstrip("/"))
                os.symlink(m.linkname, path)
                os.utime(path, (m.mtime, m.mtime), follow_symlinks=False)
        for m in reversed(dirs):  # a folder's mode and times once its content is in
            path = os.path.join(root, m.name)
            os.chmod(path, m.mode & 0o7777)
            os.utime(path, (m.mtime, m.mtime))


def _default_max_connections(max_sessions: int) -> int:
    """The sessions plus 64, at most half the container's pid limit (each connection is a thread)."""
    n = max_sessions + 64
    for path in ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            n = min(n, int(text) // 2)
        break
    return max(4, n)


def _kill_other_processes(wait: float = 2.0) -> None:
    """Kill every process of the container but this server and its init (agent code's
    children, detached or not). ``kill(-1)`` signals them all in one pass that a fork
    cannot race; then wait (at most ``wait`` seconds) until they are gone, reaping the
    server's own children (init reaps the rest), so that none holds a pid afterwards."""
    deadline = time.monotonic() + wait
    me = os.getpid()
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:  # ProcessLookupError: nothing else is running
            pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        try:
            others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        except OSError:
            return
        if not others or time.monotonic() > deadline:
            return
        time.sleep(0.002)


def _harden() -> None:
    """Make this process non-dumpable: same-uid processes lose access to its
    memory, ``/proc/<pid>/environ`` and ptrace (no capabilities to override)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):  # not Linux: nothing to harden against here
        pass


def main() -> None:
    _harden()
    name = os.environ.get("ENVFACTORY_ENV")
    token_file = os.environ.get("ENVFACTORY_TOKEN_FILE", "")
    try:
        with open(token_file) as f:
            token = f.read().strip()
        os.unlink(token_file)
    except OSError as exc:
        sys.exit(f"envfactory.runtime.serve: cannot read the secret from "
                 f"ENVFACTORY_TOKEN_FILE={token_file!r}: {exc}")
    if not name or not token:
        sys.exit("envfactory.runtime.serve: set ENVFACTORY_ENV (the environment) and "
                 "ENVFACTORY_TOKEN_FILE (the secret)")
    module = os.environ.get("ENVFACTORY_MODULE")
    if module:
        importlib.import_module(module)
    spec = get_spec(name)
    spec.get_tasks()  # build and replay the tasks now, not on the first start
    try:
        lifetime = float(os.environ.get("ENVFACTORY_MAX_LIFETIME_S") or 0)
    except ValueError:
        lifetime = 0.0
    if lifetime > 0:
        timer = threading.Timer(lifetime, os._exit, args=(0,))
        timer.daemon = True
        timer.start()
    max_conn = os.environ.get("ENVFACTORY_MAX_CONNECTIONS", "")
    # Killing every other process is only right inside the container, where this server is
    # the child of its init (pid 1) and everything else is agent code.
    reap = os.environ.get("ENVFACTORY_REAP_AGENT_PROCESSES") == "1" and os.getppid() == 1
    cap = os.environ.get("ENVFACTORY_WORK_ARCHIVE_MAX", "")
    Server(spec, token, int(os.environ.get("ENVFACTORY_MAX_SESSIONS", "256")),
           max_connections=int(max_conn) if max_conn.isdigit() else None, reap=reap,
           work_dir=os.environ.get("ENVFACTORY_WORK_DIR") or None,
           work_archive_max=int(cap) if cap.isdigit() else 8 << 20).serve_forever(
        os.environ.get("ENVFACTORY_SOCKET", "/run/envf/s")
    )


if __name__ == "__main__":
    main()
