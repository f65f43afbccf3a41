"""Generated environment modules never run on the host (issue 17): verified in a container by
default, loaded from a manifest a container answers, played and judged in containers.

The module under test is what an LLM could write: a valid environment (reference solutions,
an answer-facts task, a task with its own ``check``, a ``terminal`` rule) whose *import* has
side effects: it appends to a marker file at a host path, sets an environment variable and a
builtins flag, and records (in its description) the user, network and root file system it
finds. A fake OpenAI-compatible endpoint serves it to :func:`generate_from_prompt`.

* verification ran in a container by default (provenance; the marker is absent; the probe
  says uid 10001, no network, read-only root);
* :func:`load_generated` + ``make`` + ``reset`` + ``step`` + judging never import it here
  (marker absent, no such module in ``sys.modules``, no env var, no flag), and the environment
  plays and judges correctly (every reference solution succeeds, doing nothing fails, the
  ``check`` and the goal state are judged in a judge container of its own);
* the old behaviour would have failed: importing the file the way the old ``load_generated``
  did, or verifying it with ``sandbox="process"``, writes the marker.

Runtime: about 30-40 s on 2 cores once the base image exists (images are cached by content).
"""

from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import envfactory
from envfactory.factory.from_prompt import generate_from_prompt, load_generated
from envfactory.factory.sandbox import SandboxLimits, verify_in_sandbox
from envfactory.runtime.container import LABEL, owner_label

from conftest import require_docker
from test_factory_llm import ReplayServer  # noqa: E402

pytestmark = pytest.mark.docker

NAME = "SealedNotes-v0"
FLAG = "ENVFACTORY_TEST_GENERATED_IMPORTED"
WRITE = '<tool_call>{{"name": "write_note", "arguments": {{"title": "{t}", "text": "{x}"}}}}</tool_call>'


def module_code(marker: Path) -> str:
    """A valid generated module whose import has side effects on whatever host imports it."""
    return textwrap.dedent(f'''
        """SealedNotes-v0: keep short notes by title (its import has side effects)."""
        import builtins
        import os
        import socket

        from envfactory import ToolEnvSpec, State, Task, ToolError, call, tool

        os.environ["{FLAG}"] = "1"
        builtins.envf_generated_imported = True
        try:
            with open({str(marker)!r}, "a") as f:
                f.write(f"imported by uid {{os.getuid()}}\\n")
        except OSError:
            pass


        def _probe() -> str:
            try:
                socket.create_connection(("1.1.1.1", 53), timeout=1).close()
                net = "yes"
            except OSError:
                net = "no"
            try:
                open("/envf-probe", "w").close()
                root = "writable"
            except OSError:
                root = "read-only"
            return f"uid={{os.getuid()}} net={{net}} root={{root}}"


        PROBE = _probe()


        class NotesState(State):
            notes: dict[str, str] = {{}}


        @tool
        def write_note(state: NotesState, title: str, text: str) -> str:
            """Create or replace a note.

            Args:
                title: The note's title.
                text: The note's text.
            """
            if not title.strip():
                raise ToolError("title must not be empty")
            state.notes[title] = text
            return f"Saved note {{title!r}}."


        @tool
        def delete_note(state: NotesState, title: str) -> str:
            """Delete a note.

            Args:
                title: The note's title.
            """
            if title not in state.notes:
                raise ToolError(f"no note {{title!r}}; existing: {{sorted(state.notes)}}")
            del state.notes[title]
            return f"Deleted note {{title!r}}."


        @tool(read_only=True)
        def read_note(state: NotesState, title: str) -> str:
            """Return the text of a note.

            Args:
                title: The note's title.
            """
            if title not in state.notes:
                raise ToolError(f"no note {{title!r}}; existing: {{sorted(state.notes)}}")
            return state.notes[title]


        def world() -> NotesState:
            return NotesState(notes={{"groceries": "milk, eggs", "ideas": "a garden robot"}})


        def _todo_ok(s: NotesState) -> bool:
            return s.notes.get("todo", "").lower().startswith("call")


        def tasks() -> list[Task]:
            return [
                Task(id="notes-0", instruction="Write a note titled 'plan' saying 'ship friday'.",
                     initial_state=world(), solution=[call("write_note", title="plan", text="ship friday")]),
                Task(id="notes-1", instruction="What is on my groceries note?", initial_state=world(),
                     solution=[call("read_note", title="groceries")], answer_facts=["milk", "eggs"]),
                Task(id="notes-2", instruction="Delete the ideas note.", initial_state=world(),
                     solution=[call("delete_note", title="ideas")]),
                Task(id="notes-3", instruction="Add a note titled 'todo' whose text starts with 'call'.",
                     initial_state=world(), solution=[call("write_note", title="todo", text="call mom")],
                     check=_todo_ok),
                Task(id="notes-4", instruction="Change the groceries note to say 'bread'.",
                     initial_state=world(), solution=[call("write_note", title="groceries", text="bread")]),
            ]


        SPEC = ToolEnvSpec(name="{NAME}", domain="notes", description="Keep short notes. " + PROBE,
                           state_type=NotesState, tools=[write_note, delete_note, read_note], tasks=tasks,
                           terminal=lambda s: "STOP" in s.notes)
        ''')


