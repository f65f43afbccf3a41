"""Files written by agent code survive a container's death (issue 17: snapshots cover more
than the pydantic state).

An environment that runs agent code (``isolation="container"``, one container per session;
here tests/docker_attack_env.py's CodeSandbox-v0, whose ``run_python`` runs code with
``/tmp`` as its working folder) cannot be resumed by replaying its journal: agent code need
not be deterministic, and the files it wrote are not in the state. Such a world is
snapshotted at every step boundary instead: the server answers each ``run`` with the state
and a tar.gz of the work folder (one reply), and a world whose container is killed
(``docker kill --signal KILL``) resumes on a fresh container from that snapshot, files
included, then re-sends the lost batch. Forks and ``dump_with_files()``/``load()`` carry the
files too; a folder over ``Limits.work_archive_mb`` is never lost silently: fork and
``dump_with_files`` refuse, naming the cap, and a resume ends the episode as lost, saying so.

Every test here failed before this change: the agent code of most writes random numbers (a
journal replay answers differently, and the resume ended the episode as lost); the one whose
code is deterministic crosses the journal's automatic state snapshot (which held no files).

Runtime: about 10 s on 2 cores once the image exists (each kill waits for a fresh container).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import envfactory
from envfactory import call
from envfactory.runtime.container import Limits
from envfactory.runtime.docker import SNAPSHOT_EVERY, WORK_FILES
from envfactory.runtime.pool import Pool, wait_background
from envfactory.snapshots import sign_snapshot
from envfactory.state import canonical_json

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
# Deterministic agent code: nested folders, modes, a symbolic and a hard link, then a listing.
SETUP = ("import os\n"
         "os.makedirs('deep/er/est', exist_ok=True)\n"
         "open('deep/er/est/data.bin', 'wb').write(bytes(range(256)) * 64)\n"
         "open('notes.txt', 'w').write('first line\\n')\n"
         "os.chmod('notes.txt', 0o600)\n"
         "os.symlink('deep/er/est/data.bin', 'link')\n"
         "os.link('notes.txt', 'notes.hard')\n"
         "os.makedirs('locked'); open('locked/x', 'w').write('x'); os.chmod('locked', 0o500)\n"
         "print('set up')")
LIST = ("import os, stat\n"
        "open('notes.txt', 'a').write('line {n}\\n')\n"
        "out = []\n"
        "for d, ds, fs in sorted(os.walk('.')):\n"
        "    for f in sorted(ds + fs):\n"
        "        p = os.path.join(d, f); st = os.lstat(p)\n"
        "        out.append((p, stat.filemode(st.st_mode), st.st_nlink if not stat.S_ISDIR(st.st_mode) else 0,\n"
        "                    os.readlink(p) if os.path.islink(p) else\n"
        "                    (open(p, 'rb').read()[:40].hex() if stat.S_ISREG(st.st_mode) else '')))\n"
        "print(out)")


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def _kill9(ep) -> str:
    """``docker kill --signal KILL`` the container serving ``ep``; its id."""
    c = ep._world.container
    assert c is not None and not c.dead
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
        assert ep._world.resumed == 1 and ep._world.container.id != first
        c = _run(ep, WRITE.format(f="c"))  # and the episode goes on from there
        assert _run(ep, READ) == str([("a", a), ("b", b), ("c", c)])
        assert ep.state.runs == 5  # the state came back too (the re-sent batch ran once)
        ep.step(call("write_file", path="/answer.txt", content="42"))
        assert ep.step("Done.").reward == 1.0
    finally:
        ep.close()


def _play(kill: bool) -> list:
    """SETUP, then more batches than the journal of a replayed world holds (SNAPSHOT_EVERY),
    (the container killed here when ``kill``), then two listings and the answer: every result,
    the transcript, the log, the final state and the reward."""
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30, max_turns=SNAPSHOT_EVERY + 8)
    try:
        trace: list = [ep.reset(0)]
        steps = ([call("run_python", code=SETUP)]
                 + [call("write_file", path=f"/f{i}", content=str(i)) for i in range(SNAPSHOT_EVERY + 1)])
        for action in steps:
            trace.append(ep.step(action).to_json())
        if kill:
            _kill9(ep)
        for n in (1, 2):
            trace.append(ep.step(call("run_python", code=LIST.format(n=n))).to_json())
        trace.append(ep.step(call("write_file", path="/answer.txt", content="42")).to_json())
        trace.append(ep.step("Done.").to_json())
        assert ep._world.resumed == (1 if kill else 0)
        trace += [ep.transcript(), json.dumps(ep.status.log), canonical_json(ep.state), ep.rewards, ep.success]
        return json.loads(json.dumps(trace))
    finally:
        ep.close()


def test_a_resumed_episode_equals_an_uninterrupted_one() -> None:
    """Deterministic agent code (so a journal could replay it), but the episode outlasts the
    journal, so the files can only come from the snapshots: with a kill -9 before the listings,
    the whole trace equals an uninterrupted run's (links, modes and a read-only folder included)."""
    killed, whole = _play(True), _play(False)
    listing = whole[-9]["messages"][0]["content"]
    assert "('./link', 'lrwxrwxrwx', 1, 'deep/er/est/data.bin')" in listing
    assert "('./notes.hard', '-rw-------', 2, " in listing and "('./locked', 'dr-x------', 0, '')" in listing
    assert killed == whole
    assert whole[-1] is True and whole[-2] == {"agent_0": 1.0}


