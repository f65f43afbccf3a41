"""Any picklable Python state as an episode's world: faithful copies and portable snapshots.

:func:`~envfactory.factory.from_class` keeps a third-party class's instances (or
their attributes) in a :class:`PyState`, a :class:`~envfactory.State` subclass
like any other as far as the engine sees: ``model_dump(mode="json")`` dumps it,
``model_validate`` loads it, :func:`~envfactory.state.copy_state` forks it. What
it holds is arbitrary Python data:

* **fork** copies the whole object graph as one (:func:`graph_copy`, one memo for
  every field): an attribute that points into another attribute (the current
  directory inside the tree) still does in the copy; ``random.Random`` keeps its
  exact stream; sets, tuples, int and tuple dict keys stay what they are. For
  ``from_class`` states the copy is deferred (:func:`lazy_state_copy`, copy on
  write): a fork shares the values until a tool runs on one side (:func:`own`);
* **what the episode saw**: for tasks that require their reads
  (:class:`~envfactory.factory.from_class.ReadsCheck`) the tools record a digest of
  every result they return (:func:`note_result`), beside the fields: forks copy it,
  JSON dumps carry it (``"$seen"``), the hash and equality ignore it;
* **dump** is a versioned, portable JSON document (:func:`encode`, format
  ``{"$pystate": 1, <field>: <value>, ...}``). Plain JSON data (dicts with string
  keys, lists, strings, booleans, ``None``, finite floats, integers up to 2**53)
  is written as itself, so a state of plain data dumps exactly as pydantic would
  have; everything else carries a tag:

  ===================  =====================================================
  ``{"$tuple": [..]}``  a tuple; ``$set`` / ``$frozenset`` (sorted elements)
  ``{"$dict": [[k, v], ..]}``  a dict with a key that is not a string, or starts with ``$``
  ``{"$int": "..."}``  an integer beyond 2**53; ``{"$float": "nan"}``, ``"inf"``, ``"-inf"``
  ``{"$bytes": b64}``  bytes; ``$bytearray``
  ``{"$class": "mod:Qual", attr: .., ..}``  an object (its ``__dict__``; ``$attrs``,
                        ``$slots`` or ``$state`` when needed)
  ``{"$reduce": "mod:Qual", "$args": [..], "$state"?, "$items"?, "$kv"?}``  an object
                        rebuilt through its pickle protocol (``random.Random``,
                        ``collections.deque``, enums, datetimes)
  ``{"$global": "mod:Qual"}``  a class or function, by reference
  ``{"$ref": "/field/a/b"}``  the object first written at that JSON Pointer of the
                        document (shared references and cycles)
  ===================  =====================================================

**Trust.** Loading a document never unpickles: it only instantiates classes from
the *trusted* modules (by default the packages of the classes the environment
was built from) and a fixed list of standard-library types (:data:`STDLIB`),
through ``cls.__new__`` or the class's own constructor with the document's
arguments. A document naming any other callable is refused. So a snapshot from
an untrusted source can at worst build objects of those classes with odd
contents; it cannot run arbitrary code the way a pickle can.
"""

from __future__ import annotations

import base64
import copy as _copy_mod
import copyreg
import decimal
import fractions
import gc
import hashlib
import importlib
import json
import math
import re
import threading
import types
import weakref
from typing import Any, Callable, ClassVar, Container, Iterable

from pydantic import BaseModel, ConfigDict, SerializationInfo, model_serializer, model_validator

from envfactory.state import State
from envfactory.factory.classes import cow as _cow_mod
from envfactory.factory.classes.cow import CowDict, CowList

__all__ = ["PyState", "PyStateError", "FORMAT_KEY", "FORMAT_VERSION", "SEEN_KEY", "STDLIB", "encode", "decode",
           "graph_copy", "graph_state_copy", "lazy_state_copy", "cow_state_copy", "own", "trusted_for", "note_result", "record_results",
           "seen_results", "result_digest"]

FORMAT_KEY = "$pystate"
FORMAT_VERSION = 1
SEEN_KEY = "$seen"
"""Where a JSON document carries the digests of the tool results the episode returned."""
_MAX_EXACT = 2 ** 53

STDLIB = frozenset({
    "builtins:list", "builtins:dict", "builtins:set", "builtins:frozenset", "builtins:tuple",
    "builtins:int", "builtins:float", "builtins:str", "builtins:bytes", "builtins:bytearray",
    "builtins:bool", "builtins:complex", "builtins:object", "builtins:range", "builtins:slice",
    "copyreg:__newobj__", "copyreg:__newobj_ex__",
    "random:Random", "collections:OrderedDict", "collections:defaultdict", "collections:deque",
    "collections:Counter", "datetime:date", "datetime:datetime", "datetime:time",
    "datetime:timedelta", "datetime:timezone", "decimal:Decimal", "fractions:Fraction",
    "uuid:UUID", "pathlib:PurePosixPath", "pathlib:PosixPath",
})
"""Standard-library callables a document may name besides the trusted modules' classes."""

_SCALARS = frozenset((str, bool, type(None)))
_JSON_LEAF = frozenset((str, bool, type(None), int, float))  # what a document holds as itself
_IMMUTABLE = frozenset((str, int, float, bool, type(None), bytes, complex, range))
_TAGS = ("$ref", "$class", "$reduce", "$tuple", "$dict", "$set", "$frozenset", "$int", "$float",
         "$bytes", "$bytearray", "$global")
