"""``envfactory.step_many``: one turn in each of many episodes from one thread, the container worlds'
round trips in flight together (issue 29: 1,000 sessions at twice the steps/s of threads, each
waiting on its own reply). Without Docker: each world's session lives on the real environment
server (:class:`envfactory.runtime.serve.Server`) in this process, on a socket pair, as in
``tests/adversarial/test_hostile_wire.py``; the Docker run is ``test_docker_parity``'s business
and the figure is ``python -m benchmarks.docker_runtime sessions driver=step_many``'s."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import envfactory
import envfactory.runtime.container
from envfactory import EpisodeError, step_many
from envfactory.episode import Episode
from envfactory.registry import spec as get_spec
from envfactory.runtime import wire
from envfactory.runtime.batch import BatchChannel
from envfactory.runtime.serve import Server

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "adversarial"))
from test_hostile_wire import TOKEN, FakeContainer, _link_to, _world_on, increment_as  # noqa: E402

_calls = st.sampled_from([
    '<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>',
    '<tool_call>{"name": "increment", "arguments": {"by": 11}}</tool_call>',
    '<tool_call>{"name": "reset_counter", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call> and <tool_call>{"name": "increment", '
    '"arguments": {"by": 1}}</tool_call>',
    "<tool_call>{oops</tool_call>",
    "The counter shows 10.",
])


def _episodes(srv: Server, n: int, timeout: float = 30.0, max_turns: int = 4) -> list[Episode]:
    out = []
    for _ in range(n):
        world, _ = _world_on(srv, "Counter-v0", timeout)
        ep = Episode(get_spec("Counter-v0"), world, max_turns=max_turns)
        ep.reset(0)
        out.append(ep)
    return out


def _seen(ep: Episode, r) -> tuple:
    return r.messages, r.reward, r.terminated, r.truncated, r.info, r.rewards


@pytest.mark.parametrize("batched", [False, True], ids=["sessions' channels", "batch channel"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_calls, min_size=4, max_size=4), min_size=1, max_size=5))
def test_step_many_plays_what_step_plays(batched, rounds) -> None:
    """Rounds of turns over container worlds, played with ``step_many`` and, on twins, with ``step``
    one at a time: the same results, transcripts, states and verdicts; over each session's own
    channel, or all of them over their container's batch channel (a frame a round at most)."""
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    many, c = _batched(srv, 4) if batched else (_episodes(srv, 4), None)
    one = _episodes(srv, 4)
    for actions in rounds:
        live = [(i, a) for i, a in enumerate(actions) if not many[i].done]
        got = step_many([(many[i], a) for i, a in live])
        want = [one[i].step(a) for i, a in live]
        assert [_seen(many[i], r) for (i, _), r in zip(live, got)] == [_seen(one[i], r) for (i, _), r in zip(live, want)]
    for a, b in zip(many, one):
        assert a.transcript() == b.transcript() and a.status.log == b.status.log and a.state == b.state and a.success == b.success
        a.close()
        b.close()
    if c is not None:
        assert c._b is None or c._b.frames_sent <= len(rounds)


def test_step_many_overlaps_the_round_trips_and_mixes_in_process_episodes() -> None:
    """Eight sessions whose server answers each call after 0.3 s take one wait, not eight; an
    in-process episode in the same call is played while they run."""
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    eps = _episodes(srv, 8)
    local = envfactory.make("Counter-v0")
    local.reset(0)
    with increment_as(srv, lambda fn: lambda state, by=1: (time.sleep(0.3), fn(state, by))[1]):
        t0 = time.monotonic()
        results = step_many([(e, '<tool_call>{"name": "increment", "arguments": {"by": 3}}</tool_call>') for e in eps]
                            + [(local, '<tool_call>{"name": "increment", "arguments": {"by": 5}}</tool_call>')])
        took = time.monotonic() - t0
    assert [r.messages[0]["content"] for r in results] == ["3"] * 8 + ["5"]
    assert took < 8 * 0.3 / 2, took  # one thread, yet not one wait after another


def test_a_reply_that_never_comes_ends_that_turn_at_its_deadline_only() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    fine = _episodes(srv, 2)
    silent, _, _ = _link_to(lambda sock: time.sleep(30))  # reads nothing, answers nothing
    world, _ = _world_on(srv, "Counter-v0", 1.0)
    stuck = Episode(get_spec("Counter-v0"), world, max_turns=4)
    stuck.reset(0)
    world._link._chan = silent._chan  # its next request goes to the silent peer
    call = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    t0 = time.monotonic()
    a, gone, b = step_many([(fine[0], call), (stuck, call), (fine[1], call)])
    assert time.monotonic() - t0 < 10
    assert a.messages[0]["content"] == b.messages[0]["content"] == "1"
    assert gone.truncated and gone.info.get("timeout") and gone.info["ended_by"] == "timeout", gone.info
    assert "did not finish within" in gone.messages[0]["content"]


