"""Copy on write per container: a fork of a multi-MB state costs O(fields), its first tool call
copies only the dicts and lists that call reaches.

A ``from_class`` state of attributes (:class:`~envfactory.factory.classes.pystate.PyState`) shares its
values with its forks. While a tool runs on a state (:func:`armed`), its dict and list fields are
:class:`CowDict` / :class:`CowList` containers stamped with that state's *token*; reaching a
child container through one (indexing, ``get``, iteration, ``pop``, ...) gives the state its own
shallow copy of the child, stamped alike and stored in place, so a write lands in the state's
copy and never in a container another state still holds. A fork gives both sides new tokens:
everything either side holds becomes shared again, and each copies what its next calls reach.

A pydantic model (:func:`cow_model`: a database held in one model of nested models, as
τ²-bench's toolkits hold theirs) is copied like a container when first reached: a new instance
of its class whose dicts and lists are the state's copy-on-write containers and whose nested
models are copied alike (attribute reads cannot be intercepted, so a model's own values are made
the state's when the model is).

Semantics are those of copying each field as a tree (:func:`envfactory.state.copy_state`'s plain
copier, what these states used before): values that are not dicts or lists (objects, sets) are
deep-copied when first reached. Outside a tool call the containers read as the dicts and lists
they are (no copy); dumps, hashes and snapshots write them as plain data.
"""

from __future__ import annotations

import json as _json_mod
import threading
import weakref
from typing import Any, Iterator, SupportsIndex

from pydantic import BaseModel

from envfactory.quotas import _LONG, _ascii_dump, _key_size, _str_size

__all__ = ["CowDict", "CowList", "armed", "new_token", "COW_TYPES", "cow_model"]

_IMM = frozenset((str, int, float, bool, type(None), bytes, complex, range, frozenset))
_local = threading.local()


def _token() -> Any:
    return getattr(_local, "tok", None)


class _Token:
    """Whose containers are whose: one per state between forks."""

    __slots__ = ("__weakref__",)


def new_token() -> _Token:
    return _Token()


def _cow_copy(v: Any, tok: Any) -> Any:
    """A shallow copy of the dict or list ``v`` for the state of ``tok`` (a dict remembers its
    source, whose measure and JSON it differs from only where the state changed it)."""
    if v.__class__ is dict or v.__class__ is CowDict:
        new: Any = CowDict()
        dict.update(new, dict.items(v))  # (C-level: no call per item)
        new._src = v
        new._dirty = set()
        if v.__class__ is CowDict and v._src is not None:
            # One source at a time: a chain of old versions is not kept alive. ``v`` (a state's
            # own table until a fork froze it) is measured from its source first, while that is
            # still known, so its copies (the fork's two sides) are measured from it in turn,
            # by what they changed, not walked whole (the cost of a write after a fork of a
            # state that had written).
            if v._tok is not tok and v._tok is not None:
                _remember_size(v)
            v._src = None
            v._dirty = None
    else:
        new = CowList(list.__iter__(v))
    new._tok = tok
    return new


_MODELS: dict[type, bool] = {}
_BM = BaseModel


def cow_model(cls: type) -> bool:
    """Whether instances of ``cls`` are pydantic models copied on write per model (a database
    held in one model of nested models, as τ²-bench's toolkits hold theirs): copied, when a
    call first reaches one, as :func:`envfactory.state.copy_state`'s copier copies a model (a new
    instance, its fields set, extra and private values), but shallowly: its dict and list
    fields become the state's copy-on-write containers, its nested models copied alike, so a
    call that changes one record of a multi-MB database copies that record, not the database.
    Models with a copier, pickling or equality of their own are copied whole, as before."""
    ok = _MODELS.get(cls)
    if ok is None:
        ok = (issubclass(cls, _BM) and getattr(cls, "__state_copy__", None) is None
              and all(getattr(cls, n) is getattr(_BM, n) for n in (
                  "__copy__", "__deepcopy__", "__getstate__", "__setstate__", "__reduce__", "__reduce_ex__",
                  "__eq__", "__getattr__", "__setattr__", "__delattr__")))
        _MODELS[cls] = ok
    return ok


def _own_value(x: Any, tok: Any) -> Any:
    """What a model copied for the state of ``tok`` holds in place of ``x``, one of its values."""
    c = x.__class__
    if c in _IMM:
        return x
    if c is CowDict or c is CowList:
        return x if x._tok is tok else _cow_copy(x, tok)
    if c is dict or c is list:
        return _cow_copy(x, tok)
    ok = _MODELS.get(c)
    if ok or (ok is None and cow_model(c)):
        return _model_copy(x, tok)
    from envfactory.state import _copy

    return _copy(x)


