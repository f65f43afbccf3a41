"""Files written by agent code survive a container's death (issue 17: snapshots cover more
than the pydantic state).

An environment that runs agent code (``isolation="container"``, one container per session;
here tests/docker_attack_env.py's CodeSandbox-v0, whose ``run_python`` runs code with
``/tmp`` as its working folder) cannot be resumed by replaying its journal: agent code need
not be deterministic, and the files it wrote are not in the state. Such a world is
snapshotted at every step boundary instead: the server answers each ``run`` with the state
and a tar.gz of the work folder (one reply), and a world whose container is killed resumes
on a fresh container from that snapshot, files included, then re-sends the lost batch.

The agent code here is deliberately not deterministic (it writes random numbers), so a
journal replay answers differently and the resume failed before this change (the episode
ended as lost): each test failed before it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import envfactory
from envfactory import call
from envfactory.runtime.container import Limits
from envfactory.runtime.pool import Pool, wait_background

from conftest import require_docker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import docker_attack_env  # noqa: E402,F401  (registers CodeSandbox-v0, isolation="container")

pytestmark = pytest.mark.docker

NAME = "CodeSandbox-v0"
WRITE = ("import random, os\n"
         "os.makedirs('/tmp/work/sub', exist_ok=True)\n"
         "n = random.random()\n"
         "open('/tmp/work/sub/{f}', 'w').write(str(n))\n"
         "print(n)")
READ = ("import os\n"
        "print(sorted((f, open(os.path.join('/tmp/work/sub', f)).read()) for f in os.listdir('/tmp/work/sub')))")


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def _kill9(ep) -> str:
    c = ep.world.container
    c.client.api.kill(c.id, signal="KILL")
    return c.id


def _run(ep, code: str) -> str:
    r = ep.step(call("run_python", code=code))
    assert not r.done, r.messages
    return r.messages[0]["content"].strip()


def test_a_killed_containers_files_come_back_with_the_resumed_world() -> None:
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30)
    try:
        ep.reset(0)
        a = _run(ep, WRITE.format(f="a"))
        b = _run(ep, WRITE.format(f="b"))
        first = _kill9(ep)
        seen = _run(ep, READ)  # resumed on a fresh container, then the batch re-sent
        assert seen == str([("a", a), ("b", b)])
        assert ep.world.resumed == 1 and ep.world.container.id != first
        c = _run(ep, WRITE.format(f="c"))  # and the episode goes on from there
        assert _run(ep, READ) == str([("a", a), ("b", b), ("c", c)])
        assert ep.state.runs == 5  # the state came back too (the re-sent batch ran once)
        r = ep.step(call("write_file", path="/answer.txt", content="42"))
        assert ep.step("Done.").reward == 1.0
    finally:
        ep.close()


def test_a_new_episode_starts_with_an_empty_work_folder() -> None:
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30)
    try:
        ep.reset(0)
        _run(ep, WRITE.format(f="a"))
        ep.reset(0)
        assert "No such file" in ep.step(call("run_python", code=READ)).messages[0]["content"]
    finally:
        ep.close()


def test_a_fork_sees_the_parents_files_and_its_writes_stay_its_own() -> None:
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30)
    child = None
    try:
        ep.reset(0)
        a = _run(ep, WRITE.format(f="a"))
        child = ep.fork()
        assert child.world.container.id != ep.world.container.id  # a container of its own
        assert _run(child, READ) == str([("a", a)])
        b = _run(child, WRITE.format(f="b"))
        assert _run(child, READ) == str([("a", a), ("b", b)])
        assert _run(ep, READ) == str([("a", a)])
    finally:
        if child is not None:
            child.close()
        ep.close()


def test_a_work_folder_over_the_archive_cap_is_named_when_the_resume_fails() -> None:
    """1 MiB cap; 3 MiB of random bytes (incompressible): the snapshot says it is over the cap,
    a fork is refused, and when the container dies the episode ends as truncated, naming the cap
    (never a silent loss of files, never a hang)."""
    spec = envfactory.spec(NAME)
    pool = Pool(spec, warm=0, limits=Limits(work_archive_mb=1))
    ep = envfactory.make(NAME, runtime="docker", pool=pool, step_timeout=30)
    try:
        ep.reset(0)
        _run(ep, "import os\nopen('/tmp/big', 'wb').write(os.urandom(3 << 20))\nprint('ok')")
        with pytest.raises(envfactory.EpisodeError, match="work_archive_mb"):  # a fork would lose the files
            ep.fork()
        _kill9(ep)
        r = ep.step(call("run_python", code=READ))
        said = r.messages[0]["content"]
        assert r.truncated and r.info["world_lost"] and "cap" in said and "work_archive_mb" in said, said
        _run_after = ep.reset(0)  # a new episode on a fresh container
        assert _run(ep, "print(6 * 7)") == "42" and _run_after is not None
    finally:
        ep.close()
        pool.shutdown()
        wait_background()
