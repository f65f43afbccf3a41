"""The world-state decoder (``envfactory.factory.classes.pystate``, which loads snapshots' and containers'
state documents) refuses constructor calls that would allocate without bound (issue 28)."""

from __future__ import annotations

import random
import time

import pytest

from envfactory.factory.classes import pystate


def _decode(value):
    return pystate.decode({pystate.FORMAT_KEY: pystate.FORMAT_VERSION, "x": value})["x"]


HUGE = {
    "bytes": {"$reduce": "builtins:bytes", "$args": [2 ** 30]},
    "bytearray": {"$reduce": "builtins:bytearray", "$args": [2 ** 40]},
    "newobj bytes": {"$reduce": "copyreg:__newobj__", "$args": [{"$global": "builtins:bytes"}, 2 ** 30]},
    "newobj_ex bytes": {"$reduce": "copyreg:__newobj_ex__",
                        "$args": [{"$global": "builtins:bytearray"}, {"$tuple": [2 ** 30]}, {}]},
    "list of range": {"$reduce": "builtins:list",
                      "$args": [{"$reduce": "builtins:range", "$args": [2 ** 40]}]},
    "deque of range": {"$reduce": "collections:deque",
                       "$args": [{"$reduce": "builtins:range", "$args": [0, 2 ** 50, 1]}]},
    "fraction exponent": {"$reduce": "fractions:Fraction", "$args": ["1e999999999"]},
    "int of decimal": {"$reduce": "builtins:int",
                       "$args": [{"$reduce": "decimal:Decimal", "$args": ["1e999999999"]}]},
}


@pytest.mark.parametrize("name", sorted(HUGE))
def test_the_decoder_refuses_huge_allocations(name):
    """Before: ``$reduce builtins:bytes [2**30]`` (57 bytes of JSON) allocated 1 GiB."""
    t0 = time.perf_counter()
    with pytest.raises(pystate.PyStateError, match="refus"):
        _decode(HUGE[name])
    assert time.perf_counter() - t0 < 1.0


def test_the_decoder_still_builds_small_values():
    assert _decode({"$reduce": "builtins:bytes", "$args": [16]}) == bytes(16)
    assert _decode({"$reduce": "builtins:list", "$args": [{"$reduce": "builtins:range", "$args": [5]}]}) == \
        [0, 1, 2, 3, 4]
    assert _decode({"$reduce": "builtins:range", "$args": [0, 2 ** 50]}) == range(2 ** 50)  # lazy: fine
    assert str(_decode({"$reduce": "fractions:Fraction", "$args": ["1e3"]})) == "1000"
    assert _decode({"$reduce": "builtins:int",
                    "$args": [{"$reduce": "decimal:Decimal", "$args": ["1.5e2"]}]}) == 150
    rng = random.Random(3)
    rng.random()
    again = pystate.decode(pystate.encode({"r": rng}))["r"]
    assert again.random() == rng.random()


@pytest.mark.parametrize("value", [
    {"$reduce": "builtins:list", "$args": [], "$kv": [[1, 2]]},   # list[1] = 2: IndexError
    {"$reduce": "builtins:dict", "$args": [], "$items": [1]},     # a dict has no append
    {"$reduce": "builtins:bytearray", "$args": [], "$state": {"a": 1}},  # no __dict__ to update
    {"$tuple": 5},
    {"$dict": 5},
    {"$bytes": 5},
    {"$reduce": "builtins:list", "$args": 5},
])
def test_a_malformed_document_is_a_pystate_error(value):
    """Whatever is wrong in a document, loading it is a PyStateError (a ValueError, which pydantic
    reports as a validation error and restore as a SnapshotError), never a TypeError or an
    AttributeError from inside the decoder."""
    with pytest.raises(pystate.PyStateError):
        _decode(value)
