"""Success checks derived from what a reference walk changed.

The state is flattened into leaves (``path -> value``): dicts are walked key by
key, lists and scalars are leaves (list order is meaningful; sets are sorted by
:func:`~envfactory.state.canonical_json`). A :class:`ChangeCheck` holds every
leaf the walk changed, added or removed, with its value after the walk; a final
state passes when each of those leaves has that value. Leaves the walk did not
touch are not judged, so an agent may look around or take another route.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..state import State, canonical_json

__all__ = ["ABSENT", "ChangeCheck", "flatten", "state_leaves", "diff_leaves"]

ABSENT = "<absent>"
"""Marks a leaf that must not exist (the walk deleted it)."""

Path = tuple[str, ...]


def flatten(node: Any, prefix: Path = (), out: dict[Path, Any] | None = None) -> dict[Path, Any]:
    """``{path: leaf}`` of JSON data; an empty dict is a leaf of its own."""
    out = {} if out is None else out
    if isinstance(node, dict) and node:
        for k, v in node.items():
            flatten(v, prefix + (str(k),), out)
    else:
        out[prefix] = node
    return out


def state_leaves(state: State) -> dict[Path, Any]:
    """The canonical leaves of a state."""
    return flatten(json.loads(canonical_json(state)))


def diff_leaves(before: dict[Path, Any], after: dict[Path, Any]) -> dict[Path, Any]:
    """Leaves of ``after`` that differ from ``before``, and ``ABSENT`` for removed ones."""
    out = {p: v for p, v in after.items() if p not in before or before[p] != v}
    inner = {p[:i] for p in after for i in range(1, len(p))}  # paths that are dicts now
    for p in before:
        if p not in after and p not in inner and not any(p[:i] in after for i in range(len(p))):
            out[p] = ABSENT
    return out


@dataclass(frozen=True)
class ChangeCheck:
    """``check(final_state) -> bool``: every changed leaf has its expected value."""

    expected: tuple[tuple[Path, Any], ...]

    @classmethod
    def from_states(cls, before: State, after: State) -> "ChangeCheck":
        changed = diff_leaves(state_leaves(before), state_leaves(after))
        return cls(tuple(sorted(changed.items(), key=lambda kv: kv[0])))

    def __call__(self, state: State) -> bool:
        root = json.loads(canonical_json(state))
        for path, want in self.expected:
            node = root
            for key in path:
                if not isinstance(node, dict) or key not in node:
                    node = ABSENT
                    break
                node = node[key]
            if node != want:
                return False
        return True

    def __bool__(self) -> bool:
        return bool(self.expected)

    def describe(self) -> list[dict[str, Any]]:
        """JSON form: ``[{"path": "a.b", "equals": value}]``."""
        return [{"path": ".".join(p), "equals": v} for p, v in self.expected]