_TAG_RANK = {t: i for i, t in enumerate(_TAGS)}


class PyStateError(ValueError):
    """A value cannot be carried faithfully (not picklable, or a class that is not trusted),
    or a document cannot be loaded; the message names the place."""


def _esc(key: str) -> str:
    if "~" not in key and "/" not in key:
        return key
    return key.replace("~", "~0").replace("/", "~1")


def _unesc(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _ref_of(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not module or not qual:
        raise PyStateError(f"{obj!r} has no importable name")
    return f"{module}:{qual}"


def _import(ref: str) -> Any:
    module, _, qual = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def trusted_for(classes: Iterable[type]) -> tuple[str, ...]:
    """The default trusted modules for ``classes``: each class's package (its module
    for a top-level module)."""
    out = []
    for c in classes:
        m = c.__module__
        out.append(m.rpartition(".")[0] or m)
    return tuple(sorted(set(out)))


def _trusted_module(module: str, trusted: tuple[str, ...]) -> bool:
    return any(module == t or module.startswith(t + ".") for t in trusted)


# -- encoding ---------------------------------------------------------------------------------
class _Encoder:
    def __init__(self, trusted: tuple[str, ...], omit: Callable[[type], Container[str] | None] | None = None) -> None:
        self.trusted = trusted
        self.omit = omit  # attributes left out per class (a comparison's view, never a snapshot)
        self.memo: dict[int, str] = {}
        self.refs: dict[tuple[int, bool], str] = {}  # checked names of classes and functions
        self.keep: list[Any] = []  # objects whose id is in memo stay alive meanwhile

    def global_ref(self, obj: Any, path: str, call: bool) -> str:
        known = self.refs.get((id(obj), call))
        if known is not None:
            return known
        ref = self._global_ref(obj, path, call)
        self.refs[(id(obj), call)] = ref
        self.keep.append(obj)
        return ref

    def _global_ref(self, obj: Any, path: str, call: bool) -> str:
        ref = _ref_of(obj)
        if "<locals>" in ref:
            raise PyStateError(f"{path or '/'}: {ref} is defined inside a function and cannot be "
                               "restored by name; define it at module level")
        try:
            same = _import(ref) is obj
        except Exception:
            same = False
        if not same:
            raise PyStateError(f"{path or '/'}: {ref} cannot be imported back by that name")
        module = ref.partition(":")[0]
        if ref in STDLIB or (_trusted_module(module, self.trusted) and (not call or isinstance(obj, type))):
            return ref
        raise PyStateError(
            f"{path or '/'}: {ref} is not trusted for snapshots (trusted: the modules "
            f"{list(self.trusted)} and the standard-library types in envfactory.factory.classes.pystate.STDLIB); "
            "pass its module in from_class(..., trusted_modules=[...])")

    def enc(self, v: Any, path: str) -> Any:
        cls = v.__class__
        if cls in _SCALARS:
            return v
        if cls is int:
            return v if -_MAX_EXACT <= v <= _MAX_EXACT else {"$int": str(v)}
        if cls is float:
            if math.isfinite(v):
                return v
            return {"$float": "nan" if v != v else ("inf" if v > 0 else "-inf")}
        if cls is tuple:
            return {"$tuple": self._list(v, f"{path}/$tuple")}
        if cls is bytes:
            return {"$bytes": base64.b64encode(v).decode()}
        if cls is frozenset:
            return {"$frozenset": self._set_items(v, f"{path}/$frozenset")}
        if isinstance(v, type) or _is_function(v):
            return {"$global": self.global_ref(v, path, call=False)}
        seen = self.memo.get(id(v))
        if seen is not None:
            return {"$ref": seen}
        self.memo[id(v)] = path
        self.keep.append(v)
        if cls is dict or cls is CowDict:
            if all(k.__class__ is str and k[:1] != "$" for k in v):
                return self._fields(v, path)
            return {"$dict": [[self.enc(k, f"{path}/$dict/{i}/0"), self.enc(x, f"{path}/$dict/{i}/1")]
                              for i, (k, x) in enumerate(v.items())]}
        if cls is list or cls is CowList:
            return self._list(v, path)
        if cls is set:
            return {"$set": self._set_items(v, f"{path}/$set")}
        if cls is bytearray:
            return {"$bytearray": base64.b64encode(bytes(v)).decode()}
        return self._object(v, path)

    def _fields(self, d: dict[str, Any], path: str, out: dict[str, Any] | None = None) -> dict[str, Any]:
        """``d`` (string keys, none starting with ``$``) encoded into ``out``: values that are
        written as themselves are copied without a call (and without building their path)."""
        out = {} if out is None else out
        leaf, top = _SCALARS, _MAX_EXACT
        for k, x in d.items():
            c = x.__class__
            if c in leaf or (c is int and -top <= x <= top) or (c is float and x - x == 0.0):
                out[k] = x
            else:
                out[k] = self.enc(x, f"{path}/{_esc(k)}")
        return out

    def _list(self, v: list[Any] | tuple[Any, ...], path: str) -> list[Any]:
        leaf, top = _SCALARS, _MAX_EXACT
        out = []
        for i, x in enumerate(v):
            c = x.__class__
            if c in leaf or (c is int and -top <= x <= top) or (c is float and x - x == 0.0):
                out.append(x)
            else:
                out.append(self.enc(x, f"{path}/{i}"))
        return out

    def _set_items(self, v: Any, path: str) -> list[Any]:
        def key(x: Any) -> str:
            return json.dumps(_Encoder(self.trusted, self.omit).enc(x, ""), sort_keys=True)

        if len(v) < 2:
            items = list(v)
        elif all(x.__class__ is str or (x.__class__ is int and -_MAX_EXACT <= x <= _MAX_EXACT) for x in v):
            items = sorted(v, key=json.dumps)  # written as themselves: the same order, faster
        else:
            items = sorted(v, key=key)
        return [self.enc(x, f"{path}/{i}") for i, x in enumerate(items)]

    def _object(self, v: Any, path: str) -> Any:
        try:
            kind = _REDUCE_KIND.get(v.__class__)
            if kind is None:
                kind = _reduce_kind(v.__class__)
            if kind == _BY_DICT:  # what object.__reduce_ex__(4) gives, without building it
                rv: Any = (_NEWOBJ, (v.__class__,), v.__dict__ or None)
            elif kind == _BY_GETSTATE:
                rv = (_NEWOBJ, (v.__class__,), v.__getstate__())
            else:
                rv = v.__reduce_ex__(4)
        except Exception as exc:
            raise PyStateError(f"{path or '/'}: {type(v).__qualname__} cannot be carried in a snapshot "
                               f"(not picklable: {exc})") from None
        if isinstance(rv, str):
            return {"$global": self.global_ref(v, path, call=False)}
        func, args, state, items, kv = (tuple(rv) + (None,) * 5)[:5]
        if func is _NEWOBJ and len(args) == 1 and args[0] is type(v) and items is None and kv is None:
            out: dict[str, Any] = {"$class": self.global_ref(type(v), path, call=True)}
            slots = None
            if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)) \
                    and isinstance(state[1], dict):
                state, slots = state
            if state is None or isinstance(state, dict):
                attrs = state or {}
                left_out = self.omit(type(v)) if self.omit is not None else None
                if left_out:
                    attrs = {k: x for k, x in attrs.items() if k not in left_out}
                if all(k.__class__ is str and k[:1] != "$" for k in attrs):
                    self._fields(attrs, path, out)
                else:
                    out["$attrs"] = self._plain_dict(attrs, f"{path}/$attrs")
                if slots:
                    out["$slots"] = self._plain_dict(slots, f"{path}/$slots")
            else:
                out["$state"] = self.enc(state, f"{path}/$state")
            return out
        out = {"$reduce": self.global_ref(func, path, call=True),
               "$args": [self.enc(a, f"{path}/$args/{i}") for i, a in enumerate(args)]}
        if state is not None:
            out["$state"] = self.enc(state, f"{path}/$state")
        if items is not None:
            out["$items"] = [self.enc(x, f"{path}/$items/{i}") for i, x in enumerate(items)]
        if kv is not None:
            out["$kv"] = [[self.enc(k, f"{path}/$kv/{i}/0"), self.enc(x, f"{path}/$kv/{i}/1")]
                          for i, (k, x) in enumerate(kv)]
        return out

    def _plain_dict(self, d: dict, path: str) -> Any:
        # a dict that is part of an object's state, not an object of its own: no memo entry
        if all(k.__class__ is str and k[:1] != "$" for k in d):
            return self._fields(d, path)
        return {"$dict": [[self.enc(k, f"{path}/$dict/{i}/0"), self.enc(x, f"{path}/$dict/{i}/1")]
                          for i, (k, x) in enumerate(d.items())]}


