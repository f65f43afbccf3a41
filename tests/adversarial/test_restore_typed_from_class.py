"""A restored ``from_class`` state holds, in each attribute, a value of the type the class gives
it (issue 63): its annotation when the class annotates it (checked with pydantic), else the type
it starts with; a pydantic model value validates against its model. A snapshot re-signed with the
key (:func:`~envfactory.snapshots.sign_snapshot`) that puts a ``range``, a set, a string or a dict
of the wrong fields into an attribute is refused by name, before anything in the episode changes.
Before: every one of these was restored, and the class's tools answered with errors (``'range'
object has no attribute 'append'``) or, worse, quietly wrong (``len("oops")`` items)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from envfactory import Episode, SnapshotError
from envfactory.factory.from_class import ClassTask, from_class
from envfactory.snapshots import sign_snapshot
from envfactory.task import call

sys.path.insert(0, str(Path(__file__).parents[1]))

RANGE = {"$reduce": "builtins:range", "$args": [3]}


class Item(BaseModel):
    name: str
    qty: int


class Shelf(BaseModel):
    items: dict[str, Item]


class Desk:
    """A desk: some attributes annotated, some not."""

    count: int
    tags: list[str]
    size: int  # annotated, but the class stores a string: the annotation is not believed
    stock: dict[str, Item]

    def __init__(self) -> None:
        self.count = 0
        self.tags = ["a"]
        self.size = "big"
        self.items = {"x": 1}
        self.label = "desk"
        self.price = 1.5
        self.entries = [1, 2]
        self.item = Item(name="pen", qty=1)
        self.note = None
        self.stock = {"pen": Item(name="pen", qty=3)}
        self.shelf = Shelf(items={"ink": Item(name="ink", qty=2)})

    def add(self, n: int) -> str:
        """Add to the count.

        Args:
            n: How many.
        """
        self.count += n
        self.entries.append(n)
        return f"count {self.count}, {self.item.name} x{self.item.qty}, {len(self.items)} items, {self.label.upper()}"

    def relabel(self, code: int) -> str:
        """Label the desk with a number (the class rebinds a str attribute to an int).

        Args:
            code: The number.
        """
        self.label = code
        return "relabelled"


def _spec() -> Any:
    return from_class(Desk, name="TypedDesk-v0", domain="test", trusted_modules=[__name__],
                      tasks=[ClassTask(id="t", instruction="add one", config={}, solution=[call("add", n=1)])])


SPEC = _spec()


def _step(ep: Episode, tool: str, **args: Any) -> str:
    return ep.step(call(tool, **args).to_hermes()).messages[0]["content"]


def _started() -> Episode:
    ep = Episode(SPEC)
    ep.reset("t")
    _step(ep, "add", n=1)
    return ep


def _view(ep: Episode) -> str:
    return json.dumps([ep.state.model_dump(mode="json"), ep.transcript()], sort_keys=True, default=str)


def _item(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields of the pydantic model in the document's ``item`` (``{"$class": ..., "__dict__": {...}}``)."""
    node = doc["item"]
    return node.get("__dict__", node)


