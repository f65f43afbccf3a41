"""``envfactory serve NAME --protocol mcp``: played with the official MCP SDK's clients, over stdio
(a spawned ``python -m envfactory.cli serve``) and over streamable HTTP (a server subprocess on a free
port), each play compared with ``envfactory.make(NAME)`` given the same calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import serve_mcp_http, stop_process

import envfactory
from envfactory import ToolCall
from envfactory.faces.mcp_server import EPISODE_META, EpisodeService

ROOT = Path(__file__).resolve().parents[1]
NAME = "FileSystem-v0"


def _tasks():
    spec = envfactory.spec(NAME)
    facts = next(t for t in spec.tasks_in("train") if t.answer_facts)        # a look-up: the answer matters
    change = next(t for t in spec.tasks_in("train") if not t.answer_facts and len(t.solution) >= 2)  # a change
    return spec, facts, change


def _answer(task) -> str:
    return "Done. " + " ".join(task.answer_facts)


def _plays():
    """(label, task, calls, expected reward): the reference solution and wrong plays."""
    _, facts, change = _tasks()
    return [
        ("reference-facts", facts, [*facts.solution, ToolCall("finish", {"answer": _answer(facts)})], 1.0),
        ("reference-change", change, [*change.solution, ToolCall("finish", {"answer": "Done."})], 1.0),
        ("wrong-no-answer", facts, [*facts.solution, ToolCall("finish", {"answer": "no idea"})], 0.0),
        ("wrong-half", change, [change.solution[0], ToolCall("finish", {"answer": "Done."})], 0.0),
    ]


def _local(task, calls):
    """The same calls through envfactory.make: each step's (observation, failed), and the end."""
    ep = envfactory.make(NAME)
    ep.reset(task.id)
    steps = []
    for c in calls:
        r = ep.step([ToolCall(c.name, dict(c.arguments))])
        steps.append((r.messages[0]["content"], not ep.status.log[-1]["ok"]))
    return steps, ep.rewards["agent_0"], ep.success, ep.status.ended_by


def _schemas_match(tools: list[types.Tool]) -> None:
    spec = envfactory.spec(NAME)
    by_name = {t.name: t for t in tools}
    for s in spec.tool_schemas():
        f = s["function"]
        assert f["name"] in by_name, f["name"]
        t = by_name[f["name"]]
        assert t.description == f["description"] and t.input_schema == f["parameters"], f["name"]
        assert t.annotations.read_only_hint == spec.all_tools[f["name"]].read_only
    assert {"start_episode", "episode_status", "end_episode"} <= set(by_name)


async def _play(session, task, calls, meta=None):
    kw = {"meta": meta} if meta else {}
    start = await session.call_tool("start_episode", {"task_id": task.id}, **kw)
    assert not start.is_error, start.content
    assert start.structured_content["task_id"] == task.id
    assert start.content[0].text == task.instruction
    eid = start.structured_content["episode"]
    if meta is not None:
        kw = {"meta": {**meta, EPISODE_META: eid}}
    steps = []
    for c in calls:
        r = await session.call_tool(c.name, c.arguments, **kw)
        steps.append((r.content[0].text, bool(r.is_error)))
    status = await session.call_tool("episode_status", {}, **kw)
    return steps, status.structured_content, r


def _compare(steps, status, last, task, calls, expected):
    local_steps, reward, success, ended_by = _local(task, calls)
    assert steps == local_steps  # every observation and every error flag, as make() gives them
    assert reward == expected and status["reward"] == reward and status["success"] == success
    assert status["done"] and status["ended_by"] == ended_by == "finish"
    assert last.meta["envfactory/reward"] == reward and last.meta["envfactory/done"] is True


def _server_params(*extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "envfactory.cli", "serve", NAME, "--protocol",
                                                               "mcp", *extra], cwd=str(ROOT),
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_stdio_session_plays_like_make():
    async def main():
        async with stdio_client(_server_params()) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                _schemas_match((await s.list_tools()).tools)
                # before start_episode, and without a default task: a tool error, not a crash
                early = await s.call_tool("list_dir", {"path": "/"})
                assert early.is_error and "start_episode" in early.content[0].text
                for label, task, calls, expected in _plays():
                    steps, status, last = await _play(s, task, calls)
                    _compare(steps, status, last, task, calls, expected)
                # the instruction and the status as resources
                res = await s.read_resource("envfactory://episode/task")
                assert res.contents[0].text == _plays()[-1][1].instruction
                st = json.loads((await s.read_resource("envfactory://episode/status")).contents[0].text)
                assert st["done"] and st["reward"] == 0.0
                # a tool error is an MCP tool error carrying the observation
                await s.call_tool("start_episode", {"task_id": _plays()[0][1].id})
                bad = await s.call_tool("read_file", {"path": "/no/such/file"})
                ep = envfactory.make(NAME)
                ep.reset(_plays()[0][1].id)
                want = ep.step([ToolCall("read_file", {"path": "/no/such/file"})]).messages[0]["content"]
                assert bad.is_error and bad.content[0].text == want and want.startswith("Error")
                invalid = await s.call_tool("read_file", {"path": 3})
                assert invalid.is_error and "invalid arguments" in invalid.content[0].text
                # end_episode: an answer without a tool call ends and judges the episode
                end = await s.call_tool("end_episode", {"answer": "nothing"})
                assert end.structured_content["done"] and end.structured_content["ended_by"] == "answer"
                assert end.meta["envfactory/done"] is True and end.meta["envfactory/ended_by"] == "answer"
                after = await s.call_tool("list_dir", {"path": "/"})
                assert after.is_error and "has ended" in after.content[0].text

    anyio.run(main)


