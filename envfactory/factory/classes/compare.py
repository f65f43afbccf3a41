"""When two worlds made of classes are the same, as their owners would say (``from_class(compare=...)``).

A task's success compares the episode's final state with the state its reference solution
produces. Hashing the whole state also compares what no owner compares: a clock stamp, a
per-run id, a cache. The classes' own rule comes first:

* ``"auto"`` (the default), per class: its own ``__eq__`` when it defines one; otherwise its
  public attributes (the convention of the suites such classes come from: ``_name`` is an
  implementation detail), or every attribute when it has no public one;
* ``"public"``: the public attributes of each class (not of the objects they hold);
* ``"all"``: the whole state;
* ``{"ClassName": ["attr", ...]}``: every attribute but those, for the environment's classes
  and for any object of that class inside them (an ``Entry`` in a list);
* ``f(final, expected) -> bool``: called with each class's two instances.

Values are compared as snapshots write them (:func:`~envfactory.factory.classes.pystate.encode`), so objects without
an ``__eq__`` compare by content, not identity.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterable, Literal, Mapping

from envfactory.definition import SpecError
from envfactory.state import canonical_json, leaf_at, state_hash
from envfactory.factory.tasks.success import ChangeCheck
from envfactory.factory.classes.pystate import encode

__all__ = ["Compare", "Comparison", "MatchesReference", "OwnerChangeCheck"]

Compare = Literal["auto", "public", "all"] | Mapping[str, Iterable[str]] | Callable[[Any, Any], bool]


class _Private:
    """The names a ``"public"`` comparison leaves out: those starting with ``_``."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.startswith("_")


_PRIVATE = _Private()


def _own_eq(cls: type) -> bool:
    return getattr(cls, "__eq__", object.__eq__) is not object.__eq__


class Comparison:
    """How :func:`~envfactory.factory.from_class.from_class` compares two of an environment's states.

    Args:
        parts: ``(state field, class)`` per service (a field holding the instance), or the one
            class's ``("", class)`` when the state has a field per attribute (``mapping``).
        probes: An instance per part (what ``"auto"`` looks at).
        compare: See the module's docstring.
        mapping: ``{attribute: state field}`` for a state of attributes, else empty.
        trusted: The modules whose classes snapshots may name.
    """

    def __init__(self, parts: list[tuple[str, type]], probes: list[Any], compare: Compare,
                 mapping: dict[str, str], trusted: tuple[str, ...]) -> None:
        self.parts = parts
        self.mapping = mapping
        self.attributes = bool(mapping)
        self.trusted = trusted
        self.judge: Callable[[Any, Any], bool] | None = None
        self.eq: list[bool] = [False] * len(parts)
        omit_types: dict[type, Container[str]] = {}
        self.omit_names: dict[str, frozenset[str]] = {}
        if callable(compare):
            self.judge = compare
        elif isinstance(compare, Mapping):
            self.omit_names = {str(k): frozenset(v if not isinstance(v, str) else [v]) for k, v in compare.items()}
        elif compare == "public":
            omit_types = {cls: _PRIVATE for _, cls in parts}
        elif compare == "auto":
            for i, ((_, cls), probe) in enumerate(zip(parts, probes)):
                attrs = list(getattr(probe, "__dict__", None) or ())
                if _own_eq(cls):
                    self.eq[i] = True
                elif any(not a.startswith("_") for a in attrs) and any(a.startswith("_") for a in attrs):
                    omit_types[cls] = _PRIVATE
        elif compare != "all":
            raise SpecError(f"compare must be 'auto', 'public', 'all', a mapping of class names to the "
                            f"attributes to leave out, or f(final, expected) -> bool; got {compare!r}")
        self.omit_types = omit_types
        self.whole = self.judge is None and not any(self.eq) and not omit_types and not self.omit_names
        """Whether this is the whole state's hash (the engine's own comparison)."""
        self.by_content = self.judge is None and not any(self.eq)
        """Whether :meth:`view` alone decides (no instances to keep for an equality)."""

    def _omit(self, cls: type) -> Container[str] | None:
        return self.omit_types.get(cls) or self.omit_names.get(cls.__name__)

    def narrow(self, check: ChangeCheck, final: Any) -> Callable[[Any], bool]:
        """A synthesized task's check (the leaves its walk changed, valued as in ``final``) made to
        judge only what this comparison compares: the leaves of left-out attributes dropped; an
        owner's equality judges the whole final state instead."""
        if self.whole:
            return check
        if not self.by_content:
            return MatchesReference(final, self)
        root = json.loads(canonical_json(final))
        by_name = {**{c.__name__: o for c, o in self.omit_types.items()}, **self.omit_names}
        kept = tuple((p, _strip(v, by_name)) for p, v in check.expected if self._judged(root, p, by_name))
        return OwnerChangeCheck(kept, by_name)

    def _judged(self, root: Any, path: tuple[str, ...], by_name: Mapping[str, Container[str]]) -> bool:
        """Whether the leaf at ``path`` of a state's canonical JSON is compared."""
        if self.attributes:  # the path starts with a field
            omit = self._omit(self.parts[0][1])
            attr = next((a for a, f in self.mapping.items() if f == path[0]), None)
            if omit and attr is not None and attr in omit:
                return False
        node = root
        for k in path:
            if not isinstance(node, dict):
                return True
            if "$class" in node:
                omit = by_name.get(_class_name(node["$class"]))
                if omit and k in omit:
                    return False
            node = node.get(k)
        return True

    def _instances(self, state: Any) -> list[Any]:
        d = state.__dict__
        out = []
        for key, cls in self.parts:
            if not self.attributes:
                out.append(d[key])
            else:  # a state of attributes: the instance, rebuilt around the fields' values
                inst: Any = object.__new__(cls)
                inst.__dict__.update({a: d[f] for a, f in self.mapping.items()})
                out.append(inst)
        return out

    def _fields(self, state: Any) -> dict[str, Any]:
        """The state's fields as compared by content (the parts judged by an equality left out)."""
        d = state.__dict__
        if self.attributes:
            if self.eq[0]:
                return {}
            omit = self._omit(self.parts[0][1]) or ()
            return {f: d[f] for a, f in self.mapping.items() if a not in omit}
        return {key: d[key] for (key, _), eq in zip(self.parts, self.eq) if not eq}

    def view(self, state: Any) -> str:
        """What is compared by content, as one string (equal states, equal views)."""
        if self.whole:
            return state_hash(state)
        if self.judge is not None:  # the owner's function decides; nothing is compared by content
            return ""
        doc = encode(self._fields(state), self.trusted, omit=self._omit)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def same(self, a: Any, b: Any, b_view: str | None = None) -> bool:
        """Whether ``a`` and ``b`` are the same world, as the classes' owners would say."""
        if self.judge is not None:
            return all(bool(self.judge(x, y)) for x, y in zip(self._instances(a), self._instances(b)))
        if any(self.eq):
            pairs = zip(self._instances(a), self._instances(b), self.eq)
            if not all(x == y for x, y, eq in pairs if eq):
                return False
        return self.view(a) == (b_view if b_view is not None else self.view(b))

    def differences(self, a: Any, b: Any) -> list[str]:
        """The attributes (``Class.attr``, at any depth) whose values differ between ``a`` and ``b``,
        every attribute looked at, whatever the comparison leaves out."""
        names: set[str] = set()
        da, db = encode(a.__dict__, self.trusted), encode(b.__dict__, self.trusted)
        if self.attributes:
            cls_name = self.parts[0][1].__name__
            for attr, f in self.mapping.items():
                _diff(da.get(f), db.get(f), cls_name, attr, names)
        else:
            for key, cls in self.parts:
                _diff(da.get(key), db.get(key), cls.__name__, key, names)
        return sorted(names)

    def advice(self, names: list[str]) -> str:
        """How to leave ``names`` out of success (a ``compare=`` example)."""
        by_class: dict[str, list[str]] = {}
        for n in names:
            cls, _, attr = n.rpartition(".")
            by_class.setdefault(cls, []).append(attr)
        return (f"if these are per-run values (clocks, ids) that the class's owner does not compare, "
                f"leave them out of success: from_class(..., compare={by_class!r})")