def _class_ref(cls: type, trusted: tuple[str, ...]) -> str | None:
    """How a document names ``cls`` (its ``$class``), ``None`` where the encoder refuses it (for
    :mod:`~envfactory.factory.classes.cow`'s canonical JSON of models)."""
    try:
        return _Encoder(trusted).global_ref(cls, "", call=True)
    except PyStateError:
        return None


_cow_mod.CLASS_REF = _class_ref

_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]  # typeshed lacks it; CPython has it
_BY_REDUCE, _BY_DICT, _BY_GETSTATE = 0, 1, 2
_REDUCE_KIND: dict[type, int] = {}


def _reduce_kind(cls: type) -> int:
    """How :func:`encode` gets the pickle reduction of ``cls``'s instances, the same one as
    ``obj.__reduce_ex__(4)`` whenever it does not call it: ``_BY_DICT`` for a plain class
    (:func:`_plain_class`: ``(__newobj__, (cls,), obj.__dict__ or None)``), ``_BY_GETSTATE`` for
    one that only defines ``__getstate__`` (pydantic models: ``(__newobj__, (cls,),
    obj.__getstate__())``), else ``_BY_REDUCE`` (call it)."""
    kind = _REDUCE_KIND.get(cls)
    if kind is not None:
        return kind
    kind = _BY_REDUCE
    if _plain_class(cls):
        kind = _BY_DICT
    elif (getattr(cls, "__reduce_ex__", None) is _OBJ_REDUCE_EX and getattr(cls, "__reduce__", None) is _OBJ_REDUCE
          and getattr(cls, "__getnewargs__", None) is None and getattr(cls, "__getnewargs_ex__", None) is None
          and getattr(cls, "__getstate__", None) not in (None, _OBJ_GETSTATE)
          and not issubclass(cls, (list, dict)) and cls.__mro__[-1] is object
          and all(b.__flags__ & (1 << 9) for b in cls.__mro__[:-1] if b is not object)
          and any(b.__dict__.get("__getstate__") is not None for b in cls.__mro__[:-1])):
        kind = _BY_GETSTATE
    _REDUCE_KIND[cls] = kind
    return kind


