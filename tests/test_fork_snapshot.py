"""fork / snapshot / restore on live episodes."""

import json

import pytest

import envfactory
from envfactory.checks.scripted import OraclePolicy


def _mid_episode(name, task_id, k):
    env = envfactory.make(name)
    env.reset(task_id)
    task = env.task
    for a in OraclePolicy.actions(task)[:k]:
        env.step(a)
    return env, task


def test_fork_is_independent_both_ways():
    env, task = _mid_episode("FileSystem-v0", "fs-015", 1)  # make_dir done, two moves left
    child = env.fork()
    assert child.transcript() == env.transcript() and child.state.hash() == env.state.hash()
    before = env.state.hash()
    child.step('<tool_call>{"name": "write_file", "arguments": {"path": "/tmp/x", "content": "child"}}</tool_call>')
    assert env.state.hash() == before and "/tmp/x" not in env.state.fs.files
    assert len(env.transcript()) == len(child.transcript()) - 2
    env.step('<tool_call>{"name": "delete_file", "arguments": {"path": "/tmp/keep.txt"}}</tool_call>')
    assert "/tmp/keep.txt" in child.state.fs.files
    # nested models are copied too, not shared
    hd, _ = _mid_episode("Helpdesk-v0", "hd-014", 1)
    hd_child = hd.fork()
    hd_child.step('<tool_call>{"name": "add_comment", "arguments": {"ticket_id": "T-1001", "text": "c"}}</tool_call>')
    assert hd.state.desk.tickets["T-1001"].comments == []
    assert hd_child.state.desk.tickets["T-1001"].comments == ["c"]


def test_forks_finish_like_the_original():
    env, task = _mid_episode("Bank-v0", "bank-020", 2)
    child = env.fork()
    rest = OraclePolicy.actions(task)[2:]
    for a in rest:
        r1, r2 = env.step(a), child.step(a)
        assert r1.messages == r2.messages and r1.reward == r2.reward
    assert r1.reward == 1.0 and env.state.hash() == child.state.hash()


def test_snapshot_is_json_and_restore_reproduces_exactly():
    env, task = _mid_episode("Helpdesk-v0", "hd-020", 5)
    snap = json.loads(json.dumps(env.snapshot()))
    other = envfactory.make("Helpdesk-v0")
    other.restore(snap)
    assert other.transcript() == env.transcript() and other.state.hash() == env.state.hash()
    assert other.task.id == task.id
    for a in OraclePolicy.actions(task)[5:]:
        r1, r2 = env.step(a), other.step(a)
        assert (r1.messages, r1.reward, r1.terminated, r1.info) == (r2.messages, r2.reward, r2.terminated, r2.info)
    assert r1.reward == 1.0
    # restoring does not alias the snapshot: the episode went on, the snapshot did not change
    assert json.loads(json.dumps(snap)) == snap and len(snap["transcripts"]["agent_0"]) < len(other.transcript())


def test_restore_rejects_foreign_snapshots():
    env, _ = _mid_episode("Bank-v0", "bank-001", 1)
    snap = env.snapshot()
    with pytest.raises(ValueError, match="snapshot is of 'Bank-v0'"):
        envfactory.make("Counter-v0").restore(snap)
    with pytest.raises(ValueError, match="not an envfactory snapshot"):
        envfactory.make("Bank-v0").restore({"format": 99})


def test_fork_of_a_finished_episode_stays_finished():
    env, task = _mid_episode("Counter-v0", "counter-0-1", 2)
    assert env.done
    assert env.fork().done
