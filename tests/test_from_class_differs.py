"""from_class tells a call that changed the world from a read by comparing values
(``_differs``), not by hashing whole states: values equal by ``==`` are the same world (the
copy-on-write state's own equality); unequal ones differ where the canonical hash would differ,
and "cannot tell" (None) is said where only the hash can."""

from __future__ import annotations

import random

import pytest

from envfactory.factory.from_class import _differs


class Plain:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Owned:
    def __init__(self, x, note=""):
        self.x, self.note = x, note

    def __eq__(self, other):
        return self.x == other.x  # an owner's equality: its inequality says nothing of the JSON


DB = {"users": {"u1": {"name": "A", "tags": ["x"], "n": 1}}, "orders": {"o1": {"status": "pending", "total": 1.5}}}


@pytest.mark.parametrize("a,b,want", [
    (DB, {"users": {"u1": {"name": "A", "tags": ["x"], "n": 1}}, "orders": {"o1": {"status": "pending", "total": 1.5}}},
     False),
    (DB, {"users": {"u1": {"name": "A", "tags": ["x"], "n": 1}}, "orders": {"o1": {"status": "cancelled", "total": 1.5}}},
     True),
    (DB, {"users": {"u1": {"name": "A", "tags": ["x", "y"], "n": 1}}, "orders": DB["orders"]}, True),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}, False),  # key order: the canonical JSON sorts keys
    ({"a": 1}, {"a": 1.0}, False),  # equal by ==: the same world (as the state's equality says)
    ({"a": float("nan")}, {"a": float("nan")}, False),
    ({"a": 1}, {"a": "1"}, True),
    ([1, 2], [2, 1], True),
    (Plain(x=[1]), Plain(x=[1]), False),
    (Plain(x=[1]), Plain(x=[2]), True),
    ({"o": Owned(1, "a")}, {"o": Owned(1, "b")}, False),
    ({"o": Owned(1)}, {"o": Owned(2)}, None),
    ([Plain(x=Owned(1))], [Plain(x=Owned(2))], None),
    ({"a": 1, "o": Owned(1)}, {"a": 2, "o": Owned(2)}, True),
    (random.Random(1), random.Random(2), None),  # its state is not in its attributes
    ({1, 2}, {1, 2}, False),
])
def test_differs_where_the_hash_would_and_says_so_when_it_cannot_tell(a, b, want):
    assert _differs(a, b) is want


def _tree(n, label="x"):
    root = Plain(name="root", parent=None, children=[])
    node = root
    for i in range(n):
        child = Plain(name=f"n{i}", parent=node, children=[])
        node.children.append(child)
        node = child if i % 3 else root
    root.label = label
    return root


def test_graphs_with_cycles_are_walked_once_and_shared_references_left_to_the_hash():
    import copy

    a = _tree(3000)
    assert _differs(a, copy.deepcopy(a)) is False  # parent pointers: each node compared once
    b = copy.deepcopy(a)
    b.children[-1].children.append(Plain(name="new", parent=None, children=[]))
    assert _differs(a, b) is True
    shared = [Plain(v=1)]
    x, y = {"p": shared, "q": shared}, {"p": [Plain(v=1)], "q": [Plain(v=1)]}
    assert _differs(x, y) is None  # the same values, shared on one side only: the hash decides
