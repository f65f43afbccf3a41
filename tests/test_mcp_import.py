"""envfactory.factory.from_mcp: a third-party MCP server (mcp-kb-sqlite, unchanged) as an environment,
started per episode over stdio with the official SDK; examples/mcp/kb_env.py is run as written."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import envfactory
from envfactory import Episode, ToolCall, call
from envfactory.checks.scripted import NoopPolicy, OraclePolicy, play
from envfactory.factory import from_mcp as fm
from envfactory.factory.from_mcp import MCPState, MCPWorld, ReadCheck, from_mcp, list_server_tools, make_episode, mcp_task

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mcp" / "kb_env.py"


@pytest.fixture(scope="module")
def kb():
    spec = importlib.util.spec_from_file_location("envf_example_kb_env", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _get(ep: Episode, entry: int) -> str:
    """What the server's own read tool says about an entry (a call the referee does not see)."""
    return ReadCheck(call("get", id=entry, include_data=True), runtime=ep.spec.metadata["mcp_runtime"]).observe(
        ep.state)


def test_example_runs_and_verifies():
    r = subprocess.run([sys.executable, str(EXAMPLE), "--json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(r.stdout)
    rep = doc["verify"]
    assert rep["verified"] and rep["failures"] == [] and rep["tasks"] >= 20
    for check in ("reference", "noop", "claim", "random", "tool_determinism", "determinism", "fork", "snapshot",
                  "malformed", "gymnasium"):
        assert check in rep["checks"]
    assert doc["example"]["reward"] == 1.0


def test_tools_are_the_servers_own(kb):
    server = {t.name: t for t in list_server_tools(kb.SERVER, env={"DB_PATH": "{state_dir}/kb.db"})}
    tools = kb.SPEC.all_tools
    assert set(server) == set(tools) - {"finish"}
    for name, t in server.items():
        params = tools[name].parameters
        assert set(params["properties"]) == set(t.input_schema["properties"])
        assert params.get("required", []) == t.input_schema.get("required", [])
        assert tools[name].description == " ".join(t.description.split())
    assert {n for n, t in tools.items() if t.read_only} == {"get", "search", "list", "list_namespaces",
                                                            "get_relations", "finish"}


@pytest.mark.parametrize("runtime", ["mcp", "local"])
def test_reference_earns_one_and_wrong_plays_zero(kb, runtime):
    ep = envfactory.make(kb.NAME, runtime=runtime)
    assert isinstance(ep._world, MCPWorld) == (runtime == "mcp")
    try:
        for task in kb.SPEC.get_tasks()[:4] + kb.SPEC.get_tasks()[-2:]:
            assert play(ep, OraclePolicy(), task.id).reward == 1.0, task.id
            assert play(ep, NoopPolicy(), task.id).reward == 0.0, task.id
        # a wrong edit: the check (a read-tool call on the server) sees it
        task = kb.SPEC.task("kb-003")
        ep.reset(task.id)
        ep.step([ToolCall("save", {"id": 3, "title": "Pool size 41"})])
        r = ep.step("done")
        assert r.terminated and r.reward == 0.0
        assert "Pool size 41" in _get(ep, 3)
        assert ep.state.calls[-1] == {"name": "save", "arguments": {"id": 3, "title": "Pool size 41"}}
    finally:
        ep.close()


def test_errors_are_observations(kb):
    ep = make_episode(kb.SPEC)
    try:
        ep.reset("kb-003")
        cases = {
            '{"name": "get", "arguments": {"id": "three"}}': "Error: invalid arguments for tool 'get'",
            '{"name": "get", "arguments": {"id": 3, "bogus": 1}}': "Error: invalid arguments for tool 'get'",
            '{"name": "get", "arguments": {"id": 404}}': "Error: Not found: id=404",  # the server's own text
            '{"name": "replace", "arguments": {"id": 3, "old_string": "zzz", "new_string": "y"}}': "Error: old_string",
        }
        for action, start in cases.items():
            r = ep.step(f"<tool_call>{action}</tool_call>")
            assert r.messages[0]["content"].startswith(start), r.messages[0]["content"]
            assert not ep.status.log[-1]["ok"]
        ok = ep.step([ToolCall("get", {"id": 3})])
        assert ok.messages[0]["content"].startswith("id=3 | proj/db/pool") and ep.status.log[-1]["ok"]
        assert "<date>" in ok.messages[0]["content"]  # scrubbed, so that episodes are the same any day
    finally:
        ep.close()


def test_fork_and_snapshot_rebuild_the_servers_state(kb):
    ep = make_episode(kb.SPEC)
    try:
        ep.reset("kb-011")
        ep.step([ToolCall("save", {"ns": "notes/x", "key": "k", "title": "Written before the fork"})])
        child = ep.fork()
        snap = json.loads(json.dumps(ep.snapshot()))
        fix = ToolCall("replace", {"id": 3, "old_string": "max_connections=20", "new_string": "max_connections=50"})
        child.step([fix])
        assert "max_connections=50" in _get(child, 3) and "max_connections=20" in _get(ep, 3)  # independent
        assert "Written before the fork" in _get(child, 6)  # and it started where its parent was
        other = make_episode(kb.SPEC)
        other.restore(snap)
        assert "Written before the fork" in _get(other, 6) and "max_connections=20" in _get(other, 3)
        for e in (ep, other, child):
            if e is not child:
                e.step([fix])
            assert e.step([ToolCall("finish", {"answer": "done"})]).reward == 1.0
        child.close()
        other.close()
    finally:
        ep.close()


def test_restore_unknown_fork_and_snapshot_are_not_implemented(kb):
    """Without a declared way to rebuild the server's state, fresh episodes play but fork,
    snapshot and restore raise NotImplementedError naming what is missing."""
    raw = kb.tasks()[:1]
    spec = from_mcp(kb.SERVER, name="KnowledgeBaseNoRestore-v0", domain="knowledge-base", tasks=raw,
                    env={"DB_PATH": "{state_dir}/kb.db"}, error_prefixes=("Error", "Not found:"),
                    scrub=[(r"\d{4}-\d{2}-\d{2}", "<date>")])
    assert spec.metadata["restore"] is None
    ep = make_episode(spec)
    try:
        for task in spec.get_tasks():
            assert play(ep, OraclePolicy(), task.id).reward == 1.0
        ep.reset(raw[0]["id"])
        for op, what in ((ep.fork, "fork the episode"), (ep.snapshot, "snapshot the episode")):
            with pytest.raises(NotImplementedError) as err:
                op()
            msg = str(err.value)
            assert what in msg and "offers no way to save and load its state" in msg
            assert "restore='files'" in msg and "restore='replay'" in msg
        with pytest.raises(NotImplementedError, match="cannot restore a snapshot"):
            ep._world.load(spec.task(raw[0]["id"]), {"calls": []})
    finally:
        ep.close()


def test_replay_restore_rebuilds_on_a_fresh_process(kb):
    raw = [t for t in kb.tasks() if t["id"] == "kb-011"]
    spec = from_mcp(kb.SERVER, name="KnowledgeBaseReplay-v0", domain="knowledge-base", tasks=raw,
                    env={"DB_PATH": "{state_dir}/kb.db"}, restore="replay", error_prefixes=("Error", "Not found:"),
                    scrub=[(r"\d{4}-\d{2}-\d{2}", "<date>")])
    ep = make_episode(spec)
    try:
        ep.reset("kb-011")
        ep.step([ToolCall("save", {"id": 3, "title": "Pool size 30"})])
        child = ep.fork()
        assert child.state._live is None  # not bound yet: the first call replays the journal
        assert "Pool size 30" in _get(child, 3)
        child.close()
    finally:
        ep.close()


def test_task_checks_must_use_read_tools_and_urls_are_refused(kb):
    bad = [mcp_task("x-1", "Delete entry 1.", [call("delete", id=1)], call("delete", id=1), setup=kb.WORK[:1])]
    spec = from_mcp(kb.SERVER, name="KnowledgeBaseBad-v0", domain="kb", tasks=bad,
                    env={"DB_PATH": "{state_dir}/kb.db"}, restore="files")
    with pytest.raises(envfactory.SpecError, match="read tools"):
        spec.get_tasks()
    with pytest.raises(NotImplementedError, match="streamable HTTP"):
        from_mcp("http://127.0.0.1:9/mcp", name="Remote-v0", domain="kb", tasks=[])


def test_state_is_the_journal_and_processes_are_pooled(kb):
    task = kb.SPEC.task("kb-010")
    assert isinstance(task.initial_state, MCPState) and len(task.initial_state.calls) == len(kb.WORK)
    pool = kb.SPEC.metadata["mcp_runtime"].pool
    ep = make_episode(kb.SPEC)
    try:
        before = pool.spawned
        for _ in range(5):
            play(ep, OraclePolicy(), task.id)
        assert pool.spawned - before <= 1  # episodes reuse pooled server processes
        assert [c["name"] for c in ep.state.calls[len(kb.WORK):]] == ["save", "relate"]
    finally:
        ep.close()
    fm.close_all()
    assert not any(not c.closed for c in list(fm._OPEN))
