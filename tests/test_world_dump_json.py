"""``LocalWorld.dump_json``: a state's JSON written straight from it, as :meth:`dump` writes it
(issue 63: the container's replies of a state; a Python dump first took 21x a shared state's size)."""

from __future__ import annotations

import json

import pytest

from envfactory.state import State
from envfactory.world import LocalWorld


class Plain(State):
    rows: list = []
    meta: dict = {}
    f: float = 0.0


class Held(LocalWorld):  # a world over a given state (no spec needed for a dump)
    def __init__(self, state: State) -> None:
        self._held = state

    def view(self) -> State:
        return self._held


def _decoded(raw: bytes) -> object:
    return json.loads(raw.decode("utf-8", "surrogatepass"))  # as the wire decodes a frame


@pytest.mark.parametrize("state", [
    Plain(rows=["a", "é", 2 ** 70, 1.5e16, None, True, ("t", 1), {"k": [1, 2]}], meta={"x": 1}),
    Plain(rows=["\ud800 lone", "\udfff"], meta={"k": "\x00"}),  # surrogates: pydantic's writer refuses them
    Plain(meta={1: "int key"}),
])
def test_the_json_is_what_dump_writes(state) -> None:
    raw = Held(state).dump_json()
    assert raw is not None
    assert _decoded(raw) == state.model_dump(mode="json")


def test_a_surrogate_in_a_key_crosses_exactly() -> None:
    """pydantic replaces (or refuses) a lone surrogate in a key; the wire passes it through."""
    state = Plain(meta={"\udfffkey": "v"})
    raw = Held(state).dump_json()
    assert raw is not None and _decoded(raw) == {"rows": [], "meta": {"\udfffkey": "v"}, "f": 0.0}


def test_a_shared_nest_is_written_at_each_place_without_a_copy_first() -> None:
    rows: list = []
    for _ in range(12):
        rows = [rows, rows]
    raw = Held(Plain(rows=rows)).dump_json()
    assert raw is not None and _decoded(raw) == Plain(rows=rows).model_dump(mode="json")


def test_what_is_not_plain_json_is_left_to_dump() -> None:
    assert Held(Plain(rows=[{1, 2}], meta={"\ud800": 1})).dump_json() is None  # a set, on the fallback path
    assert _decoded(Held(Plain(rows=[float("inf")])).dump_json()) == {"rows": [None], "meta": {}, "f": 0.0}
