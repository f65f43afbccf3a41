"""PyPI's current OpenEnv (``openenv`` 0.10) against envfactory's OpenEnv server, and
``envfactory export NAME --openenv DIR`` checked by openenv's own validation.

``openenv`` 0.10 has the import name of ``openenv-core`` 0.3 (which the ``bench`` extra pins and
the rest of the tests use) and brings gradio, so it runs in a virtual environment of its own:
``openenv==0.10.0`` and envfactory's own dependencies, built once from the package registry under
``$ENVFACTORY_CACHE/venvs`` (:func:`conftest.venv_python`; a failed build fails under CI=true), the
repository on its path. In that venv, against ``envfactory serve NAME --protocol openenv`` and the
Python-level server, on openenv 0.10's server library:

* ``GenericEnvClient`` and ``MCPToolClient`` (tools over ``POST /mcp``, the episode over the
  WebSocket joined to the same session) each play a reference solution to reward 1 with the
  outputs ``envfactory.make`` gives; a tool's own failure and an unknown tool are raised by
  ``call_tool`` (``RuntimeError: Tool 'NAME' failed: ...``), as openenv's own MCP environments do;
  the WebSocket's ``{"type": "mcp"}`` JSON-RPC messages play an episode too, the reward in the
  ``finish`` call's result ``meta``;
* the Task API routes (``/{env}/splits``, ``/tasks``, ``/num_tasks``, ``/task``, ``/task_range``)
  and ``reset(split=..., index=...)``; ``openenv validate --url`` passes;
* an exported Space passes ``openenv validate DIR --skip-build`` (no Docker: the image is not
  built), ``openenv push``'s own structure checks and staging, and its ``server/app.py``, with the
  bundled envfactory installed as its Dockerfile installs it, serves an episode to reward 1 (with
  the web interface ``openenv push`` turns on).

Here (openenv-core 0.3, or none): the export's refusals and layout, and the Task API methods.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

from conftest import require_module, stop_process, venv_python

import envfactory

ROOT = Path(__file__).resolve().parents[1]
OPENENV = "openenv==0.10.0"
PLAY = ROOT / "examples" / "openenv" / "play_current.py"


# -- here: no openenv 0.10 needed ------------------------------------------------------------
def _export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envfactory.cli", "export", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_export_writes_the_space_layout(tmp_path: Path) -> None:
    import yaml

    out = tmp_path / "space"
    r = _export("Counter-v0", "--openenv", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    spec = envfactory.spec("Counter-v0")
    assert doc["tasks"] == {"train": len(spec.tasks_in("train")), "sft": len(spec.tasks_in("sft")),
                            "rl": len(spec.tasks_in("rl"))}
    for rel in ("openenv.yaml", "Dockerfile", "README.md", "pyproject.toml", "__init__.py", "client.py",
                "server/__init__.py", "server/app.py", "envfactory_src/pyproject.toml",
                "envfactory_src/envfactory/faces/openenv_server.py", "envfactory_src/environments/counter.py"):
        assert (out / rel).is_file(), rel
    assert not list(out.rglob("__pycache__")) and not (out / "envfactory_src" / "agents").exists()
    manifest = yaml.safe_load((out / "openenv.yaml").read_text())
    assert manifest["name"] == "Counter-v0" and manifest["app"] == "server.app:app" and manifest["port"] == 8000
    assert manifest["validation"]["capabilities"]["declared_tools"] == list(spec.tools_of())
    assert manifest["validation"]["capabilities"]["declared_task_count"] == doc["tasks"]
    pyproject = tomllib.loads((out / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["server"] == "server.app:main"
    assert "sdk: docker" in (out / "README.md").read_text() and "app_port: 8000" in (out / "README.md").read_text()
    compile((out / "server" / "app.py").read_text(), "server/app.py", "exec")
    # a second export into the same directory: refused without --force
    again = _export("Counter-v0", "--openenv", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr and "--force" in again.stderr
    assert _export("Counter-v0", "--openenv", str(out), "--force", "--split", "all").returncode == 0
    assert "SPLIT = 'all'" in (out / "server" / "app.py").read_text()


@pytest.mark.parametrize("args, says", [
    (["NoSuch-v9"], "NoSuch-v9"),
    (["GameAuction-v0"], "team environment"),
    (["Counter-v0", "--split", "nope"], "split must be one of"),
])
def test_export_refusals_are_named(tmp_path: Path, args: list[str], says: str) -> None:
    r = _export(args[0], "--openenv", str(tmp_path / "x"), *args[1:])
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (tmp_path / "x" / "openenv.yaml").exists()


def test_task_api_methods_and_reset_by_index() -> None:
    require_module("openenv", "pip install 'envfactory[bench]' (scripts/setup.sh installs it)")
    from envfactory.faces.openenv_server import EnvfactoryEnvironment

    spec = envfactory.spec("Counter-v0")
    env = EnvfactoryEnvironment("Counter-v0")
    assert [s["name"] for s in env.list_splits()] == ["train", "sft", "rl"]
    assert [t["task_id"] for t in env.list_tasks("rl")] == [t.id for t in spec.tasks_in("rl")]
    assert env.list_tasks("") == env.list_tasks("train") and env.num_tasks("rl") == len(spec.tasks_in("rl"))
    assert env.get_task("rl", 1) == env.list_tasks("rl")[1] and env.get_task_range("rl", 1, 3) == env.list_tasks("rl")[1:3]
    with pytest.raises(IndexError, match="out of range"):
        env.get_task("rl", 999)
    with pytest.raises(ValueError, match="serves the 'train' split"):
        env.list_tasks("eval")
    obs = env.reset(split="rl", index=1)
    assert obs.task_id == spec.tasks_in("rl")[1].id
    with pytest.raises(ValueError, match="not several"):
        env.reset(split="rl", index=1, task_id=obs.task_id)
    with pytest.raises(ValueError, match="out of range"):
        env.reset(split="rl", index=999)
    env.close()
    assert [(s["name"], s["type"]) for s in EnvfactoryEnvironment("Counter-v0", split="all").list_splits()] == \
        [("all", "test"), ("sft", "train"), ("rl", "train"), ("eval", "test")]
    held = EnvfactoryEnvironment("Counter-v0", split="heldout-phrasing")  # a held-out split holds only itself
    assert [s["name"] for s in held.list_splits()] == ["heldout-phrasing"]
    assert held.num_tasks("") == len(spec.tasks_in("heldout-phrasing"))


# -- with openenv 0.10 (a venv of its own) -----------------------------------------------------
@pytest.fixture(scope="module")
def openenv_python() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    # setuptools and wheel: the exported Space's envfactory is installed as its Dockerfile does (pip install)
    requirements = [OPENENV, "setuptools>=68", "wheel", *deps]
    key = hashlib.sha256("\n".join([sys.executable, *requirements]).encode()).hexdigest()[:8]
    return venv_python(f"{OPENENV.replace('==', '-')}-{key}", requirements, timeout=1500)


def _env(pythonpath: Path | str = ROOT, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ENABLE_WEB_INTERFACE")}
    return {**env, "PYTHONPATH": str(pythonpath), **extra}


def _run(python: str, *args: str, cwd: Path = ROOT, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([python, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return r


def _last_json(r: subprocess.CompletedProcess) -> dict:
    return json.loads(r.stdout.strip().splitlines()[-1])


def _local_outputs(name: str, task) -> list[str]:
    ep = envfactory.make(name)
    ep.reset(task.id)
    return [ep.step([c]).messages[0]["content"] for c in task.solution if c.name != "finish"]


def _check_play(out: dict, name: str) -> None:
    spec = envfactory.spec(name)
    task = spec.task(out["generic"]["task"])
    want = _local_outputs(name, task)
    g, m = out["generic"], out["mcp"]
    assert g["reward"] == 1.0 and g["done"] and g["outputs"][:len(want)] == want
    assert m["reward"] == 1.0 and m["done"] and m["outputs"] == want
    assert m["tools"] == list(spec.tools_of())
    bad, unknown = m["errors"]
    assert bad.startswith(f"Tool '{task.solution[0].name}' failed: Error: invalid arguments"), bad
    assert unknown.startswith("Tool 'no_such_tool' failed:") and "no_such_tool" in unknown[30:], unknown


TOKEN = r"""if True:
    import json
    import envfactory
    from envfactory.faces.openenv_server import BackgroundServer
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.generic_client import GenericEnvClient
    from openenv.core.mcp_client import MCPToolClient
    task = next(t for t in envfactory.spec("Counter-v0").tasks_in("train") if len(t.solution) >= 2)
    out = {}
    with BackgroundServer("Counter-v0", token="s3cret") as url:
        for label, kw in (("headers", {"base_url": url, "headers": {"Authorization": "Bearer s3cret"}}),
                          ("userinfo", {"base_url": url.replace("http://", "http://envfactory:s3cret@")})):
            with MCPToolClient(**kw).sync() as env:
                env.reset(task_id=task.id)
                [env.call_tool(c.name, **c.arguments) for c in task.solution]
                out[label] = env.step(CallToolAction(tool_name="finish", arguments={"answer": "x"})).reward
            with GenericEnvClient(**kw).sync() as env:
                out[label + "-generic"] = env.reset(task_id=task.id).observation["task_id"] == task.id
        try:
            with MCPToolClient(base_url=url).sync() as env:
                env.reset(task_id=task.id)
            out["none"] = "served"
        except Exception as exc:
            out["none"] = str(exc)
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_openenv_010_clients_play_the_python_server(openenv_python: str) -> None:
    version = _run(openenv_python, "-c", "from importlib.metadata import version; print(version('openenv'))")
    assert version.stdout.strip() == OPENENV.split("==")[1]
    _check_play(_last_json(_run(openenv_python, str(PLAY), "Counter-v0")), "Counter-v0")
    # with a token: 0.10's clients carry it as a header or as the URL's password; without it, 401
    out = _last_json(_run(openenv_python, "-c", TOKEN))
    assert out["headers"] == out["userinfo"] == 1.0 and out["headers-generic"] and out["userinfo-generic"]
    assert "401" in out["none"], out["none"]


