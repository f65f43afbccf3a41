"""``python -m envfactory.serve``: the server inside an environment's container.

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

* ``ENVF_ENV``: the environment name; ``ENVF_MODULE``: the module that registers it;
* ``ENVF_TOKEN_FILE``: a file holding the secret every request must carry.
  The server reads and deletes it before it listens, and marks itself
  non-dumpable, so processes that agent code starts in the container (same
  uid, no capabilities) can read neither the file nor the server's memory, and
  cannot issue calls of their own;
* ``ENVF_SOCKET`` (default ``/run/envf/s``); ``ENVF_MAX_SESSIONS`` (default 256).

Hostile input stays with the session that sent it: a request frame that is not
JSON, or a request that fails, gets an error reply on that session's channel,
which keeps serving; every reply is encoded ASCII-safe (a lone surrogate a tool
echoes back cannot break it); a ``run`` reply over the frame cap has its
observations cut to fit (each says how much was cut), and any other reply that
cannot be sent becomes an error reply. Other sessions never notice.
"""

from __future__ import annotations

import ctypes
import hmac
import importlib
import json
import os
import secrets
import socket
import sys
import threading
from typing import Any

from .definition import ToolEnvSpec
from .registry import spec as get_spec
from .runtime import wire
from .runtime.wire import (MAGIC, TOKEN_HEADER, FrameDecodeError, FrameEncodeError, FrameError, encode_frame,
                           recv_frame, send_frame)
from .task import ToolCall
from .world import LocalWorld

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
    __slots__ = ("world", "lock")

    def __init__(self, world: LocalWorld) -> None:
        self.world = world
        self.lock = threading.Lock()


class Server:
    """Worlds of one environment behind the socket protocol.

    Args:
        spec: The environment served.
        token: The secret every request must present.
        max_sessions: Sessions allowed at once (1 for per-session containers).
    """

    def __init__(self, spec: ToolEnvSpec, token: str, max_sessions: int = 256) -> None:
        self.spec = spec
        self._token = token.encode()
        self.max_sessions = max_sessions
        self.sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def _add(self, world: LocalWorld) -> str:
        with self._lock:
            if len(self.sessions) >= self.max_sessions:
                raise _HTTPError(409, f"this container holds at most {self.max_sessions} session(s)")
            sid = secrets.token_hex(6)
            self.sessions[sid] = _Session(world)
        return sid

    def _authorized(self, token: Any) -> bool:
        if isinstance(token, str):
            token = token.encode()
        return isinstance(token, bytes) and hmac.compare_digest(token, self._token)

    # -- HTTP control calls ---------------------------------------------
    def route(self, method: str, path: str) -> Any:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if method == "GET" and parts == ["health"]:
            return {"ok": True, "env": self.spec.name, "sessions": len(self.sessions), "pid": os.getpid()}
        if method == "POST" and parts == ["sessions"]:
            return {"session": self._add(LocalWorld(self.spec))}
        if method == "DELETE" and len(parts) == 2 and parts[0] == "sessions":
            with self._lock:
                self.sessions.pop(parts[1], None)
            return {"ok": True}
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
        sid = hello.get("session")
        if sid not in self.sessions:
            send_frame(conn, {"ok": False, "error": f"no session {sid!r} in this container"})
            return
        send_frame(conn, {"ok": True})
        sessions, op = self.sessions, self._op
        while True:
            try:
                req = recv_frame(conn)
            except FrameDecodeError as exc:  # the whole frame was read: the channel is in step
                conn.sendall(encode_frame({"ok": False, "error": f"bad request: {exc}", "kind": "bad_request"}))
                continue
            s = sessions.get(sid)
            try:
                if s is None:
                    raise LookupError(f"session {sid!r} was closed")
                with s.lock:
                    reply = op(s.world, req)
            except (KeyError, ValueError, TypeError) as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "kind": type(exc).__name__}
            except Exception as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "kind": "internal"}
            try:
                frame = encode_frame(reply)
            except FrameEncodeError as exc:
                frame = self._fallback(reply, exc)
            conn.sendall(frame)

    @staticmethod
    def _fallback(reply: dict[str, Any], err: FrameEncodeError) -> bytes:
        """A reply that could not be encoded: a ``run``'s observations cut to fit the frame
        cap, else an error for this session (its channel and every other go on)."""
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
                return encode_frame(reply)
            except FrameEncodeError as exc:
                err = exc
        return encode_frame({"ok": False, "kind": "reply_error",
                             "error": f"the reply could not be sent ({err}); this session's world may have "
                                      "changed: start it again"})

    def _op(self, world: LocalWorld, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "run":
            outs = world.run(req["agent"], req["round"], [ToolCall(c["name"], c["arguments"]) for c in req["calls"]])
            reply = {"ok": True, "outcomes": [{"content": o.content, "ok": o.ok, "kind": o.kind} for o in outs]}
        elif op == "start":
            world.start(self.spec.task(req["task"]))
            reply = {"ok": True}
        elif op == "state":
            return {"ok": True, "state": world.dump()}
        elif op == "load":
            world.load(self.spec.task(req["task"]), req["state"])
            return {"ok": True}
        else:
            raise ValueError(f"unknown op {op!r}")
        if req.get("state"):
            reply["state"] = world.dump()
        return reply

    # -- connections -----------------------------------------------------
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
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()


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
    name = os.environ.get("ENVF_ENV")
    token_file = os.environ.get("ENVF_TOKEN_FILE", "")
    try:
        with open(token_file) as f:
            token = f.read().strip()
        os.unlink(token_file)
    except OSError as exc:
        sys.exit(f"envfactory.serve: cannot read the secret from ENVF_TOKEN_FILE={token_file!r}: {exc}")
    if not name or not token:
        sys.exit("envfactory.serve: set ENVF_ENV (the environment) and ENVF_TOKEN_FILE (the secret)")
    module = os.environ.get("ENVF_MODULE")
    if module:
        importlib.import_module(module)
    spec = get_spec(name)
    spec.get_tasks()  # build and replay the tasks now, not on the first start
    Server(spec, token, int(os.environ.get("ENVF_MAX_SESSIONS", "256"))).serve_forever(
        os.environ.get("ENVF_SOCKET", "/run/envf/s")
    )


if __name__ == "__main__":
    main()
