"""A container is marked dead only on evidence from the container (issue 28, "failure stays
with its session"): an error the host's own side raises on its socket (``EBADF``: the
channel's descriptor closed under it; ``EPIPE``: its write side shut) or in a control call's
transport is checked against the container, which answers, so it is kept with every other
session in it; only the session whose channel broke resumes, on a fresh session.

Before: each such error removed the shared container and resumed every bystander in it (the
issue's 2,000-session run: 1,524 resumes and 177 episodes ended ``world_lost``).

Runtime: about 20 s on 2 cores once the image exists.
"""

from __future__ import annotations

import socket

import httpx
import pytest

import envfactory
from envfactory import call
from envfactory.registry import spec as get_spec
from envfactory.runtime.container import ContainerError

from conftest import require_docker

pytestmark = pytest.mark.docker
TODO = "/home/user/notes/todo.txt"


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


@pytest.fixture()
def pool():
    from envfactory.runtime.pool import Pool

    p = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=8)
    yield p
    p.shutdown()


def _exists(container_id: str) -> bool:
    from envfactory.runtime.pool import docker_client

    return bool(docker_client().containers.list(all=True, filters={"id": container_id}))


def _ebadf(chan: socket.socket) -> None:
    chan.close()  # the host's own descriptor goes: the next use is EBADF


def _epipe(chan: socket.socket) -> None:
    chan.shutdown(socket.SHUT_WR)  # the host's own write side goes: the next send is EPIPE


@pytest.mark.parametrize("breakage", [_ebadf, _epipe], ids=["EBADF", "EPIPE"])
def test_a_host_side_socket_error_keeps_the_healthy_container(pool, breakage) -> None:
    from envfactory.runtime.docker import stats

    local = envfactory.make("FileSystem-v0")
    victim = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
    bystander = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
    for e in (local, victim, bystander):
        e.reset(0)
    c = victim._world.container
    assert bystander._world.container is c
    write = call("write_file", path="/home/user/a.txt", content="alpha")
    assert victim.step(write).messages == local.step(write).messages
    resumed = stats()["resumed"]
    breakage(victim._world._link._chan)
    r = victim.step(call("read_file", path="/home/user/a.txt"))  # resumes on a fresh session
    assert r.messages == local.step(call("read_file", path="/home/user/a.txt")).messages and not r.done
    assert not c.dead and _exists(c.id) and victim._world.resumed == 1
    assert bystander.step(call("read_file", path=TODO)).messages[0]["content"].startswith("Move ")
    assert bystander._world.container is c and bystander._world.resumed == 0
    assert stats()["resumed"] - resumed == 1  # the victim's own session only
    victim.close()
    bystander.close()


def test_a_control_call_failing_on_the_host_side_keeps_the_container(pool, monkeypatch) -> None:
    env = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
    env.reset(0)
    c = env._world.container

    def broken(*args, **kwargs):
        raise httpx.ConnectError("[Errno 9] Bad file descriptor")

    monkeypatch.setattr(c.http, "stream", broken)
    with pytest.raises(ContainerError, match="still answers"):
        c.call("GET", "/health")
    assert not c.dead
    monkeypatch.undo()
    assert c.call("GET", "/health")["ok"] is True
    assert env.step(call("read_file", path=TODO)).messages[0]["content"].startswith("Move ")
    assert env._world.container is c
    env.close()
