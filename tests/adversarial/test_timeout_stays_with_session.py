"""A session whose tool overruns ``step_timeout`` fails alone (issue 28, "failure stays with its
session"), on the Docker runtime: an attacker and a bystander share one container; the
attacker's tool sleeps (or spins) past its step timeout, again and again. Its episode ends as
timed out; the shared container is neither removed nor replaced, and the bystander goes on
in the same session, never resumed.

Before: every timeout removed the shared container (3 attacks: 3 recycles, the bystander
resumed 3 times; the issue measured 13 recycles and 17 bystander resumes in 45 s). A looping
attacker (a 2 s sleep past a 1 s timeout) beside 4 bystanders for 45 s, at load 8-10 on 2 cores:
before, 17 attacks, 20 recycles, 27 bystander resumes, 400 bystander steps; after, 30 attacks,
0 recycles, 0 resumes, 888 bystander steps, 0 errors either way.

Runtime: about 30 s on 2 cores once the image exists.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

import envfactory
from envfactory import call

from conftest import require_docker

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


@pytest.fixture(scope="module", autouse=True)
def slow_tool():
    """SlowTool-v0 (``slow_tool_env``, isolation="session"), registered for this module's tests only:
    its ``spin``/``nap`` tools run as long as they are asked, so a later ``verify --all`` in the same
    test session (whose random agent asks for hundreds of seconds) must not find it. Imported here,
    not at collection, and taken out of the registry afterwards."""
    sys.path.insert(0, os.path.dirname(__file__))
    try:
        import slow_tool_env
    finally:
        sys.path.pop(0)
    from envfactory import registry

    registry.register(slow_tool_env.SPEC, replace=True)  # (again, where an earlier run took it out)
    yield slow_tool_env
    registry._REGISTRY.pop(slow_tool_env.SPEC.name, None)


@pytest.fixture()
def pool(slow_tool):
    from envfactory.runtime.pool import Pool

    p = Pool(slow_tool.SPEC, warm=0, sessions_per_container=8)
    started = []
    start = p.start_container

    def counted():
        c = start()
        started.append(c)
        return c

    p.start_container = counted  # type: ignore[method-assign]
    p.started = started  # type: ignore[attr-defined]
    yield p
    p.shutdown()


def _exists(container_id: str) -> bool:
    from envfactory.runtime.pool import docker_client

    return bool(docker_client().containers.list(all=True, filters={"id": container_id}))


def _attack(pool, tool: str, seconds: float) -> None:
    a = envfactory.make("SlowTool-v0", runtime="docker", pool=pool, step_timeout=1.0)
    a.reset(0)
    r = a.step(call(tool, seconds=seconds))
    assert r.truncated and r.info["timeout"] and a.status.ended_by == "timeout", r.messages
    assert r.messages[0]["content"].startswith("Error: the step did not finish within 1.0s")
    a.close()


@pytest.mark.parametrize("tool", ["nap", "spin"])
def test_a_tool_past_its_timeout_ends_only_its_own_session(pool, tool: str) -> None:
    from envfactory.runtime.docker import stats

    b = envfactory.make("SlowTool-v0", runtime="docker", pool=pool)
    b.reset(0)
    assert b.step(call("note", text="before")).messages[0]["content"] == "1 notes"
    c, session = b._world.container, b._world.session
    resumed = stats()["resumed"]
    for i in range(3):
        _attack(pool, tool, 4.0)
        r = b.step(call("note", text=str(i)))
        assert r.messages[0]["content"] == f"{i + 2} notes" and not r.done
    recycles = len(pool.started) - 1
    bystander_resumes = b._world.resumed
    assert (recycles, bystander_resumes, stats()["resumed"] - resumed) == (0, 0, 0)
    assert b._world.container is c and b._world.session == session and not c.dead and _exists(c.id)
    assert b.state.notes == ["before", "0", "1", "2"]
    b.close()


def test_a_spinning_tool_is_stopped_once_abandoned(pool) -> None:
    """A tool looping in Python does not keep the shared server's CPU after its session is
    abandoned: the server stops it (the health call counts abandoned calls still running)."""
    b = envfactory.make("SlowTool-v0", runtime="docker", pool=pool)
    b.reset(0)
    c = b._world.container
    _attack(pool, "spin", 600.0)
    deadline = time.monotonic() + 60
    while c.call("GET", "/health").get("abandoned_running") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert c.call("GET", "/health").get("abandoned_running") == 0
    assert b.step(call("note", text="x")).messages[0]["content"] == "1 notes"
    assert b._world.container is c and not c.dead
    b.close()


def test_a_container_full_of_stuck_calls_takes_no_new_session(pool) -> None:
    """Sleeps nothing can stop each hold a server thread until they return: past
    ``MAX_ABANDONED_RUNNING`` of them the container takes no new session (the next one starts
    elsewhere) while its bystanders go on there, and it is removed once the last one ends."""
    from envfactory.runtime.docker_session import MAX_ABANDONED_RUNNING

    b = envfactory.make("SlowTool-v0", runtime="docker", pool=pool)
    b.reset(0)
    c = b._world.container
    for _ in range(MAX_ABANDONED_RUNNING):
        _attack(pool, "nap", 300.0)
    assert c.retiring and not c.dead and c.abandoned_running == MAX_ABANDONED_RUNNING
    fresh = envfactory.make("SlowTool-v0", runtime="docker", pool=pool)
    fresh.reset(0)
    assert fresh._world.container is not c
    assert b.step(call("note", text="x")).messages[0]["content"] == "1 notes"
    assert b._world.container is c and b._world.resumed == 0
    fresh.close()
    b.close()
    from envfactory.runtime.pool import wait_background

    wait_background()
    assert not _exists(c.id)