def _host_imported(directory: Path) -> list[str]:
    """Modules of this process that came from ``directory`` or bear a generated module's name."""
    out = []
    for name, m in list(sys.modules.items()):
        f = getattr(m, "__file__", None) or ""
        if name.startswith(("envf_gen_", "envfactory_generated")) or (f and Path(f).resolve().parent == directory):
            out.append(name)
    return out


def _assert_never_imported_here(marker: Path, directory: Path) -> None:
    assert not marker.exists(), f"the module ran on the host: {marker.read_text()!r}"
    assert FLAG not in os.environ
    assert not hasattr(builtins, "envf_generated_imported")
    assert _host_imported(directory) == []


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    require_docker()
    base = tmp_path_factory.mktemp("generated")
    marker = base / "marker.txt"  # a host path: only an import on this host can write it
    out = base / "out"
    with ReplayServer(["```python\n" + module_code(marker) + "```"]) as llm:
        t0 = time.perf_counter()
        res = generate_from_prompt("a notes environment", llm_url=llm.url, model="fake", out_dir=out,
                                   max_rounds=1)  # the default sandbox
        res.seconds = time.perf_counter() - t0
    assert res.accepted, res.rounds
    return res, out.resolve(), marker


@pytest.fixture(scope="module")
def loaded(generated):
    res, out, marker = generated
    t0 = time.perf_counter()
    (spec,) = load_generated(out)
    spec.load_seconds = time.perf_counter() - t0
    yield spec
    spec.close()  # its judge container
    from envfactory.runtime.pool import docker_client, get_pool

    get_pool(spec, spec.image).shutdown()  # its worlds' containers
    try:  # the module's image is unique to this run (the marker's path is in its code)
        docker_client().images.remove(spec.image)
    except Exception:
        pass


def test_verification_ran_in_a_container_by_default(generated):
    res, out, marker = generated
    _assert_never_imported_here(marker, out)
    prov = json.loads(res.provenance_path.read_text())
    assert prov["sandbox"]["kind"] == "container" and prov["sandbox"]["image"].startswith("envfactory-env:")
    assert prov["name"] == NAME and prov["tasks"] == 5


def test_load_generated_builds_the_spec_from_a_containers_manifest(generated, loaded):
    from envfactory.factory.contained import ContainedSpec, ContainedState

    res, out, marker = generated
    spec = loaded
    _assert_never_imported_here(marker, out)
    assert isinstance(spec, ContainedSpec) and envfactory.spec(NAME) is spec
    assert issubclass(spec.state_type, ContainedState) and spec.state_type.__name__ == "NotesState"
    # the manifest was answered from inside a hardened container: its import-time probe says so
    assert spec.description == "Keep short notes. uid=10001 net=no root=read-only"
    assert {t["function"]["name"]: t["function"]["parameters"]["required"] for t in spec.tool_schemas()} == {
        "write_note": ["title", "text"], "delete_note": ["title"], "read_note": ["title"], "finish": ["answer"]}
    assert spec.all_tools["read_note"].read_only and not spec.all_tools["write_note"].read_only
    t1 = spec.task("notes-1")
    assert t1.answer_facts == ["milk", "eggs"] and [c.to_json() for c in t1.solution] == [
        {"name": "read_note", "arguments": {"title": "groceries"}}]
    assert spec.manifest["tasks"][3]["success"] == "check" and spec.manifest["terminal"] is True
    assert spec.task("notes-0").initial_state.model_dump() == {"notes": {"groceries": "milk, eggs",
                                                                         "ideas": "a garden robot"}}
    # the host's tools are schemas only
    out_ = spec.all_tools["write_note"].invoke(spec.task(0).initial_state, {"title": "a", "text": "b"})
    assert not out_.ok and "runs only in the module's container" in out_.content
    _assert_never_imported_here(marker, out)


