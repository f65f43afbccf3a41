"""verifiers' environment (envfactory/faces/verifiers.py) and its package (``envfactory export NAME
--verifiers DIR``), tested with verifiers' own package.

verifiers 0.4 pins what this project cannot share (``mcp==2.0.0``), so it runs in a virtual environment
of its own: verifiers 0.4.0 and envfactory's own dependencies, built once from the package registry under
``$ENVFACTORY_CACHE/venvs`` (about 3.5 minutes on 2 cores), the repository on its path. A missing one
fails under CI.

In that venv, verifiers' own classes play Counter-v0 (``env.serving()``, ``env.run_episode``: the
taskset's harness calls the model through verifiers' interception server, the model a scripted
OpenAI-compatible server; examples/verifiers/rollout.py): the reference solution is reward 1, a wrong
play 0, and malformed calls (arguments that are not JSON, a bad argument, an unknown tool) come back as
the error messages the model is shown; an exported package installs with pip and ``vf.load_environment``
finds it by its taskset id, serving the split's tasks only, and ``vf-eval`` runs it; ``from_verifiers``
makes an environment of a verifiers ``vf.Toolset`` (its ``@vf.tool`` methods, its ``vf.State``), whose
reference solution earns 1. Here: the module imports without verifiers, the rows, and the export
command's files and errors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from conftest import import_without, venv_python

import envfactory
from envfactory import cli

ROOT = Path(__file__).resolve().parents[1]
VERIFIERS = "verifiers==0.4.0"
ROLLOUT = ROOT / "examples" / "verifiers" / "rollout.py"


# -- without verifiers (this venv) ---------------------------------------------------------
def test_the_module_imports_without_verifiers_and_names_the_package():
    out = import_without("verifiers", "envfactory.faces.verifiers", "m.EnvfactoryTaskset")
    assert "ImportError: envfactory's verifiers environment needs verifiers 0.4 (pip install" in out


def test_rows_are_the_splits_tasks_with_the_tools_the_model_is_sent():
    from envfactory.faces.verifiers import verifiers_rows

    s = envfactory.spec("Counter-v0")
    rows = verifiers_rows("Counter-v0")  # default split: rl
    assert [r["task_id"] for r in rows] == [t.id for t in s.get_tasks() if s.split(t.id) == "rl"]
    assert all(r["split"] == "rl" for r in rows)
    row = rows[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"] == s.task(row["task_id"]).instruction
    assert {t["function"]["name"] for t in row["tools"]} == {"increment", "reset_counter", "read_counter", "finish"}
    assert all(t["type"] == "function" for t in row["tools"])
    with pytest.raises(ValueError, match="split must be one of"):
        verifiers_rows("Counter-v0", split="nope")


def test_export_writes_a_verifiers_package(tmp_path, capfd):
    out = tmp_path / "pkg"
    assert cli.main(["export", "Counter-v0", "--verifiers", str(out), "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["taskset_id"] == "envfactory-counter-v0" and doc["dir"] == str(out)
    assert doc["files"] == ["README.md", "envfactory_counter_v0/__init__.py", "pyproject.toml"]
    project = tomllib.loads((out / "pyproject.toml").read_text())["project"]
    assert project["name"] == "envfactory-counter-v0" and "verifiers>=0.4,<0.5" in project["dependencies"]
    source = (out / "envfactory_counter_v0" / "__init__.py").read_text()
    compile(source, "__init__.py", "exec")
    assert 'ENV_NAME = "Counter-v0"' in source and 'SPLIT = "rl"' in source
    assert '__all__ = ["EnvfactoryCounterV0Taskset", "EnvfactoryCounterV0Harness", "EnvfactoryCounterV0Env"]' in source


@pytest.mark.parametrize("argv, fragment", [
    (["Nope-v0", "--verifiers", "DIR"], "no environment named 'Nope-v0'"),
    (["Counter-v0"], "name one format and its directory: --openenv DIR | --verifiers DIR"),
    (["Counter-v0", "--verifiers", "DIR", "--split", "nope"], "split must be one of"),
    (["Counter-v0", "--verifiers", "FULL"], "exists and is not empty"),
])
def test_export_names_what_is_wrong(argv, fragment, tmp_path, capfd):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    argv = [str(tmp_path / "dir") if a == "DIR" else str(tmp_path / "full") if a == "FULL" else a for a in argv]
    assert cli.main(["export", *argv]) == 2
    err = capfd.readouterr().err
    assert "envfactory export: error: " in err and fragment in err and "Traceback" not in err
    assert not (tmp_path / "dir").exists()


# -- with verifiers (a venv of its own) -------------------------------------------------------
@pytest.fixture(scope="module")
def verifiers_python() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    requirements = [VERIFIERS, *deps]
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:8]
    return venv_python(f"{VERIFIERS.replace('==', '-')}-{key}", requirements, timeout=1800)


def _run(python: str, *args: str, path: tuple[str, ...] = ()) -> list | dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *path])
    r = subprocess.run([python, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_verifiers_plays_episodes_to_their_reward(verifiers_python: str):
    def call(name: str, arguments: str) -> dict:
        return {"name": name, "arguments": arguments}

    rollouts = [
        {"task": "counter-0-1"},                                              # the reference solution
        {"task": "counter-0-2", "turns": [{"tool_calls": [call("increment", '{"by": 1}')]},
                                          "Done, it shows 2."]},               # wrong: it shows 1
        {"task": "counter-0-2", "turns": [
            {"tool_calls": [call("increment", '{"by": ')], "reasoning_content": "Add two."},  # not JSON
            {"tool_calls": [call("increment", '{"by": "two"}'), call("decrement", "{}")]},
            '<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>',  # a Hermes block in text
            "It shows 2."]},
    ]
    oracle, wrong, errors = _run(verifiers_python, str(ROLLOUT), "Counter-v0", "--rollouts", json.dumps(rollouts))
    assert oracle["env"] == "EnvfactoryEnv" and oracle["harness"] == "envfactory-verifiers"
    assert oracle["ok"] and oracle["reward"] == 1.0 and oracle["rewards"] == {"envfactory": 1.0}
    assert oracle["envfactory"]["success"] is True and oracle["envfactory"]["ended_by"] == "answer"
    assert oracle["tool_messages"] == ["1"] and oracle["errors"] == [] and oracle["branches"] == 1
    assert wrong["ok"] and wrong["reward"] == 0.0 and wrong["metrics"]["success"] == 0.0
    shown = errors["tool_messages"]  # what the model was sent, in verifiers' trace
    assert "'arguments' of 'increment' is not valid JSON" in shown[0]
    assert "invalid arguments for tool 'increment'" in shown[1] and "by" in shown[1]
    assert "unknown tool 'decrement'" in shown[2] and "increment" in shown[2]
    assert shown[3] == "2"
    assert errors["reward"] == 1.0 and errors["envfactory"]["tool_errors"] == 2 and errors["envfactory"]["turns"] == 4
    assert errors["errors"] == []
    # each request replayed the replies as given (the reasoning too): one branch, one training sample
    assert errors["branches"] == 1 and errors["assistant_turns"] == 4


CHECKS = r"""
import json, sys
import verifiers.v1 as vf
import envfactory

