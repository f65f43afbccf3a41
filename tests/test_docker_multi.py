"""Team environments served from the Docker runtime.

A team episode on Docker is the same :class:`~envfactory.Episode` as a single
agent's, over the same :class:`~envfactory.runtime.docker.ContainerWorld`: there
is no separate multi-agent path. Every registered team environment:
PettingZoo's ``api_test``, ``parallel_api_test``, ``seed_test`` and
``parallel_seed_test`` on ``runtime="docker"``, and local/docker parity (the
joint reference solution, seeded random teams and a passive team, in turn order
and in simultaneous rounds, give identical turn results, observations,
conversations, rewards, logs and final states). Also: the verification suite
on Docker, snapshots moving between runtimes, forks (inside a shared container
and into a container of their own), rewards judged on the host whatever the
container claims, a killed container, and a turn that overruns its timeout.

Containers are shared: each environment's process-wide pool serves every test
of this module (tests that kill or freeze a container use a private pool).
Runtime: about 40-60 s on 2 cores once the image exists.
"""

from __future__ import annotations

import json
import warnings

import pytest

import envfactory
from envfactory.env import EpisodeError
from envfactory.runtime.container import ContainerError
from envfactory.runtime.docker import ContainerWorld
from envfactory.checks.scripted import MODES, episode_trace, scripted_policy

from conftest import require_docker

pytestmark = pytest.mark.docker
MULTI = sorted(s.name for s in envfactory.specs() if getattr(s, "multi_agent", False)
               and (s.module or "").split(".")[0] == "environments")


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def _exists(container_id: str) -> bool:
    from envfactory.runtime.pool import docker_client

    return bool(docker_client().containers.list(all=True, filters={"id": container_id}))


def _play(ep: envfactory.Episode, policy: str, task: object = 0, mode: str = "aec") -> envfactory.Episode:
    """Reset ``ep`` on ``task`` (unless ``task`` is ``None``: go on) and play it to the end."""
    if task is not None:
        ep.reset(task)
    team = scripted_policy(policy)
    while not ep.done:
        if mode == "aec":
            a = ep.status.next_agent
            ep.act(a, team.act(ep, a, 0))
        else:
            ep.step_round({a: team.act(ep, a, 0) for a in ep.agents})
    return ep


def test_there_are_team_environments_to_serve() -> None:
    assert len(MULTI) >= 6


@pytest.mark.parametrize("name", MULTI)
def test_pettingzoo_api_and_seed_tests_on_docker(name: str) -> None:
    from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

    import envfactory.faces.pettingzoo_env as multi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pettingzoo recommends Box/Discrete spaces; ours are Text
        aec = multi.env(name, runtime="docker")
        assert type(aec.episode) is envfactory.Episode and isinstance(aec.episode._world, ContainerWorld)
        api_test(aec, num_cycles=50)
        aec.close()
        par = multi.parallel_env(name, runtime="docker")
        parallel_api_test(par, num_cycles=50)
        par.close()
        seed_test(lambda: multi.env(name, runtime="docker"), num_cycles=50)
        parallel_seed_test(lambda: multi.parallel_env(name, runtime="docker"), num_cycles=50)


@pytest.mark.parametrize("name", MULTI)
def test_parity_every_task(name: str) -> None:
    local = envfactory.make(name)
    docker = envfactory.make(name, runtime="docker")
    assert type(docker) is type(local) and isinstance(docker._world, ContainerWorld)  # one engine
    try:
        outcomes = []
        for task in local.spec.get_tasks():
            for mode in MODES:
                for policy, seed in (("oracle", 0), ("random", 1), ("random", 2), ("noop", 0)):
                    a = episode_trace(local, scripted_policy(policy), task.id, mode, seed)
                    b = episode_trace(docker, scripted_policy(policy), task.id, mode, seed)
                    for i, (x, y) in enumerate(zip(a, b)):
                        assert x == y, f"{name} task {task.id} {mode} {policy}: step {i} differs"
                    assert len(a) == len(b)
                    outcomes.append(b[-1][1])
                    if policy == "oracle" and mode in task.metadata.get("modes", MODES):  # a task's own schedules
                        assert b[-1][1] is True, f"{name} task {task.id}: the oracle failed on docker ({mode})"
        assert True in outcomes and False in outcomes  # both outcomes were exercised
    finally:
        docker.close()


def test_verify_suite_on_docker() -> None:
    """Reference/noop/random/alone, determinism, fork and snapshot semantics, malformed input, parity."""
    from envfactory.checks.verify import verify_spec

    report = verify_spec(envfactory.spec("MultiSupport-v0"), runtime="docker", random_episodes=1,
                         api_checks=False)  # PettingZoo's tests run above
    assert report.verified, report.to_json()["failures"]
    assert {"fork", "snapshot", "determinism", "parity"} <= set(report.checks)