_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)


def _is_function(v: Any) -> bool:
    return isinstance(v, _FUNCTIONS)


class _NoGC:
    """No cyclic garbage collection meanwhile: copying, writing or loading a large graph
    allocates many objects, and collections triggered by them only rescan live ones."""

    def __enter__(self) -> None:
        self.paused = gc.isenabled()
        if self.paused:
            gc.disable()

    def __exit__(self, *exc: Any) -> None:
        if self.paused:
            gc.enable()


def encode(fields: dict[str, Any], trusted: tuple[str, ...] = (),
           omit: Callable[[type], Container[str] | None] | None = None) -> dict[str, Any]:
    """The document for ``{field: value}`` (one reference table for all fields); ``omit(cls)``
    names attributes of ``cls``'s objects to leave out (a view for comparisons, which
    :func:`decode` cannot restore)."""
    e = _Encoder(tuple(trusted), omit)
    out: dict[str, Any] = {FORMAT_KEY: FORMAT_VERSION}
    with _NoGC():
        for name, value in fields.items():
            out[name] = e.enc(value, "/" + _esc(name))
    return out


# -- decoding ---------------------------------------------------------------------------------
class _Decoder:
    def __init__(self, doc: dict[str, Any], trusted: tuple[str, ...]) -> None:
        self.doc = doc
        self.trusted = trusted
        self.table: dict[str, Any] = {}
        self.busy: set[str] = set()
        self.refs: dict[tuple[str, bool], Any] = {}

    def resolve(self, ref: Any, path: str, call: bool) -> Any:
        key = (ref, call) if ref.__class__ is str else None
        if key is not None and key in self.refs:
            return self.refs[key]
        obj = self._resolve(ref, path, call)
        if key is not None:
            self.refs[key] = obj
        return obj

    def _resolve(self, ref: Any, path: str, call: bool) -> Any:
        if not isinstance(ref, str) or ":" not in ref:
            raise PyStateError(f"{path}: bad reference {ref!r}")
        module = ref.partition(":")[0]
        if ref not in STDLIB and not _trusted_module(module, self.trusted):
            raise PyStateError(f"{path}: {ref} is not trusted; refusing to load it")
        try:
            obj = _import(ref)
        except Exception as exc:
            raise PyStateError(f"{path}: cannot import {ref}: {exc}") from None
        if call and ref not in STDLIB and not isinstance(obj, type):
            raise PyStateError(f"{path}: {ref} is not a class; refusing to call it")
        return obj

    def at(self, path: str) -> Any:
        """The value the document holds at a JSON Pointer, decoded (for forward references)."""
        if path in self.table:
            return self.table[path]
        if path in self.busy:
            raise PyStateError(f"{path}: a reference into an object that is still being built "
                               "(a cycle through constructor arguments)")
        node: Any = self.doc
        for part in path.split("/")[1:]:
            part = _unesc(part)
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise PyStateError(f"dangling reference {path!r}") from None
        return self.dec(node, path)

    def dec(self, v: Any, path: str) -> Any:
        cls = v.__class__
        if cls is list:
            if path in self.table:
                return self.table[path]
            out: list[Any] = []
            self.table[path] = out
            leaf = _JSON_LEAF
            for i, x in enumerate(v):
                out.append(x if x.__class__ in leaf else self.dec(x, f"{path}/{i}"))
            return out
        if cls is not dict:
            if cls in _SCALARS or cls is int or cls is float:
                return v
            raise PyStateError(f"{path}: {cls.__name__} is not JSON data")
        if path in self.table:
            return self.table[path]
        tag = None
        for k in v:
            if k[:1] == "$":
                rank = _TAG_RANK.get(k)
                if rank is not None and (tag is None or rank < _TAG_RANK[tag]):
                    tag = k
        if tag is None:
            d: dict[str, Any] = {}
            self.table[path] = d
            return self._fields(v, path, d)
        body = v[tag]
        if tag == "$ref":
            return self.at(body)
        if tag == "$int":
            return int(body)
        if tag == "$float":
            return float(body)
        if tag == "$tuple":
            return tuple(self.dec(x, f"{path}/$tuple/{i}") for i, x in enumerate(body))
        if tag == "$bytes":
            return base64.b64decode(body)
        if tag == "$frozenset":
            return frozenset(self.dec(x, f"{path}/$frozenset/{i}") for i, x in enumerate(body))
        if tag == "$global":
            return self.resolve(body, path, call=False)
        if tag == "$dict":
            d = {}
            self.table[path] = d
            for i, (k, x) in enumerate(body):
                d[self.dec(k, f"{path}/$dict/{i}/0")] = self.dec(x, f"{path}/$dict/{i}/1")
            return d
        if tag == "$set":
            s: set[Any] = set()
            self.table[path] = s
            s.update(self.dec(x, f"{path}/$set/{i}") for i, x in enumerate(body))
            return s
        if tag == "$bytearray":
            b = bytearray(base64.b64decode(body))
            self.table[path] = b
            return b
        if tag == "$class":
            return self._object(v, path)
        return self._reduce(v, path)

    def _fields(self, v: dict[str, Any], path: str, out: dict[str, Any], skip_tags: bool = False) -> dict[str, Any]:
        """``v``'s items decoded into ``out`` (JSON scalars as themselves, without a call);
        ``skip_tags``: leave out keys starting with ``$`` (an object's tags)."""
        leaf = _JSON_LEAF
        for k, x in v.items():
            if skip_tags and k[:1] == "$":
                continue
            out[k] = x if x.__class__ in leaf else self.dec(x, f"{path}/{_esc(k)}")
        return out

    def _state_dict(self, node: Any, path: str) -> dict[str, Any]:
        if isinstance(node, dict) and "$dict" in node:
            return {self.dec(k, f"{path}/$dict/{i}/0"): self.dec(x, f"{path}/$dict/{i}/1")
                    for i, (k, x) in enumerate(node["$dict"])}
        return {k: self.dec(x, f"{path}/{_esc(k)}") for k, x in node.items()}

    def _object(self, v: dict[str, Any], path: str) -> Any:
        cls = self.resolve(v["$class"], path, call=True)
        obj = cls.__new__(cls)
        self.table[path] = obj
        if "$state" in v:
            _set_state(obj, self.dec(v["$state"], f"{path}/$state"))
            return obj
        if "$attrs" in v:
            attrs = self._state_dict(v["$attrs"], f"{path}/$attrs")
        else:
            attrs = self._fields(v, path, {}, skip_tags=True)
        if "$slots" in v:
            _set_state(obj, (attrs or None, self._state_dict(v["$slots"], f"{path}/$slots")))
        elif attrs or getattr(cls, "__setstate__", None) is not None:
            _set_state(obj, attrs)
        return obj

    def _reduce(self, v: dict[str, Any], path: str) -> Any:
        func = self.resolve(v["$reduce"], path, call=True)
        self.busy.add(path)
        try:
            args = [self.dec(a, f"{path}/$args/{i}") for i, a in enumerate(v.get("$args", []))]
        finally:
            self.busy.discard(path)
        _check_call(v["$reduce"], func, args, path)
        try:
            obj = func(*args)
        except Exception as exc:
            raise PyStateError(f"{path}: rebuilding {v['$reduce']} failed: {type(exc).__name__}: {exc}") from None
        self.table[path] = obj
        if "$state" in v:
            _set_state(obj, self.dec(v["$state"], f"{path}/$state"))
        for i, x in enumerate(v.get("$items", ())):
            item = self.dec(x, f"{path}/$items/{i}")
            if hasattr(obj, "extend"):
                obj.extend([item])
            else:
                obj.append(item)
        for i, (k, x) in enumerate(v.get("$kv", ())):
            obj[self.dec(k, f"{path}/$kv/{i}/0")] = self.dec(x, f"{path}/$kv/{i}/1")
        return obj


