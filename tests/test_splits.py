"""Evaluation tasks never leak through a face: every face draws from one split (default
``train``: the sft and rl tasks), and an evaluation task is played only where it is asked for."""

from __future__ import annotations

import json

import anyio
import gymnasium
import pytest

import envfactory
import envfactory.faces.pettingzoo_env as multi
from envfactory.faces.mcp_server import EpisodeService

NAME = "Bank-v0"
SEEDS = range(300)


def _split_of(name: str):
    s = envfactory.spec(name)
    return {t.id: s.split(t) for t in s.get_tasks()}


def test_the_family_has_evaluation_tasks_to_leak():
    splits = _split_of(NAME)
    assert sum(v == "eval" for v in splits.values()) >= 5  # else the tests below prove nothing


def test_make_draws_only_its_split():
    splits = _split_of(NAME)
    ep = envfactory.make(NAME)
    assert ep._split == "train"
    drawn = set()
    for s in SEEDS:
        ep.reset(seed=s)
        drawn.add(ep.task.id)
    assert {splits[t] for t in drawn} == {"sft", "rl"}  # both train splits are reached, eval never
    for _ in range(50):  # no seed: at random, still within the split
        ep.reset()
        assert splits[ep.task.id] != "eval"
    ev = envfactory.make(NAME, split="eval")
    for s in range(60):
        ev.reset(seed=s)
        assert splits[ev.task.id] == "eval"
    assert {t.id for t in ev._tasks} == {t for t, v in splits.items() if v == "eval"}
    # the same seed picks the same task of the split, on every make
    assert envfactory.make(NAME, split="eval").reset(seed=7) == envfactory.make(NAME, split="eval").reset(seed=7)
    # a task named explicitly is always played (the caller asked for it)
    eval_id = next(t for t, v in splits.items() if v == "eval")
    ep.reset(eval_id)
    assert ep.task.id == eval_id
    with pytest.raises(ValueError, match="split must be one of"):
        envfactory.make(NAME, split="test")


def test_a_split_with_no_task_is_a_clear_error():
    import dataclasses

    spec = envfactory.spec("Counter-v0")
    only_sft = [t.model_copy(update={"metadata": {**t.metadata, "split": "sft"}}) for t in spec.get_tasks()]
    ep = envfactory.Episode(dataclasses.replace(spec, tasks=only_sft), split="eval")
    with pytest.raises(envfactory.SpecError, match="no task in the 'eval' split; name a task"):
        ep.reset(seed=0)
    ep.reset(only_sft[0].id)  # a named task is still played


def test_gymnasium_face_never_draws_eval_unless_asked():
    splits = _split_of(NAME)
    env = gymnasium.make(f"envfactory/{NAME}")
    seen = {env.reset(seed=s)[1]["task_id"] for s in range(200)}
    seen |= {env.reset()[1]["task_id"] for _ in range(50)}
    assert seen and all(splits[t] != "eval" for t in seen)
    # the same seeding rule as make(), split for split
    ep = envfactory.make(NAME)
    ep.reset(seed=11)
    assert env.reset(seed=11)[1]["task_id"] == ep.task.id
    ev = gymnasium.make(f"envfactory/{NAME}", split="eval")
    seen_eval = {ev.reset(seed=s)[1]["task_id"] for s in range(80)}
    assert seen_eval and all(splits[t] == "eval" for t in seen_eval)
    # an explicit task (options) is played whatever its split
    eval_id = next(t for t, v in splits.items() if v == "eval")
    assert env.reset(options={"task": eval_id})[1]["task_id"] == eval_id


def test_pettingzoo_faces_never_draw_eval_unless_asked():
    name = "MultiRecords-v0"
    assert len(envfactory.spec(name).tasks_in("eval")) >= 5
    splits = _split_of(name)
    for make_view in (multi.env, multi.parallel_env):
        view = make_view(name)
        seen = set()
        for s in range(120):
            view.reset(seed=s)
            seen.add(view.episode.task.id)
        for _ in range(30):
            view.reset()
            seen.add(view.episode.task.id)
        assert all(splits[t] != "eval" for t in seen)
        ev = make_view(name, split="eval")
        for s in range(40):
            ev.reset(seed=s)
            assert splits[ev.episode.task.id] == "eval"


def test_mcp_service_serves_only_its_split():
    splits = _split_of(NAME)
    eval_id = next(t for t, v in splits.items() if v == "eval")
    svc = EpisodeService(NAME)
    try:
        for s in range(150):
            assert splits[svc.start("k", seed=s)["task_id"]] != "eval"
        with pytest.raises(KeyError, match="'eval' split"):
            svc.start("k", task_id=eval_id)
        listed = svc.list_tasks()
        assert {r["task_id"] for r in listed} == {t for t, v in splits.items() if v != "eval"}
        assert {r["task_id"] for r in svc.list_tasks("rl")} == {t for t, v in splits.items() if v == "rl"}
        with pytest.raises(ValueError, match="not served"):
            svc.list_tasks("eval")
    finally:
        svc.close()
    with pytest.raises(KeyError, match="'eval' split"):  # a default task outside the split fails at start-up
        EpisodeService(NAME, task=eval_id)
    ev = EpisodeService(NAME, split="eval")
    try:
        assert ev.start("k", task_id=eval_id)["task_id"] == eval_id
        assert {r["split"] for r in ev.list_tasks()} == {"eval"}
    finally:
        ev.close()