def _class_name(ref: Any) -> str:
    return str(ref).rpartition(":")[2].rpartition(".")[2]


def _diff(x: Any, y: Any, owner: str, attr: str, out: set[str]) -> None:
    """Name (``owner.attr``) the deepest attributes whose encoded values ``x`` and ``y`` differ."""
    if x == y:
        return
    if isinstance(x, dict) and isinstance(y, dict):
        if "$class" in x and x.get("$class") == y.get("$class"):
            inner = _class_name(x["$class"])
            for k in (set(x) | set(y)) - {"$class"}:
                _diff(x.get(k), y.get(k), inner, k, out)
            return
        if "$class" not in x and "$class" not in y and set(x) == set(y):
            for k in x:
                _diff(x[k], y[k], owner, attr, out)
            return
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for p, q in zip(x, y):
            _diff(p, q, owner, attr, out)
        return
    out.add(f"{owner}.{attr}")


def _strip(node: Any, omit: Mapping[str, Container[str]]) -> Any:
    """JSON data (a canonical state's leaf) without the attributes ``omit`` leaves out, by class name."""
    if isinstance(node, dict):
        left_out = omit.get(_class_name(node["$class"])) if "$class" in node else None
        return {k: _strip(v, omit) for k, v in node.items() if not (left_out and k in left_out)}
    if isinstance(node, list):
        return [_strip(v, omit) for v in node]
    return node


@dataclass(frozen=True, eq=False)
class OwnerChangeCheck(ChangeCheck):
    """A synthesized task's :class:`~envfactory.factory.tasks.success.ChangeCheck` that leaves out, inside its leaves too,
    the attributes a :class:`Comparison` leaves out (``omit``: class name -> attributes)."""

    omit: Mapping[str, Container[str]] = field(default_factory=dict)

    def __call__(self, state: Any) -> bool:
        root = json.loads(canonical_json(state))
        return all(_strip(leaf_at(root, path), self.omit) == want for path, want in self.expected)


class MatchesReference:
    """A task's success check: the final state is the reference's final state, as
    :class:`Comparison` says (``from_class(compare=...)``)."""

    def __init__(self, expected: Any, comparison: Comparison) -> None:
        self.expected = expected
        self.comparison = comparison
        self.expected_view = comparison.view(expected)

    def __call__(self, state: Any) -> bool:
        return self.comparison.same(state, self.expected, self.expected_view)

    def __repr__(self) -> str:
        return "MatchesReference()"
