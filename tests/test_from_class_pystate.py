"""The PyState codec and graph copy: any picklable Python state, faithfully through
fork (copy_state) and snapshot (a versioned JSON document)."""

from __future__ import annotations

import collections
import copy
import datetime
import decimal
import enum
import json
import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from envfactory.factory.classes.pystate import (FORMAT_KEY, PyState, PyStateError, decode, encode,  # noqa: E402
                                        graph_copy, graph_state_copy)
from envfactory.state import copy_state  # noqa: E402
from fixtures.third_party.gorilla_fs import GorillaFileSystem  # noqa: E402
from fixtures.third_party.shop import Order  # noqa: E402

TRUST = ("fixtures.third_party", __name__)


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Node:
    def __init__(self, name, parent=None):
        self.name, self.parent, self.children = name, parent, []


def _zoo():
    root = Node("root")
    kid = Node("kid", root)
    root.children.append(kid)
    shared = [1, 2]
    fs = GorillaFileSystem()
    fs._load_scenario({"root": {"w": {"type": "directory", "contents": {"d": {"type": "directory", "contents": {}}}}}})
    fs.cd("d")
    rng = random.Random(42)
    rng.random()
    return {
        "rng": rng, "set": {3, 1, 2}, "frozen": frozenset({"b", "a"}), "tuple": (1, (2, "x"), [3]),
        "int_keys": {0: "a", 10: "b"}, "tuple_keys": {("tee", "M"): 2}, "dollar": {"$ref": 1, "$class": 2},
        "floats": [0.1, 1e308, -0.0, math.inf, -math.inf, 1.0, 2 ** -1074], "nan": math.nan,
        "ints": [2 ** 53, 2 ** 53 + 1, -(2 ** 70), 2 ** 200], "bytes": b"\x00\xff", "ba": bytearray(b"ab"),
        "tree": root, "pointer": kid, "alias": [shared, shared], "self_loop": None,
        "fs": fs, "order": Order(2 ** 64 + 1, [("tee", "M", 1)], 19.99, tags=frozenset({"gift"})),
        "enum": Color.BLUE, "deque": collections.deque([1, 2], maxlen=5),
        "dd": collections.defaultdict(list, {"a": [1]}), "od": collections.OrderedDict(z=1, a=2),
        "counter": collections.Counter("abca"), "when": datetime.datetime(2024, 5, 1, 12, 30),
        "money": decimal.Decimal("10.25"), "obj_key": {Color.RED: "r"}, "cls": Node,
    }


def _same(a, b):
    """Structural equality that also checks shared references inside the zoo."""
    assert encode(a, TRUST) == encode(b, TRUST)
    assert b["pointer"] is b["tree"].children[0] and b["pointer"].parent is b["tree"]
    assert b["alias"][0] is b["alias"][1]
    assert b["fs"]._current_dir is b["fs"].root.contents["d"] and b["fs"]._current_dir.parent is b["fs"].root
    assert b["rng"].random() == a["rng"].random() and b["rng"].getstate() == a["rng"].getstate()
    for k in ("set", "frozen", "tuple", "int_keys", "tuple_keys", "dollar", "ints", "bytes", "ba", "enum", "deque",
              "dd", "od", "counter", "when", "money", "obj_key"):
        assert b[k] == a[k] and type(b[k]) is type(a[k]), k
    assert [math.copysign(1, x) if x == 0 else x for x in b["floats"]] == \
           [math.copysign(1, x) if x == 0 else x for x in a["floats"]]
    assert math.isnan(b["nan"]) and b["cls"] is Node and b["dd"].default_factory is list


def test_a_snapshot_is_portable_json_and_restores_everything():
    zoo = _zoo()
    doc = encode(zoo, TRUST)
    text = json.dumps(doc, allow_nan=False)  # strict JSON: no NaN, no big ints beyond 2**53
    assert doc[FORMAT_KEY] == 1
    assert all(abs(v) <= 2 ** 53 for v in _ints(json.loads(text)))
    back = decode(json.loads(text), TRUST)
    assert json.dumps(encode(back, TRUST)) == json.dumps(doc)  # re-snapshot: equal
    _same(zoo, back)


def _ints(node):
    if isinstance(node, bool):
        return
    if isinstance(node, int):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _ints(v)
    elif isinstance(node, list):
        for v in node:
            yield from _ints(v)


def test_documents_reordered_by_sort_keys_still_resolve_references():
    zoo = _zoo()
    doc = json.loads(json.dumps(encode(zoo, TRUST), sort_keys=True))
    back = decode(doc, TRUST)
    assert back["pointer"] is back["tree"].children[0]
    assert back["fs"]._current_dir is back["fs"].root.contents["d"]


def test_graph_copy_keeps_references_and_equals_deepcopy():
    zoo = _zoo()
    a, b = graph_copy(zoo), copy.deepcopy(zoo)
    assert encode(a, TRUST) == encode(b, TRUST)
    _same(zoo, a)
    a["fs"].mkdir("new")
    assert "new" not in zoo["fs"]._current_dir.contents


