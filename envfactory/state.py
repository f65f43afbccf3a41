"""The world of an episode: one pydantic model per environment.

A :class:`State` holds the whole truth of an episode. It must stay plain data
(models, dicts, lists, sets, strings, numbers, booleans, ``None``) so that it is
JSON-serializable, canonically hashable and cheap to copy. ``fork()`` of a live
environment shares its state until either side writes, then copies it with
:func:`copy_state` (:class:`~envfactory.world.LocalWorld`), which is why that function
is written for speed rather than generality. A model class may bring its own
copier (``__state_copy__``): the factory's
:class:`~envfactory.factory.classes.pystate.PyState`, which holds arbitrary Python objects
of unchanged third-party classes, copies its whole object graph that way.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict

from .sizes import PLAIN_OF, TDict, TList, TSet

__all__ = ["State", "canonical_json", "copy_state", "state_hash", "state_to_json", "ABSENT", "flatten",
           "state_leaves", "diff_leaves", "leaf_at", "same_state", "live_leaf", "plain_model", "UNSURE"]

S = TypeVar("S", bound="State")

_IMMUTABLE = (str, int, float, bool, type(None), bytes, frozenset)


class State(BaseModel):
    """Base class for an environment's state.

    Subclass it with typed fields. Tools receive the live instance and mutate it
    in place; nothing else may. Keep fields to plain data: the state crosses
    process and container boundaries as JSON.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    __json_dump_is_fresh__: ClassVar[bool] = False
    """Whether ``model_dump(mode="json")`` always returns new lists and dicts holding only JSON
    data (no tuple, string keys): a snapshot then takes it as it is, without a JSON round trip."""

    __hash_on_demand__: ClassVar[bool] = False
    """Whether a task's expected final state is hashed when a judgment first needs it rather than
    when the task is registered (:meth:`~envfactory.task.Task.keep_expected_final`): for states
    whose hash is costly (a database imported with ``from_class``), which a final state identical
    to the reference's never needs."""

    @classmethod
    def __json_load_copies__(cls, data: Any) -> bool:
        """Whether ``model_validate(data)`` builds every list and dict of the state anew (keeps
        nothing of ``data``), so a restore may pass it a snapshot's data without copying it."""
        return False

    def copy_state(self: S) -> S:
        """An independent deep copy (see :func:`copy_state`)."""
        return copy_state(self)

    def hash(self) -> str:
        """Canonical SHA-256 of the state's JSON (see :func:`state_hash`)."""
        return state_hash(self)



def _copy(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """Generic deep copy of plain data; models go through their compiled copier.

    Memoized (``memo``: id of a container copied -> its copy): a container held twice is copied
    once and the copy holds it twice, as the original does, so a state whose containers share
    children (``rows = [rows, rows]`` thirty times: 30 lists, 2**30 paths) copies in the time
    of its containers, not of its paths. A container is remembered once copied (the copy is
    built in one C-level comprehension): a state that holds itself (a cycle) recurses without
    end here, and :func:`copy_state` copies it with :func:`copy.deepcopy` instead."""
    cls = value.__class__
    if cls in _IMMUTABLE_SET:
        return value
    if memo is None:
        memo = {}
    else:
        got = memo.get(id(value))
        if got is not None:
            return got
    if cls is dict:
        new: Any = {k: (v if v.__class__ in _IMMUTABLE_SET else _copy(v, memo)) for k, v in value.items()}
    elif cls is list:
        new = [v if v.__class__ in _IMMUTABLE_SET else _copy(v, memo) for v in value]
    elif isinstance(value, BaseModel):
        copier = _COPIERS.get(cls)
        if copier is None:
            copier = _COPIERS[cls] = _compile_copier(cls)
        new = copier(value, memo)
    elif cls is TDict:  # (a large tracked state's containers, envfactory.sizes: copied as plain ones)
        new = {k: (v if v.__class__ in _IMMUTABLE_SET else _copy(v, memo)) for k, v in value.items()}
    elif cls is TList:
        new = [v if v.__class__ in _IMMUTABLE_SET else _copy(v, memo) for v in value]
    elif cls is set or cls is TSet:
        new = set(value)  # set elements are hashable, hence treated as immutable
    elif cls is tuple:
        new = tuple([_copy(v, memo) for v in value])
    elif isinstance(value, _IMMUTABLE):  # subclasses such as enums
        return value
    else:
        import copy as _stdlib_copy

        new = _stdlib_copy.deepcopy(value, memo)  # (the same memo: its keys are ids of originals too)
    memo[id(value)] = new
    return new


_IMMUTABLE_SET = frozenset(_IMMUTABLE)
_COPIERS: dict[type, Any] = {}


def _is_immutable_type(tp: Any) -> bool:
    import enum
    import types
    import typing

    if tp in _IMMUTABLE:
        return True
    if isinstance(tp, type) and issubclass(tp, (enum.Enum, str, int, float)):
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return all(_is_immutable_type(a) for a in typing.get_args(tp))
    if origin is typing.Annotated:
        return _is_immutable_type(typing.get_args(tp)[0])
    return False


def _field_plan(tp: Any) -> str:
    """How to copy a field of annotation ``tp``: share, shallow, or deep."""
    import typing

    if _is_immutable_type(tp):
        return "share"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, set) and args and _is_immutable_type(args[0]):
        return "shallow"
    if origin is dict and len(args) == 2 and _is_immutable_type(args[1]):
        return "shallow"
    return "deep"


