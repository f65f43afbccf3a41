"""RecordsDesk-v0: two unchanged third-party-style classes (a folder tree with a pointer, a
courier desk with its own RNG) in one episode through from_class, registered and verified."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import envfactory
from envfactory.checks.scripted import ScriptPolicy, play
from envfactory.factory.from_class import ReadsCheck
from envfactory.checks.verify import verify_spec

CLASSES = Path(__file__).resolve().parent.parent / "environments" / "classes"


def test_registered_verified_and_large_enough():
    spec = envfactory.spec("RecordsDesk-v0")
    report = verify_spec(spec, random_episodes=1)
    assert report.verified, [f.to_json() for f in report.failures]
    assert report.tasks >= 50
    assert set(spec.metadata["services"]) == {"archive", "courier"}


def test_the_classes_know_nothing_of_envfactory():
    for name in ("archive.py", "courier.py"):
        tree = ast.parse((CLASSES / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m and m.split(".")[0] in ("envfactory", "pydantic") for m in imported), (name, imported)


def test_read_tasks_need_the_read_not_only_the_answer():
    spec = envfactory.spec("RecordsDesk-v0")
    reads = [t for t in spec.get_tasks() if isinstance(t.check, ReadsCheck)]
    assert len(reads) >= 15 and all(t.answer_facts for t in reads)
    env = envfactory.make("RecordsDesk-v0")
    for task in reads[:6]:
        guess = play(env, ScriptPolicy([" ".join(task.answer_facts)]), task.id)
        assert not guess.success  # the facts, stated without looking
        assert play(env, ScriptPolicy(list(task.solution), finish=True), task.id).success


def test_pointer_and_rng_survive_fork_and_snapshot():
    env = envfactory.make("RecordsDesk-v0")
    task = next(t for t in envfactory.spec("RecordsDesk-v0").get_tasks() if t.id.startswith("records-ship-"))
    env.reset(task.id)
    env.step('<tool_call>{"name": "open_folder", "arguments": {"path": "/ops"}}</tool_call>')
    child = env.fork()
    snap = json.loads(json.dumps(env.snapshot()))
    again = envfactory.make("RecordsDesk-v0")
    again.restore(snap)
    call = task.solution[0].to_hermes()
    outs = [e.step(call).messages[0]["content"] for e in (env, child, again)]
    assert outs[0] == outs[1] == outs[2] and "TRK" in outs[0]  # the same tracking number from the RNG
    here = '<tool_call>{"name": "current_folder", "arguments": {}}</tool_call>'
    assert {e.step(here).messages[0]["content"] for e in (env, child, again)} == {'{"folder": "/ops"}'}