MAX_DECODE_SIZE = 1 << 24
"""The most bytes or items one constructor call of a document may be asked to make out of a
number (``bytes(n)``, ``list(range(n))``): a few dozen bytes of JSON must not allocate
gigabytes. Documents :func:`encode` writes never ask for any (bytes travel as ``$bytes``)."""
MAX_DECODE_EXPONENT = 10_000
"""The largest decimal exponent a ``Fraction`` or a conversion of a ``Decimal`` may expand
(``Fraction("1e999999999")``, ``int(Decimal("1e999999999"))`` take minutes and gigabytes)."""
_EXPONENT = re.compile(r"[eE]\s*([+-]?[\d_]+)")


def _check_call(ref: str, func: Any, args: list[Any], path: str) -> None:
    """Refuse a constructor call whose arguments would make it allocate without bound."""
    target, call_args = func, list(args)
    if ref == "copyreg:__newobj__" and call_args:
        target, call_args = call_args[0], call_args[1:]
    elif ref == "copyreg:__newobj_ex__" and call_args:
        target = call_args[0]
        more = call_args[1] if len(call_args) > 1 else ()
        kw = call_args[2] if len(call_args) > 2 else {}
        call_args = list(more) if isinstance(more, (tuple, list)) else [more]
        call_args += list(kw.values()) if isinstance(kw, dict) else [kw]
    sized = isinstance(target, type) and issubclass(target, (bytes, bytearray))
    fraction = isinstance(target, type) and issubclass(target, fractions.Fraction)
    for a in call_args:
        why = None
        if sized and a.__class__ is int and a > MAX_DECODE_SIZE:
            why = f"a buffer of {a:,} bytes"
        elif isinstance(a, range):
            try:
                n = len(a)
            except OverflowError:
                n = MAX_DECODE_SIZE + 1
            if n > MAX_DECODE_SIZE:
                why = f"{n:,} items from a range"
        elif isinstance(a, decimal.Decimal) and a.is_finite() and abs(a.adjusted()) > MAX_DECODE_EXPONENT:
            why = f"a Decimal of exponent {a.adjusted():,}"
        elif fraction and isinstance(a, str):
            m = _EXPONENT.search(a)
            digits = m.group(1).replace("_", "") if m else ""
            if digits.lstrip("+-") and abs(int(digits[:12])) > MAX_DECODE_EXPONENT:
                why = f"a Fraction of exponent {digits[:12]}"
        if why:
            raise PyStateError(f"{path}: refusing {ref}(...): it would make {why} (the limits are "
                               f"envfactory.factory.classes.pystate.MAX_DECODE_SIZE = {MAX_DECODE_SIZE:,} and "
                               f"MAX_DECODE_EXPONENT = {MAX_DECODE_EXPONENT:,})")


