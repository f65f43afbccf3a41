"""The wire format between the host and ``python -m envfactory.serve``.

One Unix socket carries two protocols, told apart by a connection's first bytes:

* **HTTP/1.1** (control calls through httpx): ``GET /health``, ``POST /sessions``,
  ``DELETE /sessions/{id}``, ``POST /sessions/{id}/fork``. Each request carries
  the container's secret in the ``X-Envf-Token`` header.
* **The framed channel** (the world's operations): the connection opens with
  :data:`MAGIC` and then exchanges frames, each a 4-byte big-endian length and a
  UTF-8 JSON object. The first frame is ``{"token", "session"}``; after that the
  host sends one request at a time and gets one reply frame each,
  ``{"ok": true, ...}`` or ``{"ok": false, "error": "...", "kind": "..."}``:

  - ``{"op": "start", "task": id[, "state": true]}``: a fresh world of the task;
  - ``{"op": "run", "agent", "round", "calls": [{"name", "arguments"}, ...][, "state": true]}``
    -> ``{"outcomes": [{"content", "ok", "kind"}, ...]}``: calls the host already
    parsed and allowed, run in order;
  - ``{"op": "state"}`` -> ``{"state": ...}``; ``{"op": "load", "task", "state"}``.

  ``"state": true`` asks for the state in the same reply (saving a round trip when
  the host needs it after every step). The container never sees an action, a
  turn count or a reward: the rules live on the host.

This module holds the framing both ends share.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

__all__ = ["MAGIC", "TOKEN_HEADER", "FrameError", "send_frame", "recv_frame", "MAX_FRAME"]

MAGIC = b"ENVF"
TOKEN_HEADER = "X-Envf-Token"
MAX_FRAME = 64 << 20
_LEN = struct.Struct(">I")
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads


class FrameError(ConnectionError):
    """The peer closed the channel or sent something that is not a frame."""


def send_frame(sock: socket.socket, obj: Any) -> None:
    """Send one JSON frame (a single ``sendall``: one syscall for small frames)."""
    body = _dumps(obj).encode()
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_exact(sock: socket.socket, n: int, buf: bytearray) -> None:
    """Append exactly ``n`` bytes from ``sock`` to ``buf``; :class:`FrameError` on EOF."""
    while n > 0:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise FrameError("the peer closed the connection")
        buf += chunk
        n -= len(chunk)


def recv_frame(sock: socket.socket) -> Any:
    """Receive one JSON frame. Usually one ``recv`` for the header and body together."""
    data = sock.recv(65536)
    if not data:
        raise FrameError("the peer closed the connection")
    buf = bytearray(data)
    if len(buf) < 4:
        recv_exact(sock, 4 - len(buf), buf)
    (n,) = _LEN.unpack_from(buf)
    if n > MAX_FRAME:
        raise FrameError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
    missing = n + 4 - len(buf)
    if missing > 0:
        recv_exact(sock, missing, buf)
    elif missing < 0:
        raise FrameError("unexpected bytes after a frame (one request at a time per channel)")
    return _loads(bytes(buf[4:]))

