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

from envfactory.state import ABSENT, UNSURE, State, canonical_json, diff_leaves, flatten, leaf_at, live_leaf, state_leaves

__all__ = ["ABSENT", "ChangeCheck", "flatten", "state_leaves", "diff_leaves"]

Path = tuple[str, ...]


@dataclass(frozen=True)
class ChangeCheck:
    """``check(final_state) -> bool``: every changed leaf has its expected value."""

    expected: tuple[tuple[Path, Any], ...]

    @classmethod
    def from_states(cls, before: State, after: State) -> "ChangeCheck":
        changed = diff_leaves(state_leaves(before), state_leaves(after))
        return cls(tuple(sorted(changed.items(), key=lambda kv: kv[0])))

    def __call__(self, state: State) -> bool:
        # the changed leaves read from the live state (no serialization); the canonical form where
        # a leaf cannot be read for sure (see envfactory.state.live_leaf)
        for path, want in self.expected:
            got = live_leaf(state, path)
            if got is UNSURE:
                root = json.loads(canonical_json(state))
                return all(leaf_at(root, path) == want for path, want in self.expected)
            if got != want:
                return False
        return True

    def __bool__(self) -> bool:
        return bool(self.expected)

    def describe(self) -> list[dict[str, Any]]:
        """JSON form: ``[{"path": "a.b", "equals": value}]``."""
        return [{"path": ".".join(p), "equals": v} for p, v in self.expected]
