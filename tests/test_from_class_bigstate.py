"""Copy-on-write forks of states held through from_class (any Python object graph, or
pydantic records): a fork shares the values; the first tool call on either side copies
that side's values, so both sides stay independent, whoever acts first, however many
forks there are, from any thread; a call copies only the containers it reaches."""

from __future__ import annotations

import gc
import json
import threading

import pytest

from benchmarks.big_states import BenchCustomerDB, BenchTree
from envfactory.episode import Episode
from envfactory.factory.from_class import ClassTask, from_class
from envfactory.state import copy_state, state_hash
from envfactory.task import call


def _tree_spec(nodes=300):
    return from_class(BenchTree, name="T-v0", domain="t", loader="_load_scenario",
                      tasks=[ClassTask("t", "Enter child 0.", {"nodes": nodes, "seed": 1}, [call("enter", index=0)])])


def _db_spec(records=200, **options):
    return from_class(BenchCustomerDB, name="D-v0", domain="d", **options,
                      tasks=[ClassTask("t", "Credit 1.", {"records": records},
                                       [call("credit", customer_id=1, amount=5.0)])])


def _do(ep, tool, /, **args):
    return ep.step(call(tool, **args).to_hermes()).messages[0]["content"]


def test_a_fork_shares_the_values_until_a_tool_runs():
    """Before: a fork copied the whole graph at once (its values were never the parent's)."""
    ep = Episode(_tree_spec())
    ep.reset("t")
    _do(ep, "enter", index=0)
    child = ep.fork()
    assert child.state.__dict__["bench_tree"] is ep.state.__dict__["bench_tree"]
    _do(child, "grow", name="new")
    assert child.state.__dict__["bench_tree"] is not ep.state.__dict__["bench_tree"]


@pytest.mark.parametrize("which", ["tree", "records"])
@pytest.mark.parametrize("parent_first", [True, False])
def test_both_sides_stay_independent_whoever_acts_first(which, parent_first):
    spec = _tree_spec() if which == "tree" else _db_spec()

    def act(e, k):
        return _do(e, "grow", name=f"n{k}") if which == "tree" else _do(e, "credit", customer_id=3, amount=float(k))

    def replay(ks):  # a fresh episode through the same calls
        ref = Episode(spec)
        ref.reset("t")
        outs = [act(ref, k) for k in ks]
        return outs, state_hash(ref.state), ref.state.model_dump(mode="json")

    ep = Episode(spec)
    ep.reset("t")
    act(ep, 1)
    a, b = ep.fork(), ep.fork()
    grand = a.fork()
    order = [(ep, 10), (a, 20)] if parent_first else [(a, 20), (ep, 10)]
    for e, k in order:
        assert [act(e, k)] == replay([1, k])[0][1:]
    for e, k in ((ep, 10), (a, 20)):
        _, h, dump = replay([1, k])
        assert state_hash(e.state) == h and e.state.model_dump(mode="json") == dump
    _, h1, dump1 = replay([1])
    for e in (b, grand):  # untouched by both
        assert state_hash(e.state) == h1 and e.state.model_dump(mode="json") == dump1
    outs, h, _ = replay([1, 30])
    assert act(grand, 30) == outs[1] and state_hash(grand.state) == h
    assert state_hash(b.state) == h1


def test_a_tree_fork_continues_exactly_like_a_fresh_replay():
    spec = _tree_spec()
    ep = Episode(spec)
    ep.reset("t")
    _do(ep, "enter", index=0)
    child = ep.fork()
    _do(ep, "grow", name="p")
    _do(ep, "enter", index=0)
    _do(ep, "grow", name="q")  # the parent wanders off and changes the shared tree
    ref = Episode(spec)
    ref.reset("t")
    _do(ref, "enter", index=0)
    assert _do(child, "grow", name="c") == _do(ref, "grow", name="c")
    assert state_hash(child.state) == state_hash(ref.state)
    assert child.state.model_dump(mode="json") == ref.state.model_dump(mode="json")