CAP = r"""if True:
    import json
    import httpx
    import envfactory
    from envfactory.faces.openenv_server import BackgroundServer
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.mcp_client import MCPToolClient
    task = next(t for t in envfactory.spec("Counter-v0").tasks_in("train") if len(t.solution) >= 2)
    out = {}
    def client(token):
        return MCPToolClient(base_url=url, headers={"Authorization": "Bearer " + token}).sync()
    def play(env):
        env.reset(task_id=task.id)
        [env.call_tool(c.name, **c.arguments) for c in task.solution]
        return env.step(CallToolAction(tool_name="finish", arguments={"answer": "x"})).reward
    with BackgroundServer("Counter-v0", token="a,b", max_sessions=4, max_sessions_per_client=1) as url:
        with client("a") as a:
            out["a"] = play(a)  # its /mcp session and the WebSocket joining it: one session
            try:
                with client("a") as again:
                    again.reset(task_id=task.id)
                out["a-again"] = "served"
            except Exception as exc:
                out["a-again"] = repr(exc)
            out["a-raw"] = httpx.post(url + "/mcp", headers={"Authorization": "Bearer a"}, json={
                "jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}).status_code
            with client("b") as b:
                out["b"] = play(b)
        with client("a") as a:  # a's session closed: room again
            out["a-after"] = play(a)
    print(json.dumps(out))
"""