def _model_copy(v: Any, tok: Any) -> Any:
    """The state of ``tok``'s own copy of the model ``v`` (:func:`cow_model`)."""
    new = object.__new__(v.__class__)
    osa = object.__setattr__
    osa(new, "__dict__", {k: (x if x.__class__ in _IMM else _own_value(x, tok)) for k, x in v.__dict__.items()})
    osa(new, "__pydantic_fields_set__", set(v.__pydantic_fields_set__))
    extra = v.__pydantic_extra__
    osa(new, "__pydantic_extra__", None if extra is None else {k: _own_value(x, tok) for k, x in extra.items()})
    private = v.__pydantic_private__
    if private is not None:
        from envfactory.state import _copy

        private = _copy(private)
    osa(new, "__pydantic_private__", private)
    return new


def _take(parent: Any, v: Any) -> tuple[Any, bool]:
    """``v`` as the armed state may change it: ``(value, copied)``."""
    cls = v.__class__
    if cls in _IMM:
        return v, False
    tok = parent._tok
    if id(v) in parent._mine:
        return v, False
    if cls is dict or cls is CowDict or cls is list or cls is CowList:
        new: Any = _cow_copy(v, tok)
    elif _MODELS.get(cls) or cow_model(cls):
        new = _model_copy(v, tok)
    else:
        from envfactory.state import _copy

        new = _copy(v)
        if new is v:  # immutable (an enum, a tuple of scalars)
            return v, False
    parent._mine.add(id(new))
    return new, True


def _live(c: Any) -> bool:
    """Whether ``c`` belongs to the state whose tool runs now (then reaching a child copies it)."""
    tok = c._tok
    return tok is not None and tok is getattr(_local, "tok", None)