def test_a_call_copies_only_the_containers_and_records_it_reaches():
    """Before: the first call on either side of a fork copied every record (the whole value).
    (Per container: copy_on_write='containers'; the default copies the state whole.)"""
    ep = Episode(_db_spec(copy_on_write="containers"))
    ep.reset("t")
    _do(ep, "credit", customer_id=1, amount=1.0)
    child = ep.fork()
    _do(ep, "credit", customer_id=1, amount=1.0)
    mine, theirs = ep.state.__dict__["records"], child.state.__dict__["records"]
    assert mine is not theirs and mine[1] is not theirs[1]  # the table and the record reached: copied
    assert mine[1].balance == theirs[1].balance + 1.0
    assert all(mine[k] is theirs[k] for k in theirs if k != 1)  # every other record: still shared
    again = mine
    _do(ep, "credit", customer_id=1, amount=1.0)
    assert ep.state.__dict__["records"] is again  # its own now: changed in place


def test_copies_of_copies_and_a_copied_then_restored_state():
    spec = _db_spec()
    s0 = spec.task("t").initial_state
    s1 = copy_state(s0)
    s2 = copy_state(s1)
    credit = spec.all_tools["credit"]
    assert credit.invoke(s2, {"customer_id": 4, "amount": 2.0}).ok
    assert s2.records[4].balance == s0.records[4].balance + 2.0
    assert s1.records[4].balance == s0.records[4].balance
    s3 = spec.state_type.model_validate(json.loads(json.dumps(s2.model_dump(mode="json"))))
    assert credit.invoke(s3, {"customer_id": 4, "amount": 2.0}).ok
    assert s2.records[4].balance + 2.0 == s3.records[4].balance


def test_siblings_changed_from_threads_stay_independent():
    spec = _tree_spec(2000)
    ep = Episode(spec)
    ep.reset("t")
    _do(ep, "enter", index=0)
    h = state_hash(ep.state)
    forks = [ep.fork() for _ in range(6)]
    errors = []

    def work(e, k):
        try:
            for j in range(3):
                _do(e, "grow", name=f"t{k}-{j}")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(e, k)) for k, e in enumerate(forks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert state_hash(ep.state) == h
    ref = Episode(spec)
    for k, e in enumerate(forks):
        ref.reset("t")
        _do(ref, "enter", index=0)
        for j in range(3):
            _do(ref, "grow", name=f"t{k}-{j}")
        assert state_hash(e.state) == state_hash(ref.state)


def test_tasks_on_one_configuration_share_one_base_until_a_tool_runs():
    """Before: every ClassTask deep-copied (and rebuilt) its configuration's whole database."""
    from benchmarks.bigdb_import import RetailDB, retail_db, retail_tasks

    db = retail_db(40)
    spec = from_class(RetailDB, name="R-v0", domain="r", tasks=retail_tasks(db, 10))
    tasks = spec.get_tasks()
    shared = {id(t.initial_state.__dict__["db"]) for t in tasks}
    assert len(shared) == 1  # one base: every task's initial state holds the same values
    before = json.dumps(tasks[2].initial_state.model_dump(mode="json"), sort_keys=True)
    from envfactory.checks.scripted import OraclePolicy, play

    ep = Episode(spec)
    for t in tasks:  # every reference played: no task's start moves
        assert play(ep, OraclePolicy(), t.id).success
        assert ep.state.__dict__["db"] is not tasks[2].initial_state.__dict__["db"]
    assert json.dumps(tasks[2].initial_state.model_dump(mode="json"), sort_keys=True) == before
    assert db == retail_db(40)  # nor the configuration the tasks were given


def test_first_write_of_an_episode_measures_only_what_it_changed(monkeypatch):
    """Before: the first writing call after a build measured the whole shared database for the
    state quota (0.7-1.1 s on a 4.8 MB one, paid by whichever episode wrote first); the build
    now measures a shared base once, so that call walks the containers it changed."""
    from benchmarks.bigdb_import import RetailDB, retail_db, retail_tasks
    from envfactory.factory.classes import cow

    db = retail_db(400)
    spec = from_class(RetailDB, name="R-v0", domain="r", tasks=retail_tasks(db, 10), copy_on_write="containers")
    tasks = spec.get_tasks()
    ep = Episode(spec)
    ep.reset(tasks[1].id)
    walked = []
    size = cow._size
    monkeypatch.setattr(cow, "_size", lambda *a: walked.append(1) or size(*a))
    _do(ep.fork(), "modify_user_address", user_id="user_00009", address1="2 Oak", city="Reno", zip="89501")
    assert walked and len(walked) < 100, len(walked)  # a table and a record, not 400 users' 1,200 orders


@pytest.mark.parametrize("side", ["child", "parent"])
def test_writes_after_a_fork_of_a_state_that_wrote_measure_only_what_they_changed(monkeypatch, side):
    """Before: once a state had written, a fork of it made every later write on either side walk
    the whole users table for the quota's measure (the table's source forgotten by the first
    copy: 4,007 walks a step at 4,000 users, 1.6 ms, against 7); now each write measures the
    table and record it changed, and the measure is still the engine's count."""
    from benchmarks.bigdb_import import RetailDB, retail_db, retail_tasks
    from envfactory import quotas
    from envfactory.factory.classes import cow

    db = retail_db(400)
    spec = from_class(RetailDB, name="R-v0", domain="r", tasks=retail_tasks(db, 10), copy_on_write="containers",
                      max_turns=50)
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[1].id)
    _do(ep, "modify_user_address", user_id="user_00003", address1="1 Elm", city="Tulsa", zip="74101")
    child = ep.fork()
    e = child if side == "child" else ep
    walked = []
    size = cow._size
    monkeypatch.setattr(cow, "_size", lambda *a: walked.append(1) or size(*a))
    for k in range(6):
        del walked[:]
        _do(e, "modify_user_address", user_id=f"user_{k * 7:05d}", address1=f"{k} Oak", city="Reno", zip="89501")
        assert walked and len(walked) < 40, (k, len(walked))  # a table and a record, not 400 users

    class Plain:
        def __init__(self, d):
            self.__dict__ = d

    for s in (child.state, ep.state):
        plain = json.loads(json.dumps(dict(s.__dict__)))
        assert quotas.state_size(s) == quotas.state_size(Plain(plain)) - 16