def _set_state(obj: Any, state: Any) -> None:
    """What pickle does with an object's state."""
    setstate = getattr(obj, "__setstate__", None)
    if setstate is not None:
        setstate(state)
        return
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        obj.__dict__.update(state)
    if slots:
        for k, x in slots.items():
            setattr(obj, k, x)


def decode(doc: dict[str, Any], trusted: tuple[str, ...] = ()) -> dict[str, Any]:
    """``{field: value}`` from a document made by :func:`encode`."""
    version = doc.get(FORMAT_KEY)
    if version != FORMAT_VERSION:
        raise PyStateError(f"not a pystate document of version {FORMAT_VERSION} (got {version!r})")
    d = _Decoder(doc, tuple(trusted))
    try:
        with _NoGC():
            return {k: d.dec(x, "/" + _esc(k)) for k, x in doc.items() if k != FORMAT_KEY}
    except PyStateError:
        raise
    except Exception as exc:  # a malformed document: wrong shapes under the tags, nested too deep
        raise PyStateError(f"not a valid pystate document: {type(exc).__name__}: {str(exc)[:500]}") from None


# -- copying ----------------------------------------------------------------------------------
_PLAIN: dict[type, bool] = {}
_OBJ_REDUCE_EX, _OBJ_REDUCE = object.__reduce_ex__, object.__reduce__
_OBJ_GETSTATE = getattr(object, "__getstate__", None)


def _plain_class(cls: type) -> bool:
    """Whether deepcopy of an instance is ``new = cls.__new__(cls); new.__dict__ = deepcopy(dict)``."""
    ok = _PLAIN.get(cls)
    if ok is None:
        ok = (getattr(cls, "__deepcopy__", None) is None
              and getattr(cls, "__reduce_ex__", None) is _OBJ_REDUCE_EX
              and getattr(cls, "__reduce__", None) is _OBJ_REDUCE
              and getattr(cls, "__getstate__", None) is _OBJ_GETSTATE
              and getattr(cls, "__setstate__", None) is None
              and getattr(cls, "__getnewargs__", None) is None and getattr(cls, "__getnewargs_ex__", None) is None
              and not any("__slots__" in vars(k) for k in cls.__mro__[:-1])
              and cls.__mro__[-1] is object and len(cls.__mro__) >= 2
              and all(b.__flags__ & (1 << 9) for b in cls.__mro__[:-1]))  # Py_TPFLAGS_HEAPTYPE: pure Python
        _PLAIN[cls] = ok
    return ok


