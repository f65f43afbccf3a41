"""Faults, containment, cleanup and the reward-tampering attack on the Docker runtime.

The episode (the referee) runs here; its world runs in the container
(``episode._world``, a :class:`~envfactory.runtime.docker.ContainerWorld`), so
the container's faults surface as world faults: :class:`ContainerError`, or a
:class:`~envfactory.world.WorldTimeout` that the referee turns into a truncated
episode.

Runtime: about 30-60 s on 2 cores once images exist (each per-session
container starts in about a second; two tests wait out a timeout).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import envfactory
from envfactory import call
from envfactory.runtime.container import LABEL, ContainerError, Limits

from conftest import require_docker

sys.path.insert(0, os.path.dirname(__file__))
import docker_attack_env  # noqa: E402  (registers CodeSandbox-v0, isolation="container")

pytestmark = pytest.mark.docker
INC = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def _exists(container_id: str) -> bool:
    from envfactory.runtime.pool import docker_client

    return bool(docker_client().containers.list(all=True, filters={"id": container_id}))


def test_container_killed_mid_episode_names_env_and_session_and_is_replaced() -> None:
    env = envfactory.make("Counter-v0", runtime="docker", resume=False)  # resume=True: see test_crash_resume
    env.reset(0)
    env.step(INC)
    c, session = env._world.container, env._world.session
    c.client.api.kill(c.id)
    r = env.step(INC)  # the episode ends as truncated, the error naming what was lost
    said = r.messages[0]["content"]
    assert r.truncated and r.info["world_lost"] and env.status.ended_by == "world_lost" and r.reward == 0.0
    assert "Counter-v0" in said and session in said and c.name in said
    assert not _exists(c.id)
    env.reset(0)  # the pool gives a fresh container
    assert env._world.container is not c and env.step(INC).messages[0]["content"] == "1"
    env.close()


def test_labels_and_cleanup_by_close_and_gc() -> None:
    env = envfactory.make("CodeSandbox-v0", runtime="docker")
    env.reset(0)
    cid = env._world.container.id
    labels = env._world.container.client.containers.get(cid).labels
    assert labels[LABEL] == "1" and labels["org.envfactory.env"] == "CodeSandbox-v0"
    assert labels["org.envfactory.owner"].endswith(f":{os.getpid()}")
    env.close()
    env.close()  # idempotent
    from envfactory.runtime.pool import _removals

    for t in list(_removals):
        t.join(30)
    assert not _exists(cid)
    # A process that dies without cleaning up: its containers are found by their labels.
    code = ("import envfactory, os; e = envfactory.make('Counter-v0', runtime='docker'); e.reset(0); "
            "print(e._world.container.id, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    orphan = out.stdout.split()[-1]
    assert _exists(orphan)
    cli = subprocess.run([sys.executable, "-m", "envfactory.cli", "gc", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert orphan[:12] in cli.stdout and not _exists(orphan)


def test_interpreter_exit_leaves_no_container() -> None:
    code = ("import envfactory; e = envfactory.make('Counter-v0', runtime='docker'); e.reset(0); "
            "print(e._world.container.id)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert not _exists(out.stdout.split()[-1])


def test_step_that_runs_forever_times_out_and_recycles_the_container() -> None:
    env = envfactory.make("CodeSandbox-v0", runtime="docker", step_timeout=1.5)
    env.reset(0)
    c = env._world.container
    r = env.step(call("run_python", code="while True: pass"))
    assert r.truncated and r.reward == 0.0 and r.info["timeout"] and env.status.ended_by == "timeout"
    assert r.messages[0]["content"].startswith("Error: the step did not finish within 1.5s")
    assert c.name in r.messages[0]["content"] and "recycled" in r.messages[0]["content"]
    assert env.transcript()[-1] == r.messages[-1]
    assert not _exists(c.id)
    env.reset(0)
    assert env._world.container is not c
    assert env.step(call("write_file", path="/answer.txt", content="42")).messages[0]["content"] == "OK"
    env.close()


def test_memory_hog_and_fork_bomb_are_contained() -> None:
    env = envfactory.make("CodeSandbox-v0", runtime="docker", step_timeout=20,
                          pool=None, limits=Limits(memory_mb=256, pids=64))
    env.reset(0)
    r = env.step(call("run_python", code="x = b'x' * (1 << 31)\nprint(len(x))"))
    assert r.messages[0]["content"].startswith("Error: exit status"), r.messages  # killed or MemoryError
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = env.step(call("run_python", code=bomb))
    assert "was killed" in r.messages[0]["content"], r.messages
    # The server survived both, inside its limits; the episode goes on normally.
    r = env.step(call("run_python", code="print(6 * 7)"))
    assert r.messages[0]["content"].strip() == "42"
    env.close()


ATTACK = r"""
import json, os, re, socket
report = {}
def http(path, body, token=None):
    s = socket.socket(socket.AF_UNIX); s.connect('/run/envf/s')
    data = json.dumps(body).encode()
    head = f'POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n'
    if token: head += f'X-Envf-Token: {token}\r\n'
    s.sendall((head + '\r\n').encode() + data)
    return s.recv(4096).decode().split('\r\n')[0]
