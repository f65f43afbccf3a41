"""Nothing leaks, nothing is lost (issue 17, lifecycle), on the Docker runtime.

* a process that exits normally, is sent SIGTERM, or is killed (then ``envfactory gc``)
  leaves no container behind: each case runs a small script in a subprocess and then
  lists the containers labelled with that process as owner;
* an episode dropped without ``close()`` has its session closed on the server (its
  container removed, when it had one of its own);
* the background removals of per-session containers do not pile up;
* a flood of connections past the server's bound is refused, and the server, with
  every session it holds, survives it;
* agent code cannot outlive its call (``setsid`` daemons, a detached fork bomb).

Runtime: about 60-90 s on 2 cores once the images exist.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

import envfactory
from envfactory import call
from envfactory.registry import spec as get_spec
from envfactory.runtime.container import LABEL, ContainerError, Limits

from conftest import require_docker

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
import docker_attack_env  # noqa: E402,F401  (registers CodeSandbox-v0, isolation="container")

pytestmark = pytest.mark.docker
TODO = "/home/user/notes/todo.txt"


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def _client():
    from envfactory.runtime.pool import docker_client

    return docker_client()


def _owned(pid: int) -> list[str]:
    """Names of the envfactory containers (running or not) whose owner is process ``pid`` of this host
    (``docker ps -a`` filtered by the labels ``envfactory gc`` uses)."""
    owner = f"{socket.gethostname()}:{pid}"
    rows = _client().api.containers(all=True, filters={"label": [f"{LABEL}=1", f"org.envfactory.owner={owner}"]})
    return [r["Names"][0].lstrip("/") for r in rows]


def _socket_dirs(pid: int) -> list[str]:
    owner = f"{socket.gethostname()}:{pid}"
    rows = _client().api.containers(all=True, filters={"label": [f"{LABEL}=1", f"org.envfactory.owner={owner}"]})
    return [r["Labels"]["org.envfactory.socket_dir"] for r in rows]


def _exists(container_id: str) -> bool:
    return bool(_client().api.containers(all=True, filters={"id": container_id}))


# A process with every kind of container: a per-session one played and closed (the pool
# keeps a warm one), a shared one whose episode is left open, and a pool made directly
# (not through get_pool), prewarmed.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    import envfactory, docker_attack_env
    from envfactory import call
    from envfactory.registry import spec
    from envfactory.runtime.pool import Pool
    sandbox = envfactory.make("CodeSandbox-v0", runtime="docker")
    sandbox.reset(0)
    sandbox.step(call("run_python", code="print(1)"))
    sandbox.close()
    kept = envfactory.make("Counter-v0", runtime="docker")
    kept.reset(0)
    direct = Pool(spec("CodeSandbox-v0"), warm=1)
    direct.prewarm()
    print("ready", os.getpid(), flush=True)
    if {wait!r}:
        time.sleep(600)
""")


def _env() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(envfactory.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _start(wait: bool) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(tests=TESTS, wait=wait)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the script did not get ready: {line!r} {err[-3000:]}")
    pid = int(line.split()[1])
    assert pid == proc.pid
    assert len(_owned(pid)) >= 3  # the warm per-session one, the shared one, the direct pool's
    return proc, pid


def test_clean_exit_leaves_no_container() -> None:
    proc, pid = _start(wait=False)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert _owned(pid) == []  # the process is gone: nothing may still be on its way out


def test_sigterm_leaves_no_container_and_dies_of_sigterm() -> None:
    proc, pid = _start(wait=True)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-3000:])
    assert _owned(pid) == []


def test_kill_9_then_gc_leaves_no_container() -> None:
    proc, pid = _start(wait=True)
    dirs = _socket_dirs(pid)
    proc.kill()
    proc.communicate(timeout=60)
    assert _owned(pid)  # nothing could clean up
    cli = subprocess.run([sys.executable, "-m", "envfactory.cli", "gc", "--json"], capture_output=True, text=True,
                         timeout=300, env=_env())
    assert cli.returncode == 0, cli.stderr
    assert _owned(pid) == []
    assert not any(os.path.exists(d) for d in dirs)