def test_protocol_errors_come_before_anything_is_sent() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    (ep,) = _episodes(srv, 1)
    call = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    with pytest.raises(EpisodeError, match="twice"):
        step_many([(ep, call), (ep, call)])
    fresh = envfactory.make("Counter-v0")  # never reset
    with pytest.raises(EpisodeError):
        step_many([(ep, call), (fresh, call)])
    assert ep.status.turns_taken() == 0  # nothing was sent for it
    team = envfactory.make("MultiDeal-v0")
    team.reset(0)
    with pytest.raises(EpisodeError, match="team"):
        step_many([(team, call)])
    assert step_many([(ep, call)])[0].messages[0]["content"] == "1"


def test_an_error_in_one_turn_is_raised_after_the_sent_turns_are_played() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    sent = _episodes(srv, 3)
    local = envfactory.make("Counter-v0")
    local.reset(0)
    call = '<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>'
    with pytest.raises(envfactory.ActionTypeError):
        step_many([(e, call) for e in sent] + [(local, 12345)])
    for e in sent:  # each sent turn was read and played: the channel is in step for the next one
        assert e.status.turns_taken() == 1 and e.state.value == 2
        assert e.step(call).messages[0]["content"] == "4"


# -- the batch channel: a container's turns in one frame ---------------------------------------
class BatchedContainer(FakeContainer):
    """A FakeContainer whose server (in this process) also serves a batch channel."""

    def __init__(self, srv: Server, serve=None) -> None:
        self.srv, self.serve, self.dead, self._b = srv, serve, False, None

    def answers(self) -> bool:  # a channel that broke: the container is asked (here, one that died)
        return False

    def batch_channel(self):
        if self._b is None:
            host, far = socket.socketpair()
            threading.Thread(target=self.serve or self.srv._handle, args=(far,), daemon=True).start()
            host.settimeout(30)
            host.sendall(wire.MAGIC + wire.encode_frame({"token": TOKEN, "batch": True}))
            assert wire.recv_frame(host) == {"ok": True}
            self._b = BatchChannel(self, host)
        return None if self._b.broken else self._b


def _batched(srv: Server, n: int, timeout: float = 30.0, container=None,
             max_turns: int = 4) -> tuple[list[Episode], BatchedContainer]:
    c = container or BatchedContainer(srv)
    out = []
    for _ in range(n):
        world, _ = _world_on(srv, "Counter-v0", timeout)
        world._link.container = c
        ep = Episode(get_spec("Counter-v0"), world, max_turns=max_turns)
        ep.reset(0)
        out.append(ep)
    return out, c


INC = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'


def test_a_round_of_a_containers_turns_is_one_frame() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    eps, c = _batched(srv, 8)
    for n in (1, 2):
        assert [r.messages[0]["content"] for r in step_many([(e, INC) for e in eps])] == [str(n)] * 8
    assert c._b.frames_sent == 2


def test_a_slow_op_holds_only_its_own_session() -> None:
    """One turn's tool sleeps past its step timeout, among five fast ones queued behind it on the
    same batch channel: the watcher hands the queue to a new runner, so only the slow turn times
    out (one runner alone would have held every other turn past its deadline too)."""
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    eps, c = _batched(srv, 6, timeout=1.0)
    with increment_as(srv, lambda fn: lambda state, by=1: (time.sleep(3.0) if by == 7 else None, fn(state, by))[1]):
        t0 = time.monotonic()
        results = step_many([(eps[0], INC.replace('"by": 1', '"by": 7'))] + [(e, INC) for e in eps[1:]])
        took = time.monotonic() - t0
    assert results[0].truncated and results[0].info["ended_by"] == "timeout", results[0].info
    assert [r.messages[0]["content"] for r in results[1:]] == ["1"] * 5
    assert took < 2.5, took
    # the channel goes on: the late reply of the abandoned turn (if it comes) is dropped
    again = step_many([(e, INC) for e in eps[1:]])
    assert [r.messages[0]["content"] for r in again] == ["2"] * 5


def _first_batch(sock: socket.socket) -> None:
    """A fake batch channel's server: the handshake accepted, the first batch read (and dropped)."""
    sock.recv(len(wire.MAGIC))
    wire.recv_frame(sock)
    wire.send_frame(sock, {"ok": True})
    wire.recv_frame(sock)


