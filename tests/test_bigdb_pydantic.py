"""A database held in one pydantic model (τ²-bench's shape: ``self.db``, a model of tables of
nested pydantic records) imported with ``from_class(copy_on_write="containers")``: a call copies
the models it reaches (not the database), forks stay independent, the quota's measure and the
hash are the engine's, and the read-only verdicts and task checks are those of the slow path
(``copy_on_write="state"``, a whole copy per fork), found without hashing whole states."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import BaseModel

from benchmarks.bigdb_import import (Address, Order, RetailModelDB, RetailTools, retail_model_db,
                                     retail_model_tasks)
from envfactory import quotas
from envfactory.episode import Episode
from envfactory.factory.from_class import ClassTask, ReadsCheck, _state_differs, from_class
from envfactory.state import canonical_json, copy_state, state_hash
from envfactory.task import call

WHERE = {"address1": "9 Pine", "address2": "", "city": "Reno", "state": "NV", "country": "USA", "zip": "89501"}


def _spec(users: int = 40, tasks: int = 15, **options: Any) -> Any:
    db = retail_model_db(users)
    options.setdefault("copy_on_write", "containers")
    return from_class(RetailTools, name="Tau2Shaped-v0", domain="retail", tasks=retail_model_tasks(db, tasks),
                      max_turns=60, **options)


def _step(ep: Episode, tool: str, **args: Any) -> str:
    return ep.step(call(tool, **args).to_hermes()).messages[0]["content"]


def _engine_json(state: Any) -> str:
    """The engine's canonical JSON, whatever the state's class brings of its own."""
    return json.dumps(state.model_dump(mode="python"), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)


class _Plain:
    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__ = d


def _walked(state: Any) -> int:
    """The quota's measure by the engine's own walk (a plain object holding a deep copy of the
    fields: the copy-on-write containers as the plain dicts and lists they stand for)."""
    return quotas.state_size(_Plain(copy.deepcopy(dict(state.__dict__)))) - 16


def _pending(db: RetailModelDB, n: int) -> list[str]:
    return [o for o, v in db.orders.items() if v.status == "pending"][:n]


def test_a_write_lands_only_in_its_side_of_a_fork_and_copies_only_what_it_reached():
    """Before: a call's first reach of the database deep-copied the whole model (every record
    a new object on both sides); now the records a call did not reach stay shared."""
    spec = _spec()
    base = spec.get_tasks()[0].initial_state.db
    pristine = copy.deepcopy(base)
    o1, o2, o3 = _pending(base, 3)
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[0].id)
    _step(ep, "modify_pending_order_address", order_id=o1, **WHERE)
    child = ep.fork()
    assert json.loads(_step(child, "cancel_pending_order", order_id=o2, reason="no longer needed"))["status"] == \
        "cancelled"
    _step(ep, "modify_user_address", user_id="user_00002", **{**WHERE, "city": "Elko"})
    p, c = ep.state.db, child.state.db
    assert p.orders[o2].status == "pending" and c.orders[o2].status == "cancelled"
    assert c.users["user_00002"].address == base.users["user_00002"].address
    assert p.users["user_00002"].address.city == "Elko"
    assert p.orders[o1].address.city == c.orders[o1].address.city == "Reno"  # written before the fork: both
    assert base == pristine  # the configuration's database untouched
    # what neither side reached is still the configuration's own record, not a copy
    assert p.orders[o3] is c.orders[o3] is base.orders[o3]
    assert p.users["user_00030"] is base.users["user_00030"]
    # and each side is what a deep copy of the database would have given
    truth = RetailTools(copy.deepcopy(pristine))
    truth.modify_pending_order_address(o1, **WHERE)
    fork = RetailTools(copy.deepcopy(truth.db))
    fork.cancel_pending_order(o2, "no longer needed")
    truth.modify_user_address("user_00002", **{**WHERE, "city": "Elko"})
    assert c.model_dump() == fork.db.model_dump() and p.model_dump() == truth.db.model_dump()


def test_a_snapshot_restored_then_forked_stays_exact():
    spec = _spec(30)
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[0].id)
    o1, o2 = _pending(spec.get_tasks()[0].initial_state.db, 2)
    _step(ep, "cancel_pending_order", order_id=o1, reason="no longer needed")
    snap = ep.snapshot()
    h = state_hash(ep.state)
    _step(ep, "modify_user_address", user_id="user_00001", **WHERE)
    ep.restore(snap)
    assert state_hash(ep.state) == h
    assert type(ep.state.db.orders[o1]) is Order and ep.state.db.orders[o1].status == "cancelled"
    child = ep.fork()
    _step(child, "cancel_pending_order", order_id=o2, reason="no longer needed")
    assert state_hash(ep.state) == h and child.state.db.orders[o2].status == "cancelled"
    assert canonical_json(child.state) == _engine_json(child.state)
    assert quotas.state_size(child.state) == _walked(child.state)


def test_hash_and_measure_are_the_engines_through_forks_and_writes():
    spec = _spec(30)
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[0].id)
    orders = _pending(spec.get_tasks()[0].initial_state.db, 6)
    steps = [("cancel_pending_order", {"order_id": orders[0], "reason": "ordered by mistake"}),
             ("modify_user_address", {"user_id": "user_00003", **WHERE}),
             ("modify_pending_order_address", {"order_id": orders[1], **WHERE}),
             ("cancel_pending_order", {"order_id": orders[1], "reason": "no longer needed"}),
             ("get_user_details", {"user_id": "user_00003"}),
             ("cancel_pending_order", {"order_id": orders[0], "reason": "no longer needed"})]  # (raises)
    for i, (tool, args) in enumerate(steps * 2):
        _step(ep, tool, **args)
        if i % 2:
            ep = ep.fork()
        assert canonical_json(ep.state) == _engine_json(ep.state), (i, tool)
        assert quotas.state_size(ep.state) == _walked(ep.state), (i, tool)


def test_a_judgment_hashes_a_model_database_without_the_engines_serialization(monkeypatch):
    """Before: hashing a state holding a model database serialized it whole through the snapshot
    encoder (7-8 s a first judgment at 5.5 MB); now its text is the copy-on-write writer's, the
    shared records' JSON remembered, the same text as the engine's."""
    from envfactory.factory.classes import pystate
    from envfactory.factory.classes.cow import cow_canonical_json

    spec = _spec(30)
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[0].id)
    oid = _pending(spec.get_tasks()[0].initial_state.db, 2)[1]
    state_hash(ep.state)  # (the shared database written once)
    _step(ep, "modify_user_address", user_id="user_00004", **WHERE)
    child = ep.fork()
    _step(child, "cancel_pending_order", order_id=oid, reason="no longer needed")
    encoded: list[int] = []
    real = pystate.encode
    monkeypatch.setattr(pystate, "encode", lambda *a, **k: encoded.append(1) or real(*a, **k))
    texts = [cow_canonical_json(e.state) for e in (ep, child)]
    assert encoded == []
    monkeypatch.undo()
    assert texts == [_engine_json(ep.state), _engine_json(child.state)]


def test_the_quota_measure_of_a_write_does_not_walk_the_database(monkeypatch):
    """Before: every writing call measured the database model with the engine's walk (the whole
    5 MB of it at every step); now the models a call copied are counted, the shared ones
    remembered."""
    spec = _spec(60)
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[0].id)
    child = ep.fork()
    walked: list[type] = []
    walk = quotas._walk
    monkeypatch.setattr(quotas, "_walk", lambda v, limit: walked.append(type(v)) or walk(v, limit))
    _step(child, "modify_user_address", user_id="user_00009", **WHERE)
    _step(child, "modify_user_address", user_id="user_00011", **WHERE)
    assert not [t for t in walked if issubclass(t, BaseModel) and t.__module__ == RetailModelDB.__module__], walked
    monkeypatch.undo()
    assert quotas.state_size(child.state) == _walked(child.state)


def test_the_quota_still_refuses_a_write_over_the_limit_and_keeps_the_state(monkeypatch):
    spec = _spec(30)
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[0].id)
    _step(ep, "modify_user_address", user_id="user_00001", **WHERE)
    child = ep.fork()
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas.state_size(child.state) + 200)
    before = state_hash(child.state)
    out = _step(child, "modify_user_address", user_id="user_00002", **{**WHERE, "address2": "Z" * 1000})
    assert out.startswith(quotas.STATE_QUOTA_PREFIX)
    assert state_hash(child.state) == before
    assert child.state.db.users["user_00002"].address.address2 != "Z" * 1000


class Toggle:
    """A τ²-shaped toolkit whose calls change a field and change it back, or replace a nested
    model by an equal one."""

    def __init__(self, db: RetailModelDB) -> None:
        self.db = db

    def touch_status(self, order_id: str) -> str:
        """Set an order's status to 'held' and back.

        Args:
            order_id: The order.
        """
        order = self.db.orders[order_id]
        was = order.status
        order.status = "held"
        order.status = was
        return was

    def hold(self, order_id: str) -> str:
        """Hold an order.

        Args:
            order_id: The order.
        """
        self.db.orders[order_id].status = "held"
        return "held"

    def readdress_same(self, order_id: str) -> str:
        """Replace an order's address with an equal one.

        Args:
            order_id: The order.
        """
        order = self.db.orders[order_id]
        order.address = Address(**order.address.model_dump())
        return "ok"

    def readdress(self, order_id: str, city: str) -> str:
        """Replace an order's address with another city's.

        Args:
            order_id: The order.
            city: The city.
        """
        order = self.db.orders[order_id]
        order.address = Address(**{**order.address.model_dump(), "city": city})
        return "ok"

    def set_reason(self, order_id: str) -> str:
        """Set an order's cancel reason to what it is (None): the field is then set.

        Args:
            order_id: The order.
        """
        order = self.db.orders[order_id]
        order.cancel_reason = order.cancel_reason
        return "ok"


@pytest.mark.parametrize("tool, changes", [("touch_status", False), ("readdress_same", False), ("hold", True),
                                           ("readdress", True), ("set_reason", True)])
def test_a_field_changed_and_changed_back_or_a_nested_model_replaced(tool, changes):
    """The per-field comparison says what the hashes say: a field changed and changed back, or
    a nested model replaced by an equal one, is no change; another value, or a field that
    becomes set (its dump says so), is."""
    db = retail_model_db(12)
    oid = _pending(db, 1)[0]
    spec = from_class(Toggle, name="Toggle-v0", domain="t", read_only=[], copy_on_write="containers",
                      trusted_modules=["benchmarks.bigdb_import"],
                      tasks=[ClassTask("t", "Hold.", {"db": db}, [call("hold", order_id=oid)])])
    s = copy_state(spec.get_tasks()[0].initial_state)
    tools = {t.name: t for t in spec.tools}
    before = copy_state(s)
    h = state_hash(before)
    args = {"order_id": oid, **({"city": "Elko"} if tool == "readdress" else {})}
    assert tools[tool].invoke(s, args).ok
    assert _state_differs(s, before) is changes
    assert (state_hash(s) != h) is changes
    assert canonical_json(s) == _engine_json(s) and quotas.state_size(s) == _walked(s)


def _verdicts(spec: Any) -> dict[str, Any]:
    tasks = spec.get_tasks()
    out: dict[str, Any] = {"read_only": {t.name: t.read_only for t in spec.tools}}
    for t in tasks:
        check = t.check
        final = spec.start_state(t)
        spec.replay(final, t.solution)
        out[t.id] = (type(check).__name__, isinstance(check, ReadsCheck) and [n for n, _ in check.reads],
                     state_hash(final), state_hash(t.initial_state))
    return out


def test_verdicts_and_hashes_are_the_slow_paths_and_the_build_hashes_no_state(monkeypatch):
    """The read-only observation and the tasks' checks are those of ``copy_on_write="state"``
    (whole copies, compared by hashes where needed); before, every writing reference call on a
    model database was decided by hashing both whole states, in the observation and per task."""
    import envfactory.state as state_mod

    slow = _verdicts(_spec(40, 20, copy_on_write="state"))
    hashed: list[int] = []
    real = state_mod.state_hash
    monkeypatch.setattr(state_mod, "state_hash", lambda s: hashed.append(1) or real(s))
    spec = _spec(40, 20)
    spec.get_tasks()
    assert hashed == []
    monkeypatch.undo()
    assert _verdicts(spec) == slow
    assert not spec.metadata["read_only_undecided"]
    assert {t.name for t in spec.tools if not t.read_only} == {"cancel_pending_order", "modify_user_address",
                                                               "modify_pending_order_address"}


def test_a_small_tau2_shaped_class_verifies_and_its_oracle_succeeds():
    from envfactory.checks.scripted import OraclePolicy, play
    from envfactory.checks.verify import verify_spec

    spec = _spec(20, 10)
    report = verify_spec(spec, lambda: Episode(spec), api_checks=False, random_episodes=1, audit=None)
    assert [f.to_json() for f in report.failures] == []
    ep = Episode(spec)
    for t in spec.get_tasks():
        assert play(ep, OraclePolicy(), t.id).success, t.id
    # a wrong write fails its task
    t = next(t for t in spec.get_tasks() if t.id.startswith("move-"))
    ep.reset(t.id)
    _step(ep, "modify_user_address", **{**t.solution[1].arguments, "city": "Nowhere"})
    ep.step("Done.")
    assert not ep.success


def test_an_order_model_is_still_its_class_for_the_tools_and_the_renderer():
    """What the class's code sees: its own model classes (``type(x) is Order``), its dicts and
    lists as the copy-on-write subclasses, results rendered as the model dumps them."""
    spec = _spec(12)
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[0].id)
    oid = _pending(spec.get_tasks()[0].initial_state.db, 1)[0]
    out = json.loads(_step(ep, "get_order_details", order_id=oid))
    assert out == json.loads(spec.get_tasks()[0].initial_state.db.orders[oid].model_dump_json())
    assert type(ep.state.db.orders[oid]) is Order
    assert _step(ep, "get_order_details", order_id="#nope").startswith("Error: Order not found")


def test_a_renderer_gets_a_model_with_plain_dicts_and_lists():
    """A renderer is given results as plain values (an exact ``type(x) is dict`` holds), a
    model's copy-on-write containers included."""
    spec = _spec(12, render=lambda r: f"{type(r).__name__} {type(r.payment_methods).__name__} "
                                      f"{type(r.orders).__name__}")
    ep = Episode(spec)
    ep.reset(spec.get_tasks()[0].id)
    assert _step(ep, "modify_user_address", user_id="user_00001", **WHERE) == "User dict list"
    assert ep.state.db.users["user_00001"].address.city == "Reno"
