"""The Docker step's transport floor (issue 60) and the wire's fast paths under it.

* The frame codec (:mod:`envfactory.runtime.wire`) encodes with one C encoder made once and decodes
  with json's scanner called directly: it must give exactly what ``json`` gives (the same text, the
  same values, the same errors), and :func:`~envfactory.runtime.wire.recv_frame`'s one-``recv`` path
  must still refuse what the general path refuses (stray bytes, a body that is not JSON).
* :class:`~envfactory.runtime.container.Container` runs another command under the same hardening
  (the floor's echo server of :func:`benchmarks.docker_runtime.bench_step_floor`), and that floor is
  a fair one: the same request bytes, the real reply's bytes, the same client code.

Runtime: the codec tests about 2 s; the Docker ones about 20 s on 2 cores once the image exists.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.runtime import wire

from conftest import require_docker

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

_reference = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.just("\ud800") | st.just("\udfff\ud800"),
    lambda inner: st.lists(inner) | st.dictionaries(st.text() | st.just("\ud801"), inner)
    | st.dictionaries(st.integers() | st.floats() | st.booleans() | st.none(), inner),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_the_frame_encoder_writes_what_json_writes(value: object) -> None:
    assert wire._dumps(value) == _reference(value)
    assert wire.encode_body(value) == _reference(value).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("bad", [{1, 2}, object(), b"x", {(1, 2): 3}, [1, {"a": {2}}]])
def test_what_json_cannot_hold_is_the_senders_error(bad: object) -> None:
    with pytest.raises(TypeError):
        _reference(bad)
    with pytest.raises(wire.FrameEncodeError):
        wire.encode_body(bad)


def test_a_cycle_is_the_senders_error_and_the_encoder_goes_on() -> None:
    loop: list[object] = []
    loop.append(loop)
    twisted: dict[str, object] = {}
    twisted["self"] = [twisted]
    for bad in (loop, twisted):
        with pytest.raises(wire.FrameEncodeError):
            wire.encode_body(bad)
    # the encoder is shared: a failed frame leaves nothing behind for the next one
    assert wire.encode_body({"a": [loop.__class__.__name__]}) == b'{"a":["list"]}'


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), _values.map(json.dumps)), st.sampled_from(["", " ", "\n", "x", "\u00a0", "{}"]))
def test_the_frame_decoder_reads_what_json_reads(body: str, pad: str) -> None:
    for text in (body, pad + body, body + pad):
        try:
            expected = json.loads(text)
        except (ValueError, RecursionError) as exc:
            with pytest.raises(type(exc)) as got:
                wire._loads(text)
            assert str(got.value) == str(exc)
        else:
            assert json.dumps(wire._loads(text)) == json.dumps(expected)  # NaN-safe equality


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.settimeout(5)
    return a, b


def test_recv_frame_one_recv_and_split_frames_alike() -> None:
    a, b = _pair()
    try:
        doc = {"ok": True, "outcomes": [{"content": "\ud800 x", "ok": True, "kind": "ok"}]}
        a.sendall(wire.encode_frame(doc))
        assert wire.recv_frame(b) == doc
        frame = wire.encode_frame(doc)
        a.sendall(frame[:3])  # a header cut short
        a.sendall(frame[3:])
        assert wire.recv_frame(b) == doc
        a.sendall(wire.frame_of(b"not json"))  # a whole frame that is not JSON: the channel stays in step
        with pytest.raises(wire.FrameDecodeError):
            wire.recv_frame(b)
        a.sendall(wire.frame_of(b""))  # an empty body is no JSON either
        with pytest.raises(wire.FrameDecodeError):
            wire.recv_frame(b)
        a.sendall(wire.encode_frame({"n": 1}))
        assert wire.recv_frame(b) == {"n": 1}
        a.sendall(wire.encode_frame({"n": 2}) + b"!")  # stray bytes after a frame, in the same recv
        with pytest.raises(wire.FrameError):
            wire.recv_frame(b)
    finally:
        a.close()
        b.close()


def test_recv_frame_refuses_a_length_over_the_cap() -> None:
    a, b = _pair()
    try:
        a.sendall(struct.pack(">I", wire.MAX_FRAME + 1) + b"{}")
        with pytest.raises(wire.FrameError):
            wire.recv_frame(b)
    finally:
        a.close()
        b.close()


# -- the floor, in Docker ---------------------------------------------------------------------------
@pytest.mark.docker
def test_a_container_can_run_the_floor_server_under_the_same_hardening() -> None:
    require_docker()
    from benchmarks.docker_runtime import FLOOR_SERVER
    from envfactory.registry import spec
    from envfactory.runtime.container import Container, Limits
    from envfactory.runtime.docker_session import SessionLink
    from envfactory.runtime.pool import Pool

    s = spec("Counter-v0")
    pool = Pool(s, warm=0)
    answer = wire.encode_frame({"ok": True, "outcomes": [{"content": "floor", "ok": True, "kind": "ok"}]})
    c = Container(pool.client, s, pool.image, max_sessions=1, limits=Limits(),
                  command=["python3", "-c", f"REPLY_HEX = {answer.hex()!r}\n" + FLOOR_SERVER])
    try:
        cfg = c.client.api.inspect_container(c.id)
        host = cfg["HostConfig"]
        assert cfg["Config"]["User"] == "10001:10001" and cfg["Config"]["Cmd"][:2] == ["python3", "-c"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
        assert host["NanoCpus"] == 10**9 and host["PidsLimit"] == Limits().pids
        link = SessionLink(pool, "Counter-v0 (floor)", 5.0)
        link.attach(c, "floor")  # the same handshake and peer check as a session's channel
        for _ in range(3):
            assert link.request({"op": "run", "agent": "a", "round": 1, "calls": []})["outcomes"][0]["content"] == "floor"
        link.drop(remove=True)
    finally:
        c.remove()
        pool.shutdown()


@pytest.mark.docker
def test_the_floor_is_measured_with_the_steps_own_request_and_reply() -> None:
    require_docker()
    from benchmarks.docker_runtime import bench_step_floor

    out = bench_step_floor(n=100, repeats=1)
    req = {"op": "run", "agent": "agent_0", "round": 1, "calls": [{"name": "increment", "arguments": {"by": 1}}]}
    reply = {"ok": True, "outcomes": [{"content": "1", "ok": True, "kind": "ok"}]}
    assert out["floor_request_bytes"] == len(wire.encode_frame(req))
    assert out["floor_reply_bytes"] == len(wire.encode_frame(reply))
    for key in ("docker_step", "server_rt", "floor_rt", "local_step"):
        lo, mid, hi = out[f"{key}_p50_us"]
        assert 0 < lo <= mid <= hi
    assert out["docker_step_vs_floor_p50"][1] == pytest.approx(
        out["docker_step_p50_us"][1] / out["floor_rt_p50_us"][1], rel=0.02)


# -- the journal's record of a batch's outcomes (checked when a world is replayed) -----------------
def test_the_journal_keeps_short_outcomes_as_they_are_and_long_ones_as_a_digest() -> None:
    from envfactory.runtime.docker import SHORT_OUTCOMES, _digest, _record

    outs = [{"content": "1", "ok": True, "kind": "ok"}, {"content": "Error: no", "ok": False, "kind": "tool_error"}]
    assert _record(outs) == (("1", True, "ok"), ("Error: no", False, "tool_error"))
    assert _record(outs) == _record(json.loads(json.dumps(outs)))  # what a replay's reply decodes to
    for other in ([{**outs[0], "content": "2"}, outs[1]], outs[:1], [outs[0], {**outs[1], "ok": 0}],
                  [outs[0], {**outs[1], "extra": 1}], [outs[1], outs[0]], None, [1, 2]):
        assert _record(other) != _record(outs)
    long = [{"content": "x" * SHORT_OUTCOMES, "ok": True, "kind": "ok"}]
    assert _record(long) == _digest(long) and _record(long) != _record([{**long[0], "content": "y" * SHORT_OUTCOMES}])


class _ReplayLink:
    """A session link whose fresh session answers a replay with ``outcomes``."""

    def __init__(self, outcomes: list[dict[str, object]]) -> None:
        self.outcomes, self.sent, self.dropped = outcomes, [], False

    def ensure(self) -> None:
        pass

    def request(self, req: dict[str, object]) -> dict[str, object]:
        self.sent.append(req)
        return {"ok": True, "outcomes": self.outcomes} if req["op"] == "run" else {"ok": True}

    def untrustworthy(self, what: str) -> Exception:
        from envfactory.runtime.container import ContainerError

        return ContainerError(what)

    def drop(self, *, remove: bool = False) -> None:
        self.dropped = remove

    def where(self) -> str:
        return "a fresh session"


@pytest.mark.parametrize("same", [True, False])
def test_a_replay_must_give_the_outcomes_the_batch_gave(same: bool) -> None:
    from envfactory.registry import spec
    from envfactory.runtime.container import ContainerLost
    from envfactory.runtime.docker import ContainerWorld, _record
    from envfactory.runtime.docker_session import ContainerDied

    s = spec("Counter-v0")
    first = [{"content": "1", "ok": True, "kind": "ok"}]
    world = ContainerWorld.__new__(ContainerWorld)  # no pool: the link is the fake above
    world.spec, world.resumed, world._state = s, 0, None
    world._task, world._origin, world._origin_files, world._unresumable = s.get_tasks()[0], None, None, None
    run = {"op": "run", "agent": "agent_0", "round": 1, "calls": [{"name": "increment", "arguments": {"by": 1}}]}
    world._journal, world._journal_bytes = [(run, _record(first))], 100
    link = _ReplayLink(first if same else [{"content": "7", "ok": True, "kind": "ok"}])
    world._link = link  # type: ignore[assignment]
    died = ContainerDied("its container died")
    if same:
        world._resume_after(died)
        assert world.resumed == 1 and [r["op"] for r in link.sent] == ["start", "run"]
    else:
        with pytest.raises(ContainerLost, match="gave other outcomes"):
            world._resume_after(died)
        assert link.dropped and world.resumed == 0


# -- the server's plain run reply, written directly -------------------------------------------------
_texts = st.text() | st.just("\ud800") | st.just("a\udfff\ud800\"\\\n\x00\u2028é😀")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_texts, st.booleans(), _texts), max_size=6))
def test_a_plain_run_reply_is_byte_for_byte_what_the_frame_encoder_writes(outs: list[tuple[str, bool, str]]) -> None:
    from envfactory.runtime.serve import _plain_run_body
    from envfactory.tooling import ToolOutcome

    outcomes = [ToolOutcome(c, ok, k) for c, ok, k in outs]
    generic = wire.encode_body({"ok": True, "outcomes": [{"content": o.content, "ok": o.ok, "kind": o.kind}
                                                         for o in outcomes]})
    assert _plain_run_body(outcomes) == generic


def test_a_run_reply_the_direct_writer_cannot_hold_is_built_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # (the state asked for, a snapshot, an outcome of other types, a body over the cap)
    from envfactory.registry import spec
    from envfactory.runtime import serve
    from envfactory.tooling import ToolOutcome
    from envfactory.world import LocalWorld

    assert serve._plain_run_body([ToolOutcome("1", 1, "ok")]) is None  # type: ignore[arg-type]  # 1 is not true
    assert serve._plain_run_body([ToolOutcome(b"1", True, "ok")]) is None  # type: ignore[arg-type]
    s = spec("Counter-v0")
    srv = serve.Server(s, "t", 4)
    sid = srv._add(LocalWorld(s))
    srv._answer(sid, {"op": "start", "task": s.get_tasks()[0].id})
    run = {"op": "run", "agent": "agent_0", "round": 1, "calls": [{"name": "increment", "arguments": {"by": 1}}]}
    assert json.loads(srv._answer(sid, run)) == {"ok": True, "outcomes": [{"content": "1", "ok": True, "kind": "ok"}]}
    with_state = json.loads(srv._answer(sid, {**run, "state": True}))  # asked for the state: the dict path
    assert with_state["outcomes"][0]["content"] == "2" and "state" in with_state
    # over the frame cap: the reply is built as before, whose observations are then cut to fit
    # (test_hostile_wire.py::test_a_reply_over_the_frame_cap_is_capped_not_a_dropped_channel)
    monkeypatch.setattr(wire, "MAX_FRAME", 100)
    assert serve._plain_run_body([ToolOutcome("x" * 60, True, "ok")]) is None
    assert len(serve._plain_run_body([ToolOutcome("x" * 39, True, "ok")]) or b"") == 100