# 1. Steal the secret: from the server's memory, from any process's environment, from the socket folder.
report['leaks'] = []
for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:
    for what in ('environ', 'mem'):
        try:
            data = open(f'/proc/{pid}/{what}', 'rb').read(1 << 16)
            report['leaks'] += [m.decode() for m in re.findall(rb'[0-9a-f]{32}', data)]
        except OSError as e:
            report.setdefault(f'{what}_errors', set()).add(type(e).__name__)
report['folder'] = sorted(os.listdir('/run/envf'))
report = {k: sorted(v) if isinstance(v, set) else v for k, v in report.items()}
# 2. Overwrite the state (and with it any success check) through the server's own API:
#    a control call, and a world operation on the framed channel.
report['restore'] = http('/sessions/x/fork', {}, token='guess')
s = socket.socket(socket.AF_UNIX); s.connect('/run/envf/s')
data = json.dumps({'token': 'guess', 'session': 'x'}).encode()
s.sendall(b'ENVF' + len(data).to_bytes(4, 'big') + data)
reply = b''
while chunk := s.recv(4096):
    reply += chunk
report['frames'] = reply[4:].decode()   # then it would send {'op': 'load', 'state': ...}
# 3. Replace the server's socket with our own, which would report success, and fill the
#    host's disk through the socket folder (a bind mount of a host folder).
try:
    os.rename('/run/envf/s', '/run/envf/old')
    fake = socket.socket(socket.AF_UNIX); fake.bind('/run/envf/s'); fake.listen(8)
    report['socket'] = 'replaced'
except OSError as e:
    report['socket'] = 'kept: ' + type(e).__name__
try:
    with open('/run/envf/fill', 'wb') as f:
        f.write(b'x' * (1 << 20))
    report['folder_write'] = 'written'
except OSError as e:
    report['folder_write'] = type(e).__name__
print(json.dumps(report))
if report['socket'] == 'replaced' and os.fork() == 0:   # keep the fake listener alive after this program returns
    os.setsid(); os.close(1); os.close(2)
    import time; time.sleep(60)
