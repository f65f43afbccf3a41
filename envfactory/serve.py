"""``python -m envfactory.serve``: the server inside an environment's container.

It hosts :class:`~envfactory.runtime.local.LocalEnv` sessions of one
environment (:class:`~envfactory.multi.episode.MultiEpisode` sessions for a
multi-agent one, see :func:`_multi_op`) and answers on a Unix socket in a folder the host bind-mounts (the
container has no network). The wire format is in
:mod:`envfactory.runtime.wire`: HTTP/1.1 for control calls, a length-prefixed
JSON channel for the step path, both on the same socket.

Configuration (environment variables, set by the host):

* ``ENVF_ENV``: the environment name; ``ENVF_MODULE``: the module that registers it;
* ``ENVF_TOKEN_FILE``: a file holding the secret every request must carry.
  The server reads and deletes it before it listens, and marks itself
  non-dumpable, so processes that agent code starts in the container (same
  uid, no capabilities) can read neither the file nor the server's memory, and
  cannot issue calls of their own;
* ``ENVF_SOCKET`` (default ``/run/envf/s``); ``ENVF_MAX_SESSIONS`` (default 256).

Trust: the host never takes this server's word for a reward. It fetches the
final state, validates it and runs the task's success check itself.
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

from .env import EpisodeError
from .registry import spec as get_spec
from .runtime.local import LocalEnv
from .runtime.wire import MAGIC, TOKEN_HEADER, FrameError, recv_frame, send_frame
from .definition import ToolEnvSpec

__all__ = ["Server", "main"]

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            409: "Conflict", 500: "Internal Server Error"}
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Session:
    __slots__ = ("env", "lock")

    def __init__(self, env: LocalEnv) -> None:
        self.env = env
        self.lock = threading.Lock()


class Server:
    """Sessions of one environment behind the socket protocol.

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
        # A multi-agent spec is served as MultiEpisode sessions (see _multi_op).
        self.multi = bool(getattr(spec, "multi_agent", False))

    # -- sessions --------------------------------------------------------
    def _add(self, env: LocalEnv) -> str:
        with self._lock:
            if len(self.sessions) >= self.max_sessions:
                raise _HTTPError(409, f"this container holds at most {self.max_sessions} session(s)")
            sid = secrets.token_hex(6)
            self.sessions[sid] = _Session(env)
        return sid

    def _get(self, sid: str) -> _Session:
        s = self.sessions.get(sid)
        if s is None:
            raise _HTTPError(404, f"no session {sid!r} in this container (closed, or never created)")
        return s

    def _authorized(self, token: str | bytes | None) -> bool:
        if token is None:
            return False
        if isinstance(token, str):
            token = token.encode()
        return hmac.compare_digest(token, self._token)

    # -- HTTP control calls ---------------------------------------------
    def route(self, method: str, path: str, body: bytes) -> Any:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if method == "GET" and parts == ["health"]:
            return {"ok": True, "env": self.spec.name, "sessions": len(self.sessions), "pid": os.getpid()}
        if parts[:1] != ["sessions"]:
            raise _HTTPError(404, f"no route {method} {path}")
        if method == "POST" and len(parts) == 1:
            args = json.loads(body or b"{}")
            if self.multi:
                from .multi.episode import MultiEpisode

                return {"session": self._add(MultiEpisode(self.spec, max_rounds=args.get("max_rounds")))}
            return {"session": self._add(LocalEnv(self.spec, max_turns=args.get("max_turns")))}
        if len(parts) < 2:
            raise _HTTPError(404, f"no route {method} {path}")
        sid = parts[1]
        if method == "DELETE" and len(parts) == 2:
            with self._lock:
                self.sessions.pop(sid, None)
            return {"ok": True}
        s = self._get(sid)
        op = parts[2] if len(parts) > 2 else ""
        with s.lock:
            if method == "GET" and op == "snapshot":
                return s.env.snapshot()
            if method == "GET" and op == "state":
                return {"state": s.env.state.model_dump(mode="json")}
            if method == "POST" and op == "restore":
                s.env.restore(json.loads(body))
                return {"ok": True}
            if method == "POST" and op == "fork":
                child = s.env.fork()
        if method == "POST" and op == "fork":
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
            body = rf.read(n) if n else b""
            try:
                if not self._authorized(headers.get(TOKEN_HEADER.lower())):
                    raise _HTTPError(401, "missing or wrong token")
                status, doc = 200, self.route(method, target, body)
            except _HTTPError as exc:
                status, doc = exc.status, {"error": str(exc)}
            except (EpisodeError, KeyError, ValueError, TypeError) as exc:
                status, doc = 400, {"error": f"{type(exc).__name__}: {exc}", "kind": type(exc).__name__}
            except Exception as exc:  # report, keep serving
                status, doc = 500, {"error": f"{type(exc).__name__}: {exc}"}
            payload = _dumps(doc).encode()
            conn.sendall(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode("latin-1") + payload
            )
            if headers.get("connection", "").lower() == "close":
                return

    # -- the framed step channel ----------------------------------------
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
        sessions = self.sessions
        frame_op = _multi_op if self.multi else self._frame_op
        while True:
            req = recv_frame(conn)
            s = sessions.get(sid)
            if s is None:
                send_frame(conn, {"ok": False, "error": f"session {sid!r} was closed",
                                  "kind": "EpisodeError"})
                continue
            try:
                with s.lock:
                    reply = frame_op(s.env, req)
            except EpisodeError as exc:
                reply = {"ok": False, "error": str(exc), "kind": "EpisodeError"}
            except (KeyError, ValueError, TypeError) as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "kind": type(exc).__name__}
            except Exception as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "kind": "internal"}
            send_frame(conn, reply)

    @staticmethod
    def _frame_op(env: LocalEnv, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "step":
            r = env.step(req["action"])
            msgs = env.messages
            reply = {"ok": True, "assistant": msgs[len(msgs) - len(r.messages) - 1], "messages": r.messages,
                     "terminated": r.terminated, "truncated": r.truncated, "info": r.info}
            if r.terminated or r.truncated:
                reply["state"] = env.state.model_dump(mode="json")
            return reply
        if op == "reset":
            return {"ok": True, "messages": env.reset(req["task"])}
        if op == "state":
            return {"ok": True, "state": env.state.model_dump(mode="json")}
        if op == "ping":
            return {"ok": True}
        raise ValueError(f"unknown op {op!r}")

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


def _multi_op(ep: Any, req: dict[str, Any]) -> dict[str, Any]:
    """One framed request on a multi-agent session (a ``MultiEpisode``).

    Ops: ``reset {task}``, ``act {agent, action}``, ``step {actions}``,
    ``views {have}``, ``state``. ``act``/``step`` replies carry the turn results,
    the log entries they added, each agent's observation and the tail of its
    messages from ``have[agent] - 1`` (only a conversation's last message, the
    undelivered letters, can change; the rest only grows), and the state when
    the episode ended or ``state`` was asked for. The host judges the outcome.
    """
    op = req.get("op")
    if op == "state":
        return {"ok": True, "state": ep.state.model_dump(mode="json")}
    if op == "reset":
        ep.reset(req["task"])
        return {"ok": True, **_multi_views(ep, {})}
    if op == "views":
        return {"ok": True, **_multi_views(ep, req.get("have") or {})}
    if op not in ("act", "step"):
        raise ValueError(f"unknown op {op!r}")
    n_log = len(ep.log)
    if op == "act":
        results = {req["agent"]: ep.act(req["agent"], req["action"])}
    else:
        results = ep.step(req["actions"])
    reply = {"ok": True, "results": {a: r.to_json() for a, r in results.items()}, "log": ep.log[n_log:],
             **_multi_views(ep, req.get("have") or {})}
    if ep.done or req.get("state"):
        reply["state"] = ep.state.model_dump(mode="json")
    return reply


def _multi_views(ep: Any, have: dict[str, int]) -> dict[str, Any]:
    return {"observations": {a: ep.observation(a) for a in ep.agents},
            "tails": {a: ep.messages(a)[max(0, int(have.get(a, 0)) - 1):] for a in ep.agents}}


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
    spec.get_tasks()  # build and replay the tasks now, not on the first reset
    Server(spec, token, int(os.environ.get("ENVF_MAX_SESSIONS", "256"))).serve_forever(
        os.environ.get("ENVF_SOCKET", "/run/envf/s")
    )


if __name__ == "__main__":
    main()
