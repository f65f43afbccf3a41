"""A container killed mid-episode is resumed (issue 17, faults), on the Docker runtime.

``docker kill --signal KILL`` of the container that serves an episode, between two moves,
and the episode goes on as if nothing happened: the world is rebuilt on a fresh container
from its origin (the task, or the last snapshot) and its journal of batches, and the
failed request is sent again. The whole trace (every result, observation, transcript,
the rewards, success, the call log and the final state's canonical JSON) equals that of
an uninterrupted run on the in-process runtime, for one agent and for a team, for the
episodes of every session the container held, and across an automatic snapshot. A
resume that fails (its new container dies too) raises :class:`ContainerLost` from the
world, promptly, and leaves no container behind; the referee then ends the episode as
truncated with that error as the observation (``info["world_lost"]``), so a rollout
never crashes or hangs on it; ``resume=False`` gives that ending at once.

Runtime: about 30-60 s on 2 cores once the images exist (each kill waits for a fresh
container to start).
"""

from __future__ import annotations

import json
import time

import pytest

import envfactory
from envfactory.checks.scripted import OraclePolicy, RandomPolicy, _team, _turn, scripted_policy
from envfactory.runtime import docker as docker_rt
from envfactory.runtime.container import ContainerError, ContainerLost
from envfactory.runtime.docker import ContainerWorld
from envfactory.runtime.pool import wait_background
from envfactory.state import canonical_json

from conftest import require_docker

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def _exists(container_id: str) -> bool:
    from envfactory.runtime.pool import docker_client

    return bool(docker_client().api.containers(all=True, filters={"id": container_id}))


def _kill9(world: ContainerWorld) -> str:
    """``docker kill --signal KILL`` the container serving ``world``; its id."""
    c = world.container
    assert c is not None and not c.dead
    c.client.api.kill(c.id, signal="KILL")
    return c.id


def _trace(episodes: list[envfactory.Episode], policy, task, mode: str = "aec", seed: int = 0,
           kill_at: tuple[int, ...] = ()) -> list[list]:
    """``episode_trace`` for several episodes played move by move together (they may share
    a container); before the moves in ``kill_at``, the first episode's container is killed."""
    outs = []
    for ep in episodes:
        outs.append([ep.reset(task), {a: ep.transcript(a) for a in ep.agents}])
    teams = [_team(ep, policy) for ep in episodes]
    move = 0
    while not all(ep.done for ep in episodes):
        if move in kill_at:
            _kill9(episodes[0]._world)
        for ep, team, out in zip(episodes, teams, outs):
            if ep.done:
                continue
            results = _turn(ep, team, mode, seed)
            agents = ep.agents
            out.append(({a: r.to_json() for a, r in results.items()}, ep.status.next_agent, ep.status.round,
                        {a: ep.observation(a) for a in agents}, {a: list(ep.transcript(a)) for a in agents},
                        {a: ep.status.turns_taken(a) for a in agents}))
        move += 1
    for ep, out in zip(episodes, outs):
        out.append((ep.rewards, ep.success, ep.status.answer, ep.status.ended_by, ep.status.terminated, ep.status.truncated,
                    json.dumps(ep.status.log, sort_keys=True), canonical_json(ep.state)))
    return outs


