"""Copy on write per container: a fork of a multi-MB state costs O(fields), its first tool call
copies only the dicts and lists that call reaches.

A ``from_class`` state of attributes (:class:`~envfactory.factory.pystate.PyState`) shares its
values with its forks. While a tool runs on a state (:func:`armed`), its dict and list fields are
:class:`CowDict` / :class:`CowList` containers stamped with that state's *token*; reaching a
child container through one (indexing, ``get``, iteration, ``pop``, ...) gives the state its own
shallow copy of the child, stamped alike and stored in place, so a write lands in the state's
copy and never in a container another state still holds. A fork gives both sides new tokens:
everything either side holds becomes shared again, and each copies what its next calls reach.

Semantics are those of copying each field as a tree (:func:`envfactory.state.copy_state`'s plain
copier, what these states used before): values that are not dicts or lists (objects, sets) are
deep-copied when first reached. Outside a tool call the containers read as the dicts and lists
they are (no copy); dumps, hashes and snapshots write them as plain data.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, SupportsIndex

__all__ = ["CowDict", "CowList", "armed", "new_token", "COW_TYPES"]

_IMM = frozenset((str, int, float, bool, type(None), bytes, complex, range, frozenset))
_local = threading.local()


def _token() -> Any:
    return getattr(_local, "tok", None)


class _Token:
    """Whose containers are whose: one per state between forks."""

    __slots__ = ("__weakref__",)


def new_token() -> _Token:
    return _Token()


def _take(parent: Any, v: Any) -> tuple[Any, bool]:
    """``v`` as the armed state may change it: ``(value, copied)``."""
    cls = v.__class__
    if cls in _IMM:
        return v, False
    tok = parent._tok
    if id(v) in parent._mine:
        return v, False
    if cls is dict or cls is CowDict:
        new: Any = CowDict(v)
    elif cls is list or cls is CowList:
        new = CowList(v)
    else:
        from ..state import _copy

        new = _copy(v)
        if new is v:  # immutable (an enum, a tuple of scalars)
            return v, False
        parent._mine.add(id(new))
        return new, True
    new._tok = tok
    new._mine = set()
    parent._mine.add(id(new))
    return new, True


def _live(c: Any) -> bool:
    """Whether ``c`` belongs to the state whose tool runs now (then reaching a child copies it)."""
    tok = c._tok
    return tok is not None and tok is getattr(_local, "tok", None)


class CowDict(dict[Any, Any]):
    """A dict whose children are copied when a tool of its state first reaches them."""

    __slots__ = ("_tok", "_mine")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        self._tok: Any = None
        self._mine: set[int] = set()

    def _get(self, k: Any, v: Any) -> Any:
        v2, copied = _take(self, v)
        if copied:
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
        dict.__setitem__(self, k, v)

    def setdefault(self, k: Any, default: Any = None) -> Any:
        if dict.__contains__(self, k):
            return self[k]
        self[k] = default
        return default

    def pop(self, k: Any, *default: Any) -> Any:
        if dict.__contains__(self, k) and _live(self):
            self[k]  # noqa: B018 (the popped value is the state's own copy)
        return dict.pop(self, k, *default)

    def popitem(self) -> tuple[Any, Any]:
        if _live(self) and self:
            k = next(reversed(dict.keys(self)))
            self[k]  # noqa: B018
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

    __slots__ = ("_tok", "_mine")

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
            if cls is dict or cls is CowDict:
                new: Any = CowDict(v)
            elif cls is list or cls is CowList:
                new = CowList(v)
            else:
                from ..state import _copy

                d[k] = _copy(v)
                mine.add(k)
                continue
            new._tok = tok
            new._mine = set()
            d[k] = new
            mine.add(k)
        self.prev = getattr(_local, "tok", None)
        _local.tok = tok

    def __enter__(self) -> armed:
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.tok = self.prev


# -- the state quota's measure, per container ------------------------------------------------------
_SIZES: dict[int, tuple[Any, int]] = {}  # id -> (a plain container no state changes any more, its size)
_SIZES_CAP = 1 << 20


def cow_state_size(state: Any, limit: int | None = None) -> int:
    """:func:`envfactory.quotas.state_size` of a copy-on-write state, the same count, without
    walking again what no state can change any more: containers shared between states (copy on
    write copies them before a change) are measured once and remembered; only the containers this
    state has made its own since its last fork (the table and the record a call reached) are
    walked, their shared children looked up. So a writing call on a multi-MB database measures
    the tables it touched, not the database."""
    from ..quotas import state_size

    priv = state.__pydantic_private__
    tok = priv.get("_tok") if priv else None
    mine = priv.get("_mine", ()) if priv else ()
    total = 2
    try:
        for k, v in state.__dict__.items():
            total += len(k) + 4 + _size(v, k not in mine, tok, state_size, set())
    except RecursionError:  # nested too deep for this walk: the engine's, which has no depth limit
        return state_size(_Plain(state), limit)
    return total


class _Plain:
    """A state's fields as a plain object, for the engine's walk."""

    def __init__(self, state: Any) -> None:
        self.__dict__ = dict(state.__dict__)


def _size(v: Any, frozen: bool, tok: Any, leaf: Any, path: set[int]) -> int:
    """The size of ``v``; ``frozen``: no state changes it any more (it is shared, or reached only
    through what is)."""
    cls = v.__class__
    if cls is str:
        return len(v) + 2 if v.isascii() else len(v.encode("utf-16-le", "surrogatepass")) * 3 + 2
    is_cow = cls is CowDict or cls is CowList
    if not (is_cow or cls is dict or cls is list):
        return leaf(v)
    i = id(v)
    if is_cow:
        frozen = v._tok is not tok or tok is None
    if frozen:
        got = _SIZES.get(i)
        if got is not None and got[0] is v:
            return got[1]
    if i in path:
        return 16
    path.add(i)
    mine = v._mine if is_cow and not frozen else ()
    total = 2
    if cls is dict or cls is CowDict:
        for k, x in dict.items(v):
            total += len(k) + 4 if k.__class__ is str and k.isascii() else 16
            if x.__class__ is str and x.isascii():
                total += len(x) + 2
            else:
                total += _size(x, frozen or (is_cow and id(x) not in mine), tok, leaf, path)
    else:
        total += len(v)
        for x in list.__iter__(v):
            if x.__class__ is str and x.isascii():
                total += len(x) + 2
            else:
                total += _size(x, frozen or (is_cow and id(x) not in mine), tok, leaf, path)
    path.discard(i)
    if frozen:
        if len(_SIZES) >= _SIZES_CAP:
            _SIZES.clear()
        _SIZES[i] = (v, total)
    return total
