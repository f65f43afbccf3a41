"""Per-session quotas on the Docker runtime, the same as in-process; every way out of the world,
judging and fork included, through the lost-world handling (issue 28).

Before: write a 1 MB file, then 255 ``copy_file`` calls a turn, and ending the episode raised
``ContainerDied`` out of ``step()`` (the judge's state fetch was outside the referee's handling; the
shared container died of the state's size); a 256 MiB read was cut at the reply cap on Docker and
returned whole in-process; after a ``docker kill``, ``fork()`` raised ``ContainerError`` while the
parent's next step resumed. Now both runtimes refuse the same copies (``MAX_STATE_BYTES``), cut
the same observations (``MAX_OBSERVATION_CHARS``), a world lost while judged ends the episode
``world_lost``, and a fork resumes the world first, as a step does.

Runtime: about 30-60 s on 2 cores once the image exists (a kill waits for a fresh container).
"""

from __future__ import annotations


import pytest

import envfactory
from envfactory import call
from envfactory.registry import spec as get_spec

from conftest import require_docker

pytestmark = pytest.mark.docker
BIG = "/home/user/big.txt"


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


@pytest.fixture(scope="module")
def pool():
    from envfactory.runtime.pool import Pool

    p = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=8)
    yield p
    p.shutdown()


def _both(pool, **kw):
    local = envfactory.make("FileSystem-v0")
    remote = envfactory.make("FileSystem-v0", runtime="docker", pool=pool, **kw)
    local.reset(0)
    remote.reset(0)
    return local, remote


def _same_step(local, remote, action):
    a, b = local.step(action), remote.step(action)
    assert b.messages == a.messages
    assert (b.reward, b.terminated, b.truncated) == (a.reward, a.terminated, a.truncated)
    return b


def test_copy_file_amplification_is_refused_alike_and_the_episode_ends(pool) -> None:
    local, remote = _both(pool)
    _same_step(local, remote, [call("write_file", path=BIG, content="x" * 1_000_000)])
    refused = 0
    for turn in range(3):
        r = _same_step(local, remote, [call("copy_file", source=BIG, destination=f"/home/user/c{turn}_{i}.txt")
                                       for i in range(255)])
        refused += sum(m["content"].startswith("Error: state quota exceeded") for m in r.messages)
    assert refused > 0
    assert remote.state == local.state
    snap = remote.snapshot()
    end = remote.step("done")  # judging fetches the state from the container
    assert end.done and end.info["ended_by"] == "answer" and not end.info.get("world_lost")
    assert end.reward == local.step("done").reward
    assert get_spec("FileSystem-v0").state_type.model_validate(snap["state"]) == local.state
    remote.close()


def test_a_large_read_is_cut_alike(pool) -> None:
    from envfactory import quotas

    local, remote = _both(pool)
    n = quotas.MAX_OBSERVATION_CHARS + 54_321
    _same_step(local, remote, [call("write_file", path=BIG, content="r" * n)])
    one = _same_step(local, remote, call("read_file", path=BIG))
    assert one.messages[0]["content"] == "r" * quotas.MAX_OBSERVATION_CHARS + quotas.OBSERVATION_CUT
    many = _same_step(local, remote, [call("read_file", path=BIG)] * 40)  # 40 MiB asked for in a turn
    assert sum(len(m["content"]) for m in many.messages) < quotas.MAX_OBSERVATION_CHARS + 40 * 200
    remote.close()


def _kill9(env) -> None:
    c = env._world.container
    assert c is not None and not c.dead
    c.client.api.kill(c.id, signal="KILL")


def test_a_world_lost_while_judged_ends_the_episode(pool) -> None:
    from envfactory.runtime.pool import Pool

    own = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=1)  # a container to kill alone
    try:
        env = envfactory.make("FileSystem-v0", runtime="docker", pool=own, resume=False)
        env.reset(0)
        env.step(call("write_file", path="/home/user/a.txt", content="a"))
        _kill9(env)
        r = env.step("I am done.")  # judging fetches the state from the dead container
        assert r.done and r.truncated and r.info["ended_by"] == "world_lost" and r.info["world_lost"]
        assert r.reward == 0.0 and env.success is False
        env.close()
    finally:
        own.shutdown()


def test_fork_and_snapshot_resume_after_the_container_was_killed() -> None:
    from envfactory.runtime.pool import Pool

    own = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=4)
    try:
        local = envfactory.make("FileSystem-v0")
        env = envfactory.make("FileSystem-v0", runtime="docker", pool=own)
        local.reset(0)
        env.reset(0)
        action = call("write_file", path="/home/user/a.txt", content="alpha")
        _same_step(local, env, action)
        _kill9(env)
        child = env.fork()  # resumes the parent's world, then forks it
        assert child.state == local.state
        _kill9(env)
        state_type = get_spec("FileSystem-v0").state_type  # a set's JSON order is the process's own
        assert state_type.model_validate(env.snapshot()["state"]) == local.state
        # the fork and the parent are independent, and both go on like the in-process episode
        other = local.fork()
        _same_step(local, env, call("append_file", path="/home/user/a.txt", content="-parent"))
        _same_step(other, child, call("append_file", path="/home/user/a.txt", content="-child"))
        assert env.state.fs.files["/home/user/a.txt"] == "alpha-parent"
        assert child.state.fs.files["/home/user/a.txt"] == "alpha-child"
        assert env._world.resumed >= 1
        child.close()
        env.close()
    finally:
        own.shutdown()
