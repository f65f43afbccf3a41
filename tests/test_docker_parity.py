"""The Docker runtime behaves exactly like the in-process one.

Every registered single-agent environment, every task: the reference solution
and a seeded random agent give identical messages, rewards, end flags, info
and final-state hashes in ``local`` and ``docker`` (the same referee over an
in-process world and a container world). Also: fork/snapshot
semantics across the container boundary (the verification suite run against
the Docker runtime), snapshots moving between runtimes, and the Gymnasium
adapter on Docker. Runtime: about 30-60 s on 2 cores once images exist.
"""

from __future__ import annotations

import json

import gymnasium
import pytest

import envfactory
from envfactory.checks.scripted import OraclePolicy, RandomPolicy, episode_trace
from envfactory.runtime.docker import ContainerWorld
from envfactory.checks.verify import verify_spec

from conftest import require_docker

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def _single_agent_specs() -> list:
    import environments

    # (an environment of environments.OPTIONAL is checked where its package is: tests/test_bfcl.py runs
    # BFCL's in a container, whose image installs bfcl-eval; every task of them here would take minutes)
    return [s for s in envfactory.specs() if not getattr(s, "multi_agent", False)
            and (s.module or "").split(".")[0] in ("environments",) and s.module not in environments.OPTIONAL]


@pytest.mark.parametrize("name", [s.name for s in _single_agent_specs()])
def test_parity_every_task(name: str) -> None:
    local = envfactory.make(name)
    docker = envfactory.make(name, runtime="docker")
    assert type(docker) is type(local) and isinstance(docker._world, ContainerWorld)  # one engine
    schemas = local.tool_schemas()
    assert docker.tool_schemas() == schemas
    try:
        rewards = []
        for k, task in enumerate(local.spec.get_tasks()):
            for policy, seed in ((OraclePolicy(), 0), (RandomPolicy(), 1000 + k)):
                a = episode_trace(local, policy, task.id, seed=seed)
                b = episode_trace(docker, policy, task.id, seed=seed)
                assert a == b, f"{name} task {task.id}: local and docker differ"
                rewards.append(b[-1][0]["agent_0"])
        assert 1.0 in rewards and 0.0 in rewards  # both outcomes were exercised
    finally:
        docker.close()


def test_verify_suite_on_docker() -> None:
    """Reference/noop/claim/random, determinism, fork and snapshot semantics, malformed input."""
    report = verify_spec(envfactory.spec("Counter-v0"), runtime="docker", random_episodes=1)
    assert report.verified, report.to_json()["failures"]
    assert {"fork", "snapshot"} <= set(report.checks)


def test_snapshot_moves_between_runtimes_and_fork_is_independent() -> None:
    task = envfactory.spec("FileSystem-v0").get_tasks()[-1]
    actions = OraclePolicy.actions(task)
    local, docker = envfactory.make("FileSystem-v0"), envfactory.make("FileSystem-v0", runtime="docker")
    try:
        docker.reset(task.id)
        docker.step(actions[0])
        local.restore(json.loads(json.dumps(docker.snapshot())))
        assert local.transcript() == docker.transcript() and local.state.hash() == docker.state.hash()
        child = docker.fork()
        before = docker.state.hash()
        for a in actions[1:]:
            if child.step(a).done:
                break
        assert docker.state.hash() == before != child.state.hash()
        other = envfactory.make("FileSystem-v0", runtime="docker")
        other.restore(local.snapshot())  # local -> docker
        for a in actions[1:]:
            r1, r2 = local.step(a), other.step(a)
            assert (r1.messages, r1.reward, r1.done) == (r2.messages, r2.reward, r2.done)
            if r1.done:
                break
        assert r2.reward == 1.0 and other.state.hash() == local.state.hash()
        assert other._world.container is not None and child._world.container is docker._world.container
        child.close()
        other.close()
    finally:
        docker.close()


def test_gymnasium_adapter_on_docker() -> None:
    genv = gymnasium.make("envfactory/Counter-v0", runtime="docker")
    obs, info = genv.reset(seed=3, options={"task": "counter-0-2"})
    assert "exactly 2" in obs
    obs, reward, term, trunc, info = genv.step('<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>')
    assert "2" in obs and reward == 0.0
    obs, reward, term, trunc, info = genv.step("Done.")
    assert term and reward == 1.0 and info["success"] is True
    genv.close()
