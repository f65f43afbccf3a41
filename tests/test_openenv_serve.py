"""``envfactory serve NAME --protocol openenv``: openenv-core's own client (``GenericEnvClient``,
unchanged, plain dicts) plays episodes over openenv-core's own server (``create_app``), and every
step's observation, reward and done equal ``envfactory.make(NAME)``'s for the same actions."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import require_docker, require_module

require_module("openenv", "pip install 'envfactory[bench]' (scripts/setup.sh installs it)")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

import envfactory  # noqa: E402
from envfactory import ToolCall  # noqa: E402
from envfactory.faces.openenv_server import BackgroundServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _hermes(calls) -> str:
    import json

    return "".join(f'<tool_call>{json.dumps({"name": c.name, "arguments": c.arguments})}</tool_call>' for c in calls)


def _plays():
    """(env, task, actions, expected final reward): reference solutions (text and structured tool calls,
    one call per turn and several in one turn) and wrong plays."""
    counter = envfactory.spec("Counter-v0")
    multi = next(t for t in counter.tasks_in("train") if len(t.solution) >= 2)
    fs = envfactory.spec("FileSystem-v0")
    change = next(t for t in fs.tasks_in("train") if not t.answer_facts and len(t.solution) >= 2)
    facts = next(t for t in fs.tasks_in("train") if t.answer_facts)
    return [
        ("Counter-v0", multi, [{"text": _hermes([c])} for c in multi.solution] + [{"text": "Done."}], 1.0),
        ("Counter-v0", multi, [{"text": _hermes(multi.solution)}, {"text": "Done."}], 1.0),   # one turn, N calls
        ("Counter-v0", multi, [{"text": _hermes(multi.solution[:1])}, {"text": "Done."}], 0.0),
        ("FileSystem-v0", change, [tc(c) for c in change.solution] + [{"text": "Done."}], 1.0),
        ("FileSystem-v0", facts, [tc(c) for c in facts.solution]
         + [{"tool_calls": [{"name": "finish", "arguments": {"answer": "Done. " + " ".join(facts.answer_facts)}}]}],
         1.0),
        ("FileSystem-v0", change, [tc(change.solution[0]), {"text": "<tool_call>{not json</tool_call>"},
                                   {"text": "Done."}], 0.0),
    ]


def tc(c) -> dict:
    return {"tool_calls": [{"name": c.name, "arguments": c.arguments}]}


def _local(name, task, actions):
    """The same actions through envfactory.make: each step's (text, reward, done), and the success."""
    ep = envfactory.make(name)
    ep.reset(task.id)
    out = []
    for a in actions:
        act = {"role": "assistant", "content": a.get("text", ""), "tool_calls": a["tool_calls"]} \
            if a.get("tool_calls") else a["text"]
        r = ep.step(act)
        out.append(("\n".join(m["content"] for m in r.messages), r.reward, r.terminated or r.truncated))
    return out, ep.success


def _remote(url, task, actions):
    with GenericEnvClient(base_url=url).sync() as env:
        first = env.reset(task_id=task.id)
        steps = [env.step(a) for a in actions]
        state = env.state()
    return first, steps, state


def _check(name, task, actions, expected, first, steps, state):
    assert first.done is False and first.observation["task_id"] == task.id
    assert first.observation["text"] == task.instruction == first.observation["instruction"]
    assert [t["function"]["name"] for t in first.observation["tools"]] == \
        [s["function"]["name"] for s in envfactory.spec(name).tool_schemas()]
    local, success = _local(name, task, actions)
    assert [(s.observation["text"], s.reward, s.done) for s in steps] == local
    assert steps[-1].reward == expected and steps[-1].done
    assert steps[-1].observation["success"] == success == (expected == 1.0)
    assert state["done"] and state["reward"] == expected and state["task_id"] == task.id


