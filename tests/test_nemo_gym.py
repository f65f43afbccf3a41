"""NeMo Gym's resources server (envfactory/faces/nemo_gym.py), tested with NeMo Gym's own package.

nemo-gym pins what this project cannot share (ray, ``mcp<2``, ``openai<=2.7.2``) and needs Python
3.12 or newer, so it runs in a virtual environment of its own: nemo-gym 0.4.0 (0.5 and later need
Python 3.13.14+, which no machine here has) and envfactory's own dependencies, built once from the
package registry under ``$ENVFACTORY_CACHE/venvs`` with the first Python 3.12+ found (on the PATH,
else pyenv's versions), the repository on its path. A missing one fails under CI.

In that venv: NeMo Gym's ``SimpleAgent`` plays Counter-v0 through the resources server, its model a
scripted NeMo Gym model server (examples/nemo_gym/rollout.py): the reference solution is reward 1,
a wrong play 0, and a bad argument or an unknown tool comes back as the error body the model is
shown; and the server's routes through NeMo Gym's own test pattern (``setup_webserver`` and
``TestClient``): seeding errors, malformed calls, calls without or after an episode. Here: the
module imports without nemo_gym, and its dataset rows."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from conftest import IN_CI, import_without, venv_python

import envfactory

ROOT = Path(__file__).resolve().parents[1]
NEMO_GYM = "nemo-gym==0.4.0"
ROLLOUT = ROOT / "examples" / "nemo_gym" / "rollout.py"


# -- without nemo-gym (this venv) ----------------------------------------------------------
def test_the_module_imports_without_nemo_gym_and_names_the_package():
    out = import_without("nemo_gym", "envfactory.faces.nemo_gym", "m.resources_server_class()")
    assert "ImportError: envfactory's NeMo Gym resources server needs nemo-gym (pip install" in out


def test_rows_are_nemo_gym_dataset_rows_of_the_split():
    from envfactory.faces.nemo_gym import nemo_gym_rows

    s = envfactory.spec("Counter-v0")
    rows = nemo_gym_rows("Counter-v0", split="rl")
    assert [r["task_id"] for r in rows] == [t.id for t in s.get_tasks() if s.split(t.id) == "rl"]
    row = rows[0]
    params = row["responses_create_params"]
    assert [m["role"] for m in params["input"]] == ["system", "user"]
    assert params["input"][1]["content"] == s.task(row["task_id"]).instruction
    assert {t["name"] for t in params["tools"]} == {"increment", "reset_counter", "read_counter", "finish"}
    assert all(t["type"] == "function" and "function" not in t and t["parameters"]["type"] == "object"
               for t in params["tools"])  # the flat Responses shape
    assert row["env_name"] == "Counter-v0"
    json.dumps(rows)  # JSONL-ready


# -- with nemo-gym (a venv of its own) -------------------------------------------------------
def _base_python() -> str:
    """The first Python 3.12+ here: on the PATH, else one of pyenv's versions."""
    pyenv = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates = [shutil.which(n) for n in ("python3.12", "python3.13", "python3.14")]
    candidates += sorted(glob.glob(f"{pyenv}/versions/3.1[2-9]*/bin/python"))
    for c in candidates:
        if not c:
            continue
        try:
            r = subprocess.run([c, "-c", "import sys, venv; print(sys.version_info >= (3, 12))"], capture_output=True,
                               text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0 and r.stdout.strip() == "True":
            return c
    msg = "nemo-gym needs Python 3.12 or newer, and none was found (PATH: python3.12/3.13/3.14; pyenv's versions)"
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def nemo_python() -> str:
    base = _base_python()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    requirements = [NEMO_GYM, *deps]
    version = subprocess.run([base, "-c", "import sys; print('%d%d' % sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    key = hashlib.sha256("\n".join([base, *requirements]).encode()).hexdigest()[:8]
    return venv_python(f"{NEMO_GYM.replace('==', '-')}-py{version}-{key}", requirements, base=base, timeout=1500)


def _run(python: str, *args: str) -> list | dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([python, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_nemo_gyms_simple_agent_plays_episodes_to_their_reward(nemo_python: str):
    bad = '<tool_call>{"name": "increment", "arguments": {"by": "two"}}</tool_call>'
    unknown = '<tool_call>{"name": "decrement", "arguments": {}}</tool_call>'
    plus1 = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    plus2 = '<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>'
    finish = '<tool_call>{"name": "finish", "arguments": {"answer": "It shows 2."}}</tool_call>'
    rollouts = [
        {"task": "counter-0-1"},                                         # the reference solution
        {"task": "counter-0-2", "turns": [plus1, "Done, it shows 2."]},  # wrong: it shows 1
        {"task": "counter-0-2", "turns": [bad, unknown, plus2, "It shows 2."]},
        {"task": "counter-0-2", "turns": [plus2, finish]},               # ended by finish, not by verify
    ]
    oracle, wrong, errors, finished = _run(nemo_python, str(ROLLOUT), "Counter-v0", "--rollouts", json.dumps(rollouts))
    assert oracle["status"] == 200 and oracle["reward"] == 1.0 and oracle["success"] is True
    assert [json.loads(o) for o in oracle["tool_outputs"]] == [{"output": "1"}]
    assert wrong["reward"] == 0.0 and wrong["success"] is False and wrong["ended_by"] == "answer"
    # a bad argument and an unknown tool: error bodies the model was shown, turns of the episode
    shown = [json.loads(o) for o in errors["tool_outputs"]]
    assert "invalid arguments for tool 'increment'" in shown[0]["error"] and "by" in shown[0]["error"]
    assert "unknown tool 'decrement'" in shown[1]["error"] and "increment" in shown[1]["error"]
    assert shown[2] == {"output": "2"}
    assert errors["reward"] == 1.0 and errors["tool_errors"] == 2 and errors["turns"] == 4
    assert finished["reward"] == 1.0 and finished["ended_by"] == "finish"
    assert json.loads(finished["tool_outputs"][-1])["done"] is True


CHECKS = r"""
import json
from unittest.mock import MagicMock

from fastapi.testclient import TestClient
from nemo_gym.server_utils import ServerClient

from envfactory.faces.nemo_gym import nemo_gym_rows, resources_server_class

Server = resources_server_class()
Config = Server.model_fields["config"].annotation
server = Server(config=Config(host="127.0.0.1", port=8080, entrypoint="", name="envfactory", env_name="Counter-v0"),
                server_client=MagicMock(spec=ServerClient))
app = server.setup_webserver()
row = nemo_gym_rows("Counter-v0", split="rl", tasks=["counter-0-1"])[0]
response = {"id": "r", "created_at": 0.0, "model": "m", "object": "response", "parallel_tool_calls": False,
            "tool_choice": "auto", "tools": [], "output": [{"type": "message", "id": "m", "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}]}
verify = {**row, "response": response}
out = {}

def put(key, r):
    out[key] = [r.status_code, r.json()]

fresh = TestClient(app)                      # a session never seeded
put("call_unseeded", fresh.post("/increment", json={"by": 1}))
put("verify_unseeded", fresh.post("/verify", json=verify))
c = TestClient(app)                          # one session: its cookie carried from call to call
put("unknown_task", c.post("/seed_session", json={**row, "task_id": "counter-9-9"}))
put("eval_task", c.post("/seed_session", json={**row, "task_id": "counter-0-3"}))  # served: train
put("bad_split", c.post("/seed_session", json={**row, "task_id": None, "seed": 1, "split": "nope"}))
put("seed", c.post("/seed_session", json=row))
put("not_json", c.post("/increment", content=b"{by: 1", headers={"content-type": "application/json"}))
put("not_object", c.post("/increment", json=[1]))
put("bad_argument", c.post("/increment", json={"by": "two"}))
put("tool_error", c.post("/increment", json={"by": 50}))
put("unknown_tool", c.post("/decrement", json={}))
put("no_body", c.post("/read_counter"))
put("call", c.post("/increment", json={"by": 1}))
put("verify", c.post("/verify", json=verify))
put("verify_again", c.post("/verify", json=verify))
put("call_after_end", c.post("/increment", json={"by": 1}))
put("reseed", c.post("/seed_session", json={**row, "task_id": None, "seed": 3}))
put("reseeded_verify", c.post("/verify", json=verify))
paths = app.openapi()["paths"]
out["schema"] = paths["/increment"]["post"]["requestBody"]["content"]["application/json"]["schema"]
out["paths"] = sorted(paths)
server.service.close()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_resources_server_names_every_failure_through_nemo_gyms_test_client(nemo_python: str):
    out = _run(nemo_python, "-c", CHECKS)
    assert out["call_unseeded"][0] == 409 and "POST /seed_session" in out["call_unseeded"][1]["error"]
    assert out["verify_unseeded"][0] == 409 and "POST /seed_session" in out["verify_unseeded"][1]["error"]
    assert out["unknown_task"][0] == 404 and "no task 'counter-9-9'" in out["unknown_task"][1]["error"]
    assert out["eval_task"][0] == 404 and "counter-0-3" in out["eval_task"][1]["error"]
    assert "split: eval or split: all in the server's config" in out["eval_task"][1]["error"]
    assert out["bad_split"][0] == 400 and "nope" in out["bad_split"][1]["error"]
    status, seeded = out["seed"]
    assert status == 200 and seeded["task_id"] == "counter-0-1" and seeded["max_turns"] == 12
    assert seeded["instruction"].startswith("The counter shows 0") and "finish" in seeded["tools"]
    assert out["not_json"][0] == 400 and "not JSON" in out["not_json"][1]["error"]
    assert out["not_object"][0] == 400 and "one JSON object" in out["not_object"][1]["error"]
    assert out["bad_argument"] == [200, {"error": out["bad_argument"][1]["error"]}]
    assert "invalid arguments for tool 'increment'" in out["bad_argument"][1]["error"]
    assert out["tool_error"] == [200, {"error": "Error: by must be between 1 and 10"}]
    assert out["unknown_tool"][0] == 200 and "unknown tool 'decrement'" in out["unknown_tool"][1]["error"]
    assert out["no_body"] == [200, {"output": "0"}] and out["call"] == [200, {"output": "1"}]
    status, verified = out["verify"]
    assert status == 200 and verified["reward"] == 1.0 and verified["success"] is True
    assert verified["ended_by"] == "answer" and verified["tool_errors"] == 3 and verified["tool_calls"] == 5
    assert verified["responses_create_params"]["input"][1]["role"] == "user"  # NeMo Gym's fields kept
    assert out["verify_again"][1]["reward"] == 1.0                             # verify is idempotent
    assert out["call_after_end"][0] == 409 and "has ended" in out["call_after_end"][1]["error"]
    assert out["reseed"][0] == 200 and out["reseed"][1]["task_id"] != "counter-0-1"
    assert out["reseeded_verify"][1]["reward"] == 0.0  # a new episode of the same session, answered at once
    assert out["schema"] == envfactory.make("Counter-v0").tool_schemas()[0]["function"]["parameters"]
    assert {"/increment", "/reset_counter", "/read_counter", "/finish", "/seed_session", "/verify"} <= set(out["paths"])
