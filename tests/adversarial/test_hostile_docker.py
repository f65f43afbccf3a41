"""One session's hostile input never ends another's (issue 17), on the Docker runtime:
two episodes share one container; one of them sends what used to break the channel
(lone surrogates, arguments JSON cannot hold, a frame that is not JSON, a reply over
the frame cap) and the other, the bystander, must keep its session and keep working.

Runtime: about 20 s on 2 cores once the image exists (one shared container).
"""

from __future__ import annotations

import struct

import pytest

import envfactory
from envfactory import ToolCall, call
from envfactory.registry import spec as get_spec
from envfactory.runtime import wire

from conftest import require_docker

pytestmark = pytest.mark.docker
TODO = "/home/user/notes/todo.txt"


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


@pytest.fixture(scope="module")
def pool():
    from envfactory.runtime.pool import Pool

    p = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=8)
    yield p
    p.shutdown()


def _exists(container_id: str) -> bool:
    from envfactory.runtime.pool import docker_client

    return bool(docker_client().containers.list(all=True, filters={"id": container_id}))


def _pair(pool):
    """The attacker and the bystander: two live episodes in one shared container."""
    a = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
    b = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
    a.reset(0)
    b.reset(0)
    assert a._world.container is b._world.container
    return a, b


def _bystander_is_fine(b, container) -> None:
    assert b._world.container is container and not container.dead and _exists(container.id)
    local = envfactory.make("FileSystem-v0")
    local.reset(0)
    action = call("read_file", path=TODO)
    assert b.step(action).messages == local.step(action).messages


def test_lone_surrogates_do_not_end_the_shared_container(pool) -> None:
    a, b = _pair(pool)
    c = a._world.container
    local = envfactory.make("FileSystem-v0")
    local.reset(0)
    actions = [
        call("read_file", path="/\ud800"),  # a tool argument; the tool's error echoes it back
        '<tool_call>{"name": "read_file", "arguments": {"path": "/\\udfff"}}</tool_call>',  # escaped in text
        '<tool_call>{"name": "write_file", "arguments": {"path": "/home/user/x.txt", "content": "a\ud800"}}'
        "</tool_call>",  # raw in model text
        call("read_file", path="/home/user/x.txt"),
    ]
    for action in actions:
        r = a.step(action)
        assert r.messages == local.step(action).messages
    assert a._world.container is c and not c.dead
    assert a.state.fs.files["/home/user/x.txt"] == "a\ud800"
    _bystander_is_fine(b, c)
    a.close()
    b.close()


def test_arguments_the_host_cannot_encode_are_the_callers_error(pool) -> None:
    a, b = _pair(pool)
    c = a._world.container
    cyclic: dict = {}
    cyclic["me"] = cyclic
    r = a.step(ToolCall("write_file", {"path": "/home/user/y.txt", "content": {1, 2}}))
    assert not r.done and r.messages[0]["content"].startswith("Error: ") and "JSON" in r.messages[0]["content"]
    a.snapshot()
    # The world itself (below the parser) answers each such call as invalid and runs the rest.
    outs = a._world.run("agent_0", 2, [ToolCall("write_file", {"path": "/home/user/y.txt", "content": cyclic}),
                                      ToolCall("write_file", {"path": "/home/user/y.txt", "content": 10 ** 5000}),
                                      ToolCall("write_file", {"path": "/home/user/y.txt", "content": object()}),
                                      call("read_file", path=TODO)])
    assert [o.kind for o in outs] == ["invalid_arguments"] * 3 + ["ok"]
    assert a._world.container is c and not c.dead
    assert "/home/user/y.txt" not in a.state.fs.files
    _bystander_is_fine(b, c)
    a.close()
    b.close()


@pytest.mark.parametrize("body", [b"\xff\xfe", b"{not json", b"[" * 100_000], ids=["utf8", "json", "deep"])
def test_a_frame_that_is_not_json_is_answered_and_the_channel_lives(pool, body) -> None:
    a, b = _pair(pool)
    c = a._world.container
    chan = a._world._link._chan
    chan.sendall(struct.pack(">I", len(body)) + body)
    reply = wire.recv_frame(chan)
    assert reply["ok"] is False and "bad request" in reply["error"]
    assert a.step(call("read_file", path=TODO)).messages[0]["content"].startswith("Move ")
    assert a._world.container is c
    _bystander_is_fine(b, c)
    a.close()
    b.close()


def test_a_reply_over_the_frame_cap_is_cut_not_a_dropped_channel(pool) -> None:
    a, b = _pair(pool)
    c = a._world.container
    ten_mib = "z" * (10 << 20)
    assert a.step(call("write_file", path="/home/user/big.txt", content=ten_mib)).messages[0]["content"].startswith(
        "Wrote")
    r = a.step([call("read_file", path="/home/user/big.txt")] * 7)  # 70 MiB of reply > the 64 MiB cap
    assert not r.done and len(r.messages) == 7
    # the turn's observations are cut at the observation cap (issue 28) before any frame fills up:
    # the first keeps MAX_OBSERVATION_CHARS, the others are the note alone, as in-process
    from envfactory import quotas

    contents = [m["content"] for m in r.messages]
    assert contents[0] == "z" * quotas.MAX_OBSERVATION_CHARS + quotas.OBSERVATION_CUT
    assert contents[1:] == [quotas.OBSERVATION_CUT] * 6
    assert a._world.container is c and not c.dead
    assert a.step(call("delete_file", path="/home/user/big.txt")).messages[0]["content"].startswith("Deleted")
    _bystander_is_fine(b, c)
    a.close()
    b.close()


def test_a_lone_surrogate_in_a_state_judged_by_its_hash_ends_the_episode_alike(pool) -> None:
    """Found beside the 10**6-output fuzz (whose lanes play a task judged by its answer, so they
    never hashed such a state): a file whose content holds a lone surrogate, on a task judged by the
    final state's hash, made ``step("done")`` raise ``UnicodeEncodeError`` out of the hash, in-process
    and on Docker alike. The hash passes the surrogate through; the episode ends, reward 0, alike."""
    ends = []
    for ep in (envfactory.make("FileSystem-v0"), envfactory.make("FileSystem-v0", runtime="docker", pool=pool)):
        ep.reset("fs-000")
        ep.step(envfactory.call("write_file", path="/home/user/x.txt", content="a\ud800b"))
        r = ep.step("done")
        ends.append((r.info["ended_by"], r.reward, r.done))
        ep.close()
    assert ends == [("answer", 0.0, True)] * 2