def test_stdio_turn_limit_and_default_task():
    """--max-turns and --task come from the command line; the limit truncates as make(max_turns=2) does."""
    _, facts, _ = _tasks()

    async def main():
        async with stdio_client(_server_params("--task", facts.id, "--max-turns", "2")) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                first = await s.call_tool("list_dir", {"path": "/"})  # starts the default task by itself
                assert not first.is_error and first.meta["envfactory/done"] is False
                second = await s.call_tool("list_dir", {"path": "/"})
                assert second.meta["envfactory/done"] is True and second.meta["envfactory/ended_by"] == "max_turns"
                st = (await s.call_tool("episode_status", {})).structured_content
                assert st["task_id"] == facts.id and st["truncated"] and st["reward"] == 0.0 and st["turns"] == 2

    anyio.run(main)


@pytest.fixture(scope="module")
def http_server():
    proc, url, seen = serve_mcp_http(NAME)
    assert url, "the server did not announce its URL: " + seen
    try:
        yield url
    finally:
        stop_process(proc)


def test_http_sessions_are_separate_episodes(http_server):
    """Two handshake-era sessions at once: each plays its own episode (Mcp-Session-Id)."""
    plays = _plays()

    async def one(play, out):
        label, task, calls, expected = play
        async with streamable_http_client(http_server) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                _schemas_match((await s.list_tools()).tools)
                out[label] = await _play(s, task, calls)

    async def main():
        out = {}
        async with anyio.create_task_group() as tg:
            for p in plays:
                tg.start_soon(one, p, out)
        for label, task, calls, expected in plays:
            _compare(*out[label], task, calls, expected)
        assert len({out[label][1]["episode"] for label, *_ in plays}) == len(plays)

    anyio.run(main)


def test_http_stateless_client_passes_the_episode_in_meta(http_server):
    """The SDK's Client negotiates the session-less 2026 protocol: the episode id travels in _meta."""
    label, task, calls, expected = _plays()[0]

    async def main():
        async with Client(http_server) as c:
            lost = await c.call_tool("list_dir", {"path": "/"})
            assert lost.is_error and EPISODE_META in lost.content[0].text
            steps, status, last = await _play(c, task, calls, meta={})
            _compare(steps, status, last, task, calls, expected)

    anyio.run(main)


def test_service_refuses_teams_and_unknown_tasks():
    with pytest.raises(ValueError, match="team environment"):
        EpisodeService("MultiRecords-v0")
    with pytest.raises(KeyError):
        EpisodeService(NAME, task="no-such-task")
    r = subprocess.run([sys.executable, "-m", "envfactory.cli", "serve", "NoSuch-v0", "--protocol", "mcp"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "NoSuch-v0" in r.stderr and not r.stdout


def test_every_episode_call_carries_the_step_meta():
    """start_episode, episode_status and end_episode carry the episode id and the step's
    reward/done/success/ended_by in _meta, as every environment tool call does (end_episode's
    _meta was empty: null over a handshake-era session)."""
    from envfactory.faces.mcp_server import build_server

    _, facts, _ = _tasks()
    service = EpisodeService(NAME)

    async def main():
        async with Client(build_server(service, stdio=True)) as c:
            start = await c.call_tool("start_episode", {"task_id": facts.id})
            eid = start.structured_content["episode"]
            assert start.meta[EPISODE_META] == eid
            assert start.meta["envfactory/done"] is False and start.meta["envfactory/reward"] == 0.0
            kw = {"meta": {EPISODE_META: eid}}
            step = await c.call_tool(facts.solution[0].name, facts.solution[0].arguments, **kw)
            assert step.meta[EPISODE_META] == eid and step.meta["envfactory/done"] is False
            status = await c.call_tool("episode_status", {}, **kw)
            assert status.meta[EPISODE_META] == eid and status.meta["envfactory/done"] is False
            end = await c.call_tool("end_episode", {"answer": _answer(facts)}, **kw)
            st = end.structured_content
            assert st["done"] and st["ended_by"] == "answer"
            assert end.meta[EPISODE_META] == eid
            assert end.meta["envfactory/done"] is True and end.meta["envfactory/ended_by"] == "answer"
            assert end.meta["envfactory/reward"] == st["reward"] and end.meta["envfactory/success"] == st["success"]
            again = await c.call_tool("end_episode", {}, **kw)  # ending an ended episode: the same verdict
            assert again.meta["envfactory/done"] is True and again.meta["envfactory/reward"] == st["reward"]
            late = await c.call_tool(facts.solution[0].name, facts.solution[0].arguments, **kw)
            assert late.is_error and "has ended" in late.content[0].text  # refused, and says where it stands
            assert late.meta[EPISODE_META] == eid and late.meta["envfactory/done"] is True
            assert late.meta["envfactory/reward"] == st["reward"]

    anyio.run(main)
    service.close()