def test_a_batch_channel_that_breaks_ends_its_turns_as_lost_not_hung() -> None:
    """The container closes the batch channel after reading a batch (it died): every turn of it is
    resumed, and here (a pool that has no fresh container) ends as ``world_lost``; none waits for
    its deadline."""
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)

    def dies(sock: socket.socket) -> None:
        _first_batch(sock)
        sock.close()

    def no_fresh_container(exclude=()):
        raise envfactory.runtime.container.ContainerError("no engine here")

    c = BatchedContainer(srv, dies)
    eps, _ = _batched(srv, 3, timeout=20.0, container=c)
    for e in eps:
        e._world._link.pool.acquire = no_fresh_container
    t0 = time.monotonic()
    results = step_many([(e, INC) for e in eps])
    assert time.monotonic() - t0 < 10
    assert c.dead
    for r in results:
        assert r.truncated and r.info.get("world_lost"), r.info


def test_a_batch_reply_that_breaks_the_protocol_removes_the_container() -> None:
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)

    def lies(sock: socket.socket) -> None:
        _first_batch(sock)
        wire.send_frame(sock, {"replies": [["not a tag", {}]]})
        time.sleep(30)

    c = BatchedContainer(srv, lies)
    eps, _ = _batched(srv, 2, timeout=20.0, container=c)
    with pytest.raises(envfactory.runtime.container.ContainerError, match="untrustworthy"):
        step_many([(e, INC) for e in eps])
    assert c.dead
    assert all(e._world._link.container is None for e in eps)  # both sessions dropped with it


def test_two_threads_share_a_container_each_one_a_round_at_a_time() -> None:
    """Two threads' step_many calls on sessions of one container: one holds the batch channel, the
    other's turns go over their sessions' channels; every result is right."""
    srv = Server(get_spec("Counter-v0"), TOKEN, 128)
    eps, c = _batched(srv, 16)
    halves = [eps[:8], eps[8:]]
    errors: list[BaseException] = []

    def play(mine) -> None:
        try:
            for n in range(1, 4):
                got = [r.messages[0]["content"] for r in step_many([(e, INC) for e in mine])]
                assert got == [str(n)] * 8, got
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    ts = [threading.Thread(target=play, args=(h,)) for h in halves]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors


def test_a_due_snapshot_comes_in_the_batchs_own_reply(monkeypatch) -> None:
    """Every SNAPSHOT_EVERY batches the journal restarts from the state after a batch: that state
    comes in the batch's reply (no ``state`` request of its own, no round trip more), through
    ``step`` and through ``step_many`` alike, and it is the state the world then has."""
    from envfactory.runtime import docker as docker_rt

    monkeypatch.setattr(docker_rt, "SNAPSHOT_EVERY", 2)
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    ops: list[str] = []
    op = srv._op
    monkeypatch.setattr(srv, "_op", lambda world, req: (ops.append(req.get("op")), op(world, req))[1])
    (a,), _ = _batched(srv, 1, max_turns=100)
    (b,) = _episodes(srv, 1, max_turns=100)
    snaps = docker_rt.stats()["snapshots"]
    for n in range(1, 6):
        step_many([(a, INC)])
        b.step(INC)
        if n == 3:  # the third batch's reply brought the state (cached: no request) and became the origin
            for e in (a, b):
                assert e._world._journal == [] and e._world._origin == docker_rt.state_json(e._world.state())
                assert e._world._origin["value"] == 3, e._world._origin
    assert "state" not in ops and ops.count("run") == 10
    assert docker_rt.stats()["snapshots"] - snaps == 2  # one for each world
    assert len(a._world._journal) == len(b._world._journal) == 2


def test_return_exceptions_keeps_each_turns_error_in_its_place() -> None:
    """With ``return_exceptions``, a turn that cannot be played (an ended episode, an action of no
    accepted type) is its exception in the list, and every other turn is played: what a rollout
    needs, where one failing episode fails only itself."""
    srv = Server(get_spec("Counter-v0"), TOKEN, 64)
    eps, _ = _batched(srv, 3)
    ended = envfactory.make("Counter-v0", max_turns=1)
    ended.reset(0)
    ended.step(INC)
    local = envfactory.make("Counter-v0")
    local.reset(0)
    got = step_many([(eps[0], INC), (ended, INC), (local, 12345), (eps[1], INC), (eps[2], INC)], return_exceptions=True)
    assert isinstance(got[1], EpisodeError) and isinstance(got[2], envfactory.ActionTypeError)
    assert [got[i].messages[0]["content"] for i in (0, 3, 4)] == ["1", "1", "1"]
    with pytest.raises(EpisodeError, match="twice"):  # a caller's mistake is still raised
        step_many([(eps[0], INC), (eps[0], INC)], return_exceptions=True)
