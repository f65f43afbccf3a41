"""A shared container whose server creeps up in memory retires before the OOM killer takes it
(issue 63), on the Docker runtime.

Before: a long-lived container's server grew 12-15 MiB a minute under the million-output fuzz
(fragmentation that no trim returns) until the OOM killer ended it at its limit, and every session
in it was resumed elsewhere. ``Hoard-v0``'s ``hoard`` stands for that growth (memory kept outside
any state, so no quota sees it). Now the pool measures a container's memory when a session on it
starts an episode: past ``Limits.retire_memory`` of its limit the container retires (no new
session, each session moves at its next episode start, removed when the last one ends), so no
container dies and no bystander is resumed; a bystander in the middle of its episode is not moved.

Runtime: about 20-40 s on 2 cores once the image exists.
"""

from __future__ import annotations

import os
import sys

import pytest

import envfactory
from envfactory import call
from envfactory.runtime import container as container_module
from envfactory.runtime.container import Limits

from conftest import require_docker

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def hoard_spec():
    require_docker()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import hoard_env
    finally:
        sys.path.pop(0)
    from envfactory import registry

    registry.register(hoard_env.SPEC, replace=True)
    yield hoard_env.SPEC
    registry._REGISTRY.pop(hoard_env.SPEC.name, None)


def _exists(client, cid: str) -> bool:
    return any(r["Id"] == cid for r in client.api.containers(all=True))


def test_a_creeping_container_retires_before_it_dies_and_no_bystander_is_resumed(hoard_spec, monkeypatch) -> None:
    from envfactory.runtime.docker import stats
    from envfactory.runtime.pool import Pool, wait_background

    monkeypatch.setattr(container_module, "MEMORY_CHECK_S", 0.0)  # measure at every episode start
    pool = Pool(hoard_spec, warm=0, limits=Limits(memory_mb=256))
    resumed = stats()["resumed"]
    try:
        bystander = envfactory.make("Hoard-v0", runtime="docker", pool=pool)
        bystander.reset(0)
        c = bystander._world.container
        used = c.memory_used()
        assert used is not None and 1 << 20 < used < 128 << 20, used  # the engine's figure, the server's size
        hoarder = envfactory.make("Hoard-v0", runtime="docker", pool=pool)
        homes = []
        for i in range(12):  # 12 x 24 MiB: past the 256 MiB limit if it all stayed in one container
            hoarder.reset(0)
            homes.append(hoarder._world.container)
            r = hoarder.step(call("hoard", mib=24))
            assert r.messages[0]["content"].endswith("MiB hoarded"), r.messages
            b = bystander.step(call("add", text=f"r{i}"))
            assert b.messages[0]["content"] == f"{i + 1} rows", b.messages  # its episode goes on, never rebuilt
        assert homes[0] is c  # the hoarder started beside the bystander
        assert pool.stats["retired_for_memory"] >= 1, pool.stats
        assert "memory" in (c.retired_for or ""), c.retired_for
        assert c.retiring and not c.dead and bystander._world.container is c  # not moved mid-episode
        assert len({id(h) for h in homes}) >= 2  # the hoarder moved on at an episode start
        assert stats()["resumed"] == resumed  # no container died: no world was rebuilt
        assert bystander._world.resumed == 0 and hoarder._world.resumed == 0
        bystander.reset(0)  # a new episode: it leaves the retiring container, which goes
        assert bystander._world.container is not c
        assert bystander.step(call("add", text="x")).messages[0]["content"] == "1 rows"
        wait_background()
        assert not _exists(c.client, c.id)
        hoarder.close()
        bystander.close()
    finally:
        pool.shutdown()


def test_no_mark_no_retiring(hoard_spec, monkeypatch) -> None:
    """``Limits(retire_memory=None)``: a container is never retired for its memory."""
    from envfactory.runtime.pool import Pool

    monkeypatch.setattr(container_module, "MEMORY_CHECK_S", 0.0)
    pool = Pool(hoard_spec, warm=0, limits=Limits(memory_mb=256, retire_memory=None))
    try:
        e = envfactory.make("Hoard-v0", runtime="docker", pool=pool)
        e.reset(0)
        c = e._world.container
        for _ in range(3):
            e.step(call("hoard", mib=48))
            e.reset(0)
        assert e._world.container is c and not c.retiring and pool.stats["retired_for_memory"] == 0
        e.close()
    finally:
        pool.shutdown()


def test_one_transient_peak_does_not_retire_a_container(monkeypatch) -> None:
    """Past the mark at one measurement and under it at the next (one call's peak): kept; past it
    at two in a row (a creep): retired. Measurements are the engine's figure, here given."""
    from envfactory.runtime.container import Container

    monkeypatch.setattr(container_module, "MEMORY_CHECK_S", 0.0)
    c = object.__new__(Container)
    c.retire_at, c.dead, c.retired_for = None, False, None
    c.memory_limit, c.retire_memory, c._memory_checked, c._memory_high = 512 << 20, 0.5, 0.0, False
    figures = iter([300, 100, 300, 100, 300, 300])
    monkeypatch.setattr(c, "memory_used", lambda: next(figures) << 20)
    assert [c.check_memory() for _ in range(5)] == [False] * 5 and not c.retiring
    assert c.check_memory() and c.retiring and c.retired_for == "memory 300 MiB of 512 MiB"
    assert not c.check_memory()  # retired once
