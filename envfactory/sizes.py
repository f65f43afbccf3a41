"""Containers that report their mutations, so the state quota's measure costs what a call changed.

A state that a world tracks (:func:`envfactory.quotas.track`) is *adopted* by a ledger
(:class:`envfactory.quotas._Ledger`) once full measures after ``quotas.ADOPT_AFTER`` writing calls
found it past ``quotas.LEDGER_BYTES``: its dicts, lists and sets become :class:`TDict`, :class:`TList` and
:class:`TSet` (the same items), and each pydantic model in it keeps its identity with its
``__dict__`` a :class:`TDict`. Each such container (a *node*) holds the size its subtree adds to
the state's dump (``_sz``), its parent node (``_up``) and its ledger (``_lg``). Every mutator
(``d[k] = v``, ``del``, ``pop``, ``update``, ``append``, ``extend``, slice assignment, ``add``,
``discard``..., and a model's field assignment, which pydantic writes as ``model.__dict__[name] =
value``) tells the ledger what it removed and what it added; the ledger settles the sizes after
the call. A node whose ``_lg`` is ``None`` (a state that is not adopted, a part
removed from one) reports nothing: it is a plain dict, list or set with a few more slots.

They dump, copy, pickle, compare and hash as the plain containers do: ``copy()``, ``copy.copy``,
``copy.deepcopy``, ``pickle`` and :func:`envfactory.state.copy_state` make plain ones, pydantic
serializes them as it serializes a dict, list or set, and the engine's ``cls is dict`` tests
(:func:`envfactory.state._copy`, ``_identical``, ``live_leaf``, the quota's walk) count them as
the plain class. What they cannot see (a C-level write that skips the subclass's method,
``dict.__setitem__(d, k, v)``, ``object.__setattr__(model, name, v)``, ``del model.field``) is what
the journal's checkpoint, which measures the whole state, catches (see :mod:`envfactory.quotas`).
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["TDict", "TList", "TSet", "TRACKED", "PLAIN_OF", "MISSING"]

MISSING: Any = object()  # what a slot holds when it holds nothing (the containers report it)


class TDict(dict):
    """A dict that reports its mutations to its ledger (``_lg``) while it has one."""

    __slots__ = ("_lg", "_sz", "_up", "_dd", "_new", "_km")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        self._lg: Any = None
        self._sz = 0
        self._up: Any = None
        self._dd: Any = None  # this call's change of the size (None: not changed in this call)
        self._new: Any = None  # key -> a container put there in this call (measured after it)
        self._km = False  # a model's __dict__ (its keys count as a model's fields)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (dict, (dict(self),))

    def __setitem__(self, key: Any, value: Any) -> None:
        lg = self._lg
        if lg is not None:
            lg.put(self, key, dict.get(self, key, MISSING), value)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        lg = self._lg
        if lg is not None:
            old = dict.__getitem__(self, key)  # (a missing key raises here, before anything is noted)
            lg.put(self, key, old, MISSING)
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        lg = self._lg
        if lg is not None:
            old = dict.get(self, key, MISSING)
            if old is not MISSING:
                lg.put(self, key, old, MISSING)
        return dict.pop(self, key, *default)

    def popitem(self) -> Any:
        lg = self._lg
        if lg is not None and self:
            key = next(reversed(self))
            lg.put(self, key, dict.__getitem__(self, key), MISSING)
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        lg = self._lg
        if lg is not None and not dict.__contains__(self, key):
            lg.put(self, key, MISSING, default)
        return dict.setdefault(self, key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        if self._lg is None:
            dict.update(self, *args, **kwargs)
            return
        for k, v in dict(*args, **kwargs).items():  # (the pairs as dict.update takes them, in order)
            self[k] = v

    def __ior__(self, other: Any) -> "TDict":  # type: ignore[misc]
        self.update(other)
        return self

    def clear(self) -> None:
        lg = self._lg
        if lg is not None:
            for k, v in dict.items(self):
                lg.put(self, k, v, MISSING)
        dict.clear(self)

    @classmethod
    def fromkeys(cls, iterable: Iterable[Any], value: Any = None) -> dict:
        return dict.fromkeys(iterable, value)


class TList(list):
    """A list that reports its mutations to its ledger (``_lg``) while it has one."""

    __slots__ = ("_lg", "_sz", "_up", "_dd", "_new", "_km")

    def __init__(self, *args: Any) -> None:
        list.__init__(self, *args)
        self._lg: Any = None
        self._sz = 0
        self._up: Any = None
        self._dd: Any = None
        self._new: Any = None  # id -> [a container put in this call, how many times]
        self._km = False

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (list, (list(self),))

    def __setitem__(self, index: Any, value: Any) -> None:
        lg = self._lg
        if lg is None:
            list.__setitem__(self, index, value)
            return
        if index.__class__ is slice:
            value = list(value)
            old = list.__getitem__(self, index)
            list.__setitem__(self, index, value)
            lg.swap(self, old, value)
        else:
            old = list.__getitem__(self, index)
            list.__setitem__(self, index, value)
            lg.swap(self, (old,), (value,))

    def __delitem__(self, index: Any) -> None:
        lg = self._lg
        if lg is None:
            list.__delitem__(self, index)
            return
        old = list.__getitem__(self, index)
        list.__delitem__(self, index)
        lg.swap(self, old if index.__class__ is slice else (old,), ())

    def append(self, value: Any) -> None:
        lg = self._lg
        if lg is not None:
            lg.swap(self, (), (value,))
        list.append(self, value)

    def extend(self, values: Iterable[Any]) -> None:
        lg = self._lg
        if lg is None:
            list.extend(self, values)
            return
        values = list(values)
        lg.swap(self, (), values)
        list.extend(self, values)

    def __iadd__(self, values: Iterable[Any]) -> "TList":  # type: ignore[misc]
        self.extend(values)
        return self

    def __imul__(self, n: Any) -> "TList":  # type: ignore[misc]
        lg = self._lg
        if lg is None:
            list.__imul__(self, n)
            return self
        old = list(self)
        list.__imul__(self, n)
        lg.swap(self, old, list(self))
        return self

    def insert(self, index: Any, value: Any) -> None:
        lg = self._lg
        if lg is not None:
            lg.swap(self, (), (value,))
        list.insert(self, index, value)

    def pop(self, index: Any = -1) -> Any:
        lg = self._lg
        if lg is None:
            return list.pop(self, index)
        old = list.pop(self, index)
        lg.swap(self, (old,), ())
        return old

    def remove(self, value: Any) -> None:
        lg = self._lg
        if lg is None:
            list.remove(self, value)
            return
        i = list.index(self, value)
        old = list.__getitem__(self, i)
        list.__delitem__(self, i)
        lg.swap(self, (old,), ())

    def clear(self) -> None:
        lg = self._lg
        if lg is not None:
            lg.swap(self, list(self), ())
        list.clear(self)


class TSet(set):
    """A set that reports its mutations to its ledger (``_lg``) while it has one."""

    __slots__ = ("_lg", "_sz", "_up", "_dd", "_new", "_km")

    def __init__(self, *args: Any) -> None:
        set.__init__(self, *args)
        self._lg: Any = None
        self._sz = 0
        self._up: Any = None
        self._dd: Any = None
        self._new: Any = None  # True: measured again after the call
        self._km = False

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (set, (set(self),))

    def add(self, value: Any) -> None:
        lg = self._lg
        if lg is not None and value not in self:
            lg.grow(self, value, 1)
        set.add(self, value)

    def discard(self, value: Any) -> None:
        lg = self._lg
        if lg is not None and value in self:
            lg.grow(self, value, -1)
        set.discard(self, value)

    def remove(self, value: Any) -> None:
        lg = self._lg
        if lg is not None and value in self:
            lg.grow(self, value, -1)
        set.remove(self, value)

    def pop(self) -> Any:
        value = set.pop(self)
        lg = self._lg
        if lg is not None:
            lg.grow(self, value, -1, exact=True)
        return value

    def _again(self) -> None:
        lg = self._lg
        if lg is not None:
            lg.again(self)

    def clear(self) -> None:
        self._again()
        set.clear(self)

    def update(self, *others: Any) -> None:
        self._again()
        set.update(self, *others)

    def difference_update(self, *others: Any) -> None:
        self._again()
        set.difference_update(self, *others)

    def intersection_update(self, *others: Any) -> None:
        self._again()
        set.intersection_update(self, *others)

    def symmetric_difference_update(self, other: Any) -> None:
        self._again()
        set.symmetric_difference_update(self, other)

    def __ior__(self, other: Any) -> "TSet":  # type: ignore[misc]
        self._again()
        if set.__ior__(self, other) is NotImplemented:  # (not a set: the operator raises TypeError, as a set's)
            return NotImplemented
        return self

    def __iand__(self, other: Any) -> "TSet":  # type: ignore[misc]
        self._again()
        if set.__iand__(self, other) is NotImplemented:  # (not a set: the operator raises TypeError, as a set's)
            return NotImplemented
        return self

    def __isub__(self, other: Any) -> "TSet":  # type: ignore[misc]
        self._again()
        if set.__isub__(self, other) is NotImplemented:  # (not a set: the operator raises TypeError, as a set's)
            return NotImplemented
        return self

    def __ixor__(self, other: Any) -> "TSet":  # type: ignore[misc]
        self._again()
        if set.__ixor__(self, other) is NotImplemented:  # (not a set: the operator raises TypeError, as a set's)
            return NotImplemented
        return self


TRACKED = frozenset({TDict, TList, TSet})
PLAIN_OF: dict[type, type] = {TDict: dict, TList: list, TSet: set}
