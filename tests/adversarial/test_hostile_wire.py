"""The wire between the host and a container's server, attacked from both ends
without Docker (issue 17): the real :class:`envfactory.runtime.serve.Server` in this process
on a socket pair, and hostile fake servers the host talks to.

* one session's bad request or unencodable reply is an error for that session only:
  the server keeps serving it and every other session;
* the host never trusts a reply: one deadline per request covers every ``recv``,
  bodies are capped, and a malformed reply is a :class:`ContainerError` (the
  container removed), never a raw ``KeyError`` / ``AttributeError`` / ``RecursionError``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import tempfile
import threading
import time
from typing import Any, Iterator

import httpcore
import httpx
import pytest
from hypothesis import given, settings, strategies as st

from envfactory import ToolCall, call
from envfactory.registry import spec as get_spec
from envfactory.runtime import wire
from envfactory.runtime.container import Container, ContainerError, _VerifiedBackend
from envfactory.runtime.docker import ContainerWorld
from envfactory.runtime.docker_session import SessionLink
from envfactory.runtime.serve import Server
from envfactory.world import WorldTimeout

TOKEN = "t" * 32


# -- helpers ----------------------------------------------------------------------------
def _raw(obj_json: bytes) -> bytes:
    return struct.pack(">I", len(obj_json)) + obj_json


def _serve(srv: Server) -> tuple[socket.socket, str]:
    """A new session on ``srv`` and a framed channel to it (the server side on a thread)."""
    sid = srv.route("POST", "/sessions")["session"]
    host, far = socket.socketpair()
    threading.Thread(target=srv._handle, args=(far,), daemon=True).start()
    host.settimeout(30)
    host.sendall(wire.MAGIC + _raw(b'{"token":"' + TOKEN.encode() + b'","session":"' + sid.encode() + b'"}'))
    assert wire.recv_frame(host) == {"ok": True}
    return host, sid


@contextlib.contextmanager
def increment_as(srv: Server, wrap: Any) -> Iterator[None]:
    """Within the block, ``srv``'s ``increment`` tool is ``wrap(the tool's function)``."""
    tool = srv.spec.all_tools["increment"]
    fn = tool.fn
    object.__setattr__(tool, "fn", wrap(fn))
    try:
        yield
    finally:
        object.__setattr__(tool, "fn", fn)


def _ask(chan: socket.socket, body: bytes) -> Any:
    chan.sendall(_raw(body))
    return wire.recv_frame(chan)


class FakeContainer:
    name = "envf-fake"
    dead = False
    sessions = 1
    retiring = False

    def check_memory(self) -> bool:  # the engine's figure: none here, never past the mark
        return False

    def describe_exit(self) -> str:
        return "fake"

    def batch_channel(self) -> None:  # none: step_many's turns go over the sessions' channels
        return None

    def call(self, method: str, path: str, json: Any = None) -> Any:
        return {"ok": True}


class FakePool:
    def __init__(self) -> None:
        self.discarded: list[Any] = []
        self.spec = None

    def discard(self, c: Any) -> None:
        c.dead = True
        self.discarded.append(c)

    def release(self, c: Any) -> None:
        pass


def _world_on(srv: Server, name: str, timeout: float = 30.0) -> tuple[ContainerWorld, FakePool]:
    """A ContainerWorld whose session lives on the in-process server ``srv``."""
    pool = FakePool()
    world = ContainerWorld(get_spec(name), step_timeout=timeout, pool=pool)
    chan, sid = _serve(srv)
    link = world._link
    link.container, link.session, link._chan = FakeContainer(), sid, chan
    return world, pool


def _link_to(fake_server) -> tuple[SessionLink, FakePool, threading.Thread]:
    """A SessionLink whose channel's far end is ``fake_server(sock)``, on a thread."""
    pool = FakePool()
    link = SessionLink(pool, "Fake-v0", 1.0)
    host, far = socket.socketpair()
    t = threading.Thread(target=fake_server, args=(far,), daemon=True)
    t.start()
    link.container, link.session, link._chan = FakeContainer(), "s1", host
    return link, pool, t


