"""from_class carries a class's own Python state faithfully (written against the original
from_class(cls, name=, domain=, config=) call only, so these fail on the old factory for
the reasons of issue 18, not for a missing argument)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from envfactory import Episode  # noqa: E402
from envfactory.factory.from_class import Service, Synthesis, from_class  # noqa: E402
from envfactory.task import Task, call  # noqa: E402
from fixtures.third_party.ledger import Ledger  # noqa: E402
from fixtures.third_party.notebook import Notebook  # noqa: E402
from fixtures.third_party.shop import Shop  # noqa: E402


def _episode(cls, config, exclude=()):
    spec = from_class(Service(cls, exclude=exclude), name="Faithful-v0", domain="test", config=config,
                      synthesis=Synthesis(n_tasks=1))
    probe = spec.metadata["synth"].sample_state(random.Random(0))
    spec.tasks = [Task(id="t", instruction="anything", initial_state=probe, solution=[], check=lambda s: True)]
    ep = Episode(spec)
    ep.reset("t")
    return ep


def _do(ep, tool, /, **arguments):
    return ep.step(call(tool, **arguments).to_hermes()).messages[0]["content"]


def test_pointer_into_another_attribute_survives_reset_fork_and_restore():
    ep = _episode(Ledger, {}, exclude=["set_status"])
    assert _do(ep, "post", amount=5) == "posted 5"
    assert _do(ep, "balance", account_id=1) == "cash: 5"  # entries *is* books['1']
    child = ep.fork()
    assert _do(child, "post", amount=7) == "posted 7"
    assert _do(child, "balance", account_id=1) == "cash: 12"
    assert _do(ep, "balance", account_id=1) == "cash: 5"  # the parent is untouched
    other = Episode(ep.spec)
    other.restore(json.loads(json.dumps(ep.snapshot())))
    assert _do(other, "post", amount=1) == "posted 1"
    assert _do(other, "balance", account_id=1) == "cash: 6"


def test_int_keys_survive_snapshot_and_restore():
    ep = _episode(Ledger, {}, exclude=["set_status"])
    other = Episode(ep.spec)
    other.restore(json.loads(json.dumps(ep.snapshot())))
    assert _do(other, "select", account_id=2) == "selected bank"
    assert _do(other, "balance", account_id=1) == "cash: 0"


def test_int_keys_sets_and_rng_round_trip_through_snapshots():
    ep = _episode(Notebook, {"seed": 5})
    for text in ("a", "b", "c", "d"):
        _do(ep, "write", text=text)
    _do(ep, "tag", name="x")
    straight = ep.fork()
    snap = json.loads(json.dumps(ep.snapshot()))
    other = Episode(ep.spec)
    other.restore(snap)
    assert _do(other, "get_note", note_id=0) == "a"  # int keys stay ints
    assert _do(other, "tag", name="y") == "x, y"  # the set is a set
    picks = [_do(other, "shuffle_pick") for _ in range(6)]
    assert picks == [_do(straight, "shuffle_pick") for _ in range(6)]  # the same random stream
    rng = random.Random(5)
    assert picks == [str(rng.choice([0, 1, 2, 3])) for _ in range(6)]  # as the class itself would draw
    other.restore(snap)
    assert json.dumps(other.snapshot(), sort_keys=True) == json.dumps(snap, sort_keys=True)


def test_tuple_keys_big_ints_and_objects_are_accepted_and_restored():
    ep = _episode(Shop, {})
    _do(ep, "add_to_cart", sku="tee", size="M", qty=2)
    assert _do(ep, "view_cart") == '[["tee", "M", 2]]'
    _do(ep, "checkout")
    other = Episode(ep.spec)
    other.restore(json.loads(json.dumps(ep.snapshot())))
    assert "Order #18446744073709551617 (placed)" in _do(other, "get_order", order_id=2 ** 64 + 1)
    assert "Only 3 left of tee in M" in _do(other, "add_to_cart", sku="tee", size="M", qty=4)


def test_a_parameter_named_state():
    ep = _episode(Ledger, {})
    assert _do(ep, "set_status", state="closed") == "ledger closed"
    assert _do(ep, "post", amount=1) == "Error: Ledger is closed"


def test_the_class_own_error_message_is_the_observation():
    ep = _episode(Ledger, {}, exclude=["set_status"])
    assert _do(ep, "select", account_id=9) == "Error: Account not found"
    assert _do(ep, "balance", account_id=3) == "Error: Account not found"
