"""The OOM killer takes the agent's processes before the server (issue 28): in a container that
runs agent code (``isolation="container"``; tests/docker_attack_env.py's CodeSandbox-v0), every
process agent code starts gets ``oom_score_adj`` 1000 while the server keeps its own (0), so a
memory attack kills the attacker's processes and the episode goes on.

Before: agent processes inherited the server's score (0 and 0), and 60 children of 20 MiB each
in a 256 MiB container got the server killed: the episode ended ``world_lost``.

Runtime: about 20 s on 2 cores once the image exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import envfactory
from envfactory import call
from envfactory.runtime.container import Limits

from conftest import require_docker

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import docker_attack_env  # noqa: E402,F401  (registers CodeSandbox-v0, isolation="container")

pytestmark = pytest.mark.docker

SCORES = """
import os, time, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
time.sleep(0.5)
def adj(pid):
    return int(open(f"/proc/{pid}/oom_score_adj").read())
def cmd(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""
server = [p for p in os.listdir("/proc") if p.isdigit() and p != "1" and b"-m\\0envfactory.runtime." + b"serve" in cmd(p)]
print(adj(os.getpid()), adj(child.pid), [adj(p) for p in server])
child.kill()
"""

HOG = """
import subprocess, sys, time
hog = "x = bytearray(20 << 20)\\nfor i in range(0, len(x), 4096): x[i] = 1\\nimport time; time.sleep(20)"
kids = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(60)]
time.sleep(8)
print(sum(k.poll() is not None for k in kids), "of 60 children were killed")
"""


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def test_agent_processes_score_above_the_server() -> None:
    ep = envfactory.make("CodeSandbox-v0", runtime="docker", step_timeout=30)
    try:
        ep.reset(0)
        r = ep.step(call("run_python", code=SCORES))
        mine, child, server = r.messages[0]["content"].split(" ", 2)
        assert (int(mine), int(child)) == (1000, 1000), r.messages
        assert eval(server) == [0], r.messages  # the server keeps its own score
    finally:
        ep.close()


def test_a_memory_attack_kills_the_agents_processes_not_the_server() -> None:
    ep = envfactory.make("CodeSandbox-v0", runtime="docker", step_timeout=60, resume=False,
                         limits=Limits(memory_mb=256, pids=256))
    try:
        ep.reset(0)
        c = ep._world.container
        r = ep.step(call("run_python", code=HOG))
        assert not r.done and "world_lost" not in r.info, r.messages
        assert ep._world.container is c and not c.dead
        assert ep.step(call("run_python", code="print(6 * 7)")).messages[0]["content"].strip() == "42"
    finally:
        ep.close()