@pytest.mark.slow
def test_openenv_010_mcp_sessions_count_against_the_clients_cap(openenv_python: str) -> None:
    """0.10's ``MCPToolClient`` opens its session over ``POST /mcp`` (``openenv/session/create``) and
    joins it with a WebSocket: that is one session of its client's cap, not two, and not none (was:
    none, so one token could open every slot)."""
    out = _last_json(_run(openenv_python, "-c", CAP))
    assert out["a"] == out["b"] == out["a-after"] == 1.0, out
    assert "429" in out["a-again"] or "per client" in out["a-again"], out["a-again"]
    assert out["a-raw"] == 429, out  # a bare openenv/session/create beyond the cap


class _Served:
    """A server subprocess announcing ``over OpenEnv at URL`` on stderr (stderr kept drained)."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.url = None
        timer = threading.Timer(240, self.proc.kill)
        timer.start()
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = re.search(r"over OpenEnv at (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        timer.cancel()
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr or []), daemon=True).start()
        assert self.url, "the server did not announce its URL:\n" + "".join(self.lines)[-3000:]

    def close(self) -> None:
        stop_process(self.proc)


def _validate_url(python: str, url: str) -> dict:
    openenv = str(Path(python).parent / "openenv")
    r = subprocess.run([openenv, "validate", "--url", url, "--json", "--timeout", "30"], capture_output=True, text=True,
                       timeout=300, env=_env())
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["passed"], r.stdout[-3000:] + r.stderr[-2000:]
    return report


WS_MCP = r"""if True:
    import json, sys
    from websockets.sync.client import connect
    url, task_id, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    with connect(url.replace("http", "ws", 1) + "/ws") as ws:
        def ask(msg):
            ws.send(json.dumps(msg))
            return json.loads(ws.recv())
        def rpc(i, method, params):
            return ask({"type": "mcp", "data": {"jsonrpc": "2.0", "id": i, "method": method, "params": params}})
        ask({"type": "reset", "data": {"task_id": task_id}})
        out = {"list": rpc(1, "tools/list", {}),
               "calls": [rpc(i + 2, "tools/call", c) for i, c in enumerate(calls)],
               "after": rpc(99, "tools/call", calls[0])}
    print(json.dumps(out))