def test_a_program_with_its_own_sigterm_handler_keeps_it() -> None:
    code = textwrap.dedent(f"""
        import signal, sys
        sys.path.insert(0, {TESTS!r})
        mine = lambda *a: None
        signal.signal(signal.SIGTERM, mine)
        import envfactory
        from envfactory.registry import spec
        from envfactory.runtime.pool import Pool
        p = Pool(spec("Counter-v0"), warm=0)
        assert signal.getsignal(signal.SIGTERM) is mine
        p.shutdown()
        print("kept")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env())
    assert out.returncode == 0 and "kept" in out.stdout, out.stderr[-3000:]


@pytest.fixture(scope="module")
def shared_pool():
    from envfactory.runtime.pool import Pool

    p = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=8)
    yield p
    p.shutdown()


def _sessions(container, expect: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        n = container.call("GET", "/health")["sessions"]
        if n == expect or time.monotonic() > deadline:
            return n
        time.sleep(0.2)


def _settle() -> None:
    """Let the closes that collection queued run."""
    gc.collect()
    try:
        from envfactory.runtime.pool import wait_background
    except ImportError:  # (before the fix there was nothing to wait for)
        return
    wait_background()


def test_a_dropped_episode_closes_its_session(shared_pool) -> None:
    keeper = envfactory.make("FileSystem-v0", runtime="docker", pool=shared_pool)
    keeper.reset(0)
    c = keeper._world.container
    for _ in range(20):
        e = envfactory.make("FileSystem-v0", runtime="docker", pool=shared_pool)
        e.reset(0)
        assert e._world.container is c
        del e  # never closed
    _settle()
    assert _sessions(c, 1) == 1  # the keeper's alone
    assert c.sessions == 1  # and the pool's count of the container's sessions agrees
    keeper.step(call("read_file", path=TODO))  # the keeper never noticed
    keeper.close()


def test_a_dropped_episode_with_a_container_of_its_own_removes_it() -> None:
    from envfactory.runtime.pool import Pool

    pool = Pool(get_spec("CodeSandbox-v0"), warm=0)
    try:
        e = envfactory.make("CodeSandbox-v0", runtime="docker", pool=pool)
        e.reset(0)
        cid = e._world.container.id
        del e
        _settle()
        deadline = time.monotonic() + 30
        while _exists(cid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _exists(cid)
    finally:
        pool.shutdown()


def test_background_removals_do_not_pile_up() -> None:
    from envfactory.runtime import pool as pool_mod

    pool = pool_mod.Pool(get_spec("CodeSandbox-v0"), warm=1)
    ids, most = [], 0
    try:
        for _ in range(10):
            e = envfactory.make("CodeSandbox-v0", runtime="docker", pool=pool)
            e.reset(0)
            ids.append(e._world.container.id)
            e.close()
            most = max(most, len(pool_mod._removals))
        for t in list(pool_mod._removals):
            t.join(60)
        assert most <= 4, most  # bounded while episodes run
        assert len(pool_mod._removals) == 0  # and nothing kept once they are done
        assert not any(_exists(i) for i in ids)
    finally:
        pool.shutdown()


def test_a_connection_flood_is_refused_and_the_server_survives(shared_pool) -> None:
    a = envfactory.make("FileSystem-v0", runtime="docker", pool=shared_pool)
    a.reset(0)
    c = a._world.container
    before = a.step(call("read_file", path=TODO)).messages[0]["content"]
    flood = []
    try:
        for _ in range(300):  # more than the server's bound, and than its pid limit (256)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(c.socket_path)
            flood.append(s)
            if len(flood) % 50 == 0:
                time.sleep(0.2)
        time.sleep(1.0)
        # One more, over the bound: an error in its own protocol, not a dead server.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(c.socket_path)
        s.sendall(f"GET /health HTTP/1.1\r\nHost: x\r\nX-Envf-Token: {c.token}\r\n\r\n".encode())
        head = s.recv(4096).decode(errors="replace")
        s.close()
        assert head.startswith("HTTP/1.1 503") and "at most" in head, head
        # The session opened before the flood goes on.
        assert a.step(call("read_file", path=TODO)).messages[0]["content"] == before
    finally:
        for s in flood:
            s.close()
    # Once the flood is gone, new sessions are served again.
    deadline = time.monotonic() + 30
    while True:
        b = envfactory.make("FileSystem-v0", runtime="docker", pool=shared_pool)
        try:
            b.reset(0)
            break
        except ContainerError:
            b.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert b._world.container is c and not c.dead
    assert b.step(call("read_file", path=TODO)).messages[0]["content"] == before
    a.close()
    b.close()


DAEMON = textwrap.dedent("""
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(1); os.close(2)
            time.sleep(600)
        os._exit(0)
    time.sleep(0.3)
    print(len([p for p in os.listdir('/proc') if p.isdigit()]))
""")

COUNT = "import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]))"  # zombies too: they hold pids

BOMB = textwrap.dedent("""
    import os, time
    if os.fork() == 0:
        os.setsid()
        os.close(1); os.close(2)
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
    time.sleep(0.5)
    print("started")
""")


def test_agent_processes_do_not_outlive_their_call() -> None:
    env = envfactory.make("CodeSandbox-v0", runtime="docker", step_timeout=20, limits=Limits(pids=64))
    env.reset(0)
    try:
        # pid 1, the server, this program: 3 processes; the escaped daemon (and its parent,
        # not yet reaped) make more.
        baseline = int(env.step(call("run_python", code=COUNT)).messages[0]["content"])
        with_daemon = int(env.step(call("run_python", code=DAEMON)).messages[0]["content"])
        assert with_daemon > baseline
        after = int(env.step(call("run_python", code=COUNT)).messages[0]["content"])
        assert after == baseline, (baseline, after)  # the setsid daemon did not survive its call
        # A detached fork bomb would hold the pid limit for the rest of the episode.
        assert env.step(call("run_python", code=BOMB)).messages[0]["content"].strip() == "started"
        r = env.step(call("run_python", code="print(6 * 7)"))
        assert r.messages[0]["content"].strip() == "42", r.messages
        assert int(env.step(call("run_python", code=COUNT)).messages[0]["content"]) == baseline
    finally:
        env.close()


def test_a_container_has_a_maximum_lifetime() -> None:
    from envfactory.runtime.pool import Pool, wait_background

    pool = Pool(get_spec("Counter-v0"), warm=0, limits=Limits(max_lifetime_s=8))
    try:
        e = envfactory.make("Counter-v0", runtime="docker", pool=pool)
        e.reset(0)
        c = e._world.container
        while not c.retiring:  # 90% of its lifetime
            time.sleep(0.2)
        f = envfactory.make("Counter-v0", runtime="docker", pool=pool)
        f.reset(0)
        assert f._world.container is not c  # no new session in a container about to expire
        e.close()  # its last session: it goes now
        wait_background()
        assert not _exists(c.id)
        f.close()
        # Nobody removes it (its owner was killed): the server exits at the end of its lifetime.
        orphan = pool.start_container()
        deadline = time.monotonic() + 60
        while orphan.status().get("Status") == "running" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert orphan.status().get("Status") == "exited"
        orphan.remove()
    finally:
        pool.shutdown()