def test_copy_state_uses_the_class_hook_and_copies_fields_as_one_graph():
    class TwoState(PyState):
        left: object
        right: object

    TwoState.__state_copy__ = staticmethod(graph_state_copy)
    shared = {"n": 1}
    s = TwoState(left=shared, right=[shared])
    c = copy_state(s)
    assert c.right[0] is c.left and c.left is not shared
    c.left["n"] = 2
    assert s.left == {"n": 1} and c.right[0]["n"] == 2


def test_loading_refuses_classes_outside_the_trusted_modules():
    doc = encode({"x": Node("a")}, TRUST)
    evil = json.loads(json.dumps(doc).replace(f"{__name__}:Node", "os:system"))
    with pytest.raises(PyStateError, match="os:system is not trusted"):
        decode(evil, TRUST)
    evil = {FORMAT_KEY: 1, "x": {"$reduce": "builtins:eval", "$args": ["1"]}}
    with pytest.raises(PyStateError, match="not trusted"):
        decode(evil, TRUST)
    with pytest.raises(PyStateError, match="not trusted for snapshots"):
        encode({"x": Node("a")}, ("somewhere_else",))
    with pytest.raises(PyStateError, match="version 1"):
        decode({"x": 1}, TRUST)


def test_unpicklable_values_are_named():
    import threading

    with pytest.raises(PyStateError, match=r"/x/1: .*not picklable"):
        encode({"x": [1, threading.Lock()]}, TRUST)
    with pytest.raises(PyStateError, match="defined inside a function"):
        encode({"x": lambda: 1}, TRUST)


class _Record:  # a plain class, a pydantic model and a slotted one: the three ways encode reduces
    def __init__(self, i):
        self.i, self.tags = i, {"b", "a"}


def test_encode_without_calling_reduce_writes_what_reduce_ex_gives(monkeypatch):
    """The encoder reduces plain objects and pydantic models without ``__reduce_ex__(4)``
    (issue 29: snapshots of large states); the document is the one the pickle protocol gives."""
    from pydantic import BaseModel

    from envfactory.factory.classes import pystate

    class Rec(BaseModel):
        i: int
        tags: list[str] = []

    globals()["Rec"] = Rec
    Rec.__qualname__ = "Rec"
    zoo = _zoo()
    zoo.update(records=[_Record(1), _Record(2)], models=[Rec(i=1, tags=["x"]), Rec(i=2)])
    fast = encode(zoo, TRUST)
    assert pystate._REDUCE_KIND[_Record] == pystate._BY_DICT and pystate._REDUCE_KIND[Rec] == pystate._BY_GETSTATE
    monkeypatch.setattr(pystate, "_REDUCE_KIND", collections.defaultdict(lambda: pystate._BY_REDUCE))
    assert json.dumps(encode(zoo, TRUST)) == json.dumps(fast)
    back = decode(json.loads(json.dumps(fast)), TRUST)
    assert back["models"] == zoo["models"] and [r.__dict__ for r in back["records"]] == \
           [r.__dict__ for r in zoo["records"]]


def test_a_snapshot_and_a_restore_share_nothing_with_the_episode():
    """A snapshot of a ``from_class`` state is not copied through JSON again, and its state is
    restored without a copy (issue 29): editing either afterwards changes neither episode."""
    from envfactory.episode import Episode
    from envfactory.factory.from_class import ClassTask, from_class
    from envfactory.task import call

    class Store:
        def __init__(self):
            self.items = {"a": {"qty": 1, "tags": ["x"]}}
            self.node = _Record(0)

        def add(self, key: str) -> int:
            """Add one.

            Args:
                key: The item.
            """
            self.items[key]["qty"] += 1
            return self.items[key]["qty"]

    globals()["Store"] = Store
    Store.__qualname__ = "Store"
    spec = from_class(Store, name="ShareNothing-v0", domain="test", trusted_modules=[__name__],
                      tasks=[ClassTask("t", "Add a.", {}, [call("add", key="a")])])
    ep = Episode(spec)
    ep.reset("t")
    ep.step(call("add", key="a").to_hermes())
    snap = ep.snapshot()
    snap["state"]["items"]["a"]["tags"].append("edited")  # the snapshot's own data
    assert ep.state.items["a"]["tags"] == ["x"]
    snap = ep.snapshot()
    other = Episode(spec)
    other.restore(snap)
    snap["state"]["items"]["a"]["tags"].append("edited")
    snap["state"]["node"]["tags"]["$set"].append("c")
    assert other.state.items["a"] == {"qty": 2, "tags": ["x"]} and other.state.node.tags == {"a", "b"}
    other.step(call("add", key="a").to_hermes())
    assert ep.state.items["a"]["qty"] == 2 and other.state.items["a"]["qty"] == 3