def test_a_rewrite_that_keeps_size_and_times_is_snapshotted() -> None:
    """Two writes of the same size with the same mtime (``os.utime``, as ``tar x`` or ``cp -p``
    leave them): the snapshot is not fooled into reusing the first archive."""
    code = ("import os, random, time\n"
            "v = '%016x' % random.getrandbits(64)\n"
            "open('same', 'w').write(v)\n"
            "os.utime('same', ns=(10**18, 10**18))\n"
            "time.sleep(0.25)\n"  # past the racy window: the next step compares against this one's fingerprint
            "print(v)")
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30)
    try:
        ep.reset(0)
        _run(ep, code)
        second = _run(ep, code)
        _kill9(ep)
        assert _run(ep, "print(open('same').read())") == second
        assert ep._world.resumed == 1
    finally:
        ep.close()


def test_a_new_episode_starts_with_an_empty_work_folder() -> None:
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30)
    try:
        ep.reset(0)
        _run(ep, WRITE.format(f="a") + "\nos.chmod('/tmp/work/sub', 0o500)")
        ep.reset(0)
        assert "No such file" in ep.step(call("run_python", code=READ)).messages[0]["content"]
    finally:
        ep.close()


@pytest.mark.parametrize("resume", [True, False])
def test_a_fork_sees_the_parents_files_and_its_writes_stay_its_own(resume: bool) -> None:
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30, resume=resume)
    child = None
    try:
        ep.reset(0)
        a = _run(ep, WRITE.format(f="a"))
        child = ep.fork()
        assert child._world.container.id != ep._world.container.id  # a container of its own
        assert _run(child, READ) == str([("a", a)])
        b = _run(child, WRITE.format(f="b"))
        assert _run(child, READ) == str([("a", a), ("b", b)])
        assert _run(ep, READ) == str([("a", a)])
        c = _run(ep, WRITE.format(f="c"))  # nor do the parent's later writes reach the fork
        assert _run(child, READ) == str([("a", a), ("b", b)])
        assert _run(ep, READ) == str([("a", a), ("c", c)])
    finally:
        if child is not None:
            child.close()
        ep.close()


def test_dump_and_load_carry_the_work_folder() -> None:
    """``dump_with_files()`` holds the files, as JSON; ``load`` (here through ``Episode.restore``
    of a snapshot holding it) on another episode (another container) brings them back; the two
    then go their own ways. ``dump()`` stays the plain state."""
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30)
    other = envfactory.make(NAME, runtime="docker", step_timeout=30)
    try:
        ep.reset(0)
        a = _run(ep, WRITE.format(f="a"))
        dumped = json.loads(json.dumps(ep._world.dump_with_files()))
        assert set(dumped) == {"state", WORK_FILES} and dumped["state"] == ep._world.dump()
        snap = ep.snapshot()
        snap["state"] = dumped
        snap = sign_snapshot(snap)  # an edited snapshot is refused unless sealed again
        other.reset(0)
        _run(other, WRITE.format(f="stale"))  # replaced by the dump's folder
        other.restore(snap)
        assert _run(other, READ) == str([("a", a)])
        b = _run(other, WRITE.format(f="b"))
        assert _run(other, READ) == str([("a", a), ("b", b)])
        assert _run(ep, READ) == str([("a", a)])
        assert other.state.runs == 4 and ep.state.runs == 2
        other._world.load(other.task, ep._world.dump())  # the plain state: an empty folder
        assert "No such file" in other.step(call("run_python", code=READ)).messages[0]["content"]
        ep.reset(0)  # an empty folder: the plain state
        assert ep._world.dump_with_files() == ep._world.dump()
    finally:
        other.close()
        ep.close()


def test_a_work_folder_over_the_archive_cap_is_named_when_the_resume_fails() -> None:
    """1 MiB cap; 3 MiB of random bytes (incompressible): fork and dump refuse, naming the cap;
    once the folder shrinks they work again; when the container dies while it is over the cap,
    the episode ends as truncated, naming the cap (never a silent loss of files, never a hang)."""
    spec = envfactory.spec(NAME)
    pool = Pool(spec, warm=0, limits=Limits(work_archive_mb=1))
    ep = envfactory.make(NAME, runtime="docker", pool=pool, step_timeout=30)
    big = "import os\nopen('/tmp/big', 'wb').write(os.urandom(3 << 20))\nprint('ok')"
    try:
        ep.reset(0)
        _run(ep, big)
        for refused in (ep.fork, ep._world.dump_with_files):
            with pytest.raises(envfactory.EpisodeError, match=r"cap \(Limits\.work_archive_mb = 1 MiB\)"):
                refused()
        _run(ep, "import os\nos.unlink('/tmp/big')\nprint('ok')")
        ep.fork().close()  # under the cap again
        _run(ep, big)
        _kill9(ep)
        r = ep.step(call("run_python", code=READ))
        said = r.messages[0]["content"]
        assert r.truncated and r.info["world_lost"] and "cap" in said and "work_archive_mb" in said, said
        ep.reset(0)  # a new episode on a fresh container
        assert _run(ep, "print(6 * 7)") == "42"
    finally:
        ep.close()
        pool.shutdown()
        wait_background()


def test_fork_after_the_container_was_killed_resumes_like_a_step() -> None:
    """Issue 28: after a ``kill -9``, 5 of 5 forks raised ``ContainerError`` while the parent's
    next step resumed. A fork of a world that runs agent code is taken from its last step
    boundary's snapshot (files included) into a container of its own; the parent resumes on
    its next step."""
    ep = envfactory.make(NAME, runtime="docker", step_timeout=30)
    children = []
    try:
        ep.reset(0)
        a = _run(ep, WRITE.format(f="a"))
        for i in range(3):
            _kill9(ep)
            child = ep.fork()
            children.append(child)
            assert _run(child, READ) == str([("a", a)])
            assert _run(ep, READ) == str([("a", a)]) and ep._world.resumed == i + 1  # the parent resumes
    finally:
        for child in children:
            child.close()
        ep.close()
