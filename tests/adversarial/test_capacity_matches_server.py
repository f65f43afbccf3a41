"""Capacity matches what one container's server can serve, and a full container's refusal sends a
session elsewhere (issue 28, "failure stays with its session"), on the Docker runtime.

Before: ``sessions_per_container`` was taken as given (500 here), past the server's connection
limit (128 with the default pid limit), and a session the server refused (its connections all
taken) raised ``ContainerError`` out of ``reset()`` (the issue: 270-314 of 2,000 sessions).
250 Counter-v0 sessions opened one after another with 200 per container asked (load 15): before,
2 errors (one refusal, one host-side EPIPE that marked the container dead), 1 container; after,
0 errors, 3 containers of at most 114.

Runtime: about 20 s on 2 cores once the image exists (two containers).
"""

from __future__ import annotations

import socket
import struct

import pytest

import envfactory
from envfactory import call
from envfactory.registry import spec as get_spec
from envfactory.runtime import wire
from envfactory.runtime.container import CONTROL_CONNECTIONS, Limits, server_connections, session_capacity

from conftest import require_docker

pytestmark = pytest.mark.docker
TODO = "/home/user/notes/todo.txt"


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def test_sessions_per_container_is_clamped_to_the_servers_connections() -> None:
    from envfactory.runtime.pool import Pool

    for limits in (Limits(), Limits(pids=64), Limits(pids=1024)):
        p = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=500, limits=limits)
        try:
            n = p.per_container
            assert n == min(500, session_capacity(limits))
            assert n + CONTROL_CONNECTIONS < server_connections(n, limits)  # room for control calls
        finally:
            p.shutdown()
    assert session_capacity(Limits()) < 128


def _refused(path: str) -> bool:
    """Whether the server refuses a new channel now (all its connections taken)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(path)
        s.sendall(wire.MAGIC)
        (n,) = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))
        return b'"busy"' in s.recv(n, socket.MSG_WAITALL)
    except OSError:
        return False
    finally:
        s.close()


def test_a_session_the_full_server_refuses_goes_to_another_container() -> None:
    from envfactory.runtime.pool import Pool

    pool = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=8)
    held: list[socket.socket] = []
    try:
        bystander = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
        bystander.reset(0)
        c = bystander._world.container
        for _ in range(server_connections(8, pool.limits) + 4):  # every connection taken (idle ones)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(c.socket_path)
            held.append(s)
        assert _refused(c.socket_path)
        newcomer = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
        newcomer.reset(0)  # refused there: placed in another container, no error
        assert newcomer._world.container is not c and not c.dead
        assert newcomer.step(call("read_file", path=TODO)).messages[0]["content"].startswith("Move ")
        assert bystander.step(call("read_file", path=TODO)).messages[0]["content"].startswith("Move ")
        assert bystander._world.container is c and bystander._world.resumed == 0
        newcomer.close()
        bystander.close()
    finally:
        for s in held:
            s.close()
        pool.shutdown()


def test_a_channel_the_server_closes_unread_goes_to_another_container(monkeypatch) -> None:
    """A server over its connection bound with its refusal queue full closes a new connection
    unread: the host's write of the handshake fails (``EPIPE``) while the container answers.
    Before: that raised ``ContainerError`` out of ``reset()`` (and, before that, marked the
    container dead); now the session goes to another container and this one is kept."""
    from envfactory.runtime import container as container_module
    from envfactory.runtime.pool import Pool

    pool = Pool(get_spec("FileSystem-v0"), warm=0, sessions_per_container=8)
    try:
        bystander = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
        bystander.reset(0)
        c = bystander._world.container
        send = container_module.send_frame
        closed = []

        def unread(sock, obj):
            if not closed:
                closed.append(sock)
                raise BrokenPipeError(32, "Broken pipe")
            return send(sock, obj)

        monkeypatch.setattr(container_module, "send_frame", unread)
        newcomer = envfactory.make("FileSystem-v0", runtime="docker", pool=pool)
        newcomer.reset(0)
        assert closed and newcomer._world.container is not c and not c.dead
        assert bystander.step(call("read_file", path=TODO)).messages[0]["content"].startswith("Move ")
        assert bystander._world.container is c and bystander._world.resumed == 0
        newcomer.close()
        bystander.close()
    finally:
        pool.shutdown()