def _compile_copier(cls: type[BaseModel]) -> Any:
    """Build a copier for one model class from its field annotations.

    A class may bring its own: ``__state_copy__(value) -> copy`` (the factory's
    :class:`~envfactory.factory.classes.pystate.PyState` copies a whole object graph at once)."""
    own = getattr(cls, "__state_copy__", None)
    if own is not None:
        return lambda value, memo: own(value)
    shallow, deep = [], []
    for name, field in cls.model_fields.items():
        plan = _field_plan(field.annotation)
        if plan == "shallow":
            shallow.append(name)
        elif plan == "deep":
            deep.append(name)
    new_obj = object.__new__
    setattr_ = object.__setattr__
    immutable = _IMMUTABLE_SET

    def copier(value: BaseModel, memo: dict[int, Any]) -> BaseModel:
        d = value.__dict__.copy()
        for name in shallow:
            v = d[name]
            if v is not None:
                got = memo.get(id(v))
                if got is None:
                    got = memo[id(v)] = v.copy()
                d[name] = got
        for name in deep:
            v = d[name]
            if v.__class__ not in immutable:
                d[name] = _copy(v, memo)
        new = new_obj(cls)
        setattr_(new, "__dict__", d)
        setattr_(new, "__pydantic_fields_set__", value.__pydantic_fields_set__.copy())
        extra = value.__pydantic_extra__
        setattr_(new, "__pydantic_extra__", None if extra is None else _copy(extra, memo))
        private = value.__pydantic_private__
        setattr_(new, "__pydantic_private__", None if private is None else _copy(private, memo))
        return new

    return copier


def copy_state(state: S) -> S:
    """Return an independent deep copy of ``state``.

    Specialised for plain-data pydantic models: immutable leaves are shared,
    containers and models are rebuilt without re-validation. Several times faster
    than ``model_copy(deep=True)``, which goes through :func:`copy.deepcopy`. Memoized: what the
    state holds twice, the copy holds twice (and copies once); a state that holds itself (a
    cycle, which only a tool could have made) is copied by :func:`copy.deepcopy`.
    """
    try:
        return _copy(state)
    except RecursionError:
        import copy as _stdlib_copy

        return _stdlib_copy.deepcopy(state)


def state_to_json(state: BaseModel) -> dict[str, Any]:
    """The state as JSON-compatible data (the form that crosses boundaries)."""
    return state.model_dump(mode="json")


def _canonical_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        # Set iteration order is arbitrary: sort by canonical JSON of the elements.
        return sorted(value, key=lambda v: json.dumps(v, sort_keys=True, default=_canonical_default))
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value)


_HOOKS: dict[str, dict[type, Any]] = {}  # hook name -> {state class: the class's own hook, or None}
_UNSEEN = object()


def class_hook(cls: type, name: str) -> Any:
    """``getattr(cls, name, None)`` for a state class's own hook (``__canonical_json__``,
    ``__state_size__``), looked up once per class: on a pydantic model class a missing attribute
    raises and is caught inside pydantic, on every lookup of a hot path."""
    seen = _HOOKS.get(name)
    if seen is None:
        seen = _HOOKS[name] = {}
    hook = seen.get(cls, _UNSEEN)
    if hook is _UNSEEN:
        hook = seen[cls] = getattr(cls, name, None)
    return hook


