"""Tables: keyed rows of plain values, the world of spec-file environments.

A table world is ``tables[entity][key] = {field: value}`` plus a per-entity id
counter. The functions here are the primitives that spec operations
(create / read / update / delete / query) are built from; they raise
:class:`~envfactory.ToolError` with a message an agent can act on.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from envfactory.state import State
from envfactory.tooling import ToolError

__all__ = ["TableState", "Scalar", "get_row", "format_row", "check_condition", "next_key", "matches"]

Scalar = str | int | float | bool | None


class TableState(State):
    """Rows by entity and key, and the last id number issued per entity."""

    tables: dict[str, dict[str, dict[str, Scalar]]] = Field(default_factory=dict)
    counters: dict[str, int] = Field(default_factory=dict)


def get_row(state: TableState, entity: str, key: str, label: str | None = None) -> dict[str, Scalar]:
    """The row ``key`` of ``entity``, or a ToolError naming how ids look."""
    rows = state.tables.get(entity, {})
    row = rows.get(key)
    if row is None:
        example = next(iter(sorted(rows)), None)
        hint = f"; ids look like {example!r}" if example else ""
        raise ToolError(f"no {label or entity} with id {key!r}{hint}")
    return row


def format_row(entity: str, key: str, row: dict[str, Scalar]) -> str:
    """``<entity> <key>: field=value, ...`` (fields in definition order)."""
    body = ", ".join(f"{k}={'none' if v is None else v}" for k, v in row.items())
    return f"{entity} {key}: {body}"


def next_key(state: TableState, entity: str, prefix: str) -> str:
    """Issue the next id of ``entity`` (``prefix`` + number)."""
    n = state.counters.get(entity, 0) + 1
    state.counters[entity] = n
    return f"{prefix}{n}"


_OPS = {
    "equals": lambda v, x: v == x,
    "not_equals": lambda v, x: v != x,
    "in": lambda v, x: v in x,
    "not_in": lambda v, x: v not in x,
    "min": lambda v, x: v is not None and v >= x,
    "max": lambda v, x: v is not None and v <= x,
}


def check_condition(row: dict[str, Scalar], field: str, op: str, operand: Any) -> bool:
    """Whether ``row[field] <op> operand`` holds (ops: equals, not_equals, in, not_in, min, max)."""
    try:
        return bool(_OPS[op](row.get(field), operand))
    except TypeError:
        return False


def matches(row: dict[str, Scalar], filters: dict[str, Any]) -> bool:
    """Whether every given filter equals the row's field (strings case-insensitively)."""
    for k, want in filters.items():
        have = row.get(k)
        if isinstance(want, str) and isinstance(have, str):
            if have.lower() != want.lower():
                return False
        elif have != want:
            return False
    return True