"""


def _check_ws_mcp(python: str, url: str, name: str) -> None:
    """The WebSocket's ``{"type": "mcp"}`` messages (openenv 0.10's JSON-RPC over the session):
    ``tools/list``, then the reference solution as ``tools/call``s ending with ``finish``, whose
    result's ``meta`` says reward 1; a call after the end is a JSON-RPC error naming it."""
    spec = envfactory.spec(name)
    task = next(t for t in spec.tasks_in("train") if len(t.solution) >= 2 and not t.answer_facts)
    calls = [{"name": c.name, "arguments": c.arguments} for c in task.solution if c.name != "finish"]
    calls.append({"name": "finish", "arguments": {"answer": "Done."}})
    out = _last_json(_run(python, "-c", WS_MCP, url, task.id, json.dumps(calls)))
    assert out["list"]["type"] == "mcp"
    assert [t["name"] for t in out["list"]["data"]["result"]["tools"]] == list(spec.tools_of())
    results = [c["data"]["result"] for c in out["calls"]]
    assert [r["data"] for r in results[:-1]] == _local_outputs(name, task)
    assert [r["meta"]["done"] for r in results] == [False] * (len(results) - 1) + [True]
    assert results[-1]["meta"]["reward"] == 1.0 and results[-1]["meta"]["success"] is True
    assert "has ended" in out["after"]["data"]["error"]["message"]