def _assert_same(a: list, b: list, what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"{what}: move {i} differs"
    assert len(a) == len(b), what


def test_kill_9_mid_episode_resumes_with_the_same_trace_single_agent() -> None:
    name = "FileSystem-v0"
    task = envfactory.spec(name).get_tasks()[-1].id
    local = envfactory.make(name)
    # two episodes share the container: both lose it, both are resumed
    eps = [envfactory.make(name, runtime="docker", sessions_per_container=4) for _ in range(2)]
    try:
        want = _trace([local], OraclePolicy(), task)[0]
        before = docker_rt.stats()
        got = _trace(eps, OraclePolicy(), task, kill_at=(3,))
        for g in got:
            _assert_same(want, g, f"{name} oracle after a kill -9")
        assert want[-1][1] is True  # the reference solution succeeds, resumed or not
        assert sum(ep._world.resumed for ep in eps) == 2
        after = docker_rt.stats()
        assert after["resumed"] - before["resumed"] == 2 and after["resume_failed"] == before["resume_failed"]
        # a random agent (its errors included), killed twice
        want = _trace([local], RandomPolicy(turns=8), task, seed=7)[0]
        got = _trace(eps[:1], RandomPolicy(turns=8), task, seed=7, kill_at=(2, 5))[0]
        _assert_same(want, got, f"{name} random after two kills")
        assert eps[0]._world.resumed == 3
    finally:
        for ep in eps:
            ep.close()


@pytest.mark.parametrize("name,mode", [("MultiRooms-v0", "aec"), ("GameAuction-v0", "parallel")])
def test_kill_9_mid_episode_resumes_with_the_same_trace_team(name: str, mode: str) -> None:
    task = envfactory.spec(name).get_tasks()[1].id
    local = envfactory.make(name)
    ep = envfactory.make(name, runtime="docker", sessions_per_container=4)
    try:
        for policy, seed in (("oracle", 0), ("random", 3)):
            want = _trace([local], scripted_policy(policy), task, mode, seed)[0]
            got = _trace([ep], scripted_policy(policy), task, mode, seed, kill_at=(1, 3))[0]
            _assert_same(want, got, f"{name} {policy} {mode} after a kill -9")
            if policy == "oracle":
                assert got[-1][1] is True
        assert ep._world.resumed >= 2
    finally:
        ep.close()


def test_a_resume_across_an_automatic_snapshot(monkeypatch) -> None:
    """The journal is bounded: every SNAPSHOT_EVERY batches the state becomes the origin (it comes
    in that batch's own reply); a kill after a snapshot replays only the batches since."""
    monkeypatch.setattr(docker_rt, "SNAPSHOT_EVERY", 2)
    name = "Counter-v0"
    task = envfactory.spec(name).get_tasks()[-1].id
    local = envfactory.make(name)
    ep = envfactory.make(name, runtime="docker", sessions_per_container=4)
    try:
        before = docker_rt.stats()
        want = _trace([local], RandomPolicy(turns=9), task, seed=11)[0]
        got = _trace([ep], RandomPolicy(turns=9), task, seed=11, kill_at=(6,))[0]
        _assert_same(want, got, f"{name} after a snapshot and a kill -9")
        assert docker_rt.stats()["snapshots"] > before["snapshots"]
        # and a resume that must replay: five batches (a snapshot after the third), a kill, a sixth
        inc = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
        for e in (local, ep):
            e.reset(task)
            for _ in range(5):
                e.step(inc)
        assert ep._world._origin is not None and len(ep._world._journal) == 2
        before = docker_rt.stats()
        _kill9(ep._world)
        assert ep.step(inc).messages == local.step(inc).messages
        after = docker_rt.stats()
        assert after["resumed"] - before["resumed"] == 1
        assert after["replayed_batches"] - before["replayed_batches"] == 2
        assert ep.state == local.state
    finally:
        ep.close()


def assert_lost(ep, r, words: str) -> None:
    """The step ended the episode as truncated on a lost world: the error is the observation,
    nothing is judged, and the episode says why."""
    assert r.truncated and not r.terminated and r.reward == 0.0 and r.info["world_lost"] is True
    assert "timeout" not in r.info and ep.status.ended_by == "world_lost" and ep.success is False
    assert len(r.messages) == 1 and r.messages[0]["content"].startswith("Error:")
    assert words in r.messages[0]["content"], r.messages[0]["content"]
    assert ep.done and issubclass(ContainerLost, ContainerError)


def test_a_crash_during_the_resume_ends_the_episode_cleanly() -> None:
    name = "Counter-v0"
    inc = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    ep = envfactory.make(name, runtime="docker", sessions_per_container=4)
    try:
        ep.reset(0)
        ep.step(inc)
        ep.step(inc)
        world = ep._world
        link = world._link
        real_ensure = link.ensure
        doomed: list[str] = []

        def ensure_then_die() -> None:  # the resume's fresh container dies before the replay
            real_ensure()
            doomed.append(_kill9(world))

        link.ensure = ensure_then_die
        first = _kill9(world)
        before = docker_rt.stats()
        t0 = time.monotonic()
        r = ep.step(inc)
        assert time.monotonic() - t0 < 60  # no hang
        assert_lost(ep, r, "Resuming the world on a fresh container failed too")
        assert docker_rt.stats()["resume_failed"] == before["resume_failed"] + 1
        assert world.container is None and world.resumed == 0
        link.ensure = real_ensure
        wait_background()
        assert doomed and not _exists(first) and not _exists(doomed[0])  # no leak
        ep.reset(0)  # a new episode on a fresh container
        assert ep.step(inc).messages[0]["content"] == "1"
    finally:
        ep.close()


def test_a_second_death_of_the_resent_request_is_the_error() -> None:
    """A batch that kills its container (as hostile agent code could) is resumed and sent
    again once; when it kills the fresh container too, the episode ends as truncated."""
    ep = envfactory.make("Counter-v0", runtime="docker", sessions_per_container=4)
    inc = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    try:
        ep.reset(0)
        ep.step(inc)
        link = ep._world._link
        real = link.request
        seen = []

        def killing(req, **kw):
            if req.get("op") == "run" and len(req["calls"]) == 1 and req["calls"][0]["arguments"] == {"by": 5}:
                seen.append(_kill9(ep._world))
            return real(req, **kw)

        link.request = killing
        r = ep.step('<tool_call>{"name": "increment", "arguments": {"by": 5}}</tool_call>')
        assert_lost(ep, r, "stopped answering")
        assert len(seen) == 2 and ep._world.resumed == 1  # resumed once, then the error
        link.request = real
        wait_background()
        assert not any(_exists(c) for c in seen)
    finally:
        ep.close()


def test_resume_off_keeps_the_error() -> None:
    ep = envfactory.make("Counter-v0", runtime="docker", sessions_per_container=4, resume=False)
    inc = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    try:
        ep.reset(0)
        ep.step(inc)
        c = ep._world.container
        _kill9(ep._world)
        r = ep.step(inc)
        assert_lost(ep, r, "Counter-v0")
        assert c.name in r.messages[0]["content"] and ep._world.resumed == 0
        with pytest.raises(envfactory.EpisodeError, match="no live session"):  # its state went with it
            ep.state
        ep.reset(0)  # a new episode on a fresh container
        assert ep.step(inc).messages[0]["content"] == "1"
    finally:
        ep.close()