def graph_copy(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """A deep copy that keeps shared references and cycles (as :func:`copy.deepcopy`, and
    equal to it), faster on dicts, lists, sets and plain objects; one ``memo`` for a
    whole graph copied in parts."""
    memo = {} if memo is None else memo
    return _gc(value, memo)


def _gc(x: Any, memo: dict[int, Any]) -> Any:
    cls = x.__class__
    if cls in _IMMUTABLE:
        return x
    i = id(x)
    y = memo.get(i)
    if y is not None:
        return y
    imm = _IMMUTABLE
    if cls is dict or cls is CowDict:
        y = memo[i] = {}
        for k, v in x.items():
            if k.__class__ not in imm:
                k = _gc(k, memo)
            y[k] = v if v.__class__ in imm else _gc(v, memo)
        return y
    if cls is list or cls is CowList:
        y = memo[i] = []
        y += [v if v.__class__ in imm else _gc(v, memo) for v in list.__iter__(x)]
        return y
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _plain_class(cls)
    if plain:
        y = memo[i] = cls.__new__(cls)
        y.__dict__ = {k: (v if v.__class__ in imm else _gc(v, memo)) for k, v in x.__dict__.items()}
        return y
    if cls is set:
        if all(v.__class__ in imm for v in x):
            y = set(x)
        else:
            y = {_gc(v, memo) for v in x}
        memo[i] = y
        return y
    if cls is tuple:
        items = [v if v.__class__ in imm else _gc(v, memo) for v in x]
        if i in memo:  # a cycle through the tuple
            return memo[i]
        y = x if all(a is b for a, b in zip(items, x)) else tuple(items)
        memo[i] = y
        return y
    return _copy_mod.deepcopy(x, memo)


def _plain(v: Any, seen: set[int]) -> bool:
    """Whether ``v`` is JSON data that :func:`encode` writes as itself: dicts with string keys
    not starting with ``$``, lists, strings, booleans, ``None``, finite floats, integers up
    to 2**53, no container reached twice."""
    cls = v.__class__
    if cls is str or cls is bool or v is None:
        return True
    if cls is int:
        return -_MAX_EXACT <= v <= _MAX_EXACT
    if cls is float:
        return v - v == 0.0
    if cls is dict or cls is CowDict:
        i = id(v)
        if i in seen:
            return False
        seen.add(i)
        for k, x in v.items():
            if k.__class__ is not str or k[:1] == "$" or not _plain(x, seen):
                return False
        return True
    if cls is list or cls is CowList:
        i = id(v)
        if i in seen:
            return False
        seen.add(i)
        for x in v:
            if not _plain(x, seen):
                return False
        return True
    return False


# -- the state model --------------------------------------------------------------------------
class PyState(State):
    """A world of arbitrary (picklable) Python values, one per field.

    Subclasses are generated by :func:`~envfactory.factory.from_class`, which makes
    :func:`~envfactory.state.copy_state` copy on write (:func:`lazy_state_copy`); the
    copy, when a tool needs one (:func:`own`), is one graph copy of every field with
    ``__pystate_graph__`` (several instances, or attributes that point into each
    other), otherwise the engine's fast plain-data copier per field. Dumps and loads
    always go through :func:`encode` / :func:`decode`.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False, arbitrary_types_allowed=True)

    __pystate_trusted__: ClassVar[tuple[str, ...]] = ()
    __pystate_graph__: ClassVar[bool] = False
    __json_dump_is_fresh__: ClassVar[bool] = True  # model_dump below: encode() builds it, or a JSON copy
    __hash_on_demand__: ClassVar[bool] = True  # a multi-MB database is hashed only for a judgment that needs it
    # the copier copy_state looks for (envfactory.state); set per class, so declared without a value
    __state_copy__: ClassVar[Any]
    # the quota's measure (envfactory.quotas.state_size), set per class like the copier
    __state_size__: ClassVar[Any]
    __canonical_json__: ClassVar[Any]  # the hash's text (envfactory.state.canonical_json), likewise

    @model_serializer(mode="plain")
    def _pystate_dump(self, info: SerializationInfo) -> dict[str, Any]:
        d = self.__dict__
        seen: set[int] = set()
        if all(_plain(v, seen) for v in d.values()):  # the document is the data itself (pydantic copies it)
            out = {FORMAT_KEY: FORMAT_VERSION, **d}
        else:
            out = encode(d, type(self).__pystate_trusted__)
        if info.mode_is_json():  # what the episode has seen travels with the state, outside its hash
            self._add_seen(out)
        return out

    def _add_seen(self, out: dict[str, Any]) -> None:
        priv = self.__pydantic_private__
        if priv is not None and "_seen" in priv:
            out[SEEN_KEY] = sorted(priv["_seen"])

    def model_dump(self, *, mode: str = "python", **kwargs: Any) -> dict[str, Any]:
        """As pydantic's, and for ``model_dump(mode="json")`` (what worlds dump and snapshots
        carry) the same document without pydantic walking it again: :func:`encode` makes it
        fresh, and a document of plain data is copied through C ``json`` (it is JSON data)."""
        if mode != "json" or kwargs:
            return super().model_dump(mode=mode, **kwargs)
        d = self.__dict__
        seen: set[int] = set()
        if all(_plain(v, seen) for v in d.values()):
            out = {FORMAT_KEY: FORMAT_VERSION, **json.loads(json.dumps(d))}
        else:
            out = encode(d, type(self).__pystate_trusted__)
        self._add_seen(out)
        return out

    @classmethod
    def __json_load_copies__(cls, data: Any) -> bool:
        """A document (``{"$pystate": 1, ...}``) is decoded (:func:`decode`), which builds every
        container anew."""
        return isinstance(data, dict) and FORMAT_KEY in data

    @model_validator(mode="wrap")
    @classmethod
    def _pystate_load(cls, data: Any, handler: Any) -> Any:
        results = None
        if isinstance(data, dict) and FORMAT_KEY in data:
            if SEEN_KEY in data:
                data = dict(data)
                results = data.pop(SEEN_KEY)
                if not isinstance(results, list) or not all(isinstance(r, str) for r in results):
                    raise PyStateError(f"{SEEN_KEY}: a list of result digests, got {results!r}")
            data = decode(data, cls.__pystate_trusted__)
        out = handler(data)
        if results is not None:
            object.__setattr__(out, "__pydantic_private__", {"_seen": set(results)})
        return out

    def __eq__(self, other: Any) -> bool:
        """Equal fields (the results an episode has seen are not part of the world)."""
        if not isinstance(other, BaseModel):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]


def result_digest(text: str) -> str:
    """The digest under which a tool result is recorded (:func:`note_result`)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def record_results(state: Any) -> Any:
    """Make the tools record, on ``state`` and every copy of it, the results they return
    (:func:`note_result`); returns ``state``. Only states of tasks whose check looks at the
    reads record anything, so every other state dumps exactly as before."""
    priv = state.__pydantic_private__
    if priv is None:
        object.__setattr__(state, "__pydantic_private__", {"_seen": set()})
    else:
        priv.setdefault("_seen", set())
    return state