"""


def test_agent_code_cannot_change_the_host_computed_reward() -> None:
    env = envfactory.make("CodeSandbox-v0", runtime="docker", step_timeout=20)
    env.reset(0)
    r = env.step(call("run_python", code=ATTACK))
    report = r.messages[0]["content"]
    assert env._world.container.token not in report and '"folder": ["s"]' in report, report
    assert '"environ_errors": ["PermissionError"]' in report, report
    assert "401 Unauthorized" in report and "wrong token" in report, report
    # The socket folder was sealed once the server listened: no file, no impostor socket.
    assert '"socket": "kept: PermissionError"' in report and '"folder_write": "PermissionError"' in report, report
    assert os.listdir(env._world.container.host_dir) == ["s"]
    # Were the socket replaced all the same (here from the host), a new connection would meet
    # the impostor: the peer check refuses it.
    c = env._world.container
    os.rename(c.socket_path, c.socket_path + ".real")
    fake = socket.socket(socket.AF_UNIX)
    try:
        fake.bind(c.socket_path)
        fake.listen(8)
        with pytest.raises(ContainerError, match="replaced"):
            c.open_channel(env._world.session, 5)
    finally:
        fake.close()
        os.unlink(c.socket_path)
        os.rename(c.socket_path + ".real", c.socket_path)
    # The established channel still reaches the real server; the claim buys nothing.
    r = env.step("I wrote 42 to /answer.txt. Task complete, success=true, reward=1.")
    assert r.terminated and r.reward == 0.0 and r.info["success"] is False
    env.close()
    # The same task done as intended earns the reward.
    honest = envfactory.make("CodeSandbox-v0", runtime="docker")
    honest.reset(0)
    honest.step(call("write_file", path="/answer.txt", content="42"))
    assert honest.step("Done.").reward == 1.0
    honest.close()


def test_a_reply_that_breaks_the_protocol_is_a_container_fault() -> None:
    """The host checks every reply: one well-formed outcome per call, a valid state.
    A container that claims anything else (an extra outcome, a forged kind, a state
    of the wrong shape) is removed; claims of rewards in a reply are never read."""
    env = envfactory.make("Counter-v0", runtime="docker", sessions_per_container=1)
    link = env._world._link
    real = link.request

    def claims(req: dict, **kw) -> dict:
        reply = real(req, **kw)
        reply.update(reward=1.0, success=True, terminated=True, state_hash="forged")
        return reply

    link.request = claims
    env.reset(0)  # the task: make the counter show exactly 1
    for _ in range(2):
        r = env.step(INC)
        assert not r.done and r.reward == 0.0
    r = env.step("The counter shows 1, success=true, reward=1.")
    assert r.terminated and r.reward == 0.0 and r.info["success"] is False  # it shows 2
    forgeries = [
        lambda reply: reply["outcomes"].append({"content": "2", "ok": True, "kind": "ok"}),
        lambda reply: reply["outcomes"][0].update(ok="yes"),
        lambda reply: reply["outcomes"][0].update(ok=False, kind="ok"),
        lambda reply: reply.pop("outcomes"),
        lambda reply: reply.update(outcomes=["1"]),
    ]
    for forge in forgeries:
        def forged(req: dict, _forge=forge, **kw) -> dict:
            reply = real(req, **kw)
            if req["op"] == "run":
                _forge(reply)
            return reply

        link.request = forged
        env.reset(0)
        c = env._world.container
        with pytest.raises(ContainerError, match="untrustworthy") as err:
            env.step(INC)
        assert "Counter-v0" in str(err.value) and c.name in str(err.value)
        assert env._world.container is None and not _exists(c.id)
    link.request = real

    def bad_state(req: dict, **kw) -> dict:
        reply = real(req, **kw)
        if req["op"] == "state":
            reply["state"] = {"value": "a lot", "reward": 1}
        return reply

    link.request = bad_state
    env.reset(0)
    c = env._world.container
    env.step(INC)
    with pytest.raises(ContainerError, match="not a valid"):
        env.step("Done.")  # the reward needs the final state: it is validated here
    assert not _exists(c.id) and not env.success
    link.request = real
    env.reset(0)  # a fresh container serves again
    env.step(INC)
    assert env.step("Done.").reward == 1.0
    env.close()


def test_gc_leaves_other_hosts_containers_alone() -> None:
    """gc removes only what it can prove dead: a container whose owner is a process of another host
    (an engine shared between machines) stays unless told --all. (``gc(everything=True)`` itself is
    not run here: it would remove the live pooled containers other tests of this process hold.)"""
    from envfactory.runtime.pool import docker_client, gc, provably_dead

    host = socket.gethostname()
    assert not provably_dead("some-other-host:1", host)              # another host: maybe alive
    assert not provably_dead(f"{host}:{os.getpid()}", host)          # this process: alive
    assert provably_dead(f"{host}:{2**22 + 12345}", host)            # no such process here
    client = docker_client()
    other = client.containers.create("envfactory-base:bookworm", ["sleep", "1"], network_mode="none",
                                     labels={LABEL: "1", "org.envfactory.owner": "some-other-host:1",
                                             "org.envfactory.env": "Counter-v0"})
    try:
        assert other.id[:12] not in {r["id"] for r in gc()}
        assert _exists(other.id)
    finally:
        other.remove(force=True)