# found by its taskset id, as vf-eval and prime-rl find an environment package
env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "envfactory-counter-v0"}}))
tasks = list(env.taskset)
s = envfactory.spec("Counter-v0")
out = {"env": type(env).__name__, "taskset": type(env.taskset).__name__,
       "harness": env.config.agent_harnesses()["agent"].id,
       "runtime": env.config.agent.runtime.type,
       "ids": [t.data.task_id for t in tasks], "rl": [t.id for t in s.get_tasks() if s.split(t.id) == "rl"],
       "splits": sorted({t.data.split for t in tasks}),
       "prompt": [m.role for m in tasks[0].data.prompt]}
evaluation = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "envfactory-counter-v0", "split": "eval"}}))
out["eval"] = sorted({t.data.split for t in evaluation.taskset})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_an_exported_package_installs_and_verifiers_finds_it(verifiers_python: str, tmp_path):
    package, site = tmp_path / "envfactory-counter-v0", tmp_path / "site"
    assert cli.main(["export", "Counter-v0", "--verifiers", str(package)]) == 0
    # pip builds and installs it (its build backend from the registry, as any install does), beside the venv's
    # own packages: --no-deps, since envfactory comes from the repository here
    r = subprocess.run([verifiers_python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                        str(package)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (site / "envfactory_counter_v0" / "__init__.py").exists()
    assert list(site.glob("envfactory_counter_v0-0.1.0.dist-info"))
    found = _run(verifiers_python, "-c", CHECKS, path=(str(site),))
    assert found["env"] == "EnvfactoryCounterV0Env" and found["taskset"] == "EnvfactoryCounterV0Taskset"
    assert found["harness"] == "envfactory-counter-v0" and found["runtime"] == "subprocess"
    assert found["ids"] == found["rl"] and found["splits"] == ["rl"]  # never an evaluation task unless asked
    assert found["prompt"] == ["system", "user"]
    assert found["eval"] == ["eval"]
    oracle, wrong = _run(verifiers_python, str(ROLLOUT), "Counter-v0", "--taskset", "envfactory-counter-v0",
                         "--rollouts", json.dumps([{"task": "counter-0-1"},
                                                   {"task": "counter-0-1", "turns": ["Done."]}]),
                         path=(str(site),))
    assert oracle["env"] == "EnvfactoryCounterV0Env" and oracle["reward"] == 1.0
    assert wrong["reward"] == 0.0
    # verifiers' own command line (prime-rl's eval takes the same ids): the split's tasks, each reward 1
    episodes = _run(verifiers_python, str(ROLLOUT), "Counter-v0", "--taskset", "envfactory-counter-v0",
                    "--vf-eval", "3", path=(str(site),))
    assert sorted(e["task"] for e in episodes) == sorted(found["rl"][:3])  # (episodes end in any order)
    assert all(e["ok"] and e["reward"] == 1.0 and e["metrics"]["success"] == 1.0 for e in episodes), episodes


TOOLSET = r"""
import json
from pydantic import Field
import verifiers.v1 as vf
from envfactory import Episode, ToolCall
from envfactory.factory import ClassTask, from_verifiers
from envfactory.factory.from_verifiers import toolset_tools


class NotesState(vf.State):
    notes: dict[str, str] = Field(default_factory=dict)


class NotesToolset(vf.Toolset[vf.SharedToolsetConfig, NotesState]):
    '''A note book.'''

    @vf.tool
    async def write_note(self, title: str, text: str) -> str:
        '''Write a note under a title (replacing one of the same title).'''
        self.state.notes[title] = text
        return f"saved {title}"

    @vf.tool
    def read_note(self, title: str) -> str:
        '''Read the note of a title.'''
        if title not in self.state.notes:
            raise ValueError(f"no note titled {title!r}")
        return self.state.notes[title]

    @vf.tool(name="list_notes")
    def titles(self) -> list[str]:
        '''The titles of the notes.'''
        return sorted(self.state.notes)


tasks = [ClassTask(id="notes-1", instruction="Save a note titled 'milk' that says 'buy 2 litres'.",
                   config={"notes": {"eggs": "a dozen"}},
                   solution=[ToolCall("write_note", {"title": "milk", "text": "buy 2 litres"})])]
spec = from_verifiers(NotesToolset, name="Notes-v0", tasks=tasks, read_only=["read_note", "list_notes"])
out = {"names": toolset_tools(NotesToolset), "tools": [t["function"]["name"] for t in spec.tool_schemas()]}
env = Episode(spec)
env.reset("notes-1")
def say(text):
    r = env.step(text)
    return [m["content"] for m in r.messages], r.reward, r.done
out["missing"] = say('<tool_call>{"name": "read_note", "arguments": {"title": "ham"}}</tool_call>')
out["list"] = say('<tool_call>{"name": "list_notes", "arguments": {}}</tool_call>')
fork = env.fork()
out["write"] = say('<tool_call>{"name": "write_note", '
                   '"arguments": {"title": "milk", "text": "buy 2 litres"}}</tool_call>')
out["fork_list"] = fork.step('<tool_call>{"name": "list_notes", "arguments": {}}</tool_call>').messages[0]["content"]
out["end"] = say("Saved.")
env.reset("notes-1")
out["noop"] = say("Saved.")
print(json.dumps(out))
"""


@pytest.mark.slow
def test_from_verifiers_makes_an_environment_of_a_verifiers_toolset(verifiers_python: str, tmp_path):
    script = tmp_path / "toolset.py"
    script.write_text(TOOLSET)
    out = _run(verifiers_python, str(script))
    assert out["names"] == {"write_note": "write_note", "read_note": "read_note", "list_notes": "titles"}
    assert out["tools"] == ["write_note", "read_note", "list_notes", "finish"]
    assert out["missing"] == [["Error: no note titled 'ham'"], 0.0, False]  # the tool's error: an observation
    assert out["list"] == [['["eggs"]'], 0.0, False]  # the task's initial state
    assert out["write"] == [["saved milk"], 0.0, False]  # an async tool, run to completion
    assert out["fork_list"] == '["eggs"]'  # a fork made before the write keeps its own state
    assert out["end"][1:] == [1.0, True] and out["noop"][1:] == [0.0, True]
