"""The wire format between the host and ``python -m envfactory.runtime.serve``.

One Unix socket carries two protocols, told apart by a connection's first bytes:

* **HTTP/1.1** (control calls through httpx): ``GET /health``, ``POST /sessions``,
  ``DELETE /sessions/{id}``, ``POST /sessions/{id}/fork``. Each request carries
  the container's secret in the ``X-Envf-Token`` header.
* **The framed channel** (the world's operations): the connection opens with
  :data:`MAGIC` and then exchanges frames, each a 4-byte big-endian length and a
  JSON object in UTF-8 with ``surrogatepass`` (any Python string crosses unchanged,
  code point for code point: a lone surrogate, and two surrogates in a row, which
  ``\\uXXXX`` escapes would have merged into one astral character on the way; a
  receiver also accepts escaped JSON), of at most :data:`MAX_FRAME` bytes. The
  first frame is ``{"token", "session"}``; after that the host sends one request at
  a time and gets one reply frame each, ``{"ok": true, ...}`` or
  ``{"ok": false, "error": "...", "kind": "..."}``:

  - ``{"op": "start", "task": id[, "state": true]}``: a fresh world of the task;
  - ``{"op": "run", "agent", "round", "calls": [{"name", "arguments"}, ...][, "state": true]}``
    -> ``{"outcomes": [{"content", "ok", "kind"}, ...]}``: calls the host already
    parsed and allowed, run in order;
  - ``{"op": "state"}`` -> ``{"state": ...}``; ``{"op": "load", "task", "state"}``.

  ``"state": true`` asks for the state in the same reply (saving a round trip when
  the host needs it after every step). The container never sees an action, a
  turn count or a reward: the rules live on the host.
* **The batch channel** (one per container, for :func:`envfactory.step_many`): a framed
  connection whose first frame is ``{"token", "batch": true}`` (no session). The host sends
  ``{"op": "batch", "items": [[tag, session, request], ...]}`` (``tag``: an int the host
  chose; ``request``: a ``run``, as above) and gets frames ``{"replies": [[tag, reply], ...]}``,
  each reply what the session's own channel would have answered. Replies come as their ops
  finish, in any order and split over any number of frames; an op the host abandoned (its
  session closed while it ran) is never answered. The server runs a batch's ops one after
  another on one thread (no thread hand-off a step); an op that runs past
  :data:`~envfactory.runtime.serve.SLOW_OP_S` leaves the rest of the queue to a new thread,
  so that a slow tool holds only its own session.

This module holds the framing both ends share. Sending: :func:`encode_frame` raises
:class:`FrameEncodeError` (the sender's error; nothing is sent, the channel stays
usable) for an object JSON cannot hold or a frame over the cap. Receiving:
:class:`FrameError` when the channel is broken; :class:`FrameDecodeError` when a whole
frame arrived but is not JSON (the channel stays in step). ``recv_frame(sock,
deadline)`` holds one monotonic deadline over every ``recv`` of the frame, so a peer
that drips bytes cannot stretch a request past its timeout.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

__all__ = ["MAGIC", "TOKEN_HEADER", "FrameError", "FrameEncodeError", "FrameDecodeError", "encode_frame",
           "encode_body", "frame_of", "join_frames", "split_frames",
           "send_frame", "recv_frame", "MAX_FRAME", "state_json", "repair_state_keys"]

MAGIC = b"ENVF"
TOKEN_HEADER = "X-Envf-Token"
MAX_FRAME = 64 << 20
_LEN = struct.Struct(">I")


def _default(o: Any) -> Any:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def _encoder() -> Any:
    """``json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode``, without building its
    C encoder anew for every object (half of a small frame's encoding time): one C encoder, made
    once, with no table of the containers being encoded (a cycle, which that table would name, is a
    ``RecursionError`` instead, as deep nesting already is: :func:`encode_body` answers both alike)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: json's own
        return json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    chunks = make(None, _default, json.encoder.encode_basestring, None, ":", ",", False, False, True)
    join = "".join

    def dumps(obj: Any) -> str:
        return join(chunks(obj, 0))

    return dumps


_dumps = _encoder()
# the C scanner behind json.loads, without its wrappers (as envfactory.parsing does)
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(text: str) -> Any:
    """``json.loads(text)``: the scanner called directly when it takes the whole text (what the
    encoders here send: no whitespace around it), else ``json.loads`` itself (its value, its error)."""
    try:
        obj, end = _scan(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return obj


class FrameError(ConnectionError):
    """The peer closed the channel or sent something that is not a frame."""


class FrameEncodeError(ValueError):
    """An object cannot be sent as a frame (JSON cannot hold it, or it is over
    :data:`MAX_FRAME`); nothing was sent."""


class FrameDecodeError(ValueError):
    """A whole frame arrived but its body is not JSON (nor within the decoder's depth)."""


def encode_body(obj: Any) -> bytes:
    """A frame's body: the JSON of ``obj`` (UTF-8, surrogates passed through). :class:`FrameEncodeError`
    for a set, an object, a cycle, an int over the conversion limit, or a body over the cap."""
    try:
        body = _dumps(obj).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError) as exc:
        raise FrameEncodeError(f"not JSON-encodable ({type(exc).__name__}: {str(exc)[:200]})") from None
    if len(body) > MAX_FRAME:
        raise FrameEncodeError(f"a frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return body


def frame_of(body: bytes) -> bytes:
    """The frame of a body :func:`encode_body` made (or one joined from such bodies, within the cap)."""
    return _LEN.pack(len(body)) + body


def join_frames(head: bytes, parts: list[bytes], tail: bytes) -> list[bytes]:
    """Frames ``head + b",".join(parts) + tail`` (each part a JSON value, each at most
    ``MAX_FRAME - 64`` bytes), as many as the cap needs, the parts in order."""
    frames: list[bytes] = []
    chunk: list[bytes] = []
    size = len(head) + len(tail)
    for part in parts:
        if chunk and size + len(part) + 1 > MAX_FRAME:
            frames.append(frame_of(head + b",".join(chunk) + tail))
            chunk, size = [], len(head) + len(tail)
        chunk.append(part)
        size += len(part) + 1
    if chunk:
        frames.append(frame_of(head + b",".join(chunk) + tail))
    return frames


def encode_frame(obj: Any) -> bytes:
    """One frame: the length and the JSON of ``obj`` (:func:`encode_body`'s errors)."""
    return frame_of(encode_body(obj))


def send_frame(sock: socket.socket, obj: Any) -> None:
    """Send one JSON frame (a single ``sendall``: one syscall for small frames)."""
    sock.sendall(encode_frame(obj))


def _arm(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("the deadline passed")
    sock.settimeout(left)


def recv_exact(sock: socket.socket, n: int, buf: bytearray, deadline: float | None = None) -> None:
    """Append exactly ``n`` bytes from ``sock`` to ``buf``; :class:`FrameError` on EOF,
    ``socket.timeout`` once ``deadline`` (``time.monotonic()``) has passed."""
    while n > 0:
        if deadline is not None:
            _arm(sock, deadline)
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise FrameError("the peer closed the connection")
        buf += chunk
        n -= len(chunk)


def recv_frame(sock: socket.socket, deadline: float | None = None, *, armed: bool = False) -> Any:
    """Receive one JSON frame. Usually one ``recv`` for the header and body together.

    ``deadline`` (a ``time.monotonic()`` value) bounds the whole frame, every ``recv``
    together: past it, ``socket.timeout``. ``armed``: the socket's timeout already ends the
    first ``recv`` at the deadline (the caller set it just before; each ``settimeout`` is a
    system call that releases the GIL), so only later ``recv`` calls are armed. :class:`FrameError`
    when the channel is broken (EOF, a frame over the cap, stray bytes); :class:`FrameDecodeError`
    when the frame's body is not JSON."""
    if deadline is not None and not armed:
        _arm(sock, deadline)
    data = sock.recv(65536)
    got = len(data)
    if got > 4 and _LEN.unpack_from(data)[0] == got - 4:  # the usual: one recv, one whole frame
        return _decode(data[4:])
    if not data:
        raise FrameError("the peer closed the connection")
    buf = bytearray(data)
    if len(buf) < 4:
        recv_exact(sock, 4 - len(buf), buf, deadline)
    (n,) = _LEN.unpack_from(buf)
    if n > MAX_FRAME:
        raise FrameError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
    missing = n + 4 - len(buf)
    if missing > 0:
        recv_exact(sock, missing, buf, deadline)
    elif missing < 0:
        raise FrameError("unexpected bytes after a frame (one request at a time per channel)")
    return _decode(bytes(buf[4:]))


def _decode(body: bytes) -> Any:
    try:
        return _loads(body.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise FrameDecodeError(f"a frame that is not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


def split_frames(buf: bytearray) -> list[Any]:
    """The whole frames at the start of ``buf``, decoded, and removed from it (a frame still
    arriving stays). :class:`FrameError` for a length over the cap; :class:`FrameDecodeError` for
    a body that is not JSON (the frames before it are lost with it: the channel is then broken)."""
    out = []
    at, end = 0, len(buf)
    while end - at >= 4:
        (n,) = _LEN.unpack_from(buf, at)
        if n > MAX_FRAME:
            raise FrameError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
        if end - at - 4 < n:
            break
        out.append(_decode(bytes(buf[at + 4:at + 4 + n])))
        at += 4 + n
    del buf[:at]
    return out



# -- states as JSON ------------------------------------------------------------------------------
# pydantic-core's ``model_dump(mode="json")`` replaces a lone surrogate in a dict *key* with
# U+FFFD (one per UTF-8 byte), while values keep theirs: a path an agent wrote as
# "/home/user/\ud800" would come back as another key after crossing the wire. The keys are
# put back from the python-mode dump (same dicts, same order), only when a U+FFFD shows up.
_FFFD = "\ufffd"


def _fix_keys(py: Any, js: Any) -> Any:
    if js.__class__ is dict:
        if isinstance(py, dict) and len(py) == len(js):
            return {(pk if pk.__class__ is str and _FFFD in jk else jk): _fix_keys(pv, jv)
                    for (pk, pv), (jk, jv) in zip(py.items(), js.items())}
        if hasattr(py, "__dict__") and not isinstance(py, dict):  # a nested model
            return {k: _fix_keys(getattr(py, k, None), v) for k, v in js.items()}
        return js
    if js.__class__ is list and isinstance(py, (list, tuple, set, frozenset)) and len(py) == len(js):
        return [_fix_keys(p, j) for p, j in zip(py, js)]
    return js


def _fffd_key(js: Any) -> bool:
    if js.__class__ is dict:
        return any(_FFFD in k for k in js) or any(_fffd_key(v) for v in js.values())
    if js.__class__ is list:
        return any(_fffd_key(v) for v in js)
    return False


def repair_state_keys(state: Any, data: Any) -> Any:
    """``data`` (``state.model_dump(mode="json")``) with the dict keys that held lone
    surrogates restored from ``state`` (see above)."""
    return _fix_keys(state, data)


def state_json(state: Any) -> Any:
    """``state.model_dump(mode="json")``, lone surrogates in dict keys kept."""
    data = state.model_dump(mode="json")
    return repair_state_keys(state, data) if _fffd_key(data) else data