class CowDict(dict[Any, Any]):
    """A dict whose children are copied when a tool of its state first reaches them."""

    __slots__ = ("_tok", "_mine", "_src", "_dirty", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        self._tok: Any = None
        self._mine: set[int] = set()
        self._src: Any = None  # the dict this one was copied from
        # The keys whose entry may differ from the source's (set, replaced by a copy, taken
        # out): every other key holds the very value it holds in ``_src``. (None: no source.)
        self._dirty: set[Any] | None = None

    def _get(self, k: Any, v: Any) -> Any:
        v2, copied = _take(self, v)
        if copied:
            if self._dirty is not None:
                self._dirty.add(k)
            dict.__setitem__(self, k, v2)
        return v2

    def __getitem__(self, k: Any) -> Any:
        v = dict.__getitem__(self, k)
        return self._get(k, v) if _live(self) else v

    def __missing__(self, k: Any) -> Any:
        raise KeyError(k)

    def get(self, k: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, k):
            return default
        v = dict.__getitem__(self, k)
        return self._get(k, v) if _live(self) else v

    def __setitem__(self, k: Any, v: Any) -> None:
        if _live(self):  # what a tool stores is its own
            self._mine.add(id(v))
        if self._dirty is not None:
            self._dirty.add(k)
        dict.__setitem__(self, k, v)

    def __delitem__(self, k: Any) -> None:
        if self._dirty is not None:
            self._dirty.add(k)
        dict.__delitem__(self, k)

    def clear(self) -> None:
        if self._dirty is not None:
            self._dirty.update(dict.keys(self))
        dict.clear(self)

    def setdefault(self, k: Any, default: Any = None) -> Any:
        if dict.__contains__(self, k):
            return self[k]
        self[k] = default
        return default

    def pop(self, k: Any, *default: Any) -> Any:
        if dict.__contains__(self, k):
            if _live(self):
                self[k]  # noqa: B018 (the popped value is the state's own copy)
            if self._dirty is not None:
                self._dirty.add(k)
        return dict.pop(self, k, *default)

    def popitem(self) -> tuple[Any, Any]:
        if self:
            k = next(reversed(dict.keys(self)))
            if _live(self):
                self[k]  # noqa: B018
            if self._dirty is not None:
                self._dirty.add(k)
        return dict.popitem(self)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __ior__(self, other: Any) -> CowDict:
        self.update(other)
        return self

    def _all(self) -> None:
        if _live(self):
            for k, v in list(dict.items(self)):
                self._get(k, v)

    def values(self) -> Any:
        self._all()
        return dict.values(self)

    def items(self) -> Any:
        self._all()
        return dict.items(self)

    def __iter__(self) -> Iterator[Any]:  # (defined so that dict(d) and {**d} go through __getitem__)
        return dict.__iter__(self)

    def copy(self) -> dict[Any, Any]:
        return {k: self[k] for k in dict.keys(self)}

    __copy__ = copy

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        import copy

        y: dict[Any, Any] = {}
        memo[id(self)] = y
        for k, v in dict.items(self):
            y[copy.deepcopy(k, memo)] = copy.deepcopy(v, memo)
        return y

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickles as a plain dict
        return (dict, (dict(dict.items(self)),))

    def __or__(self, other: Any) -> dict[Any, Any]:
        out = self.copy()
        out.update(other)
        return out


class CowList(list[Any]):
    """A list whose children are copied when a tool of its state first reaches them."""

    __slots__ = ("_tok", "_mine", "__weakref__")

    def __init__(self, *args: Any) -> None:
        list.__init__(self, *args)
        self._tok: Any = None
        self._mine: set[int] = set()

    def _at(self, i: int) -> Any:
        v = list.__getitem__(self, i)
        v2, copied = _take(self, v)
        if copied:
            list.__setitem__(self, i, v2)
        return v2

    def __getitem__(self, i: Any) -> Any:
        if not _live(self):
            return list.__getitem__(self, i)
        if isinstance(i, slice):
            return [self._at(j) for j in range(*i.indices(len(self)))]
        return self._at(i)

    def __setitem__(self, i: Any, v: Any) -> None:
        if _live(self):
            if isinstance(i, slice):
                v = list(v)
                self._mine.update(map(id, v))
            else:
                self._mine.add(id(v))
        list.__setitem__(self, i, v)

    def __iter__(self) -> Iterator[Any]:
        if not _live(self):
            return list.__iter__(self)
        return (self._at(i) for i in range(len(self)))

    def __reversed__(self) -> Iterator[Any]:
        if not _live(self):
            return list.__reversed__(self)
        return (self._at(i) for i in range(len(self) - 1, -1, -1))

    def pop(self, i: SupportsIndex = -1) -> Any:
        if _live(self) and self:
            self._at(i.__index__())
        return list.pop(self, i)

    def append(self, v: Any) -> None:
        if _live(self):
            self._mine.add(id(v))
        list.append(self, v)

    def insert(self, i: Any, v: Any) -> None:
        if _live(self):
            self._mine.add(id(v))
        list.insert(self, i, v)

    def extend(self, vs: Any) -> None:
        vs = list(vs)
        if _live(self):
            self._mine.update(map(id, vs))
        list.extend(self, vs)

    def __iadd__(self, vs: Any) -> CowList:
        self.extend(vs)
        return self

    def copy(self) -> list[Any]:
        return list(self.__iter__())

    __copy__ = copy

    def __add__(self, other: Any) -> list[Any]:
        return self.copy() + list(other)

    def __mul__(self, n: Any) -> list[Any]:
        return self.copy() * n

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        import copy

        y: list[Any] = []
        memo[id(self)] = y
        y += [copy.deepcopy(v, memo) for v in list.__iter__(self)]
        return y

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickles as a plain list
        return (list, (list(list.__iter__(self)),))


COW_TYPES = (CowDict, CowList)


class armed:
    """``with armed(state):`` while a tool runs on ``state``: its dict and list fields become its
    own (:class:`CowDict` / :class:`CowList` with its token), any other value that is not
    immutable is copied once, so the call changes nothing another state holds."""

    __slots__ = ("prev",)

    def __init__(self, state: Any) -> None:
        priv = state.__pydantic_private__
        if priv is None:
            priv = {}
            object.__setattr__(state, "__pydantic_private__", priv)
        tok = priv.get("_tok")
        mine = priv.get("_mine")
        if tok is None or mine is None:
            tok = priv["_tok"] = _Token()
            mine = priv["_mine"] = set()
        d = state.__dict__
        for k, v in d.items():
            cls = v.__class__
            if cls in _IMM or k in mine:
                continue
            if (cls is CowDict or cls is CowList) and v._tok is tok:
                mine.add(k)
                continue
            if cls is dict or cls is CowDict or cls is list or cls is CowList:
                d[k] = _cow_copy(v, tok)
            elif _MODELS.get(cls) or cow_model(cls):
                d[k] = _model_copy(v, tok)  # (a database in one model: its records copied as reached)
            else:
                from envfactory.state import _copy

                d[k] = _copy(v)
            mine.add(k)
        self.prev = getattr(_local, "tok", None)
        _local.tok = tok

    def __enter__(self) -> armed:
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.tok = self.prev


# -- the state quota's measure, per container ------------------------------------------------------
def _hold(v: Any) -> Any:
    """What a cache keeps of ``v``: a state's container weakly (a dropped fork's tables are not
    kept alive by being remembered), a plain one (a configuration's, shared) as itself."""
    c = v.__class__
    if c is CowDict or c is CowList:
        return weakref.ref(v)
    if c is not dict and c is not list:  # a model (a state's own copy, or a configuration's)
        try:
            return weakref.ref(v)
        except TypeError:
            return v
    return v


def _is(held: Any, v: Any) -> bool:
    return (held() if held.__class__ is weakref.ReferenceType else held) is v


_SIZES: dict[int, tuple[Any, int]] = {}  # id -> (a container no state changes any more (_hold), its size)
_SIZES_CAP = 1 << 19


def _room(cache: dict[int, Any], cap: int) -> None:
    """Make room in a full cache: the entries of containers gone (dropped forks' tables) out
    first; only when the live ones alone fill most of it is it emptied (so a long run of forks
    does not, every so many calls, forget the shared database's measure and walk it again)."""
    if len(cache) < cap:
        return
    ref = weakref.ReferenceType
    for k in [k for k, e in cache.items() if e[0].__class__ is ref and e[0]() is None]:
        del cache[k]
    if len(cache) >= cap * 3 // 4:
        cache.clear()


def cow_state_size(state: Any, limit: int | None = None) -> int:
    """:func:`envfactory.quotas.state_size` of a copy-on-write state, the same count, without
    walking again what no state can change any more: containers shared between states (copy on
    write copies them before a change) are measured once and remembered; only the containers this
    state has made its own since its last fork (the table and the record a call reached) are
    walked, their shared children looked up. So a writing call on a multi-MB database measures
    the tables it touched, not the database. Stops past ``limit`` (returning a number over it) as
    the engine's walk does: a container found larger ends the count (so lists nested in pairs of
    themselves thirty times, 2**30 paths, cost the few levels that reach the limit)."""
    from envfactory.quotas import state_size

    priv = state.__pydantic_private__
    tok = priv.get("_tok") if priv else None
    mine = priv.get("_mine", ()) if priv else ()
    cap = limit if limit is not None else _NO_LIMIT
    total = 2
    try:
        for k, v in state.__dict__.items():
            total += len(k) + 4 + _size(v, k not in mine, tok, state_size, set(), cap)
            if total > cap:
                return total
    except _Past as past:
        return max(past.size, cap + 1)
    except RecursionError:  # nested too deep for this walk: the engine's, which has no depth limit
        return state_size(_Plain(state), limit)
    return total


_NO_LIMIT = 1 << 62


class _Past(Exception):
    """A part of the state measured past the limit (its size): the count stops there."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


_MISSING = object()


def _entry_size(k: Any, x: Any, frozen: bool, tok: Any, leaf: Any, path: set[int], cap: int) -> int:
    n = len(_ascii_dump(k)) + 2 if k.__class__ is str and len(k) <= _LONG else _key_size(k)
    if x.__class__ is str:
        return n + (len(_ascii_dump(x)) if len(x) <= _LONG else _str_size(x))
    return n + _size(x, frozen, tok, leaf, path, cap)


def _size_from(v: Any, src: Any, size: int, frozen: bool, tok: Any, leaf: Any, path: set[int], cap: int) -> int:
    """The size of the dict ``v`` from that of its source ``src`` (``size``): only the entries
    that differ are measured (a table of thousands of records, one of them changed). (The source's
    entries taken out are measured without ``cap``: remembered, and what leaves cannot stop the count.)"""
    i = id(v)
    path.add(i)
    mine = v._mine if not frozen else ()
    get = dict.get
    dirty = v._dirty
    if dirty is not None and len(dirty) < len(v):  # only the keys changed since the copy
        for k in dirty:
            x = get(v, k, _MISSING)
            old = get(src, k, _MISSING)
            if x is old:
                continue
            if x is not _MISSING:
                size += _entry_size(k, x, frozen or id(x) not in mine, tok, leaf, path, cap)
            if old is not _MISSING:
                size -= _entry_size(k, old, True, tok, leaf, path, _NO_LIMIT)
        path.discard(i)
        return size
    same = 0
    for k, x in dict.items(v):
        old = get(src, k, _MISSING)
        if old is x:
            same += 1
            continue
        size += _entry_size(k, x, frozen or id(x) not in mine, tok, leaf, path, cap)
        if old is not _MISSING:
            same += 1
            size -= _entry_size(k, old, True, tok, leaf, path, _NO_LIMIT)
    if same != len(src):  # keys taken out
        for k, old in dict.items(src):
            if not dict.__contains__(v, k):
                size -= _entry_size(k, old, True, tok, leaf, path, _NO_LIMIT)
    path.discard(i)
    return size


def _remember_size(v: Any) -> None:
    """Remember the size of ``v``, a dict no state changes any more that is about to forget its
    source, if its source's is remembered (so it costs what ``v`` changed, not the table)."""
    src = v._src
    got = _SIZES.get(id(src))
    if got is None or not _is(got[0], src):
        return
    from envfactory.quotas import state_size

    try:
        _size(v, True, None, state_size, set(), _NO_LIMIT)
    except RecursionError:
        pass


def _model_size(v: Any, frozen: bool, tok: Any, leaf: Any, path: set[int], cap: int) -> int:
    """The size of a model (:func:`cow_model`), counted as the engine's walk counts one (its
    fields' values), remembered when no state changes it any more. A state's own model was
    copied for it with its nested models (:func:`_model_copy`): what it holds is the state's
    own too, but for the copy-on-write containers, which say so themselves."""
    i = id(v)
    if frozen:
        got = _SIZES.get(i)
        if got is not None and _is(got[0], v):
            return got[1]
    if i in path:
        return 16
    path.add(i)
    total = 2
    esc = _ascii_dump
    for k, x in v.__dict__.items():
        total += len(k) + 4
        if x.__class__ is str and len(x) <= _LONG:
            total += len(esc(x))
        else:
            total += _size(x, frozen, tok, leaf, path, cap)
    path.discard(i)
    if total > cap:
        raise _Past(total)
    if frozen:
        _room(_SIZES, _SIZES_CAP)
        _SIZES[i] = (_hold(v), total)
    return total


class _Plain:
    """A state's fields as a plain object, for the engine's walk."""

    def __init__(self, state: Any) -> None:
        self.__dict__ = dict(state.__dict__)


def _size(v: Any, frozen: bool, tok: Any, leaf: Any, path: set[int], cap: int) -> int:
    """The size of ``v``; ``frozen``: no state changes it any more (it is shared, or reached only
    through what is). Raises :class:`_Past` for a container (or model) found past ``cap``."""
    cls = v.__class__
    if cls is str:
        return len(_ascii_dump(v)) if len(v) <= _LONG else _str_size(v)
    is_cow = cls is CowDict or cls is CowList
    if not (is_cow or cls is dict or cls is list):
        if _MODELS.get(cls) or (cls not in _IMM and cow_model(cls)):
            return _model_size(v, frozen, tok, leaf, path, cap)
        return int(leaf(v, cap))
    i = id(v)
    if is_cow:
        frozen = v._tok is not tok or tok is None
    if frozen:
        got = _SIZES.get(i)
        if got is not None and _is(got[0], v):
            return got[1]
    if i in path:
        return 16
    src = v._src if cls is CowDict else None
    if src is not None:
        got = _SIZES.get(id(src))
        if got is not None and _is(got[0], src):
            total = _size_from(v, src, got[1], frozen, tok, leaf, path, cap)
            if total > cap:
                raise _Past(total)
            if frozen:
                _room(_SIZES, _SIZES_CAP)
                _SIZES[i] = (_hold(v), total)
            return total
    path.add(i)
    mine = v._mine if is_cow and not frozen else ()
    total = 2
    esc = _ascii_dump
    if cls is dict or cls is CowDict:
        for k, x in dict.items(v):  # strings inline (quotas._str_size of one within _LONG)
            total += len(esc(k)) + 2 if k.__class__ is str and len(k) <= _LONG else _key_size(k)
            if x.__class__ is str and len(x) <= _LONG:
                total += len(esc(x))
            else:
                total += _size(x, frozen or (is_cow and id(x) not in mine), tok, leaf, path, cap)
    else:
        total += len(v)
        for x in list.__iter__(v):
            if x.__class__ is str and len(x) <= _LONG:
                total += len(esc(x))
            else:
                total += _size(x, frozen or (is_cow and id(x) not in mine), tok, leaf, path, cap)
    path.discard(i)
    if total > cap:
        raise _Past(total)
    if frozen:
        _room(_SIZES, _SIZES_CAP)
        _SIZES[i] = (_hold(v), total)
    return total


# -- the canonical JSON (the state's hash), per container --------------------------------------------
_JSONS: dict[int, tuple[Any, str, frozenset[int], Any]] = {}
"""id -> (a frozen container, its JSON, the ids of the containers it holds, for a large dict its
entries' texts by key and its keys in order)."""
_ENTRIES_FROM = 64
_JSONS_CAP = 1 << 18
_TOP = 2 ** 53


class _NotPlain(Exception):
    """The state is not plain JSON data written as itself: the engine's own serialization decides."""


def cow_canonical_json(state: Any) -> str | None:
    """:func:`envfactory.state.canonical_json` of a copy-on-write state of plain data, the same
    text, with the JSON of containers no state can change any more (shared ones) written once and
    remembered: hashing a task's expected state on a multi-MB database writes again only what its
    calls changed. ``None`` when the state is not plain data written as itself (objects, tuples,
    a container reached twice): the engine's serialization writes it."""
    priv = state.__pydantic_private__
    tok = priv.get("_tok") if priv else None
    mine = priv.get("_mine", ()) if priv else ()
    seen: set[int] = set()
    items = [("$pystate", "1")]
    _local.trusted = getattr(state.__class__, "__pystate_trusted__", ())
    try:
        for k, v in state.__dict__.items():
            if k.__class__ is not str or k[:1] == "$":
                return None
            items.append((k, _json(v, k not in mine, tok, seen)[0]))
    except (_NotPlain, RecursionError):
        return None
    items.sort(key=lambda kv: kv[0])
    parts = ["{"]
    for n, (k, t) in enumerate(items):  # (one copy of a multi-MB text, not one per piece)
        parts += ["," if n else "", _STR(k), ":", t]
    parts.append("}")
    return "".join(parts)


_ENCODE = _json_mod.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                check_circular=False).encode
_STR = _json_mod.encoder.encode_basestring  # (what json.dumps(s, ensure_ascii=False) writes)
_LEAF_TYPES = frozenset((str, bool, type(None)))


