"""``envfactory.step_many`` over real containers: the turns bound for one container go over its
batch channel (:mod:`envfactory.runtime.batch`), one frame a round, and give what ``step`` gives
on in-process twins; a container killed between rounds is resumed for every session it held.
The in-process cases (slow ops, broken and lying channels, two threads) are in
``tests/test_step_many.py``; the figure is ``python -m benchmarks.docker_runtime sessions
driver=step_many``'s."""

from __future__ import annotations

import random
import socket

import pytest

import envfactory
from envfactory import step_many
from envfactory.runtime import docker as docker_rt
from envfactory.runtime.container import Limits
from envfactory.runtime.pool import Pool

from conftest import require_docker

pytestmark = pytest.mark.docker

ACTIONS = [
    '<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>',
    '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>',
    '<tool_call>{"name": "reset_counter", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    "<tool_call>{oops</tool_call>",
]


@pytest.fixture(scope="module", autouse=True)
def _docker() -> None:
    require_docker()


def _seen(r) -> tuple:
    return r.messages, r.reward, r.terminated, r.truncated, r.info


def test_step_many_over_shared_containers_plays_what_step_plays_and_survives_a_kill(monkeypatch) -> None:
    monkeypatch.setattr(docker_rt, "SNAPSHOT_EVERY", 3)  # snapshots (in the batch's reply) and replays too
    name = "Counter-v0"
    pool = Pool(envfactory.spec(name), sessions_per_container=10, limits=Limits(pids=256, memory_mb=512))
    rng = random.Random(0)
    docker_eps, local_eps = [], []
    try:
        for i in range(30):
            d = envfactory.make(name, runtime="docker", pool=pool, max_turns=40)
            d.reset(i % 3)
            docker_eps.append(d)
            loc = envfactory.make(name, max_turns=40)
            loc.reset(i % 3)
            local_eps.append(loc)
        containers = {id(e._world.container): e._world.container for e in docker_eps}
        assert len(containers) == 3
        killed = None
        for rnd in range(8):
            if rnd == 4:  # kill -9 the container of the first episode, between two rounds
                killed = docker_eps[0]._world.container
                killed.client.api.kill(killed.id, signal="KILL")
            live = [i for i, e in enumerate(local_eps) if not e.done]
            actions = {i: rng.choice(ACTIONS) for i in live}
            got = step_many([(docker_eps[i], actions[i]) for i in live])
            want = [local_eps[i].step(actions[i]) for i in live]
            assert [_seen(r) for r in got] == [_seen(r) for r in want], f"round {rnd}"
        for d, loc in zip(docker_eps, local_eps):
            assert d.state == loc.state and d.status.log == loc.status.log and d.transcript() == loc.transcript()
        assert all(c._batch is not None and c._batch.frames_sent >= 4 for c in containers.values() if c is not killed)
        moved = [e for e in docker_eps if e._world.container is not killed]
        assert len(moved) == 30 and sum(e._world.resumed for e in docker_eps) == 10  # each of its sessions, once
    finally:
        for e in docker_eps:
            e.close()
        pool.shutdown()


def test_a_batch_channel_broken_on_the_hosts_side_keeps_its_container() -> None:
    """The host's end of a batch channel fails (here: shut down under it) while the container is
    fine: the container answers its health request, so it is kept; each of its turns is resumed
    on a fresh session (replayed from its journal) and sent again, and the next round opens a new
    batch channel."""
    name = "Counter-v0"
    pool = Pool(envfactory.spec(name), sessions_per_container=8, limits=Limits(pids=256, memory_mb=512))
    inc = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    eps = []
    try:
        for _ in range(8):
            e = envfactory.make(name, runtime="docker", pool=pool, max_turns=40)
            e.reset(0)
            eps.append(e)
        (c,) = {id(e._world.container): e._world.container for e in eps}.values()
        assert [r.messages[0]["content"] for r in step_many([(e, inc) for e in eps])] == ["1"] * 8
        first = c._batch
        first.sock.shutdown(socket.SHUT_RDWR)
        assert [r.messages[0]["content"] for r in step_many([(e, inc) for e in eps])] == ["2"] * 8
        assert not c.dead and sum(e._world.resumed for e in eps) == 8
        assert all(e._world.container is c for e in eps)  # the same container, new sessions
        assert [r.messages[0]["content"] for r in step_many([(e, inc) for e in eps])] == ["3"] * 8
        assert c._batch is not first and c._batch.frames_sent == 1
    finally:
        for e in eps:
            e.close()
        pool.shutdown()


def test_a_rollout_over_shared_containers_steps_them_in_batch_frames() -> None:
    """``agents.rollout.rollout`` over one agent's Docker episodes plays each tick as one
    ``step_many`` round (the turns of a shared container in one batch frame) and gives the
    trajectories of the same rollout over in-process episodes."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from agents.rollout import rollout
    from agents.policies.scripted_model import ScriptedModel
    from agents.models.tiny import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    inc = ACTIONS[1]

    def script(prompt: list[int], turn: int) -> str:  # counter-0-N: N increments of 1, then an answer
        target = int(tokenizer.decode(prompt).split("exactly ")[1].split(" ")[0])
        return inc if turn < target else "The counter shows the target."

    name = "Counter-v0"
    tasks = [t.id for t in envfactory.spec(name).get_tasks()[:8]]
    pool = Pool(envfactory.spec(name), sessions_per_container=8, limits=Limits(pids=256, memory_mb=512))
    docker_eps = [envfactory.make(name, runtime="docker", pool=pool, max_turns=8) for _ in tasks]
    try:
        trajectories = []
        for eps in ([envfactory.make(name, max_turns=8) for _ in tasks], docker_eps):
            done = rollout(ScriptedModel(tokenizer, script), list(zip(eps, tasks)), max_new_tokens=64, seed=3,
                           tokenizer=tokenizer)
            trajectories.append([({a: t.to_json() for a, t in r.trajectories.items()}, r.success, r.error)
                                 for r in done])
        assert trajectories[0] == trajectories[1]
        assert all(success for _, success, _ in trajectories[1])
        (c,) = {id(e._world.container): e._world.container for e in docker_eps}.values()
        assert c._batch is not None and c._batch.frames_sent >= 2
    finally:
        for e in docker_eps:
            e.close()
        pool.shutdown()
