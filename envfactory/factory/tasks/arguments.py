"""Where task synthesis draws tool arguments from: the current state.

A walk over the tool graph needs arguments that make sense *now*: ids that
exist, values a field can take. An :data:`ArgSource` says where to find the
candidates for one parameter:

* a list: fixed candidates;
* ``"keys:<path>"``: the keys of the dict at ``<path>`` in the state's JSON
  (``*`` matches every key at one level), e.g. ``"keys:desk.tickets"``;
* ``"values:<path>"``: the leaf values at ``<path>``, e.g.
  ``"values:desk.tickets.*.customer"``;
* a callable ``f(state_json) -> list``.

Parameters without a source are inferred from their JSON schema: enums and
booleans list their values; ``<thing>_id`` looks for dicts named after
``<thing>``; a name matching a leaf field takes that field's values; anything
else takes fresh values from a small vocabulary.
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable, Union

__all__ = ["ArgSource", "candidates", "draw_arguments", "FRESH_WORDS", "is_free"]

ArgSource = Union[list, str, Callable[[Any], list]]

FRESH_WORDS = [
    "harbor", "maple", "quartz", "lantern", "orbit", "meadow", "cobalt", "juniper", "summit",
    "falcon", "willow", "ember", "glacier", "saffron", "tundra", "velvet", "zephyr", "onyx",
]


def _untag(node: Any) -> Any:
    """A snapshot-encoded dict (``{"$dict": [[key, value], ...]}``, see
    :mod:`~envfactory.factory.classes.pystate`) as a dict of its scalar keys; an object (``{"$class": ..}``) as its
    attributes. Plain JSON comes back as it is."""
    if isinstance(node, dict) and node and any(isinstance(k, str) and k[:1] == "$" for k in node):
        if "$dict" in node and isinstance(node["$dict"], list):
            return {k: v for k, v in node["$dict"] if isinstance(k, (str, int, float, bool))}
        return {k: v for k, v in node.items() if not (isinstance(k, str) and k[:1] == "$")}
    return node


def _walk(node: Any, parts: list[str]) -> list[Any]:
    node = _untag(node)
    if not parts:
        return [node]
    head, rest = parts[0], parts[1:]
    if isinstance(node, dict):
        if head not in node and head.lstrip("-").isdigit():
            key: Any = int(head)
            if key in node:
                return _walk(node[key], rest)
        if head == "*":
            return [x for k in sorted(node, key=str) for x in _walk(node[k], rest)]
        return _walk(node[head], rest) if head in node else []
    if isinstance(node, list) and head == "*":
        return [x for v in node for x in _walk(v, rest)]
    return []


def _unique(values: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for v in values:
        if isinstance(v, (str, int, float, bool)) and v is not None:
            seen.setdefault(json.dumps(v, sort_keys=True), v)
    return [seen[k] for k in sorted(seen)]


def resolve(source: ArgSource, state_json: Any) -> list[Any]:
    """The candidates a source yields on a state (sorted, deduplicated)."""
    if isinstance(source, list):
        return list(source)
    if callable(source):
        return _unique(list(source(state_json)))
    kind, _, path = source.partition(":")
    nodes = _walk(state_json, [p for p in path.split(".") if p])
    if kind == "keys":
        return _unique([k for n in nodes if isinstance(n, dict) for k in n])
    if kind == "values":
        return _unique([n for n in nodes if not isinstance(n, (dict, list))])
    raise ValueError(f"argument source {source!r} must start with 'keys:' or 'values:'")


def _dicts_named(node: Any, stem: str, out: list[dict], depth: int = 0) -> None:
    """The dicts held under a key that names ``stem`` (``user_id``: ``users``, ``user``), down to
    depth 6, objects and tagged dicts of a snapshot document included (in no particular order:
    callers sort the keys they take)."""
    by_key = _index(node).dicts
    for norm, found in by_key.items():
        if norm.startswith(stem) or stem.startswith(norm):
            out += found


def _leaves_named(node: Any, name: str, out: list[Any], depth: int = 0) -> None:
    """The scalar values held under the key ``name``, down to depth 8 (in no particular order)."""
    out += _index(node).leaves.get(name, ())


class _Index:
    """What :func:`candidates` looks up in one state document, found in one walk each (a
    multi-MB database is walked once, not once per parameter)."""

    def __init__(self, doc: Any) -> None:
        self.doc = doc  # (keeps the document, whose id is the key, alive)
        self._dicts: dict[str, list[dict]] | None = None
        self._leaves: dict[Any, list[Any]] | None = None

    @property
    def dicts(self) -> dict[str, list[dict]]:
        if self._dicts is None:
            self._dicts = {}
            self._walk_dicts(self.doc, 0)
        return self._dicts

    def _walk_dicts(self, node: Any, depth: int) -> None:
        node = _untag(node)
        if not isinstance(node, dict) or depth > 6:
            return
        found = self._dicts
        assert found is not None
        for k, v in node.items():
            if not isinstance(k, str):
                continue
            v = _untag(v)
            if isinstance(v, dict):
                found.setdefault(k.lower().rstrip("s"), []).append(v)
                self._walk_dicts(v, depth + 1)

    @property
    def leaves(self) -> dict[Any, list[Any]]:
        if self._leaves is None:
            self._leaves = {}
            self._walk_leaves(self.doc, 0)
        return self._leaves

    def _walk_leaves(self, node: Any, depth: int) -> None:
        if depth > 8:
            return
        found = self._leaves
        assert found is not None
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, (dict, list)):
                    self._walk_leaves(v, depth + 1)
                else:
                    found.setdefault(k, []).append(v)
        elif isinstance(node, list):
            for v in node:
                if isinstance(v, (dict, list)):
                    self._walk_leaves(v, depth + 1)


_LAST_INDEX: list[_Index] = []


def _index(doc: Any) -> _Index:
    """The index of ``doc`` (the last two documents' kept)."""
    for ix in _LAST_INDEX:
        if ix.doc is doc:
            return ix
    ix = _Index(doc)
    _LAST_INDEX.insert(0, ix)
    del _LAST_INDEX[2:]
    return ix


def _schema_options(schema: dict[str, Any]) -> dict[str, Any]:
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        return options[0] if options else schema
    return schema


def is_free(schema: dict[str, Any]) -> bool:
    """Whether a random agent cannot guess this parameter's value by its type alone
    (strings and numbers; not enums, booleans or constants)."""
    s = _schema_options(schema)
    return "enum" not in s and "const" not in s and s.get("type") in ("string", "integer", "number")


def candidates(name: str, schema: dict[str, Any], state_json: Any) -> list[Any]:
    """Inferred candidates for a parameter with no declared source."""
    s = _schema_options(schema)
    if "enum" in s:
        return list(s["enum"])
    if "const" in s:
        return [s["const"]]
    t = s.get("type")
    if t == "boolean":
        return [True, False]
    if t == "string":
        stem = name[:-3] if name.endswith("_id") else name
        if name.endswith("_id") or name == "id":
            found: list[dict] = []
            _dicts_named(state_json, stem.lower() or "id", found)
            keys = _unique([k for d in found for k in d])
            if keys:
                return keys
        leaves: list[Any] = []
        _leaves_named(state_json, name, leaves)
        values = [v for v in _unique(leaves) if isinstance(v, str)]
        return values or list(FRESH_WORDS)
    if t in ("integer", "number"):
        leaves = []
        _leaves_named(state_json, name, leaves)
        nums = [v for v in _unique(leaves) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        lo, hi = s.get("minimum", 1), s.get("maximum", 12)
        pool = nums + list(range(int(lo), int(min(hi, lo + 11)) + 1))
        return [float(v) if t == "number" else int(v) for v in _unique(pool)]
    return []


def draw_arguments(
    tool_name: str,
    parameters: dict[str, Any],
    state_json: Any,
    sources: dict[str, ArgSource],
    rng: random.Random,
    pools: dict[tuple[str, str], list[Any]] | None = None,
) -> dict[str, Any] | None:
    """Arguments for one call drawn from the state, or ``None`` when a required
    parameter has no candidate. Optional parameters are filled half the time.

    ``pools``: the candidates found on this same ``state_json`` so far, by ``(tool, parameter)``
    (filled in here): a caller drawing many calls from one state finds them once, not per call
    (on a multi-MB database, finding them walks the whole document)."""
    props = parameters.get("properties", {})
    required = set(parameters.get("required", []))
    args: dict[str, Any] = {}
    for pname in props:
        source = sources.get(f"{tool_name}.{pname}", sources.get(pname))
        if pname not in required and rng.random() < 0.5 and source is None:
            continue
        pool = pools.get((tool_name, pname)) if pools is not None else None
        if pool is None:
            pool = resolve(source, state_json) if source is not None else candidates(
                pname, props[pname], state_json)
            if pools is not None:
                pools[(tool_name, pname)] = pool
        if not pool:
            if pname in required:
                return None
            continue
        args[pname] = pool[rng.randrange(len(pool))]
    return args