def test_the_build_hashes_no_expected_state_and_the_first_judgment_of_a_task_does(monkeypatch):
    """Before: the build serialized and hashed every task's expected final state (48 hashes of
    about 46 ms on a 5 MB database, a quarter of the build), tasks never played included. Now a
    database's expected state is hashed by the first judgment of its task; verdicts unchanged."""
    from benchmarks.bigdb_import import RetailDB, retail_db, retail_tasks
    from envfactory.checks.scripted import OraclePolicy, play
    from envfactory.factory.classes import cow
    from envfactory.factory.from_class import ReadsCheck

    hashed = []
    inner = cow._json  # (what writes a copy-on-write state's canonical JSON)
    monkeypatch.setattr(cow, "_json", lambda *a: hashed.append(1) or inner(*a))
    spec = from_class(RetailDB, name="R-v0", domain="r", tasks=retail_tasks(retail_db(60), 12),
                      copy_on_write="containers")
    tasks = spec.get_tasks()
    assert hashed == []  # nothing serialized while the tasks were built
    change = [t for t in tasks if t.check is None]
    reads = [t for t in tasks if isinstance(t.check, ReadsCheck)]
    assert len(change) >= 4 and reads
    assert all(t.expected_state_hash is None for t in change)
    assert all(t.check._hash is None for t in reads)

    def reference(t):
        final = spec.start_state(t)
        spec.replay(final, t.solution)
        return state_hash(final)

    ep = Episode(spec)
    for t in change[:2] + reads[:1]:
        assert play(ep, OraclePolicy(), t.id).success
    assert hashed  # (what is counted: judging hashes)
    assert [t.expected_state_hash for t in change[:2]] == [reference(t) for t in change[:2]]
    assert reads[0].check.describe()["state"] == reads[0].check.expected_hash == reference(reads[0])
    assert all(t.expected_state_hash is None for t in change[2:])  # not played: not hashed

    t = next(t for t in change[2:] if t.solution[0].name == "modify_user_address")
    ep.reset(t.id)
    _do(ep, "modify_user_address", **{**t.solution[0].arguments, "city": "Tulsa!"})
    r = ep.step("Done.")
    assert r.done and not ep.success  # another final state
    assert t.expected_hash() == t.expected_state_hash == reference(t)