def _read_request(sock: socket.socket) -> None:
    (n,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
    sock.recv(n, socket.MSG_WAITALL)


# -- the server: one session's hostile input stays that session's ----------------------
@pytest.fixture
def fs_server() -> Server:
    return Server(get_spec("FileSystem-v0"), TOKEN, 8)


def test_lone_surrogates_in_arguments_and_replies_keep_every_session(fs_server) -> None:
    a, _ = _serve(fs_server)
    b, _ = _serve(fs_server)
    for chan in (a, b):
        assert _ask(chan, b'{"op":"start","task":"' + get_spec("FileSystem-v0").get_tasks()[0].id.encode() + b'"}')["ok"]
    # A lone surrogate, escaped (the host encodes ASCII-safe): the tool's error echoes it back.
    reply = _ask(a, b'{"op":"run","agent":"agent_0","round":1,"calls":[{"name":"read_file",'
                    b'"arguments":{"path":"/\\ud800"}}],"state":true}')
    assert reply["ok"] and reply["outcomes"][0]["content"] == "Error: file /\ud800 does not exist"
    reply = _ask(a, b'{"op":"run","agent":"agent_0","round":2,"calls":[{"name":"write_file",'
                    b'"arguments":{"path":"/home/user/x.txt","content":"\\ud800"}}],"state":true}')
    assert reply["ok"] and reply["outcomes"][0]["ok"], reply
    assert reply["state"]["fs"]["files"]["/home/user/x.txt"] == "\ud800"
    assert _ask(b, b'{"op":"state"}')["ok"]  # the bystander is served
    assert _ask(a, b'{"op":"state"}')["ok"]  # and so is the session that sent it


@pytest.mark.parametrize("body", [b"\xff\xfe not utf-8", b"{not json", b"[" * 200_000 + b"]" * 200_000,
                                  b"[1, 2]", b'{"op": "run", "calls": 5}'],
                         ids=["utf8", "json", "deep", "list", "calls"])
def test_a_bad_request_is_an_error_for_that_session_only(fs_server, body) -> None:
    a, _ = _serve(fs_server)
    b, _ = _serve(fs_server)
    reply = _ask(a, body)
    assert reply["ok"] is False and isinstance(reply["error"], str)
    assert _ask(a, b'{"op":"state"}')["ok"] is False  # no task started: an error, and the channel lives
    assert _ask(b, b'{"op":"start","task":"' + get_spec("FileSystem-v0").get_tasks()[0].id.encode() + b'"}')["ok"]
    assert _ask(b, b'{"op":"state"}')["ok"]


def test_a_reply_over_the_frame_cap_is_capped_not_a_dropped_channel(fs_server, monkeypatch) -> None:
    monkeypatch.setattr(wire, "MAX_FRAME", 64 << 10)
    a, _ = _serve(fs_server)
    tid = get_spec("FileSystem-v0").get_tasks()[0].id
    assert _ask(a, json.dumps({"op": "start", "task": tid}).encode())["ok"]
    for i, tool in enumerate(("write_file", "append_file")):
        reply = _ask(a, json.dumps({"op": "run", "agent": "agent_0", "round": i + 1, "calls": [
            {"name": tool, "arguments": {"path": "/home/user/big.txt", "content": "x" * (40 << 10)}}]}).encode())
        assert reply["outcomes"][0]["ok"], reply
    reply = _ask(a, json.dumps({"op": "run", "agent": "agent_0", "round": 3, "calls": [
        {"name": "read_file", "arguments": {"path": "/home/user/big.txt"}}] * 6}).encode())
    assert reply["ok"] and len(reply["outcomes"]) == 6  # 6 x 80 KiB > 64 KiB: each cut to fit
    for o in reply["outcomes"]:
        assert o["ok"] and o["content"].startswith("xxx") and "truncated" in o["content"]
    # A reply that cannot be cut (the state itself is over the cap): an error for this session
    reply = _ask(a, b'{"op":"state"}')
    assert reply["ok"] is False and "reply" in reply["error"]
    assert _ask(a, json.dumps({"op": "start", "task": tid}).encode())["ok"]  # the channel lives
    assert _ask(a, b'{"op":"state"}')["ok"]


# -- the host: arguments it cannot encode are that call's error ------------------------
def test_unencodable_arguments_are_that_calls_error_not_a_container_fault(fs_server) -> None:
    world, pool = _world_on(fs_server, "FileSystem-v0")
    task = get_spec("FileSystem-v0").get_tasks()[0]
    world.start(task)
    cyclic: dict = {}
    cyclic["me"] = cyclic
    calls = [ToolCall("write_file", {"path": "/home/user/a.txt", "content": {1, 2}}),
             ToolCall("write_file", {"path": "/home/user/b.txt", "content": "fine \ud800"}),
             ToolCall("write_file", {"path": "/home/user/c.txt", "content": cyclic}),
             ToolCall("write_file", {"path": "/home/user/d.txt", "content": 10 ** 5000}),
             ToolCall("write_file", {"path": "/home/user/e.txt", "content": object()}),
             ToolCall("read_file", {"path": "/home/user/b.txt"})]
    outs = world.run("agent_0", 1, calls)
    assert [o.kind for o in outs] == ["invalid_arguments", "ok", "invalid_arguments", "invalid_arguments",
                                      "invalid_arguments", "ok"]
    assert all(o.content.startswith("Error: invalid arguments for tool 'write_file'") for o in outs if not o.ok)
    assert outs[-1].content == "fine \ud800"
    assert not pool.discarded and world.container is not None
    assert "/home/user/a.txt" not in world.state().fs.files
    assert world.state().fs.files["/home/user/b.txt"] == "fine \ud800"


def test_a_batch_over_the_frame_cap_runs_in_order_and_a_call_over_it_is_invalid(fs_server, monkeypatch) -> None:
    monkeypatch.setattr(wire, "MAX_FRAME", 64 << 10)
    world, pool = _world_on(fs_server, "FileSystem-v0")
    world.start(get_spec("FileSystem-v0").get_tasks()[0])
    path = "/home/user/log.txt"
    calls = [call("write_file", path=path, content="")]
    calls += [call("append_file", path=path, content=ch * (20 << 10)) for ch in "abc"]  # 60 KiB: 3 requests
    calls += [call("append_file", path=path, content="d" * (40 << 10))]  # over half the cap: refused alone
    calls += [call("append_file", path=path, content="e")]
    outs = world.run("agent_0", 1, calls)
    assert [o.kind for o in outs] == ["ok"] * 4 + ["invalid_arguments", "ok"], outs
    assert not pool.discarded
    assert world.state().fs.files[path] == "a" * (20 << 10) + "b" * (20 << 10) + "c" * (20 << 10) + "e"


# -- the host: a hostile container ------------------------------------------------------
def test_one_deadline_covers_every_recv_of_a_request() -> None:
    """A reply dripped a byte at a time, each within the per-recv timeout, used to hold a
    step for as long as the drip lasted (here about 20 s for a 1 s step timeout)."""
    def drip(sock: socket.socket) -> None:
        _read_request(sock)
        reply = _raw(b'{"ok":true,"outcomes":[],"pad":"' + b"x" * 24 + b'"}')
        try:
            for i in range(len(reply)):
                sock.sendall(reply[i:i + 1])
                time.sleep(0.4)
        except OSError:
            pass

    link, pool, _ = _link_to(drip)
    t0 = time.monotonic()
    with pytest.raises(WorldTimeout, match="did not finish within 1.0s"):
        link.request({"op": "run", "calls": []}, overrun=WorldTimeout)
    assert time.monotonic() - t0 < 10  # generous: the drip would last about 20 s
    assert pool.discarded  # the container is recycled


@pytest.mark.parametrize("reply", [
    b"[1, 2]", b'"ok"', b"null", b"[" * 200_000 + b"]" * 200_000, b"\xff\xfe", b"{oops",
    b'{"ok": "yes"}', b'{"ok": false, "error": {"x": 1}, "kind": ["KeyError"]}',
    b'{"ok": false, "error": "e", "kind": {"a": 1}}', b'{"ok": true, "outcomes": 5}',
    b'{"ok": true, "outcomes": [null]}', b'{"ok": true, "outcomes": [{"content": "x"}]}',
], ids=["list", "str", "null", "deep", "utf8", "json", "ok-type", "error-types", "kind-dict",
        "outcomes-type", "outcome-null", "outcome-keys"])
def test_a_malformed_reply_is_a_container_fault(reply: bytes) -> None:
    def fake(sock: socket.socket) -> None:
        _read_request(sock)
        sock.sendall(_raw(reply))
        time.sleep(5)

    pool = FakePool()
    world = ContainerWorld(get_spec("Counter-v0"), step_timeout=5, pool=pool)
    world._task = get_spec("Counter-v0").get_tasks()[0]
    host, far = socket.socketpair()
    threading.Thread(target=fake, args=(far,), daemon=True).start()
    link = world._link
    link.container, link.session, link._chan = FakeContainer(), "s1", host
    with pytest.raises(ContainerError):
        world.run("agent_0", 1, [call("increment", by=1)])
    assert pool.discarded and world.container is None  # removed as untrustworthy


# -- the host: HTTP control calls and the channel handshake -----------------------------
def _fake_container(path: str, timeout: float = 1.0) -> Container:
    c = Container.__new__(Container)
    c.spec, c.name, c.token, c.socket_path = get_spec("Counter-v0"), "envf-fake", TOKEN, path
    c.dead, c.sessions, c._pid, c.client, c.id = False, 0, os.getpid(), None, "fake"
    transport = httpx.HTTPTransport(uds=path)
    transport._pool = httpcore.ConnectionPool(uds=path, network_backend=_VerifiedBackend(c))
    c.http = httpx.Client(transport=transport, base_url="http://envf", timeout=timeout)
    return c


def _listen(answer) -> tuple[str, socket.socket]:
    d = tempfile.mkdtemp()
    path = os.path.join(d, "s")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return path, srv


def _http_answer(head: bytes, body_chunks, delay: float = 0.0):
    def answer(conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(head)
            for chunk in body_chunks():
                conn.sendall(chunk)
                if delay:
                    time.sleep(delay)
        except OSError:
            pass
        finally:
            time.sleep(0.2)
            conn.close()
    return answer


def test_a_huge_http_body_is_capped() -> None:
    body = lambda: (b"[" + b"0," * (1 << 19) for _ in range(40))  # noqa: E731  (40 MiB)
    path, srv = _listen(_http_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 41943080\r\n\r\n", body))
    c = _fake_container(path, timeout=30)
    with pytest.raises(ContainerError, match="bytes"):
        c.call("POST", "/sessions")
    srv.close()


def test_a_dripped_http_reply_runs_into_one_deadline() -> None:
    drip = lambda: (b" " for _ in range(40))  # noqa: E731
    path, srv = _listen(_http_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\n\r\n", drip, delay=0.4))
    c = _fake_container(path, timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(ContainerError, match="timed out"):
        c.call("POST", "/sessions")
    assert time.monotonic() - t0 < 10  # generous: the drip lasts about 16 s
    srv.close()


@pytest.mark.parametrize("status,body", [(200, b"[1]"), (200, b"{oops"), (500, b"[1]"), (500, b"{}"),
                                         (200, b'{"session": 5}'), (200, b"{}")])
def test_a_malformed_http_reply_is_a_container_fault(status: int, body: bytes) -> None:
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    path, srv = _listen(_http_answer(head, lambda: [body]))
    c = _fake_container(path, timeout=5)
    link = SessionLink(FakePool(), "Counter-v0", 5)
    link.pool.acquire = lambda exclude=(): c  # Pool.acquire(exclude=refused containers)
    with pytest.raises(ContainerError):
        link.ensure()  # POST /sessions, then the channel
    srv.close()


@pytest.mark.parametrize("hello", [b"[1]", b'"ok"', b"{oops", b"[" * 200_000], ids=["list", "str", "json", "deep"])
def test_a_malformed_handshake_is_a_container_fault(hello: bytes) -> None:
    def answer(conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(_raw(hello))
            time.sleep(2)
        except OSError:
            pass
        finally:
            conn.close()

    path, srv = _listen(answer)
    c = _fake_container(path)
    with pytest.raises(ContainerError):
        c.open_channel("s1", 5)
    srv.close()


# -- the batch channel ---------------------------------------------------------------------------
def _batch_channel(srv: Server, token: str = TOKEN) -> socket.socket:
    host, far = socket.socketpair()
    threading.Thread(target=srv._handle, args=(far,), daemon=True).start()
    host.settimeout(10)
    host.sendall(wire.MAGIC + wire.encode_frame({"token": token, "batch": True}))
    return host


def _open_batch(srv: Server) -> socket.socket:
    """A batch channel to ``srv``, its handshake accepted."""
    b = _batch_channel(srv)
    assert wire.recv_frame(b) == {"ok": True}
    return b


def _replies(chan: socket.socket, n: int) -> dict[int, Any]:
    """Read batch reply frames until ``n`` replies are in: ``{tag: reply}``."""
    got: dict[int, Any] = {}
    while len(got) < n:
        frame = wire.recv_frame(chan)
        assert isinstance(frame, dict) and "replies" in frame, frame
        got.update({tag: reply for tag, reply in frame["replies"]})
    return got


def _run(by: int = 1) -> dict[str, Any]:
    return {"op": "run", "agent": "agent", "round": 1, "calls": [{"name": "increment", "arguments": {"by": by}}]}


def test_the_batch_channel_needs_the_token() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 8)
    chan = _batch_channel(srv, "x" * 32)
    assert wire.recv_frame(chan)["ok"] is False
    with pytest.raises((wire.FrameError, OSError)):
        wire.recv_frame(chan)  # closed


def test_hostile_batches_get_an_error_and_the_channel_keeps_serving() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 8)
    chan, sid = _serve(srv)
    b = _open_batch(srv)
    for bad in (b"{not json", b"[]", b'{"op": "batch"}', b'{"op": "batch", "items": [[1, 2]]}',
                b'{"op": "batch", "items": [["tag", "' + sid.encode() + b'", {}]]}',
                b'{"op": "batch", "items": [[1.5, "s", {}]]}', b'{"op": "other", "items": []}'):
        reply = _ask(b, bad)
        assert reply["ok"] is False and reply["kind"] == "bad_request", (bad, reply)
    assert _ask(b, b'{"op": "batch", "items": [[1, "' + sid.encode() + b'", "not a request"]]}')["kind"] == "bad_request"
    _start(chan)
    wire.send_frame(b, {"op": "batch", "items": [[7, sid, _run(2)]]})
    assert _replies(b, 1) == {7: _replies_ok(2)}  # the channel kept serving


def _start(chan: socket.socket) -> None:
    assert _ask(chan, json.dumps({"op": "start", "task": get_spec("Counter-v0").get_tasks()[0].id}).encode())["ok"]


def test_a_batch_runs_run_ops_only_and_answers_each_item_on_its_own() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 8)
    chan, sid = _serve(srv)
    _start(chan)
    b = _open_batch(srv)
    wire.send_frame(b, {"op": "batch", "items": [[1, sid, _run(2)], [2, sid, {"op": "state"}], [3, "nope", _run()],
                                                 [4, sid, {"op": "run"}], [5, sid, _run(3)]]})
    got = _replies(b, 5)
    assert got[1]["ok"] and got[1]["outcomes"][0]["content"] == "2"
    assert got[2]["ok"] is False and "run" in got[2]["error"]  # no state, load or judge op here
    assert got[3]["ok"] is False and "closed" in got[3]["error"]  # no such session
    assert got[4]["ok"] is False and got[4]["kind"] == "KeyError"  # a run without its fields
    assert got[5]["ok"] and got[5]["outcomes"][0]["content"] == "5"  # the session went on, in order


def test_an_abandoned_sessions_op_in_a_batch_is_never_answered_and_the_rest_are() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 8)
    a, slow = _serve(srv)
    c, fast = _serve(srv)
    _start(a)
    _start(c)

    def slow_nine(fn):
        def increment(state, by=1):
            for _ in range(300 if by == 9 else 1):  # 9: three seconds, in Python (a stop lands between sleeps)
                time.sleep(0.01)
            return fn(state, by)
        return increment

    with increment_as(srv, slow_nine):
        b = _open_batch(srv)
        wire.send_frame(b, {"op": "batch", "items": [[1, slow, _run(9)], [2, fast, _run(1)]]})
        assert _replies(b, 1) == {2: _replies_ok(1)}  # answered while the slow op still runs
        t0 = time.monotonic()
        srv.route("DELETE", f"/sessions/{slow}")  # the host gave up on it: the op is stopped
        assert time.monotonic() - t0 < 1.0
        wire.send_frame(b, {"op": "batch", "items": [[3, fast, _run(1)]]})
        assert _replies(b, 1) == {3: _replies_ok(2)}  # nothing ever came for tag 1


def _replies_ok(value: int) -> dict[str, Any]:
    return {"ok": True, "outcomes": [{"content": str(value), "ok": True, "kind": "ok"}]}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=30), st.integers(1, 40))
