"""Multi-agent environments served from the Docker runtime.

Every registered multi-agent environment: PettingZoo's ``api_test``,
``parallel_api_test``, ``seed_test`` and ``parallel_seed_test`` on
``runtime="docker"``, and local/docker parity (the joint reference solution
and seeded random joint actions, in turn order and in simultaneous rounds,
give identical turn results, observations, conversations, rewards, logs and
final states). Also: the verification suite on Docker (fork and snapshot
across the container boundary), snapshots moving between runtimes, rewards
judged on the host whatever the container claims, a killed container, and a
turn that overruns its timeout.

Containers are shared: each environment's process-wide pool serves every test
of this module (tests that kill or freeze a container use a private pool).
Runtime: about 40-60 s on 2 cores once the image exists.
"""

from __future__ import annotations

import json
import warnings

import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

import envfactory
import envfactory.multi as multi
from envfactory.multi.team import NoopPolicy, OraclePolicy, RandomPolicy, play
from envfactory.multi.verify import episode_trace, verify_multi_spec

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


def test_there_are_multi_agent_environments_to_serve() -> None:
    assert len(MULTI) >= 6


@pytest.mark.parametrize("name", MULTI)
def test_pettingzoo_api_and_seed_tests_on_docker(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pettingzoo recommends Box/Discrete spaces; ours are Text
        aec = multi.env(name, runtime="docker")
        assert type(aec.episode).__name__ == "DockerMultiEpisode"
        api_test(aec, num_cycles=50)
        aec.close()
        par = multi.parallel_env(name, runtime="docker")
        parallel_api_test(par, num_cycles=50)
        par.close()
        seed_test(lambda: multi.env(name, runtime="docker"), num_cycles=50)
        parallel_seed_test(lambda: multi.parallel_env(name, runtime="docker"), num_cycles=50)


@pytest.mark.parametrize("name", MULTI)
def test_parity_every_task(name: str) -> None:
    local = envfactory.make_multi(name)
    docker = envfactory.make_multi(name, runtime="docker")
    try:
        outcomes = []
        for task in local.spec.get_tasks():
            for mode in ("aec", "parallel"):
                for policy, seed in ((OraclePolicy, 0), (RandomPolicy, 1), (RandomPolicy, 2)):
                    team = {a: policy() for a in local.agents}
                    a = episode_trace(local, team, task.id, mode, seed)
                    b = episode_trace(docker, team, task.id, mode, seed)
                    for i, (x, y) in enumerate(zip(a, b)):
                        assert x == y, f"{name} task {task.id} {mode} {policy.name}: step {i} differs"
                    assert len(a) == len(b)
                    outcomes.append(b[-1][1])
                    if policy is OraclePolicy:
                        assert b[-1][1] is True, f"{name} task {task.id}: the oracle failed on docker ({mode})"
        assert True in outcomes and False in outcomes  # both outcomes were exercised
    finally:
        docker.close()


def test_verify_suite_on_docker() -> None:
    """Reference/noop/random/alone, determinism, fork and snapshot semantics, malformed input, parity."""
    report = verify_multi_spec(envfactory.spec("MultiSupport-v0"), runtime="docker", random_seeds=1,
                               pettingzoo=False)  # PettingZoo's tests run above
    assert report.verified, [f.__dict__ for f in report.failures]
    assert {"fork", "snapshot", "determinism", "parity"} <= set(report.checks)


def test_snapshot_moves_between_runtimes_and_fork_is_independent() -> None:
    name = "MultiRecords-v0"
    task = envfactory.spec(name).get_tasks()[-1]
    oracle = OraclePolicy()
    local, docker = envfactory.make_multi(name), envfactory.make_multi(name, runtime="docker")
    private = envfactory.make_multi(name, runtime="docker", sessions_per_container=1)
    try:
        docker.reset(task.id)
        for _ in range(3):
            a = docker.next_agent
            docker.act(a, oracle.act(docker, a, 0))
        local.restore(json.loads(json.dumps(docker.snapshot())))  # docker -> local
        assert local.state.hash() == docker.state.hash()
        assert all(local.messages(a) == docker.messages(a) for a in local.agents)
        before = docker.state.hash()
        children = [docker.fork()]  # a session forked inside the shared container
        private.restore(docker.snapshot())
        children.append(private.fork())  # the container is full: the fork gets a container of its own
        assert children[1].container is not private.container
        for child in children:
            while not child.done:
                a = child.next_agent
                child.act(a, oracle.act(child, a, 0))
            assert child.success is True and child.state.hash() != before
        assert docker.state.hash() == before and not docker.done
        other = envfactory.make_multi(name, runtime="docker")
        other.restore(local.snapshot())  # local -> docker
        while not local.done:
            a = local.next_agent
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
    from envfactory.runtime.container import ContainerError

    name = "MultiDeal-v0"  # mixed motive: payoffs come from the final state
    ep = envfactory.make_multi(name, runtime="docker", sessions_per_container=2)
    link = ep._link
    real = link.request

    def inflated(req: dict, **kw) -> dict:
        reply = real(req, **kw)
        for r in reply.get("results", {}).values():
            r["rewards"] = dict.fromkeys(r["rewards"], 1.0)
            r["info"].update(success=True, answer="I won")
        return reply

    link.request = inflated
    out = play(ep, {a: NoopPolicy() for a in ep.agents}, 0)
    assert out.ended_by == "quiescence" and out.success is False and set(out.rewards.values()) == {0.0}
    assert ep.success is False and ep.answer != "I won"

    def ends_early(req: dict, **kw) -> dict:
        reply = real(req, **kw)
        for r in reply.get("results", {}).values():
            r["terminated"] = True
            r["info"]["ended_by"] = "finish"
        return reply

    link.request = ends_early
    ep.reset(0)
    c = ep.container
    with pytest.raises(ContainerError, match="untrustworthy") as err:
        ep.act(ep.next_agent, "I pass.")
    assert name in str(err.value) and c.name in str(err.value)
    assert ep.done and not ep.success and not _exists(c.id)
    link.request = real
    assert play(ep, {a: OraclePolicy() for a in ep.agents}, 0).success  # a fresh container serves again
    ep.close()


def test_container_killed_mid_episode_and_a_frozen_turn_times_out() -> None:
    from envfactory.runtime.container import ContainerError

    name = "MultiRooms-v0"
    ep = envfactory.make_multi(name, runtime="docker", sessions_per_container=3, step_timeout=2.0)
    try:
        ep.reset(0)
        ep.act(ep.next_agent, "I pass.")
        c, session = ep.container, ep._link.session
        c.client.api.kill(c.id)
        with pytest.raises(ContainerError) as err:
            ep.act(ep.next_agent, "I pass.")
        assert name in str(err.value) and session in str(err.value) and c.name in str(err.value)
        assert not _exists(c.id)
        ep.reset(0)
        c = ep.container
        c.client.api.pause(c.id)  # the server stops answering: the turn overruns step_timeout
        agent = ep.next_agent
        r = ep.act(agent, '<tool_call>{"name": "finish", "arguments": {"answer": "x"}}</tool_call>')
        assert r.truncated and r.info["timeout"] and r.rewards == dict.fromkeys(ep.agents, 0.0)
        assert "did not finish within 2.0s" in r.messages[0]["content"] and ep.done and ep.success is False
        assert "did not finish" in ep.observation(agent) and ep.messages(agent)[-1] == r.messages[0]
        assert not _exists(c.id)
        assert play(ep, {a: OraclePolicy() for a in ep.agents}, 0).success
    finally:
        ep.close()