WRONG = {  # what the re-signed snapshot's state gets -> what the refusal must say
    "str where a dict was": (lambda s: s.update(items="oops"), r"attribute 'items' of Desk: expected dict.*found str"),
    "list where an int was (annotated int)": (lambda s: s.update(count=[1]),
                                              r"attribute 'count' of Desk: expected int \(its annotation\), found list"),
    "range where a list was": (lambda s: s.update(entries=RANGE), r"attribute 'entries'.*expected list.*found range"),
    "set where a list was": (lambda s: s.update(entries={"$set": [1, 2]}), r"attribute 'entries'.*found set"),
    "tuple where a list was": (lambda s: s.update(entries={"$tuple": [1, 2]}), r"attribute 'entries'.*found tuple"),
    "range in an annotated list[str]": (lambda s: s.update(tags=RANGE), r"attribute 'tags'.*list\[str\].*found range"),
    "ints in an annotated list[str]": (lambda s: s.update(tags=[1, 2]), r"attribute 'tags'.*list\[str\].*string"),
    "str where a float was": (lambda s: s.update(price="1.5"), r"attribute 'price'.*expected float.*found str"),
    "dict of wrong fields where a model was": (lambda s: s.update(item={"nom": 3}),
                                               r"attribute 'item'.*expected Item.*found dict"),
    "a model field of the wrong type": (lambda s: _item(s).update(qty="many"),
                                        r"attribute 'item'.*Item does not validate.*qty.*found str 'many'"),
    "a range inside a model": (lambda s: _item(s).update(name=RANGE), r"attribute 'item'.*name.*found range"),
    "a model field missing": (lambda s: _item(s).pop("qty"), r"attribute 'item'.*qty.*required"),
    "a dict of a model's fields in an annotated dict[str, Item]": (
        lambda s: s.update(stock={"pen": {"name": "pen", "qty": 3}}),
        r"attribute 'stock'.*dict\[str, .*Item\] \(its annotation\).*Expected `Item`"),
    "a dict of a record's fields inside a model": (
        lambda s: s["shelf"]["__dict__"].update(items={"ink": {"name": "ink", "qty": 2}}),
        r"attribute 'shelf'.*Shelf does not validate.*Expected `Item`"),
    "a missing attribute": (lambda s: s.pop("label"), r"Desk: attributes missing: \['label'\]"),
    "an extra attribute": (lambda s: s.update(extra=1), r"Desk: attributes it does not have: \['extra'\]"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_wrong_typed_attribute_is_refused_and_the_episode_keeps_its_state(case):
    edit, message = WRONG[case]
    snap = _started().snapshot()
    edit(snap["state"])
    ep = _started()
    _step(ep, "add", n=2)
    before = _view(ep)
    with pytest.raises(SnapshotError, match=message):
        ep.restore(sign_snapshot(snap))
    assert _view(ep) == before  # nothing changed
    assert _step(ep, "add", n=1) == "count 4, pen x1, 1 items, DESK"  # and it still steps


def test_a_well_typed_edited_snapshot_restores():
    snap = _started().snapshot()
    doc = snap["state"]
    doc.update(count=5, tags=["b", "c"], items={"y": 2, "z": 3}, label="bureau", price=3, entries=[], note="now",
               size="small")
    _item(doc).update(name="ink", qty=7)
    ep = _started()
    ep.restore(sign_snapshot(snap))
    assert _step(ep, "add", n=1) == "count 6, ink x7, 2 items, BUREAU"
    assert ep.state.price == 3 and ep.state.note == "now" and ep.state.entries == [1]


def test_an_annotation_the_class_itself_contradicts_is_not_believed():
    """``size: int``, but the class stores ``"big"``: its snapshots restore (the type it starts
    with decides), and a forged int there is still refused."""
    snap = _started().snapshot()
    snap["state"]["size"] = "huge"
    _started().restore(sign_snapshot(snap))
    snap["state"]["size"] = 3
    with pytest.raises(SnapshotError, match=r"attribute 'size'.*expected str.*found int"):
        _started().restore(sign_snapshot(snap))


def test_a_type_the_class_gives_an_attribute_itself_restores():
    """``relabel`` rebinds ``label`` to an int: the snapshot after it restores."""
    ep = _started()
    assert _step(ep, "relabel", code=7) == "relabelled"
    snap = copy.deepcopy(ep.snapshot())
    other = _started()
    other.restore(snap)
    assert other.state.label == 7


def test_genuine_snapshots_still_round_trip():
    ep = _started()
    snap = json.loads(json.dumps(ep.snapshot()))
    other = Episode(SPEC)
    other.restore(snap)
    assert _view(other) == _view(ep)
    assert _step(other, "add", n=1) == "count 2, pen x1, 1 items, DESK"


def test_a_state_of_objects_checks_each_instances_attributes():
    """``state="objects"`` (a field holding the live instance, attributes pointing into each
    other): the field must hold the class's instance, its attributes typed as they started."""
    from fixtures.third_party.ledger import Ledger

    from envfactory.task import Task

    spec = from_class(Ledger, name="TypedLedger-v0", domain="test", config={},
                      tasks=[ClassTask(id="t", instruction="post", config={}, solution=[call("post", amount=5)])])
    ep = Episode(spec)
    ep.reset("t")
    _step(ep, "post", amount=5)
    snap = ep.snapshot()
    assert isinstance(spec.get_tasks()[0], Task)
    body = snap["state"]["ledger"]
    for edit, message in [(lambda b: b.update(status=["open"]), r"attribute 'status' of ledger.*expected str.*list"),
                          (lambda b: b.update(accounts=RANGE), r"attribute 'accounts'.*expected dict.*range"),
                          (lambda b: b.pop("status"), r"lacks attributes \['status'\]"),
                          (lambda b: b.update(stolen=1), r"Ledger has no attribute 'stolen'")]:
        forged = copy.deepcopy(snap)
        edit(forged["state"]["ledger"])
        other = Episode(spec)
        other.reset("t")
        with pytest.raises(SnapshotError, match=message):
            other.restore(sign_snapshot(forged))
        assert _step(other, "post", amount=1) == "posted 1"
    forged = copy.deepcopy(snap)
    forged["state"]["ledger"] = {"accounts": {}}
    with pytest.raises(SnapshotError, match=r"field 'ledger': expected a Ledger, found dict"):
        Episode(spec).restore(sign_snapshot(forged))
    assert "status" in body
    good = copy.deepcopy(snap)
    good["state"]["ledger"]["status"] = "closed"
    other = Episode(spec)
    other.restore(sign_snapshot(good))
    assert _step(other, "post", amount=1) == "Error: Ledger is closed"