def test_openenv_client_plays_like_make():
    plays = _plays()
    urls = {}
    with BackgroundServer("Counter-v0") as urls["Counter-v0"], BackgroundServer("FileSystem-v0") as urls["FileSystem-v0"]:
        for name, task, actions, expected in plays:
            _check(name, task, actions, expected, *_remote(urls[name], task, actions))
        # a step after the end, a bad task id: errors for that request, the session lives on
        with GenericEnvClient(base_url=urls["Counter-v0"]).sync() as env:
            with pytest.raises(RuntimeError, match="no episode"):
                env.step({"text": "hi"})
            with pytest.raises(RuntimeError):
                env.reset(task_id="no-such-task")
            r = env.reset(seed=3)
            want = envfactory.make("Counter-v0")
            assert r.observation["text"] == want.reset(seed=3)[1]["content"]
            env.step({"text": "Done."})
            with pytest.raises(RuntimeError, match="has ended"):
                env.step({"text": "Done."})
            assert env.reset(task=plays[0][1].id).observation["task_id"] == plays[0][1].id  # reusable
        # the typed client of envfactory.faces.openenv_server: the same play, typed observations
        from envfactory.faces.openenv_server import EnvfactoryAction, EnvfactoryClient, EnvfactoryObservation

        name, task, actions, expected = plays[3]
        with EnvfactoryClient(base_url=urls[name]).sync() as env:
            first = env.reset(task_id=task.id)
            assert isinstance(first.observation, EnvfactoryObservation) and first.observation.task_id == task.id
            steps = [env.step(EnvfactoryAction(**a)) for a in actions]
            assert [(s.observation.text, s.reward, s.done) for s in steps] == _local(name, task, actions)[0]
            assert steps[-1].observation.success is True and env.state().reward == expected


def test_sessions_are_independent():
    """One environment instance (one Episode) per WebSocket client: interleaved steps do not mix."""
    task = next(t for t in envfactory.spec("Counter-v0").tasks_in("train") if len(t.solution) >= 2)
    with BackgroundServer("Counter-v0") as url:
        a = GenericEnvClient(base_url=url).sync()
        b = GenericEnvClient(base_url=url).sync()
        with a, b:
            a.reset(task_id=task.id)
            b.reset(task_id=task.id)
            ra = [a.step({"text": _hermes([c])}).observation["text"] for c in task.solution]
            rb = b.step({"text": _hermes(task.solution[:1])}).observation["text"]
            assert rb == ra[0] and ra[-1] != ra[0]
            assert a.step({"text": "Done."}).reward == 1.0
            assert b.step({"text": "Done."}).reward == 0.0


