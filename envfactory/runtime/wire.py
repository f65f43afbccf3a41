"""The wire format between the host and ``python -m envfactory.serve``.

One Unix socket carries two protocols, told apart by a connection's first bytes:

* **HTTP/1.1** (control calls through httpx): ``GET /health``, ``POST /sessions``,
  ``DELETE /sessions/{id}``, ``GET /sessions/{id}/snapshot``,
  ``POST /sessions/{id}/restore``, ``POST /sessions/{id}/fork``,
  ``GET /sessions/{id}/state``. Each request carries the container's secret in
  the ``X-Envf-Token`` header.
* **The framed channel** (the step path): the connection opens with
  :data:`MAGIC` and then exchanges frames, each a 4-byte big-endian length and a
  UTF-8 JSON object. The first frame is ``{"token", "session"}``; after that the
  host sends ``{"op": "reset" | "step" | "state", ...}`` and gets one reply frame
  per request: ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.

This module holds what both ends share: framing, and converting an action into
JSON without changing what :func:`envfactory.parsing.parse_action` makes of it.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from ..task import ToolCall

__all__ = ["MAGIC", "TOKEN_HEADER", "FrameError", "send_frame", "recv_frame", "action_to_json",
           "MAX_FRAME"]

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


def action_to_json(action: Any) -> Any:
    """``action`` as JSON data that parses exactly like the original.

    :class:`ToolCall` objects (alone, in lists, or in an assistant message's
    ``tool_calls``) become ``{"name", "arguments"[, "id"]}`` objects, which
    :func:`~envfactory.parsing.parse_action` reads back into the same calls.
    """
    if isinstance(action, ToolCall):
        return action.to_json()
    if isinstance(action, (list, tuple)):
        return [action_to_json(a) for a in action]
    if isinstance(action, dict) and isinstance(action.get("tool_calls"), (list, tuple)):
        out = dict(action)
        out["tool_calls"] = [action_to_json(a) for a in action["tool_calls"]]
        return out
    return action
