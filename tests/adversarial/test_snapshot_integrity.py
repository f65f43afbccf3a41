"""Snapshots cannot lie (issue 28): ``Episode.restore`` refuses a snapshot that was edited
(an HMAC over its canonical bytes), one whose referee fields have the wrong types or contradict
each other, and a world state whose decoding would allocate without bound."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

import envfactory
from envfactory import SnapshotError
from envfactory.snapshots import sign_snapshot
from envfactory.task import call

sys.path.insert(0, str(Path(__file__).parents[1]))


def _counter(steps: int = 1):
    env = envfactory.make("Counter-v0")
    env.reset(task="counter-0-8")
    for _ in range(steps):
        env.step(call("increment", by=1).to_hermes())
    return env


def test_own_snapshots_restore_also_through_json():
    env = _counter(2)
    snap = json.loads(json.dumps(env.snapshot()))
    other = envfactory.make("Counter-v0")
    other.restore(snap)
    assert other.state.value == 2 and other.transcript() == env.transcript()
    assert other.step(call("increment", by=3).to_hermes()).messages[0]["content"] == "5"


def test_an_edited_verdict_is_refused():
    """Before: ``ended_by: "timeout"`` skipped the judging, so the edited reward 1 and success
    stood on an unsolved state (the counter shows 1, not 8)."""
    env = _counter(1)
    snap = env.snapshot()
    snap.update(terminated=False, truncated=True, ended_by="timeout", success=True, rewards={"agent_0": 1.0})
    other = envfactory.make("Counter-v0")
    with pytest.raises(SnapshotError, match="integrity"):
        other.restore(snap)
    assert other.success is None and other.rewards == {"agent_0": 0.0}


@pytest.mark.parametrize("edit", [
    lambda s: s["state"].update(value=8),
    lambda s: s["transcripts"]["agent_0"].append({"role": "user", "content": "forged"}),
    lambda s: s.pop("mac"),
    lambda s: s.update(mac="0" * 64),
])
def test_any_edit_breaks_the_seal(edit):
    snap = _counter(1).snapshot()
    edit(snap)
    with pytest.raises(SnapshotError, match="integrity"):
        envfactory.make("Counter-v0").restore(snap)


def test_the_key_is_settable_and_shared(monkeypatch):
    """Processes that share ``ENVFACTORY_SNAPSHOT_KEY`` restore each other's snapshots; a
    process with another key (or the default per-process random one) does not."""
    monkeypatch.setenv("ENVFACTORY_SNAPSHOT_KEY", "one shared secret")
    snap = _counter(1).snapshot()
    envfactory.make("Counter-v0").restore(snap)
    monkeypatch.setenv("ENVFACTORY_SNAPSHOT_KEY", "another secret")
    with pytest.raises(SnapshotError, match="integrity"):
        envfactory.make("Counter-v0").restore(snap)
    monkeypatch.delenv("ENVFACTORY_SNAPSHOT_KEY")
    with pytest.raises(SnapshotError, match="integrity"):
        envfactory.make("Counter-v0").restore(snap)
    monkeypatch.setenv("ENVFACTORY_SNAPSHOT_KEY", "one shared secret")
    envfactory.make("Counter-v0").restore(snap)


BAD_FIELDS = {
    "round": "3",
    "pos": 5,
    "max_turns": "12",
    "acted": {"agent_0": "many"},
    "seen_mail": {"agent_0": -1},
    "counts": {"agent_0": {"tool_calls": "2"}},
    "rewards": {"agent_0": "1.0"},
    "terminated": "no",
    "success": 1,
    "answer": 8,
    "ended_by": "bribery",
    "passed": ["nobody"],
    "last_words": {"agent_0": 8},
    "log": [[1, "agent_0", "increment"]],
    "transcripts": {"agent_0": "hello"},
    "last_tool": {"agent_0": [{"role": 3}]},
    "task_id": ["counter-0-8"],
}


@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_type_confused_referee_fields_are_refused_by_name(field):
    """Signed with this process's key (a holder of the key edited it), still refused: before,
    ``round: "3"`` was accepted and the next ``step()`` raised a TypeError."""
    snap = _counter(1).snapshot()
    snap[field] = BAD_FIELDS[field]
    other = envfactory.make("Counter-v0")
    with pytest.raises(SnapshotError, match=field):
        other.restore(sign_snapshot(snap))


def test_an_unknown_agent_is_refused():
    snap = _counter(1).snapshot()
    snap["acted"] = {"agent_0": 1, "agent_9": 0}
    with pytest.raises(SnapshotError, match="acted"):
        envfactory.make("Counter-v0").restore(sign_snapshot(snap))


@pytest.mark.parametrize("how", ["timeout", "running"])
def test_a_verdict_that_contradicts_the_ending_is_refused(how):
    """Signed, well typed, and still a lie: a timed-out (or still running) episode has no success
    and no reward."""
    snap = _counter(1).snapshot()
    if how == "timeout":
        snap.update(terminated=False, truncated=True, ended_by="timeout")
    snap.update(success=True, rewards={"agent_0": 1.0})
    with pytest.raises(SnapshotError, match="success|reward"):
        envfactory.make("Counter-v0").restore(sign_snapshot(snap))


def test_a_signed_genuine_ending_is_judged_again():
    env = _counter(1)
    env.step("I am done.")  # answers without a tool call: ends unsolved
    snap = env.snapshot()
    assert env.done and env.success is False
    snap.update(success=True, rewards={"agent_0": 1.0})
    other = envfactory.make("Counter-v0")
    other.restore(sign_snapshot(snap))
    assert other.success is False and other.rewards == {"agent_0": 0.0}


BOMB = {"$reduce": "builtins:bytes", "$args": [2 ** 30]}


def test_a_restored_world_state_is_decoded_under_the_limits():
    """End to end: a from_class world (a pystate document) whose signed snapshot holds the bomb."""
    from envfactory import Episode
    from envfactory.factory.from_class import Service, Synthesis, from_class
    from envfactory.task import Task
    from fixtures.third_party.ledger import Ledger

    spec = from_class(Service(Ledger, exclude=["set_status"]), name="Sealed-v0", domain="test", config={},
                      synthesis=Synthesis(n_tasks=1))
    probe = spec.metadata["synth"].sample_state(random.Random(0))
    spec.tasks = [Task(id="t", instruction="anything", initial_state=probe, solution=[], check=lambda s: True)]
    ep = Episode(spec)
    ep.reset("t")
    snap = ep.snapshot()
    field = next(k for k in snap["state"] if not k.startswith("$"))
    snap["state"][field] = BOMB  # tests/adversarial/test_snapshot_decoding.py
    with pytest.raises(SnapshotError, match="refus"):
        Episode(spec).restore(sign_snapshot(snap))


def test_a_deeply_nested_snapshot_is_refused_not_a_recursion_error():
    snap = _counter(1).snapshot()
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    snap["state"] = {"value": deep}
    with pytest.raises(SnapshotError):
        envfactory.make("Counter-v0").restore(snap)