def _leaf_json(v: Any, cls: type) -> str | None:
    """The JSON of a container that holds only plain scalars (written by C ``json``), ``None``
    if it holds a container or an object."""
    leaf = _LEAF_TYPES
    if cls is dict or cls is CowDict:
        for k, x in dict.items(v):
            if k.__class__ is not str or k[:1] == "$":
                raise _NotPlain
            c = x.__class__
            if c in leaf:
                continue
            if c is int:
                if not -_TOP <= x <= _TOP:
                    raise _NotPlain
            elif c is float:
                if x - x != 0.0:
                    raise _NotPlain
            else:
                return None
        return _ENCODE(v if cls is dict else dict(dict.items(v)))
    for x in list.__iter__(v):
        c = x.__class__
        if c in leaf:
            continue
        if c is int:
            if not -_TOP <= x <= _TOP:
                raise _NotPlain
        elif c is float:
            if x - x != 0.0:
                raise _NotPlain
        else:
            return None
    return _ENCODE(v if cls is list else list(list.__iter__(v)))


def _json(v: Any, frozen: bool, tok: Any, seen: set[int]) -> tuple[str, frozenset[int] | None]:
    """``v``'s canonical JSON, and (for a container no state changes any more, which is
    remembered) the ids of the containers it holds."""
    cls = v.__class__
    if cls is str:
        return _STR(v), None
    if cls is bool or v is None:
        return ("true" if v else "false") if cls is bool else "null", None
    if cls is int:
        if -_TOP <= v <= _TOP:
            return str(v), None
        raise _NotPlain
    if cls is float:
        if v - v == 0.0:
            return float.__repr__(v), None
        raise _NotPlain
    is_cow = cls is CowDict or cls is CowList
    if not (is_cow or cls is dict or cls is list):
        if _MODELS.get(cls) or cow_model(cls):
            return _model_json(v, frozen, tok, seen)
        raise _NotPlain
    i = id(v)
    if is_cow:
        frozen = v._tok is not tok or tok is None
    if frozen:
        got = _JSONS.get(i)
        if got is not None and _is(got[0], v):
            if not seen.isdisjoint(got[2]):
                raise _NotPlain  # a container reached twice: written as a reference
            seen.update(got[2])
            return got[1], got[2]
    if i in seen:
        raise _NotPlain
    text = _leaf_json(v, cls)
    if text is not None:  # (not remembered: C json writes it again faster than a look-up saves)
        seen.add(i)
        return text, (frozenset((i,)) if frozen else None)
    src = v._src if cls is CowDict else None
    if src is not None:
        got = _JSONS.get(id(src))
        if got is not None and _is(got[0], src) and got[3] is not None:
            made = _json_from(v, got, frozen, tok, seen)
            if made is not None:
                if frozen:
                    _room(_JSONS, _JSONS_CAP)
                    _JSONS[i] = (_hold(v), *made)
                return made[0], made[1]
    seen.add(i)
    inner: set[int] = {i}
    mine = v._mine if is_cow and not frozen else ()
    entries: Any = None
    if cls is dict or cls is CowDict:
        items = []
        for k, x in dict.items(v):
            if k.__class__ is not str or k[:1] == "$":
                raise _NotPlain
            if x.__class__ is str:  # (the common leaf, without a call)
                items.append((k, _STR(k) + ":" + _STR(x)))
                continue
            text, ids = _json(x, frozen or (is_cow and id(x) not in mine), tok, seen)
            if ids is not None and frozen:
                inner |= ids
            items.append((k, _STR(k) + ":" + text))
        items.sort(key=lambda kv: kv[0])
        out = "{" + ",".join([t for _, t in items]) + "}"
        if len(items) >= _ENTRIES_FROM:
            entries = _entries(dict(items), [k for k, _ in items])
    else:
        texts = []
        for x in list.__iter__(v):
            text, ids = _json(x, frozen or (is_cow and id(x) not in mine), tok, seen)
            if ids is not None and frozen:
                inner |= ids
            texts.append(text)
        out = "[" + ",".join(texts) + "]"
    if not frozen:  # (a state's own container: never remembered, so its parent needs no ids from it)
        return out, None
    ids_out = frozenset(inner)
    _room(_JSONS, _JSONS_CAP)
    _JSONS[i] = (_hold(v), out, ids_out, entries)
    return out, ids_out