def canonical_json(state: BaseModel) -> str:
    """The state's canonical JSON: sorted keys, sorted sets, compact separators. A state class
    may bring its own writer of the same text (``__canonical_json__(state) -> str | None``,
    ``None``: written here): a copy-on-write state remembers what no state can change any more."""
    own = class_hook(state.__class__, "__canonical_json__")
    if own is not None:
        text = own(state)
        if text is not None:
            return str(text)
    return json.dumps(
        state.model_dump(mode="python"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=_canonical_default,
    )


def state_hash(state: BaseModel) -> str:
    """Canonical hash: SHA-256 of :func:`canonical_json` (as UTF-8, a lone surrogate passed through
    as its three bytes, as the wire passes it); equal states hash equal."""
    return hashlib.sha256(canonical_json(state).encode("utf-8", "surrogatepass")).hexdigest()


# -- leaves: a state flattened to ``path -> value`` (success checks, the reward-hacking audit) -----
ABSENT = "<absent>"
"""Marks a leaf that does not exist (or must not: a reference deleted it)."""

LeafPath = tuple[str, ...]


def flatten(node: Any, prefix: LeafPath = (), out: dict[LeafPath, Any] | None = None) -> dict[LeafPath, Any]:
    """``{path: leaf}`` of JSON data; an empty dict is a leaf of its own."""
    out = {} if out is None else out
    if isinstance(node, dict) and node:
        for k, v in node.items():
            flatten(v, prefix + (str(k),), out)
    else:
        out[prefix] = node
    return out


def state_leaves(state: State) -> dict[LeafPath, Any]:
    """The canonical leaves of a state."""
    return flatten(json.loads(canonical_json(state)))


def diff_leaves(before: dict[LeafPath, Any], after: dict[LeafPath, Any]) -> dict[LeafPath, Any]:
    """Leaves of ``after`` that differ from ``before``, and ``ABSENT`` for removed ones."""
    out = {p: v for p, v in after.items() if p not in before or before[p] != v}
    inner = {p[:i] for p in after for i in range(1, len(p))}  # paths that are dicts now
    for p in before:
        if p not in after and p not in inner and not any(p[:i] in after for i in range(len(p))):
            out[p] = ABSENT
    return out


def leaf_at(root: Any, path: LeafPath) -> Any:
    """The value at ``path`` in JSON data ``root`` (as :func:`flatten` names it), or ``ABSENT``."""
    node = root
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return ABSENT
        node = node[key]
    return node


# -- judging without serializing the whole state -------------------------------------------------
# A success check compares the final state with what the reference produced. Serializing the whole
# state (model_dump, canonical JSON, SHA-256) costs far more than the step that ends the episode;
# the functions below look at the live objects instead, and say "I do not know" (False or UNSURE)
# wherever the serialized form could differ from what they see, so that the caller falls back to
# the canonical form and no verdict changes.
UNSURE = object()
"""What :func:`live_leaf` answers where the live objects do not show the canonical leaf for sure."""

_SCALAR_CLASSES = frozenset({str, int, bool, type(None)})
_STR = {str}
_PLAIN: dict[type, bool] = {}


def _schema_is_plain(node: Any) -> bool:
    """No custom serialization anywhere in a pydantic core schema: no serializer function or
    format, no computed field, no excluded field, no root model."""
    if isinstance(node, dict):
        if "serialization" in node or node.get("computed_fields") or node.get("serialization_exclude") \
                or node.get("root_model"):
            return False
        return all(_schema_is_plain(v) for k, v in node.items() if k not in ("cls", "metadata", "config"))
    if isinstance(node, list):
        return all(_schema_is_plain(v) for v in node)
    return True


def plain_model(cls: type) -> bool:
    """Whether a model class dumps (``model_dump(mode="python")``) as exactly its fields' values
    under their names: nothing in its core schema (nested models included) serializes otherwise,
    it brings no copier of its own (the factory's arbitrary Python states) and dumps no aliases."""
    ok = _PLAIN.get(cls)
    if ok is None:
        try:
            ok = (getattr(cls, "__state_copy__", None) is None
                  and not cls.model_config.get("serialize_by_alias")  # type: ignore[attr-defined]
                  and _schema_is_plain(cls.__pydantic_core_schema__))  # type: ignore[attr-defined]
        except (AttributeError, RecursionError):
            ok = False
        _PLAIN[cls] = ok
    return ok


def _identical(a: Any, b: Any) -> bool:
    if a is b:
        return True
    c = a.__class__
    if c is not b.__class__:
        c = PLAIN_OF.get(c, c)  # (a tracked container, envfactory.sizes, is its plain class)
        if c is not PLAIN_OF.get(b.__class__, b.__class__):
            return False
    if c in _SCALAR_CLASSES:
        return a == b
    if c is float:
        return repr(a) == repr(b)  # -0.0 and 0.0 serialize apart; NaN and NaN together
    if c is dict or c is TDict:
        if len(a) != len(b):
            return False
        if a == b:  # equal (C speed); identical when every key is a string and the values one scalar class
            # (a key or a value equal to a string is a string, or an str enum, which serializes as one:
            # only numbers need the other side's classes, 1 == 1.0 == True)
            kinds = set(map(type, a.values()))
            if len(kinds) == 1 and kinds <= _SCALAR_CLASSES and set(map(type, a)) == _STR \
                    and (kinds == _STR or kinds == set(map(type, b.values()))):
                return True
        get = b.get
        for k, v in a.items():
            if k.__class__ is not str:
                return False
            w = get(k, _MISSING)
            if w is _MISSING or not (v is w or _identical(v, w)):
                return False
        return True
    if c is list or c is tuple or c is TList:
        if len(a) != len(b):
            return False
        if a == b:
            kinds = set(map(type, a))
            if len(kinds) == 1 and kinds <= _SCALAR_CLASSES and kinds == set(map(type, b)):
                return True
        return all(map(_identical, a, b))
    if c is set or c is frozenset or c is TSet:  # sets of strings: equal sets serialize alike
        return a == b and set(map(type, a)) <= _STR  # b's members equal strings: strings (or str enums)
    if _PLAIN.get(c) or (isinstance(a, BaseModel) and plain_model(c)):
        if a.__pydantic_extra__ or b.__pydantic_extra__:
            return False
        da, db = a.__dict__, b.__dict__
        if len(da) != len(db):
            return False
        for k, v in da.items():
            w = db.get(k, _MISSING)
            if w is _MISSING or not (v is w or _identical(v, w)):
                return False
        return True
    return False


_MISSING = object()


def same_state(a: BaseModel, b: BaseModel) -> bool:
    """``True`` only when ``a`` and ``b`` certainly have the same :func:`canonical_json` (hence
    the same :func:`state_hash`): the same classes all the way down, equal strings, integers and
    booleans, floats with the same representation, string-keyed dicts and string sets, plain models
    (:func:`plain_model`). ``False`` means *not known*: compare the hashes."""
    try:
        return _identical(a, b)
    except RecursionError:
        return False


def live_leaf(state: BaseModel, path: LeafPath) -> Any:
    """The leaf at ``path`` of ``json.loads(canonical_json(state))`` (as :func:`leaf_at` finds it,
    ``ABSENT`` included), read from the live objects without serializing the state; :data:`UNSURE`
    wherever they do not show it for sure (then serialize). Leaves: strings, numbers, booleans,
    ``None``, lists of those and empty dicts."""
    node: Any = state
    for key in path:
        c = node.__class__
        if c is dict or c is TDict:
            v = node.get(key, _MISSING)
            if v is _MISSING:
                return ABSENT if all(k.__class__ is str for k in node) else UNSURE
            node = v
        elif _PLAIN.get(c) or (isinstance(node, BaseModel) and plain_model(c)):
            # a plain model's __dict__ is its fields, dumped under their names
            v = node.__dict__.get(key, _MISSING)
            if v is _MISSING or node.__pydantic_extra__:
                return UNSURE
            node = v
        elif c in _SCALAR_CLASSES or c is float or c is list or c is tuple or c is set or c is frozenset \
                or c is TList or c is TSet:
            return ABSENT  # not a dict in the canonical form: nothing below it
        else:
            return UNSURE
    c = node.__class__
    if c in _SCALAR_CLASSES or c is float:
        return node
    if (c is list or c is tuple or c is TList) and all(x.__class__ in _SCALAR_CLASSES for x in node):
        return list(node)
    if (c is dict or c is TDict) and not node:
        return {}
    return UNSURE