def test_joined_frames_stay_under_the_cap_and_split_back_in_order(texts, cut) -> None:
    """``join_frames`` (a batch, or its replies) never makes a frame over the cap, and
    ``split_frames`` gives the parts back in order from any prefix of the stream (a frame still
    arriving stays in the buffer)."""
    old = wire.MAX_FRAME
    wire.MAX_FRAME = 300
    try:
        parts = [wire.encode_body(t) for t in texts if len(wire.encode_body(t)) <= wire.MAX_FRAME - 64]
        frames = wire.join_frames(b'{"replies":[', parts, b"]}")
        assert all(len(f) - 4 <= wire.MAX_FRAME for f in frames)
        stream = b"".join(frames)
        buf = bytearray(stream[:cut])
        got = wire.split_frames(buf)
        buf += stream[cut:]
        got += wire.split_frames(buf)
        assert not buf
        assert [x for f in got for x in f["replies"]] == [json.loads(p) for p in parts]
    finally:
        wire.MAX_FRAME = old


def test_a_batch_channel_without_a_thread_is_refused_as_busy_and_steps_go_on(monkeypatch) -> None:
    """A container at its pid limit cannot start the batch channel's watcher: it answers the
    handshake as busy (never an ``ok`` and then a closed channel, which the host would take for a
    dead container), and the host's turns go over their sessions' channels."""
    from envfactory.runtime import serve as serve_mod

    srv = Server(get_spec("Counter-v0"), TOKEN, 8)
    real = serve_mod.threading.Thread

    class NoWatcher(real):  # type: ignore[misc, valid-type]
        def start(self) -> None:
            if self.name == "envf-batch-watch":
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(serve_mod.threading, "Thread", NoWatcher)
    b = _batch_channel(srv)
    reply = wire.recv_frame(b)
    assert reply["ok"] is False and reply["kind"] == "busy", reply


def test_an_op_that_raises_system_exit_in_a_batch_is_its_own_error() -> None:
    """A tool that raises ``SystemExit`` (no ``Exception``) answers its own item: the call's error
    outcome, as in-process and on a session's channel (issue 63: one fault, one behaviour; it was
    an error reply, a ``ContainerError`` on the host); the batch's runner goes on with the items
    behind it."""
    srv = Server(get_spec("Counter-v0"), TOKEN, 8)
    a, sid = _serve(srv)
    _start(a)

    def exits_on_13(fn):
        def increment(state, by=1):
            if by == 13:
                raise SystemExit("a tool that exits")
            return fn(state, by)
        return increment

    with increment_as(srv, exits_on_13):
        b = _open_batch(srv)
        wire.send_frame(b, {"op": "batch", "items": [[1, sid, _run(13)], [2, sid, _run(2)]]})
        got = _replies(b, 2)
        assert got[1] == {"ok": True, "outcomes": [{"content": "Error: tool 'increment' failed: SystemExit: a tool "
                                                               "that exits", "ok": False, "kind": "exception"}]}, got[1]
        assert got[2] == _replies_ok(2)