_REFS: dict[tuple[type, tuple[str, ...]], str | None] = {}
CLASS_REF: Any = None
"""``f(cls, trusted) -> "module:Qualname" | None``: how the snapshot encoder names a class, or
``None`` where it refuses it (set by :mod:`~envfactory.factory.classes.pystate`, which imports this
module)."""


def _class_ref(cls: type) -> str:
    """What a snapshot names a model's class by (``"module:Qualname"``), checked as the encoder
    checks it (importable by that name, trusted); :class:`_NotPlain` when it refuses it (the
    engine's serialization then says why)."""
    trusted = getattr(_local, "trusted", ())
    key = (cls, trusted)
    if key not in _REFS:
        if CLASS_REF is None:
            raise _NotPlain
        _REFS[key] = CLASS_REF(cls, trusted)
    ref = _REFS[key]
    if ref is None:
        raise _NotPlain
    return ref


def _model_json(v: Any, frozen: bool, tok: Any, seen: set[int]) -> tuple[str, frozenset[int] | None]:
    """A model's canonical JSON (:func:`cow_model`), the text the snapshot encoder's document of
    it gives (``{"$class": ..., "__dict__": {fields}, "__pydantic_extra__": ...,
    "__pydantic_fields_set__": {"$set": [...]}, "__pydantic_private__": null}``, as
    pickling's state), remembered when no state changes it any more; a model with private
    values is left to the engine."""
    i = id(v)
    if frozen:
        got = _JSONS.get(i)
        if got is not None and _is(got[0], v):
            if not seen.isdisjoint(got[2]):
                raise _NotPlain
            seen.update(got[2])
            return got[1], got[2]
    d = v.__dict__
    if i in seen or id(d) in seen or v.__pydantic_private__ is not None:
        raise _NotPlain
    ref = _class_ref(v.__class__)
    fields_set = v.__pydantic_fields_set__
    if id(fields_set) in seen:
        raise _NotPlain
    seen.add(i)
    seen.add(id(d))
    seen.add(id(fields_set))
    inner: set[int] = {i, id(d), id(fields_set)}
    items = []
    for k, x in d.items():
        if k.__class__ is not str or k[:1] == "$":
            raise _NotPlain
        if x.__class__ is str:
            items.append((k, _STR(x)))
            continue
        text, ids = _json(x, frozen, tok, seen)
        if ids is not None and frozen:
            inner |= ids
        items.append((k, text))
    items.sort(key=lambda kv: kv[0])
    parts = ['{"$class":', _STR(ref), ',"__dict__":{']
    for n, (k, t) in enumerate(items):
        parts += ["," if n else "", _STR(k), ":", t]
    extra = v.__pydantic_extra__
    if extra is None:
        extra_text = "null"
    else:
        extra_text, ids = _json(extra, frozen, tok, seen)
        if ids is not None and frozen:
            inner |= ids
    names = sorted(fields_set, key=_json_mod.dumps) if all(n.__class__ is str for n in fields_set) else None
    if names is None:
        raise _NotPlain
    parts += ['},"__pydantic_extra__":', extra_text, ',"__pydantic_fields_set__":{"$set":[',
              ",".join(map(_STR, names)), ']},"__pydantic_private__":null}']
    out = "".join(parts)  # (one copy of a multi-MB text, not one per piece)
    if not frozen:
        return out, None
    ids_out = frozenset(inner)
    _room(_JSONS, _JSONS_CAP)
    _JSONS[i] = (_hold(v), out, ids_out, None)
    return out, ids_out