def test_cli_serve_protocol_openenv():
    """The command line: a server subprocess on a free port, played by the client; unknown env: exit 2."""
    bad = subprocess.run([sys.executable, "-m", "envfactory.cli", "serve", "NoSuch-v9", "--protocol", "openenv"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "NoSuch-v9" in bad.stdout + bad.stderr
    proc = subprocess.Popen([sys.executable, "-m", "envfactory.cli", "serve", "Bank-v0", "--protocol", "openenv",
                             "--port", "0", "--max-turns", "5"], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = None
        timer = threading.Timer(120, proc.kill)
        timer.start()
        for line in proc.stderr:
            m = re.search(r"over OpenEnv at (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        timer.cancel()
        assert url, "the server did not announce its URL"
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
        spec = envfactory.spec("Bank-v0")
        task = next(t for t in spec.tasks_in("train") if not t.answer_facts)
        actions = [{"text": _hermes([c])} for c in task.solution] + [{"text": "Done."}]
        first, steps, state = _remote(url, task, actions)
        local, _ = _local("Bank-v0", task, actions)
        assert [(s.observation["text"], s.reward, s.done) for s in steps] == local and steps[-1].reward == 1.0
        assert state["max_turns"] == 5 and first.observation["max_turns"] == 5
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.docker
def test_docker_runtime():
    require_docker()
    name, task, actions, expected = _plays()[0]
    with BackgroundServer(name, runtime="docker") as url:
        _check(name, task, actions, expected, *_remote(url, task, actions))


def test_example_script():
    sys.path.insert(0, str(ROOT / "examples" / "openenv"))
    try:
        import play_openenv
    finally:
        sys.path.pop(0)
    out = play_openenv.main(["Counter-v0", "--episodes", "2"])
    assert out["episodes"] == 2 and out["rewards"] == out["local_rewards"] and max(out["rewards"]) == 1.0


def test_openenv_mcp_tool_client_plays_an_episode():
    """openenv-core's own MCP tool interface (MCPToolClient: ListToolsAction / CallToolAction over /ws)
    lists the environment's tools and plays a reference solution to reward 1; a tool's own failure
    is raised (openenv 0.10's clients: tests/test_openenv_current.py)."""
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient

    spec = envfactory.spec("Counter-v0")
    task = next(t for t in spec.tasks_in("train") if len(t.solution) >= 2)
    local = envfactory.make("Counter-v0")
    local.reset(task.id)
    want = [local.step([c]).messages[0]["content"] for c in task.solution]
    with BackgroundServer("Counter-v0") as url:
        with MCPToolClient(base_url=url).sync() as env:
            env.reset(task_id=task.id)
            assert [t.name for t in env.list_tools()] == list(spec.tools_of())
            assert [str(env.call_tool(c.name, **c.arguments)) for c in task.solution] == want
            end = env.step(CallToolAction(tool_name="finish", arguments={"answer": "done"}))
            assert end.done and end.reward == 1.0
            with pytest.raises(RuntimeError, match="has ended"):
                env.call_tool("increment", by=1)
            with pytest.raises(RuntimeError, match="unknown tool 'nope'"):
                env.call_tool("nope")
        # a tool's own failure is raised by call_tool (docs/faces.md), and the episode plays the turn on
        with MCPToolClient(base_url=url).sync() as env:
            env.reset(task_id=task.id)
            with pytest.raises(RuntimeError, match=r"Tool 'increment' failed: Error: invalid arguments.*invalid_args"):
                env.call_tool("increment", by="two")
            failed = env.step(CallToolAction(tool_name="increment", arguments={"by": "two"}))
            assert failed.observation.error.error_type.value == "invalid_args" and failed.done is False
            assert [str(env.call_tool(c.name, **c.arguments)) for c in task.solution] == want
            assert env.step(CallToolAction(tool_name="finish", arguments={"answer": "done"})).reward == 1.0


def test_openenv_http_errors_are_4xx_with_the_message():
    import httpx

    with BackgroundServer("Counter-v0") as url:
        r = httpx.post(url + "/step", json={"action": {"text": "hi"}}, timeout=30)
        assert r.status_code == 409 and "call reset" in r.json()["detail"]
        r = httpx.post(url + "/reset", json={"task_id": "no-such-task"}, timeout=30)
        assert r.status_code == 400 and "no-such-task" in r.json()["detail"]


def test_serving_imports_neither_gradio_nor_the_client():
    """The server loads openenv-core without its optional Gradio web UI (7 s of the 18-23 s start)
    and without the client side (requests, container providers); ENABLE_WEB_INTERFACE=true, read when
    the app is built, still mounts openenv-core's web UI at /web."""
    code = """if True:
        import os, sys
        import envfactory.faces.openenv_server as o
        assert "gradio" not in sys.modules, "gradio imported"
        assert "openenv.core.env_client" not in sys.modules and "requests" not in sys.modules, "client imported"
        def routes(app):  # build_app's app is openenv-core's behind envfactory's guards (.app: the one inside)
            while not hasattr(app, "routes"):
                app = app.app
            return {getattr(r, "path", None) for r in app.routes}
        paths = routes(o.build_app("Counter-v0"))
        assert "/ws" in paths and "/web" not in paths, paths
        os.environ["ENABLE_WEB_INTERFACE"] = "true"
        paths = routes(o.build_app("Counter-v0"))
        assert "/web" in paths and "gradio" in sys.modules, paths
        assert o.EnvfactoryClient.__name__ == "EnvfactoryClient" and "openenv.core.env_client" in sys.modules
        print("OK")
    """
    env = {k: v for k, v in os.environ.items() if k != "ENABLE_WEB_INTERFACE"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