@pytest.mark.slow
def test_openenv_010_against_the_cli_server_and_its_task_routes(openenv_python: str) -> None:
    import httpx

    server = _Served([openenv_python, "-m", "envfactory.cli", "serve", "Bank-v0", "--protocol", "openenv",
                      "--port", "0"], ROOT, _env())
    try:
        url = server.url
        _check_play(_last_json(_run(openenv_python, str(PLAY), "--url", url, "Bank-v0")), "Bank-v0")
        _check_ws_mcp(openenv_python, url, "Bank-v0")
        spec = envfactory.spec("Bank-v0")
        with httpx.Client(base_url=url, timeout=60) as h:
            splits = h.get("/Bank-v0/splits").json()
            assert [s["name"] for s in splits] == ["train", "sft", "rl"]
            assert {s["name"]: s["num_tasks"] for s in splits} == {n: len(spec.tasks_in(n)) for n in ("train", "sft", "rl")}
            tasks = h.post("/bank-v0/tasks", json={"split": "rl"}).json()["tasks"]
            assert [t["task_id"] for t in tasks] == [t.id for t in spec.tasks_in("rl")]
            assert h.post("/Bank-v0/num_tasks", json={"split": "sft"}).json() == {"num_tasks": len(spec.tasks_in("sft"))}
            assert h.post("/Bank-v0/task", json={"split": "rl", "index": 2}).json()["task"] == tasks[2]
            assert h.post("/Bank-v0/task_range", json={"split": "rl", "start": 1, "stop": 3}).json()["tasks"] == tasks[1:3]
            assert h.get("/list_environments").json() == ["Bank-v0"]
            # refusals: an index out of range, a split the server does not serve, another environment
            r = h.post("/Bank-v0/task", json={"split": "rl", "index": 10_000})
            assert r.status_code == 400
            r = h.post("/Bank-v0/tasks", json={"split": "eval"})
            assert r.status_code == 400 and "serves the 'train' split" in r.json()["detail"]
            assert h.get("/Other-v0/splits").status_code == 404
            # the Task API's selection: reset(split, index)
            obs = h.post("/reset", json={"split": "rl", "index": 2}).json()["observation"]
            assert obs["task_id"] == tasks[2]["task_id"]
        report = _validate_url(openenv_python, url)
        assert report["mode"] == "simulation"
    finally:
        server.close()


@pytest.mark.slow
def test_an_exported_space_passes_openenvs_validation_and_serves(openenv_python: str, tmp_path: Path) -> None:
    space = tmp_path / "space"
    r = _export("Counter-v0", "--openenv", str(space))
    assert r.returncode == 0, r.stderr
    openenv = str(Path(openenv_python).parent / "openenv")
    # `openenv validate DIR`: every level this build implements without building the image
    v = subprocess.run([openenv, "validate", str(space), "--skip-build", "--json"], capture_output=True, text=True,
                       timeout=300, env=_env())
    assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-2000:]
    report = json.loads(v.stdout)
    status = {c["check_id"]: c["status"] for c in report["results"]}
    assert status["static.manifest"] == "pass" and report["verdict"] in ("pass", "warn")
    assert not [c for c, s in status.items() if s in ("fail", "error")], status
    # `openenv push`'s own checks and staging (everything but the upload), and the deployment check
    code = """if True:
        import json, sys
        from pathlib import Path
        from openenv.cli._cli_utils import validate_env_structure
        from openenv.cli._validation import validate_multi_mode_deployment
        from openenv.cli.commands.push import _prepare_staging_directory, _validate_openenv_directory
        space, staging = Path(sys.argv[1]), Path(sys.argv[2])
        name, manifest = _validate_openenv_directory(space)
        _prepare_staging_directory(space, name, staging, [])
        ok, issues = validate_multi_mode_deployment(space)
        print(json.dumps({"name": name, "warnings": validate_env_structure(space), "issues": issues,
                          "staged": sorted(str(p.relative_to(staging)) for p in staging.iterdir())}))
    """
    pushed = _last_json(_run(openenv_python, "-c", code, str(space), str(tmp_path / "staging")))
    assert pushed["name"] == "Counter-v0" and pushed["warnings"] == []
    assert pushed["issues"] in ([], ["Missing uv.lock - run 'uv lock' to generate it"])  # uv.lock: not written
    assert {"Dockerfile", "README.md", "openenv.yaml", "server", "envfactory_src"} <= set(pushed["staged"])
    # the image's install of the bundled envfactory (its Dockerfile: pip install ./envfactory_src), then
    # its entry point, with the web interface that `openenv push` turns on
    site = tmp_path / "site"
    _run(openenv_python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site),
         str(space / "envfactory_src"))
    server = _Served([openenv_python, "-m", "server.app", "--host", "127.0.0.1", "--port", "0"], space,
                     _env(site, ENABLE_WEB_INTERFACE="true"))
    try:
        import httpx

        assert httpx.get(server.url + "/web/", timeout=60).status_code == 200
        _validate_url(openenv_python, server.url)
        _check_play(_last_json(_run(openenv_python, str(PLAY), "--url", server.url, "Counter-v0")), "Counter-v0")
    finally:
        server.close()