def test_mcp_face_over_the_official_client():
    """list_tasks and start_episode through the MCP SDK, on a server started with the default split."""
    from mcp import ClientSession, StdioServerParameters, stdio_client
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    splits = _split_of(NAME)
    eval_id = next(t for t, v in splits.items() if v == "eval")
    params = StdioServerParameters(command=sys.executable, args=["-m", "envfactory.cli", "serve", NAME],
                                   cwd=str(root), env={**os.environ, "PYTHONPATH": str(root)})

    async def main():
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                assert "list_tasks" in {t.name for t in (await s.list_tools()).tools}
                rows = (await s.call_tool("list_tasks", {})).structured_content["tasks"]
                assert rows and all(row["split"] != "eval" for row in rows)
                refused = await s.call_tool("list_tasks", {"split": "eval"})
                assert refused.is_error and "not served" in refused.content[0].text
                for seed in range(40):
                    got = await s.call_tool("start_episode", {"seed": seed})
                    assert splits[got.structured_content["task_id"]] != "eval"
                bad = await s.call_tool("start_episode", {"task_id": eval_id})
                assert bad.is_error and "'eval' split" in bad.content[0].text

    anyio.run(main)


def test_openenv_face_serves_only_its_split():
    pytest.importorskip("openenv")
    from openenv.core.generic_client import GenericEnvClient

    from envfactory.faces.openenv_server import BackgroundServer, EnvfactoryClient

    splits = _split_of(NAME)
    eval_id = next(t for t, v in splits.items() if v == "eval")
    with BackgroundServer(NAME) as url:
        with GenericEnvClient(base_url=url).sync() as env:
            for s in range(60):
                assert splits[env.reset(seed=s).observation["task_id"]] != "eval"
            with pytest.raises(RuntimeError):
                env.reset(task_id=eval_id)
        client = EnvfactoryClient(base_url=url)
        rows = client.list_tasks()
        assert rows and {r["split"] for r in rows} <= {"sft", "rl"}
        assert {r["task_id"] for r in client.list_tasks("sft")} == {t for t, v in splits.items() if v == "sft"}
        with pytest.raises(ValueError, match="not served"):
            client.list_tasks("eval")
    with BackgroundServer(NAME, split="eval") as url:
        with GenericEnvClient(base_url=url).sync() as env:
            for s in range(20):
                assert splits[env.reset(seed=s).observation["task_id"]] == "eval"
        assert json.dumps(EnvfactoryClient(base_url=url).list_tasks())  # served, listed


def test_a_remote_client_picks_a_split_within_the_served_one():
    """A client of a server started with --split all picks the split of each episode: start_episode /
    reset(split=..., seed=...) draws as make(NAME, split=...).reset(seed=...) does; a split (or a
    named task) outside the served one is refused with the reason."""
    pytest.importorskip("openenv")
    from mcp import Client
    from openenv.core.generic_client import GenericEnvClient

    from envfactory.faces.mcp_server import build_server
    from envfactory.faces.openenv_server import BackgroundServer

    splits = _split_of(NAME)
    rl_id = next(t for t, v in splits.items() if v == "rl")
    spec = envfactory.spec(NAME)
    want = {split: [spec.draw_task(split, s).id for s in range(12)] for split in ("eval", "rl", "train")}

    svc = EpisodeService(NAME, split="all")
    try:
        for split, ids in want.items():
            assert [svc.start("k", seed=s, split=split)["task_id"] for s in range(12)] == ids
        with pytest.raises(KeyError, match="'rl' split"):
            svc.start("k", task_id=rl_id, split="eval")
    finally:
        svc.close()
    train_only = EpisodeService(NAME)
    try:
        with pytest.raises(ValueError, match="not served"):
            train_only.start("k", seed=0, split="eval")
    finally:
        train_only.close()

    async def mcp_main():
        svc = EpisodeService(NAME, split="all")
        async with Client(build_server(svc, stdio=True)) as c:
            got = await c.call_tool("start_episode", {"seed": 3, "split": "eval"})
            assert not got.is_error and got.structured_content["task_id"] == want["eval"][3]
            bad = await c.call_tool("start_episode", {"seed": 3, "split": "nope"})
            assert bad.is_error and "split must be one of" in bad.content[0].text
        svc.close()

    anyio.run(mcp_main)

    with BackgroundServer(NAME, split="all") as url:
        with GenericEnvClient(base_url=url).sync() as env:
            for split, ids in want.items():
                assert [env.reset(seed=s, split=split).observation["task_id"] for s in range(12)] == ids
            with pytest.raises(RuntimeError, match="'rl' split"):
                env.reset(task_id=rl_id, split="eval")
    with BackgroundServer(NAME) as url:
        import httpx

        r = httpx.post(url + "/reset", json={"seed": 0, "split": "eval"}, timeout=30)
        assert r.status_code == 400 and "not served" in r.json()["detail"]