def test_reference_solutions_succeed_and_doing_nothing_fails_judged_in_containers(generated, loaded):
    from envfactory.runtime.docker import ContainerWorld

    res, out, marker = generated
    spec = loaded
    env = envfactory.make(NAME)  # no runtime asked: the spec's own, in a container
    try:
        assert isinstance(env._world, ContainerWorld)
        steps = []
        for task in spec.get_tasks():
            env.reset(task.id)
            for c in task.solution:
                t0 = time.perf_counter()
                r = env.step("<tool_call>" + json.dumps(c.to_json()) + "</tool_call>")
                steps.append(time.perf_counter() - t0)
                assert r.messages[-1]["content"].startswith(("Saved", "Deleted", "milk")) and not r.done
            r = env.step("Done: " + ", ".join(task.answer_facts))
            assert r.done and r.reward == 1.0 and r.info["success"] is True, task.id
            env.reset(task.id)
            r = env.step("I did it.")
            assert r.done and r.reward == 0.0, task.id
        # a check of the module (notes-3) judged both ways, in the judge container
        before = spec.judge.requests
        env.reset("notes-3")
        env.step(WRITE.format(t="todo", x="buy milk"))
        assert env.step("done").reward == 0.0
        env.reset("notes-3")
        env.step(WRITE.format(t="todo", x="Call the bank"))
        assert env.step("done").reward == 1.0
        assert spec.judge.requests > before
        # terminal() of the module, judged there too: a note called STOP ends the episode
        env.reset("notes-0")
        r = env.step(WRITE.format(t="STOP", x="now"))
        assert r.done and r.info["ended_by"] == "terminal" and r.reward == 0.0
        # the judge is a container of its own, not the agent's
        assert spec.judge.container is not None and spec.judge.container.id != env._world.container.id
        print(f"\ngenerate (1 round, container verification): {res.seconds:.2f}s; "
              f"load_generated: {spec.load_seconds:.2f}s; step: median "
              f"{sorted(steps)[len(steps) // 2] * 1e3:.2f} ms over {len(steps)} steps")
    finally:
        env.close()
    _assert_never_imported_here(marker, out)


def test_local_runtime_is_refused(loaded):
    with pytest.raises(ValueError, match="runs only in containers.*docker runtime only"):
        envfactory.make(NAME, runtime="local")
    with pytest.raises(ValueError, match="docker runtime only"):
        envfactory.make(NAME, runtime="ray")


def test_the_agents_session_cannot_judge_and_the_host_keeps_states_json(loaded):
    spec = loaded
    env = envfactory.make(NAME, runtime="docker")
    try:
        env.reset("notes-0")
        # judge ops run only on a session that never held a world, never on the agent's
        with pytest.raises(ValueError, match="judge session of its own"):
            env._world._link.request({"op": "judge", "task": "notes-0", "state": env._world.dump()})
        # the host takes states as JSON objects with the state's fields, nothing else
        for bad in ({"notes": {}, "admin": True}, {"notes": {"a": ("t", "u")}}, [1, 2]):
            with pytest.raises(ValueError):
                env._world.load(spec.task("notes-0"), bad)
        # a state the real type refuses judges as a failure (in the container), not a crash
        assert spec.judge.state_ok("notes-0", {"notes": {"a": 1}}) is False
        # arguments JSON cannot carry are refused here; the container validates the rest
        r = env.step({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "write_note",
                                                          "arguments": {"title": "x", "text": ("a",)}}}]})
        assert "invalid arguments" in r.messages[-1]["content"]
        r = env.step(WRITE.format(t="", x="y"))
        assert r.messages[-1]["content"] == "Error: title must not be empty"
        r = env.step('<tool_call>{"name": "write_note", "arguments": {"title": 3}}</tool_call>')
        assert "invalid arguments for tool 'write_note'" in r.messages[-1]["content"]
    finally:
        env.close()


def test_a_module_changed_after_verification_is_refused(generated, tmp_path):
    res, out, marker = generated
    for p in (res.module_path, res.provenance_path):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    (tmp_path / res.module_path.name).write_text(res.module_path.read_text() + "\nimport shutil\n")
    with pytest.raises(ValueError, match="changed since it was verified"):
        load_generated(tmp_path)


def test_a_hanging_module_is_stopped_in_its_container(tmp_path):
    require_docker()
    with ReplayServer(["```python\nwhile True:\n    pass\n```"]) as llm:
        res = generate_from_prompt("x", llm_url=llm.url, model="m", out_dir=tmp_path, max_rounds=1,
                                   limits=SandboxLimits(timeout_s=3))
    assert not res.accepted and "timed out" in res.rounds[0]["error"]
    from envfactory.runtime.pool import docker_client

    left = docker_client().api.containers(all=True, filters={"label": [
        f"{LABEL}=1", "org.envfactory.env=sandbox-verify", f"org.envfactory.owner={owner_label()}"]})
    assert left == []


def test_the_old_behaviour_would_have_failed(tmp_path):
    """The marker detects a host import: the old ``load_generated`` (spec_from_file_location +
    exec_module in the host process) and the old default sandbox (a process) both write it."""
    require_docker()
    marker = tmp_path / "marker.txt"
    module = tmp_path / "sealednotes_v0.py"
    module.write_text(module_code(marker))
    old_load = textwrap.dedent(f"""
        import importlib.util
        spec_ = importlib.util.spec_from_file_location("envfactory_generated.sealednotes_v0", {str(module)!r})
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
        print(module.SPEC.description)
        """)
    r = subprocess.run([sys.executable, "-c", old_load], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert marker.read_text().startswith("imported by uid")
    assert "uid=10001" not in r.stdout  # it ran as this host's user
    marker.unlink()
    report = verify_in_sandbox(module, min_tasks=5, sandbox="process")  # the old default, now an opt-in
    assert report["ok"], report
    assert marker.exists()
    marker.unlink()
    report = verify_in_sandbox(module, min_tasks=5)  # the new default
    assert report["ok"], report
    assert not marker.exists()