def _entries(texts: dict[Any, str], order: list[Any]) -> tuple[dict[Any, str], list[Any], dict[Any, int]]:
    """What a large dict's JSON is remembered with: its entries' texts, its keys in order, and
    where each entry starts in the text (so a copy that changed a few is spliced, not rejoined)."""
    at: dict[Any, int] = {}
    n = 1
    for k in order:
        at[k] = n
        n += len(texts[k]) + 1
    return texts, order, at


def _json_from(v: Any, got: Any, frozen: bool, tok: Any, seen: set[int]) -> Any:
    """``(JSON, ids, entries)`` of the dict ``v`` from those of its source (``got``): only the
    entries that differ are written; ``None`` when what they replaced is no longer remembered."""
    src, src_text, src_ids, (texts, order, at) = v._src, got[1], got[2], got[3]
    mine = v._mine if not frozen else ()
    gone: set[int] = {id(src)}  # the source's containers that ``v`` no longer holds
    new_keys = False
    changed: list[tuple[Any, Any]] = []
    removed: list[Any] = []
    get = dict.get
    dirty = v._dirty
    if dirty is not None and len(dirty) < len(v):  # only the keys changed since the copy
        for k in dirty:
            x = get(v, k, _MISSING)
            old = get(src, k, _MISSING)
            if old is x:
                continue
            if old is not _MISSING and not _forget(old, gone):
                return None
            if x is _MISSING:
                removed.append(k)
                continue
            if old is _MISSING:
                if k.__class__ is not str or k[:1] == "$":
                    raise _NotPlain
                new_keys = True
            changed.append((k, x))
    else:
        same = 0
        for k, x in dict.items(v):
            old = get(src, k, _MISSING)
            if old is x:
                same += 1
                continue
            if old is _MISSING:
                if k.__class__ is not str or k[:1] == "$":
                    raise _NotPlain
                new_keys = True
            else:
                same += 1
                if not _forget(old, gone):
                    return None
            changed.append((k, x))
        if same != len(src):
            for k, old in dict.items(src):
                if not dict.__contains__(v, k):
                    removed.append(k)
                    if not _forget(old, gone):
                        return None
    kept = src_ids - gone  # (a changed record's copy still holds its unchanged parts: they are not gone)
    seen.add(id(v))
    inner: set[int] = {id(v)}
    written: dict[Any, str] = {}
    for k, x in changed:
        text, ids = _json(x, frozen or id(x) not in mine, tok, seen)
        if ids is not None and frozen:
            inner |= ids
        written[k] = _STR(k) + ":" + text
    if not seen.isdisjoint(kept):
        raise _NotPlain
    seen |= kept
    if not frozen and not new_keys and not removed:  # a state's own copy, same keys: spliced
        pieces: list[str] = []
        last = 0
        for n, k in sorted((at[k], k) for k in written):
            pieces.append(src_text[last:n])
            pieces.append(written[k])
            last = n + len(texts[k])
        pieces.append(src_text[last:])
        return "".join(pieces), None, None
    texts = {**texts, **written}
    for k in removed:
        del texts[k]
    if new_keys or removed:
        order = sorted(texts)
    out = "{" + ",".join([texts[k] for k in order]) + "}"
    if not frozen:
        return out, None, None
    inner |= kept
    return out, frozenset(inner), _entries(texts, order)


def _forget(old: Any, gone: set[int]) -> bool:
    """Add the containers ``old`` (a value of a source) holds to ``gone``; ``False`` when they are
    no longer remembered."""
    c = old.__class__
    if c is dict or c is list or c is CowDict or c is CowList:
        got = _JSONS.get(id(old))
        if got is not None and _is(got[0], old):
            gone |= got[2]
        elif _leaf_json(old, c) is not None:  # (only scalars: not remembered, itself alone)
            gone.add(id(old))
        else:
            return False
    elif c not in _IMM and (_MODELS.get(c) or cow_model(c)):
        got = _JSONS.get(id(old))
        if got is None or not _is(got[0], old):
            return False
        gone |= got[2]
    return True