def test_snapshot_moves_between_runtimes_and_fork_is_independent() -> None:
    name = "MultiRecords-v0"
    task = envfactory.spec(name).get_tasks()[-1]
    oracle = scripted_policy("oracle")
    local, docker = envfactory.make(name), envfactory.make(name, runtime="docker")
    private = envfactory.make(name, runtime="docker", sessions_per_container=1)
    try:
        docker.reset(task.id)
        for _ in range(3):
            a = docker.status.next_agent
            docker.act(a, oracle.act(docker, a, 0))
        local.restore(json.loads(json.dumps(docker.snapshot())))  # docker -> local
        assert local.state.hash() == docker.state.hash()
        assert all(local.transcript(a) == docker.transcript(a) for a in local.agents)
        assert all(local.observation(a) == docker.observation(a) for a in local.agents)
        before = docker.state.hash()
        children = [docker.fork()]  # a session forked inside the shared container
        assert children[0]._world.container is docker._world.container
        assert children[0]._world.session != docker._world.session
        private.restore(docker.snapshot())
        children.append(private.fork())  # the container is full: the fork gets a container of its own
        assert children[1]._world.container is not private._world.container
        for child in children:
            _play(child, "oracle", None)
            assert child.success is True and child.state.hash() != before
        assert docker.state.hash() == before and not docker.done
        assert private.state.hash() == before and not private.done
        other = envfactory.make(name, runtime="docker")
        other.restore(local.snapshot())  # local -> docker
        while not local.done:
            a = local.status.next_agent
            action = oracle.act(local, a, 0)
            r1, r2 = local.act(a, action), other.act(a, action)
            assert r1.to_json() == r2.to_json()
        assert other.rewards == local.rewards and other.success is True
        assert other.state.hash() == local.state.hash() == children[0].state.hash()
        for ep in children + [other]:
            ep.close()
    finally:
        docker.close()
        private.close()


def test_rewards_are_judged_on_the_host_not_claimed_by_the_container() -> None:
    name = "MultiDeal-v0"  # mixed motive: payoffs come from the final state
    ep = envfactory.make(name, runtime="docker", sessions_per_container=2)
    link = ep._world._link
    real = link.request

    def claims(req: dict, **kw) -> dict:
        reply = real(req, **kw)
        reply.update(rewards=dict.fromkeys(ep.agents, 1.0), success=True, answer="I won", terminated=True)
        for o in reply.get("outcomes", []):
            o["reward"] = 1.0
        return reply

    link.request = claims
    _play(ep, "noop")
    assert ep.status.ended_by == "quiescence" and ep.success is False and set(ep.rewards.values()) == {0.0}
    assert ep.status.answer != "I won"
    _play(ep, "random", mode="parallel")  # the claims never end an episode either
    assert ep.status.ended_by != "finish" and set(ep.rewards.values()) == {0.0}

    def no_state(req: dict, **kw) -> dict:  # a team's referee needs the state (the mail) after every call
        reply = real(req, **kw)
        reply.pop("state", None)
        return reply

    for forge in (no_state,):
        link.request = forge
        with pytest.raises(ContainerError, match="untrustworthy"):
            ep.reset(0)
        assert ep._world.container is None
    link.request = real
    ep.reset(0)
    c = ep._world.container

    def miscounts(req: dict, **kw) -> dict:
        reply = real(req, **kw)
        if req["op"] == "run":
            reply["outcomes"] = reply["outcomes"] * 2
        return reply

    link.request = miscounts
    agent = ep.status.next_agent
    with pytest.raises(ContainerError, match="untrustworthy") as err:
        ep.act(agent, '<tool_call>{"name": "send_message", "arguments": {"to": "all", "content": "hi"}}</tool_call>')
    assert name in str(err.value) and c.name in str(err.value)
    assert not ep.success and not _exists(c.id)
    with pytest.raises(EpisodeError, match="no live session"):
        ep.act(ep.status.next_agent, '<tool_call>{"name": "send_message", "arguments": {"to": "all", "content": "x"}}</tool_call>')
    link.request = real
    assert _play(ep, "oracle").success  # a fresh container serves again
    ep.close()


def test_container_killed_mid_episode_and_a_frozen_turn_times_out() -> None:
    name = "MultiRooms-v0"
    ep = envfactory.make(name, runtime="docker", sessions_per_container=3, step_timeout=2.0, resume=False)
    send = '<tool_call>{"name": "send_message", "arguments": {"to": "all", "content": "hello"}}</tool_call>'
    try:
        ep.reset(0)
        ep.act(ep.status.next_agent, send)
        c, session = ep._world.container, ep._world.session
        c.client.api.kill(c.id)
        r = ep.act(ep.status.next_agent, send)  # the episode ends as truncated, the error naming what was lost
        said = r.messages[0]["content"]
        assert r.truncated and r.info["world_lost"] and ep.status.ended_by == "world_lost"
        assert r.rewards == dict.fromkeys(ep.agents, 0.0)
        assert name in said and session in said and c.name in said
        assert not _exists(c.id)
        ep.reset(0)
        c = ep._world.container
        assert c is not None and c.id is not None
        ep.act(ep.status.next_agent, send)
        c.client.api.pause(c.id)  # the server stops answering: the turn overruns step_timeout
        agent = ep.status.next_agent
        r = ep.act(agent, send)
        assert r.truncated and r.info["timeout"] and r.rewards == dict.fromkeys(ep.agents, 0.0)
        assert ep.status.ended_by == "timeout" and ep.done and ep.success is False
        assert "did not finish within 2.0s" in r.messages[0]["content"] and c.name in r.messages[0]["content"]
        assert "did not finish" in ep.observation(agent) and r.messages[0] in ep.transcript(agent)
        # the mail still reads (from the last state seen before the overrun): the letter is there
        assert any("hello" in m["content"] for m in ep.transcript(agent) if m["role"] == "user")
        assert not _exists(c.id)
        assert _play(ep, "oracle").success
    finally:
        ep.close()
