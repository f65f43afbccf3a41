"""Several Docker engines behind one pool (``docker_hosts=[...]`` / ``$ENVFACTORY_DOCKER_HOSTS``):
sessions and containers spread over them, the image is copied to an engine that lacks it, each
engine keeps its own warm containers, and an engine that disappears is reported (``Pool.stats``,
``Pool.host_rows``, the error names it) while its sessions end (or resume elsewhere) within
seconds, never hang, and it rejoins when it answers again.

A second ``dockerd`` (its own socket, data root, exec root, pidfile) is started by
``scripts/second-dockerd.sh`` for this module and stopped after it (left running when it was
already up); the engine-loss test starts and stops a third one of its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import IN_CI, require_docker

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "second-dockerd.sh"
FIRST = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
SECOND_DIR = os.environ.get("ENVFACTORY_DOCKERD2_DIR", "/tmp/ef-dockerd2")


@contextlib.contextmanager
def extra_engine(directory: str):
    """A ``dockerd`` of its own under ``directory`` (scripts/second-dockerd.sh): its URL. Stopped
    on exit unless it was already running. Under CI a failure to start it fails the test."""
    from envfactory.runtime.pool import engine_answers

    require_docker()
    url = f"unix://{directory}/docker.sock"
    was_up = engine_answers(url) is None
    if not was_up:
        r = subprocess.run(["bash", str(SCRIPT), "start", directory], capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            msg = f"a second Docker engine could not be started ({r.stderr.strip()[-1500:]})"
            if IN_CI or os.getuid() == 0:
                pytest.fail(msg)
            pytest.skip(msg + " (needs root)")
    try:
        yield url
    finally:
        if not was_up:
            subprocess.run(["bash", str(SCRIPT), "stop", directory], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def engines():
    with extra_engine(SECOND_DIR) as second:
        yield [FIRST, second]


def _play(ep, task):
    out = []
    for c in task.solution:
        out.append(ep.step(c.to_hermes()).messages)
    return out


def test_sessions_and_containers_spread_over_the_engines_and_play_like_local(engines):
    import docker

    import envfactory
    from envfactory.runtime.pool import Pool

    spec = envfactory.spec("Bank-v0")
    pool = Pool(spec, docker_hosts=engines, sessions_per_container=2, warm=0)
    try:
        tasks = [t for t in spec.get_tasks() if t.solution and not t.answer_facts][:8]
        far = [envfactory.make("Bank-v0", runtime="docker", pool=pool) for _ in tasks]
        for ep, task in zip(far, tasks):
            ep.reset(task.id)
        rows = pool.host_rows()
        assert [r["host"] for r in rows] == engines and all(r["up"] for r in rows)
        assert [r["sessions"] for r in rows] == [4, 4], rows  # the engine holding fewer gets the next one
        assert [r["containers"] for r in rows] == [2, 2], rows
        assert {ep._world.container.engine for ep in far} == set(engines)
        for ep, task in zip(far, tasks):
            near = envfactory.make("Bank-v0")
            near.reset(task.id)
            assert _play(ep, task) == _play(near, task)
            assert ep.step("done").reward == near.step("done").reward == 1.0
        fork = far[0].fork()  # a fork stays on its parent's engine when the container has room
        assert fork.state == far[0].state
        # the containers really run on each engine, labelled as ours
        for url in engines:
            client = docker.DockerClient(base_url=url)
            ours = client.containers.list(filters={"label": "org.envfactory.env=Bank-v0"})
            assert {c.name for c in ours} >= {c.name for c in pool.containers() if c.engine == url}
            client.close()
        for ep in far + [fork]:
            ep.close()
        assert pool.stats["lost_hosts"] == 0 and pool.stats["hosts"] == 2
    finally:
        pool.shutdown()


def test_the_env_var_names_the_engines_and_the_warm_pool_is_per_engine(engines, monkeypatch):
    import docker_attack_env  # noqa: F401  (CodeSandbox-v0: isolation="container", a container per session)

    import envfactory
    from envfactory.runtime.pool import Pool

    monkeypatch.setenv("ENVFACTORY_DOCKER_HOSTS", ",".join(engines))
    spec = envfactory.spec("CodeSandbox-v0")
    pool = Pool(spec, warm=1)
    try:
        assert pool.hosts == tuple(engines)
        pool.prewarm(2)  # two ready containers on each engine
        assert [r["containers"] for r in pool.host_rows()] == [2, 2]
        ready = {c.name for c in pool.containers()}
        eps = [envfactory.make("CodeSandbox-v0", runtime="docker", pool=pool) for _ in range(2)]
        for ep in eps:
            ep.reset(0)
        assert {ep._world.container.name for ep in eps} <= ready  # warm: no cold start on the way
        assert {ep._world.container.engine for ep in eps} == set(engines)
        for ep in eps:
            ep.close()
    finally:
        pool.shutdown()
    ep = envfactory.make("Counter-v0", runtime="docker")  # the process-wide pool reads the variable too
    try:
        ep.reset(0)
        assert ep._world.pool.hosts == tuple(engines)
    finally:
        ep.close()


def test_a_lost_engine_is_reported_and_its_sessions_never_hang(engines):
    """A third engine (fresh data root: the image is copied there) is stopped mid-episode: its
    sessions resume on the live engine, or (resume off) end as truncated naming the engine."""
    import docker

    import envfactory
    from envfactory import call
    from envfactory.runtime.pool import Pool

    directory = tempfile.mkdtemp(prefix="ef-dockerd-lost-", dir="/tmp")
    try:
        with extra_engine(directory) as third:
            spec = envfactory.spec("Counter-v0")
            pool = Pool(spec, docker_hosts=[FIRST, third], sessions_per_container=2, warm=0)
            try:
                third_client = docker.DockerClient(base_url=third)
                assert third_client.images.get(pool.image)  # copied from the first engine
                third_client.close()
                eps = [envfactory.make("Counter-v0", runtime="docker", pool=pool) for _ in range(4)]
                for ep in eps:
                    ep.reset("counter-0-9")
                    assert ep.step(call("increment", by=2).to_hermes()).messages[0]["content"] == "2"
                on_third = [ep for ep in eps if ep._world.container.engine == third]
                assert len(on_third) == 2
                truncated = on_third[0]
                truncated._world.resume = False  # the other resumes (the runtime's crash resume)
                subprocess.run(["bash", str(SCRIPT), "stop", directory], check=True, capture_output=True,
                               timeout=120)
                for ep in eps:
                    t0 = time.perf_counter()
                    r = ep.step(call("increment", by=1).to_hermes())
                    assert time.perf_counter() - t0 < 30  # never hung
                    if ep is truncated:  # the episode ends as truncated, the engine named
                        assert r.truncated and r.info["world_lost"] and ep.status.ended_by == "world_lost"
                        assert third in r.messages[0]["content"] and r.reward == 0.0
                    else:  # resumed on the engine that answers
                        assert r.messages[0]["content"] == "3" and not r.done
                        assert ep._world.container.engine == FIRST
                assert pool.stats["lost_hosts"] == 1 and third in pool.stats["lost"]
                rows = {r["host"]: r for r in pool.host_rows()}
                assert rows[third]["up"] is False and rows[FIRST]["up"] is True
                fresh = envfactory.make("Counter-v0", runtime="docker", pool=pool)
                fresh.reset("counter-0-9")  # new sessions go to the engine that answers
                assert fresh._world.container.engine == FIRST
                # the engine comes back: pinged again (after RETRY_LOST_S), it rejoins
                subprocess.run(["bash", str(SCRIPT), "start", directory], check=True, capture_output=True,
                               timeout=120)
                pool.RETRY_LOST_S = 0.0
                back = envfactory.make("Counter-v0", runtime="docker", pool=pool)
                back.reset("counter-0-9")
                assert back._world.container.engine == third  # the engine holding the fewest sessions
                assert pool.stats["lost_hosts"] == 0 and pool.stats["hosts_recovered"] == 1
                for ep in eps + [fresh, back]:
                    ep.close()
            finally:
                t0 = time.perf_counter()
                pool.shutdown()
                assert time.perf_counter() - t0 < 30
    finally:
        shutil.rmtree(directory, ignore_errors=True)