def note_result(state: Any, text: str) -> None:
    """Record that a tool call on ``state`` returned ``text`` (the observation an agent saw),
    if the state records results (:func:`record_results`).

    Kept beside the fields (pydantic's private slot), so the world's hash and equality
    ignore it, while forks copy it and JSON dumps carry it (``"$seen"``): a read-only
    task's check asks whether its reference's read results are among these."""
    priv = state.__pydantic_private__
    if priv is not None:
        seen = priv.get("_seen")
        if seen is not None:
            seen.add(result_digest(text))


def seen_results(state: Any) -> frozenset[str]:
    """The digests of the tool results recorded on ``state`` (:func:`note_result`)."""
    priv = getattr(state, "__pydantic_private__", None)
    return frozenset(priv.get("_seen", ())) if priv else frozenset()


class _Share:
    """How many states hold one set of field values (copy on write, :func:`lazy_state_copy`)."""

    __slots__ = ("n", "lock")

    def __init__(self) -> None:
        self.n = 1
        self.lock = threading.Lock()

    def __reduce__(self) -> Any:  # a pickled or deep-copied state owns what it holds
        return (_Share, ())


def lazy_state_copy(value: PyState) -> PyState:
    """:func:`~envfactory.state.copy_state` for a :class:`PyState`: copy on write.

    The copy shares the field values (an O(fields) fork, whatever the state's size) and a
    share count with ``value``; the first tool call on either side (:func:`own`, which
    every ``from_class`` tool runs first) copies that side's values, as one graph
    (:func:`graph_state_copy`) or field by field, so the other keeps the originals. Only
    tools may change a state in place (the engine's rule): reading, hashing, dumping and
    forking a shared state copy nothing."""
    priv = value.__pydantic_private__
    if priv is None:
        priv = {}
        object.__setattr__(value, "__pydantic_private__", priv)
    share = priv.get("_cow")
    if share is None:
        share = priv["_cow"] = _Share()
        weakref.finalize(value, _release, priv).atexit = False
    with share.lock:
        share.n += 1
    new = object.__new__(value.__class__)
    object.__setattr__(new, "__dict__", dict(value.__dict__))
    object.__setattr__(new, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
    object.__setattr__(new, "__pydantic_extra__", None)
    mine: dict[str, Any] = {"_cow": share}
    seen = priv.get("_seen")
    if seen is not None:
        mine["_seen"] = set(seen)
    object.__setattr__(new, "__pydantic_private__", mine)
    weakref.finalize(new, _release, mine).atexit = False  # a fork dropped unused gives its share back
    return new


def cow_state_copy(value: PyState) -> PyState:
    """:func:`~envfactory.state.copy_state` for a :class:`PyState` of attributes: copy on write
    per container (:mod:`~envfactory.factory.classes.cow`). The copy shares the field values (an O(fields) fork, whatever
    the state's size); both sides lose their token, so each one's next tool call (run under
    :class:`~envfactory.factory.classes.cow.armed`) copies only the dicts and lists it reaches (a table and a record,
    not the database), and every other value it holds once."""
    priv = value.__pydantic_private__
    if priv is not None:
        priv.pop("_tok", None)
        priv.pop("_mine", None)
    new = object.__new__(value.__class__)
    object.__setattr__(new, "__dict__", dict(value.__dict__))
    object.__setattr__(new, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
    object.__setattr__(new, "__pydantic_extra__", None)
    mine: dict[str, Any] | None = None
    seen = priv.get("_seen") if priv is not None else None
    if seen is not None:
        mine = {"_seen": set(seen)}
    object.__setattr__(new, "__pydantic_private__", mine)
    return new


def _release(priv: dict[str, Any]) -> None:
    share = priv.get("_cow")
    if share is not None:
        with share.lock:
            if share.n > 1:
                share.n -= 1


def own(state: Any) -> None:
    """Before a tool changes ``state`` in place: if its values are shared with a copy
    (:func:`lazy_state_copy`), give it its own copy of them first."""
    priv = state.__pydantic_private__
    if priv is None:
        return
    share = priv.get("_cow")
    if share is None or share.n == 1:  # the sharer that copies last sees 1 only after the copy
        return
    with share.lock:
        if share.n == 1:
            return
        d = state.__dict__
        with _NoGC():
            if state.__class__.__pystate_graph__:
                memo: dict[int, Any] = {}
                new = {k: (v if v.__class__ in _IMMUTABLE else _gc(v, memo)) for k, v in d.items()}
            else:
                from envfactory.state import _copy

                new = {k: _copy(v) for k, v in d.items()}
        d.update(new)
        priv["_cow"] = _Share()
        share.n -= 1


def graph_state_copy(value: PyState) -> PyState:
    """:func:`~envfactory.state.copy_state` for a graph :class:`PyState`: all fields in one copy."""
    cls = value.__class__
    memo: dict[int, Any] = {}
    d = {k: (v if v.__class__ in _IMMUTABLE else _gc(v, memo)) for k, v in value.__dict__.items()}
    new = object.__new__(cls)
    object.__setattr__(new, "__dict__", d)
    object.__setattr__(new, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
    object.__setattr__(new, "__pydantic_extra__", None)
    priv = value.__pydantic_private__
    object.__setattr__(new, "__pydantic_private__", None if priv is None else {
        k: (set(v) if v.__class__ is set else _copy_mod.deepcopy(v)) for k, v in priv.items()})
    return new
