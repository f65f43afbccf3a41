"""Per-session quotas: how large a world's state and a turn's observation may grow.

Both runtimes enforce the same quotas with the same code (the container's server runs a
:class:`~envfactory.world.LocalWorld` too), so a session over a quota gets the same observation
in-process and in a container:

* :data:`MAX_STATE_BYTES` (default 32 MiB, half a wire frame, so a state at its quota crosses
  between host and container in one reply; ``ENVFACTORY_MAX_STATE_BYTES``): the state's size as
  its dump would write it (:func:`state_size`). A tool call that would take the state past it is
  that call's error observation (kind ``quota``), and the state is as it was before the call
  (a copy is taken before every writing call, and kept instead of the state after it when that
  is over), however much the one call grew it; the other calls of the turn run. Counting what a dump writes, not what Python holds, is what holds
  under copy-on-write sharing: a string copied 255 times costs nothing in memory but is written
  255 times by a snapshot, a fork into a container, or a reply.
* :data:`MAX_OBSERVATION_CHARS` (default 1 MiB of text; ``ENVFACTORY_MAX_OBSERVATION_CHARS``):
  the characters a turn's tool observations hold together. The observation that reaches the cap
  is cut there and ends with :data:`OBSERVATION_CUT`; later ones in the turn are that note alone.

Set the attributes (``envfactory.quotas.MAX_STATE_BYTES = ...``) or the environment variables
before import; a container is started with the host's values (at its creation).
"""

from __future__ import annotations

import os
import time
import weakref
from enum import Enum
from json.encoder import encode_basestring_ascii as _ascii_dump
from typing import Any, Callable, Sequence

from pydantic import BaseModel

from .sizes import MISSING as _MISSING, TDict, TList, TSet
from .state import _copy, class_hook, copy_state
from .tooling import ToolOutcome, stops_the_process

__all__ = ["MAX_STATE_BYTES", "MAX_OBSERVATION_CHARS", "STATE_QUOTA_PREFIX", "OBSERVATION_CUT", "state_size",
           "cut_observations", "invoke_within_quota", "cut_outcomes", "track", "track_fork"]

MAX_STATE_BYTES = int(os.environ.get("ENVFACTORY_MAX_STATE_BYTES", 32 << 20))
MAX_OBSERVATION_CHARS = int(os.environ.get("ENVFACTORY_MAX_OBSERVATION_CHARS", 1 << 20))

STATE_QUOTA_PREFIX = "Error: state quota exceeded"
OBSERVATION_CUT = ("\n[cut: this turn's tool observations reached their cap of "
                   "envfactory.quotas.MAX_OBSERVATION_CHARS characters (ENVFACTORY_MAX_OBSERVATION_CHARS)]")

_NUMBER = (int, float, bool)
_BIG = 10 ** 15  # an int within it writes at most 16 characters; one past it, about bit_length * log10(2)
FLOAT_BYTES = 12  # a float writes at most 24 characters ("-1.2345678901234567e-308"): half of it at most
_MODELS: set[type] = set()  # classes seen to be pydantic models
_LONG = 256  # a string longer than this is first checked for a character a dump escapes (_str_size)
_ESCAPED = bytes(range(32)) + b'"\\\x7f'  # the ASCII characters an ASCII dump escapes (\u0000..\u001f, \", \\, \u007f)
_SIZERS: dict[type, Callable[[Any, int | None], int]] = {}  # state class -> how to measure it


def state_size(state: Any, limit: int | None = None) -> int:
    """The bytes a JSON dump of ``state`` would write (a close estimate, computed without
    writing it): every string counted each time it occurs, exactly as an ASCII dump (the
    container's replies) writes it (:func:`_str_size`): a printable ASCII character at one byte, a
    control character, ``"`` and ``\\`` at their escapes (``\\u0000``, ``\\n``, ``\\"``), any other
    character at its ``\\uXXXX`` escape (so never less than the UTF-8 of the canonical dump, which
    writes such a character as itself). Stops counting once past
    ``limit`` (then returns a number over it), so a check costs at most ``limit`` worth of walking.
    A cycle (only a Python-object state can hold one; its dump writes a reference) counts once.
    A state class may bring its own measure of the same count (``__state_size__(state, limit)``:
    a copy-on-write state remembers what no state can change any more)."""
    return (_SIZERS.get(state.__class__) or _sizer_for(state.__class__))(state, limit)


def _sizer_for(cls: type) -> Callable[[Any, int | None], int]:
    """How :func:`state_size` measures a state of class ``cls``, chosen once per class: the
    class's own ``__state_size__``, the one-pass count of a model of scalars (else the walk), or
    the walk."""
    hook = class_hook(cls, "__state_size__")
    sizer: Callable[[Any, int | None], int]
    if hook is not None:
        def sizer(state: Any, limit: int | None) -> int:
            return int(hook(state, limit))
    elif issubclass(cls, BaseModel):
        sizer = _model_size
    else:
        sizer = _walk
    _SIZERS[cls] = sizer
    return sizer


def _model_size(state: Any, limit: int | None) -> int:
    """A model whose fields are all strings, numbers, booleans or None in one pass, counted as
    the walk counts them; any other model walked. (The quota's check after every call: one
    function, no call inside it, for the usual small state.)"""
    total = 2
    for k, x in state.__dict__.items():
        c = x.__class__
        if c is str:
            total += len(k) + 4 + (len(_ascii_dump(x)) if len(x) <= _LONG else _str_size(x))
        elif (c is int and -_BIG < x < _BIG) or c is bool or x is None:
            total += len(k) + 12
        elif c is float:
            total += len(k) + 4 + FLOAT_BYTES
        else:
            return _walk(state, limit)
    return total


def _str_size(s: str) -> int:
    """What a string writes in a dump, its quotes included: exactly what an ASCII dump
    (``ensure_ascii``: the container's replies) writes, ``len(encode_basestring_ascii(s))``; the
    canonical dump (``ensure_ascii=False``) writes no more bytes (a character past ASCII as its
    UTF-8, 2 to 4 bytes, not its 6- or 12-byte escape; ``\\x7f`` as itself). The measure's one
    count of a string: the walk, the ledger and the copy-on-write measure inline it for a string
    of at most :data:`_LONG` characters (the C encoder, one call); a longer ASCII string is
    first checked for a character the dump escapes (a third of the encoder's time)."""
    if len(s) > _LONG and s.isascii():
        b = s.encode()
        if len(b.translate(None, _ESCAPED)) == len(b):
            return len(b) + 2
    return len(_ascii_dump(s))


def _int_size(v: int) -> int:
    """What an int past :data:`_BIG` writes (its digits, and a sign), without writing it."""
    return v.bit_length() * 30103 // 100000 + 3


def _key_size(k: Any) -> int:
    """What a dict key writes (with its quotes and the colon and comma around it)."""
    c = k.__class__
    if c is str:
        return _str_size(k) + 2
    if c is int and not -_BIG < k < _BIG:
        return _int_size(k) + 4
    return 16


def _walk(state: Any, limit: int | None) -> int:
    """:func:`state_size` by walking the state (see there). A container met again (shared: a dump
    writes it at every place it appears) adds the size it had the first time, unwalked, so that
    ``rows = [rows, rows]`` nested 30 times costs 31 containers, not 2**31 (a walk of a state that
    does not change)."""
    cap = limit if limit is not None else 1 << 62
    esc = _ascii_dump
    total = 0
    stack: list[Any] = [state]
    seen: dict[int, int] = {}  # container (or long string) id -> its size; -1 while a container is walked
    push, pop = stack.append, stack.pop
    while stack:
        v = pop()
        c = v.__class__
        if c is str:
            if len(v) <= _LONG:
                total += len(esc(v))
            else:  # a long string met again (a file copied 255 times) is counted once, then looked up
                i = id(v)
                known = seen.get(i)
                if known is None:
                    known = seen[i] = _str_size(v)
                total += known
        elif c is int:
            total += 8 if -_BIG < v < _BIG else _int_size(v)
        elif c is float:
            total += FLOAT_BYTES
        elif c is bool or v is None:
            total += 8
        elif c is _Leave:
            seen[v.id] = total - v.start
            continue
        else:
            i = id(v)
            known = seen.get(i)
            if known is not None:
                total += known if known >= 0 else 16
                if total > cap:
                    return total
                continue
            if c is dict or c is TDict:
                seen[i] = -1
                push(_Leave(i, total))
                total += 2
                for k, x in v.items():  # strings inline (the _str_size of one within _LONG)
                    total += len(esc(k)) + 2 if k.__class__ is str and len(k) <= _LONG else _key_size(k)
                    if x.__class__ is str and len(x) <= _LONG:
                        total += len(esc(x))
                    else:
                        push(x)
            elif c is list or c is tuple or c is set or c is frozenset or c is TList or c is TSet:
                start = total
                total += 2 + len(v)
                rest = None
                for x in v:  # strings inline (the common leaves): no trip through the stack
                    if x.__class__ is str and len(x) <= _LONG:
                        total += len(esc(x))
                    elif rest is None:
                        rest = [x]
                    else:
                        rest.append(x)
                if rest:
                    seen[i] = -1
                    push(_Leave(i, start))
                    stack.extend(rest)
                else:
                    seen[i] = total - start
            elif c in _MODELS or isinstance(v, BaseModel):
                _MODELS.add(c)
                seen[i] = -1
                push(_Leave(i, total))
                total += 2
                for k, x in v.__dict__.items():
                    total += len(k) + 4
                    push(x)
            elif isinstance(v, str):  # a subclass: as a string
                total += _str_size(str.__str__(v))
            elif isinstance(v, (bytes, bytearray)):
                total += len(v) * 2 + 2
            elif isinstance(v, int):  # a subclass (an IntEnum): as an int
                total += 16 if -_BIG < v < _BIG else _int_size(int(v))
            elif isinstance(v, (_NUMBER, type, Enum)):
                total += 16
            elif isinstance(v, dict):  # a subclass: its items, as above
                seen[i] = -1
                push(_Leave(i, total))
                total += 2
                for k, x in v.items():
                    total += 4
                    push(k)
                    push(x)
            elif isinstance(v, (list, tuple, set, frozenset)):
                seen[i] = -1
                push(_Leave(i, total))
                total += 2 + len(v)
                stack.extend(v)
            else:  # any other Python object: its attributes (what a dump writes), else its repr
                d = getattr(v, "__dict__", None)
                total += 16
                if d.__class__ is dict:
                    seen[i] = -1
                    push(_Leave(i, total - 16))
                    push(d)
                else:
                    total += len(repr(v))
        if total > cap:
            return total
    return total


class _Leave:
    """A marker on the walk's stack: the container ``id``, whose walk began at the total
    ``start``, is walked (its size is known from here on)."""

    __slots__ = ("id", "start")

    def __init__(self, i: int, start: int) -> None:
        self.id = i
        self.start = start


def state_quota_error(name: str, size: int, applied: bool = False) -> str:
    """The error observation of a call that took the state past the quota: undone (always, but
    for a state that cannot be copied: then ``applied``, which the message says)."""
    what = ("it was applied (the state could not be copied before it, so it could not be undone), so the state is "
            "now over the quota" if applied else "it was not applied, and the state is as it was before it")
    return (f"{STATE_QUOTA_PREFIX}: this call of '{name}' would make the state more than "
            f"{MAX_STATE_BYTES} bytes as written by a dump (at least {size}); {what}. The quota is "
            "envfactory.quotas.MAX_STATE_BYTES (ENVFACTORY_MAX_STATE_BYTES).")


def state_unmeasured_error(name: str, exc: BaseException, applied: bool = False) -> str:
    """The error observation of a call after which the state could not be measured (a value in
    it whose ``repr`` or own measure fails): undone, as a call over the quota is."""
    what = "it was applied (the state could not be copied before it)" if applied else \
        "it was not applied, and the state is as it was before it"
    return (f"{STATE_QUOTA_PREFIX}: after this call of '{name}' the state's size could not be measured "
            f"({type(exc).__name__}); {what}.")


def cut_observations(contents: Sequence[str], room: int) -> tuple[list[str] | None, int]:
    """``contents`` cut to ``room`` characters together (``None``: nothing to cut), and the room
    left. The content that reaches the cap keeps what fits and ends with :data:`OBSERVATION_CUT`;
    every later non-empty one is that note alone. Cutting twice is cutting once at the smaller
    room, so the world (per batch) and the referee (per turn) agree on both runtimes."""
    out: list[str] | None = None
    for i, content in enumerate(contents):
        n = len(content)
        if n <= room:
            room -= n
            continue
        if out is None:
            out = list(contents)
        out[i] = content[:room] + OBSERVATION_CUT
        room = 0
    return out, room


# -- the measure kept per container (a large tracked state) ---------------------------------------
# A tracked state (:func:`track`) that :data:`ADOPT_AFTER` full measures after writing calls found
# at least :data:`LEDGER_BYTES` (``ENVFACTORY_LEDGER_BYTES``, ``ENVFACTORY_ADOPT_AFTER``) is, at
# its next writing call, adopted by a ledger (:mod:`envfactory.sizes`; the adoption costs about
# three full measures, so waiting for three first bounds what an episode too short to earn it back
# loses, and a fork written once pays none): its containers report every mutation while a
# writing call runs, and the measure after the call is the last one plus what the call removed
# (each removed part at its size before the call, kept per container) and what it added (walked
# after the call): proportional to the change, not the state. Whatever the ledger cannot vouch for
# falls back to the full measure for that call and drops the ledger (at most
# :data:`_ADOPTIONS` adoptions per journal): a mutation outside a writing call (a read-only tool
# that writes, a caller's own change between steps), a part put in two places (sharing, a cycle),
# a value of a type it does not know (any object but plain data and plain pydantic models), and a
# verdict over the quota, which the full measure confirms. A C-level write that skips the
# containers' methods (``dict.__setitem__(d, k, v)``) is what a tool may do and the ledger cannot
# see: each checkpoint of the journal (every so many calls, when it copies the state anyway) also
# measures the whole state and drops a ledger that disagrees.
LEDGER_BYTES = int(os.environ.get("ENVFACTORY_LEDGER_BYTES", 512))
ADOPT_AFTER = int(os.environ.get("ENVFACTORY_ADOPT_AFTER", 3))  # full measures of a large state before its adoption
_ADOPTIONS = 2
_LEAF_CLASSES = frozenset({str, int, float, bool, type(None)})
_NODE_CLASSES = frozenset({dict, list, set, TDict, TList, TSet})
_ADOPTABLE: dict[type, bool] = {}


class _Refuse(Exception):
    """The ledger cannot vouch for the state (a part in two places, an unknown value)."""


class _Over(Exception):
    """What a call added takes the state past the quota (the full measure confirms)."""


def _leaf(v: Any) -> int:
    """What an immutable value writes (as :func:`_walk` counts it), or -1 for a container, a model
    or anything that could change in place."""
    c = v.__class__
    if c is str:
        return len(_ascii_dump(v)) if len(v) <= _LONG else _str_size(v)
    if c is int:
        return 8 if -_BIG < v < _BIG else _int_size(v)
    if c is float:
        return FLOAT_BYTES
    if c is bool or v is None:
        return 8
    if c in _NODE_CLASSES or c in _MODELS:
        return -1
    if c is tuple or c is frozenset:
        for x in v:
            if x.__class__ not in _LEAF_CLASSES and _leaf(x) < 0:
                return -1
        return _walk(v, None)
    if isinstance(v, (dict, list, set, bytearray, BaseModel)):
        return -1
    if isinstance(v, (str, bytes, int, float, Enum, type)):
        return _walk(v, None)
    return -1


def _adoptable(cls: type) -> bool:
    """Whether a model class writes its fields only through ``model.__dict__[name] = value``
    (pydantic's own ``__setattr__``, no validated assignment, no extra fields) and brings no
    measure or copier of its own."""
    ok = _ADOPTABLE.get(cls)
    if ok is None:
        cfg = getattr(cls, "model_config", {})
        ok = _ADOPTABLE[cls] = (
            issubclass(cls, BaseModel) and cls.__setattr__ is BaseModel.__setattr__
            and cls.__delattr__ is BaseModel.__delattr__ and not cfg.get("validate_assignment")
            and cfg.get("extra") != "allow"
            and all(class_hook(cls, h) is None for h in ("__state_size__", "__state_copy__", "__canonical_json__")))
    return ok


class _Ledger:
    """A tracked state's size kept per container (see above)."""

    __slots__ = ("root", "total", "active", "stale", "dirty", "dead")

    def __init__(self) -> None:
        self.root: Any = None  # the state's __dict__ (a TDict)
        self.total = 0
        self.active = False  # a writing call runs
        self.stale = False  # something changed that the ledger cannot vouch for
        self.dirty: list[Any] = []  # the nodes changed in this call
        self.dead = False

    # what the containers report (sizes.TDict / TList / TSet) ---------------------------------
    def put(self, node: Any, key: Any, old: Any, new: Any) -> None:
        """A dict's (or a model's) slot ``key`` goes from ``old`` to ``new`` (_MISSING: none)."""
        if not self.active:
            self.stale = True
            return
        if node._dd is None:
            node._dd = 0
            self.dirty.append(node)
        ks = len(key) + 4 if node._km else _key_size(key)
        d = 0
        pending = node._new
        if old is not _MISSING:
            if pending is not None and key in pending:  # put there in this call: not counted yet
                if pending.pop(key) is not old:
                    self.stale = True
                    return
                d -= ks
            else:
                s = self._out(old)
                if s < 0:
                    self.stale = True
                    return
                d -= ks + s
        if new is not _MISSING:
            s = _leaf(new)
            if s >= 0:
                d += ks + s
            else:
                d += ks
                if pending is None:
                    pending = node._new = {}
                pending[key] = new
        node._dd += d

    def swap(self, node: Any, removed: Any, added: Any) -> None:
        """A list lost ``removed`` and gained ``added`` (its items, in any order)."""
        if not self.active:
            self.stale = True
            return
        if node._dd is None:
            node._dd = 0
            self.dirty.append(node)
        d = 0
        pending = node._new
        for e in removed:
            got = None if pending is None else pending.get(id(e))
            if got is not None:  # one of those put in this call (or the same object: the same size)
                got[1] -= 1
                if not got[1]:
                    del pending[id(e)]
                d -= 1
            else:
                s = self._out(e)
                if s < 0:
                    self.stale = True
                    return
                d -= 1 + s
        for e in added:
            s = _leaf(e)
            if s >= 0:
                d += 1 + s
            else:
                d += 1
                if pending is None:
                    pending = node._new = {}
                got = pending.get(id(e))
                if got is None:
                    pending[id(e)] = [e, 1]
                else:
                    got[1] += 1
        node._dd += d

    def grow(self, node: Any, value: Any, sign: int, exact: bool = False) -> None:
        """A set gained (1) or lost (-1) ``value`` (``exact``: that very member)."""
        if not self.active:
            self.stale = True
            return
        if node._dd is None:
            node._dd = 0
            self.dirty.append(node)
        s = _leaf(value) if value.__class__ is str or exact else -1
        if s < 0:
            node._new = True  # (1 == 1.0 == True: measured again after the call)
        else:
            node._dd += sign * (1 + s)

    def again(self, node: Any) -> None:
        """A set changed in bulk: measured again after the call."""
        if not self.active:
            self.stale = True
            return
        if node._dd is None:
            node._dd = 0
            self.dirty.append(node)
        node._new = True

    # removing and adding parts --------------------------------------------------------------------
    def _out(self, v: Any) -> int:
        """The size ``v`` had before the call (it leaves the state: its nodes leave the ledger), or
        -1 when it is not a part the ledger counted."""
        s = _leaf(v)
        if s >= 0:
            return s
        c = v.__class__
        node = v if c is TDict or c is TList or c is TSet else getattr(v, "__dict__", None)
        if node is None or node.__class__ is not TDict and c is not TList and c is not TSet or node._lg is not self:
            return -1
        s = node._sz
        stack = [node]
        while stack:
            n = stack.pop()
            if n._lg is not self:
                continue
            pending = n._new
            n._lg = n._up = n._dd = n._new = None
            if n.__class__ is TSet:
                continue
            if n.__class__ is TDict:
                items: Any = dict.items(n) if not pending else [(k, x) for k, x in dict.items(n) if k not in pending]
                for _, x in items:
                    c = x.__class__
                    if c is TDict or c is TList or c is TSet:
                        stack.append(x)
                    elif c not in _LEAF_CLASSES and isinstance(x, BaseModel):
                        stack.append(x.__dict__)
            else:
                for x in n:
                    c = x.__class__
                    if pending and id(x) in pending:
                        continue
                    if c is TDict or c is TList or c is TSet:
                        stack.append(x)
                    elif c not in _LEAF_CLASSES and isinstance(x, BaseModel):
                        stack.append(x.__dict__)
        return int(s)

    def _scan(self, v: Any, seen: set[int], cap: int) -> int:
        """The size of a part to adopt, without changing anything; raises :class:`_Refuse` for a part
        held twice (``seen``), held by the state already, or unknown, :class:`_Over` past ``cap``."""
        s = _leaf(v)
        if s >= 0:
            return s
        c = v.__class__
        i = id(v)
        if i in seen:
            raise _Refuse
        seen.add(i)
        scan = self._scan
        esc = _ascii_dump
        if c is dict or c is TDict:
            if c is TDict and v._lg is self:
                raise _Refuse
            total = 2
            for k, x in dict.items(v):
                total += len(esc(k)) + 2 if k.__class__ is str and len(k) <= _LONG else _key_size(k)
                xc = x.__class__  # (the usual leaves inline: no call)
                if xc is str:
                    total += len(esc(x)) if len(x) <= _LONG else _str_size(x)
                elif (xc is int and -_BIG < x < _BIG) or xc is bool or x is None:
                    total += 8
                else:
                    total += scan(x, seen, cap)
                if total > cap:
                    raise _Over
            return total
        if c is list or c is TList:
            if c is TList and v._lg is self:
                raise _Refuse
            total = 2 + len(v)
            for x in v:
                if x.__class__ is str and len(x) <= _LONG:
                    total += len(esc(x))
                else:
                    total += scan(x, seen, cap)
                if total > cap:
                    raise _Over
            return total
        if c is set or c is TSet:
            if c is TSet and v._lg is self:
                raise _Refuse
            total = 2 + len(v)
            for x in v:
                s = _leaf(x)
                if s < 0:
                    raise _Refuse
                total += s
                if total > cap:
                    raise _Over
            return total
        if (c in _MODELS or isinstance(v, BaseModel)) and _adoptable(c):
            _MODELS.add(c)
            d = v.__dict__
            if d.__class__ is TDict and d._lg is self:
                raise _Refuse
            if id(d) in seen:
                raise _Refuse
            seen.add(id(d))
            total = 2
            for k, x in dict.items(d):
                xc = x.__class__  # (the usual leaves inline: no call)
                if xc is str:
                    total += len(k) + 4 + (len(esc(x)) if len(x) <= _LONG else _str_size(x))
                elif (xc is int and -_BIG < x < _BIG) or xc is bool or x is None:
                    total += len(k) + 12
                elif xc is float:
                    total += len(k) + 4 + FLOAT_BYTES
                else:
                    total += len(k) + 4 + scan(x, seen, cap)
                if total > cap:
                    raise _Over
            return total
        raise _Refuse

    def _adopt(self, v: Any, up: Any) -> tuple[int, Any]:
        """``v`` (scanned) joins the ledger under node ``up``: its size, and what the parent holds
        in its place (a plain container becomes a tracked one; a model keeps its identity)."""
        s = _leaf(v)
        if s >= 0:
            return s, v
        c = v.__class__
        adopt = self._adopt
        esc = _ascii_dump
        if c is list or c is TList:
            node: Any = v if c is TList else TList(v)
            total = 2 + len(node)
            for i, x in enumerate(node):
                if x.__class__ is str and len(x) <= _LONG:
                    total += len(esc(x))
                    continue
                s, y = adopt(x, node)
                if y is not x:
                    list.__setitem__(node, i, y)
                total += s
        elif c is set or c is TSet:
            node = v if c is TSet else TSet(v)
            total = 2 + len(node)
            for x in node:
                total += _leaf(x)
        else:
            km = c is not dict and c is not TDict
            d = v.__dict__ if km else v
            node = d if d.__class__ is TDict else TDict(d)
            if km and node is not d:
                object.__setattr__(v, "__dict__", node)
            total = 2
            changed = None
            for k, x in dict.items(node):
                total += len(k) + 4 if km else len(esc(k)) + 2 if k.__class__ is str and len(k) <= _LONG else _key_size(k)
                xc = x.__class__  # (the usual leaves inline: no call)
                if xc is str:
                    total += len(esc(x)) if len(x) <= _LONG else _str_size(x)
                elif (xc is int and -_BIG < x < _BIG) or xc is bool or x is None:
                    total += 8
                elif xc is float:
                    total += FLOAT_BYTES
                else:
                    s, y = adopt(x, node)
                    if y is not x:
                        if changed is None:
                            changed = []
                        changed.append((k, y))
                    total += s
            if changed:
                for k, y in changed:
                    dict.__setitem__(node, k, y)
            node._km = km
            node._lg, node._up, node._dd, node._new, node._sz = self, up, None, None, total
            return total, (v if km else node)
        node._lg, node._up, node._dd, node._new, node._sz = self, up, None, None, total
        return total, node

    def adopt(self, state: Any, cap: int) -> int:
        """Take ``state`` on (its size); raises :class:`_Refuse` or :class:`_Over` (nothing changed)."""
        if not _adoptable(state.__class__):
            raise _Refuse
        try:
            if self._scan(state, set(), cap) > cap:
                raise _Over
            total, _ = self._adopt(state, None)
        except RecursionError:
            raise _Refuse from None
        self.root = state.__dict__
        self.total = total
        return total

    def settle(self, limit: int) -> int | None:
        """The state's size after a writing call (its changes counted), or ``None``: the ledger
        cannot vouch for it (then it is dead: measure the whole state). Raises :class:`_Over`."""
        dirty, self.dirty = self.dirty, []
        if self.stale or self.root._lg is not self:
            self.dead = True
            return None
        try:
            work = []
            freed = 0
            for node in dirty:
                d = node._dd
                if d is None or node._lg is not self:
                    continue
                node._dd = None
                if d < 0:
                    freed -= d
                work.append((node, d, node._new))
                node._new = None
            cap = limit - self.total + freed
            seen: set[int] = set()
            for node, d, pending in work:  # everything added is scanned before anything changes
                if pending and node.__class__ is not TSet:
                    for x in (pending.values() if node.__class__ is TDict else (e for e, n in pending.values())):
                        cap -= self._scan(x, seen, cap)
                        if cap < 0:
                            raise _Over
                    if node.__class__ is TList and any(n != 1 for _, n in pending.values()):
                        raise _Refuse
            for node, d, pending in work:
                c = node.__class__
                if pending:
                    if c is TSet:
                        d = 2 + len(node) - node._sz
                        for x in node:
                            s = _leaf(x)
                            if s < 0:
                                raise _Refuse
                            d += s
                    elif c is TDict:
                        for k, x in pending.items():
                            s, y = self._adopt(x, node)
                            if y is not x:
                                dict.__setitem__(node, k, y)
                            d += s
                    else:
                        for x, _ in pending.values():
                            s, y = self._adopt(x, node)
                            if y is not x:
                                for i in range(len(node) - 1, -1, -1):
                                    if list.__getitem__(node, i) is x:
                                        list.__setitem__(node, i, y)
                                        break
                            d += s
                if d:
                    n = node
                    while n is not None:
                        n._sz += d
                        n = n._up
        except (_Refuse, RecursionError):
            self.dead = True
            return None
        except _Over:
            self.dead = True
            raise
        self.total = self.root._sz
        return self.total

    def kill(self) -> None:
        self.dead = True
        self.active = False
        self.stale = True


# -- undoing a call ---------------------------------------------------------------------------------
# A call over the quota is undone, whatever it did. A state a world tracks (:func:`track`: every
# sole agent's state the worlds start, load or fork) is undone by replay: it keeps an origin that
# nothing changes (a task's initial state, or a copy taken when it was loaded, forked or last
# checkpointed) and every call run on it since (its tool, a copy of its arguments, what it
# answered); a call that takes it over the quota is undone by replaying those calls on a copy of
# the origin, each checked to answer as it did. So a call costs a copy of its arguments, not of
# the state, and a copy-on-write state (a class's own ``__state_copy__``) keeps its sharing: a
# copy before each call would cost it a whole copy at the call's first write, or make every call
# a fork boundary. A plain state starts a new origin (a copy) once its journal holds
# :data:`_CHECKPOINT_CALLS` calls, :data:`_CHECKPOINT_BYTES` of arguments or
# :data:`_CHECKPOINT_SECONDS` of tool time, so a replay stays short (a copy-on-write state only
# after an undo: a new origin is a fork boundary for it). A state whose checkpoint (its copy, and
# its ledger's check) took longer keeps its journal longer, in proportion (a call per
# :data:`_CHECKPOINT_CALL_SECONDS` of it, its time in tool time, 16 times the bytes at most): so
# a large state's checkpoint costs each call a constant share, not one proportional to the state,
# and an undo replays about what a checkpoint costs. An untracked state (a team's) is copied
# before each writing call instead (memoized), and the copy kept when the call goes over.
_CHECKPOINT_CALLS = 256
_CHECKPOINT_BYTES = 1 << 20
_CHECKPOINT_SECONDS = 0.05
_CHECKPOINT_CALL_SECONDS = 4e-6
_OWN_COPIER: dict[type, bool] = {}


class _Journal:
    """What rebuilds a tracked state: its origin and the calls since (see above)."""

    __slots__ = ("origin", "calls", "state", "bytes", "seconds", "own", "ledger", "adopts", "big", "limits")

    def __init__(self, origin: Any, calls: list[tuple[Any, Any, Any]] | None = None) -> None:
        self.origin = origin
        self.calls: list[tuple[Any, Any, Any]] = [] if calls is None else calls
        self.state: Any = None  # a weak reference to the state it rebuilds
        self.bytes = 0  # the journaled arguments' size (as the quota measures)
        self.seconds = 0.0  # the journaled calls' time: what a replay costs
        self.own = _own_copier(origin.__class__)
        self.ledger: _Ledger | None = None  # the state's size kept per container (a large state)
        self.adopts = 0  # the ledgers this journal's state was given
        self.big = 0  # the writing calls that found the state past LEDGER_BYTES (ADOPT_AFTER: the next one adopts it)
        self.limits: tuple[int, int, float] | None = None  # before the next checkpoint (None: the defaults)


_JOURNALS: dict[int, _Journal] = {}


def _limits(cost: float) -> tuple[int, int, float] | None:
    """A journal's checkpoint limits after a checkpoint that took ``cost`` seconds (see above;
    ``None``: the defaults)."""
    if cost <= _CHECKPOINT_SECONDS:
        return None
    return (max(_CHECKPOINT_CALLS, int(cost / _CHECKPOINT_CALL_SECONDS)),
            int(_CHECKPOINT_BYTES * min(16.0, cost / _CHECKPOINT_SECONDS)), cost)


def _own_copier(cls: type) -> bool:
    own = _OWN_COPIER.get(cls)
    if own is None:
        own = _OWN_COPIER[cls] = class_hook(cls, "__state_copy__") is not None
    return own


def _forget(ref: Any, i: int) -> None:
    j = _JOURNALS.get(i)
    if j is not None and j.state is ref:
        del _JOURNALS[i]


def _attach(state: Any, journal: _Journal) -> None:
    i = id(state)
    try:
        journal.state = weakref.ref(state, lambda ref: _forget(ref, i))
    except TypeError:  # not weakly referenceable: undone by a copy instead
        return
    _JOURNALS[i] = journal


def _journal(state: Any) -> _Journal | None:
    j = _JOURNALS.get(id(state))
    if j is not None and j.state() is state:
        return j
    return None


def track(state: Any, origin: Any = None) -> None:
    """Undo ``state``'s calls by replay (see above), from ``origin``: a state equal to it that
    nothing will change (``None``: a copy taken here). Worlds call it when they start, load or fork
    a sole agent's state; a state never tracked is copied before each writing call instead."""
    _attach(state, _Journal(copy_state(state) if origin is None else origin))


def track_fork(child: Any, parent: Any) -> None:
    """``child`` is a fresh copy of ``parent``: it is rebuilt from the same origin and calls."""
    j = _journal(parent)
    if j is not None:
        new = _Journal(j.origin, list(j.calls))
        new.bytes, new.seconds = j.bytes, j.seconds
        new.limits = j.limits  # (the parent's checkpoint limits: a journal past the defaults is not copied at once)
        _attach(child, new)
    else:
        track(child)


def fresh_copy(copy: Any, original: Any) -> None:
    """Note that ``copy`` is a fresh copy of ``original`` (a task's initial state, copied by
    ``reset``, which nothing changes): the calls on it are undone by replay from ``original``."""
    _attach(copy, _Journal(original))


def _rebuild(journal: _Journal) -> tuple[Any, bool]:
    """A state rebuilt from ``journal``'s origin and calls, and whether every call answered as it
    did (when not, a tool that does not answer the same twice: the state is what they gave now)."""
    state = copy_state(journal.origin)
    same = True
    for tool, arguments, was in journal.calls:
        out = tool.invoke(state, _copy(arguments) if arguments.__class__ is dict else arguments)
        if _answer(out) != was:
            same = False
    return state, same


def _answer(out: ToolOutcome) -> tuple[Any, ...]:
    """What a replayed call must answer again (a long observation by its length and hash, so that
    the journal holds no more of it)."""
    c = out.content
    return (out.ok, out.kind, c if len(c) <= 1024 else (len(c), hash(c)))


def _undo_by_replay(journal: _Journal, tool: Any, error: str) -> tuple[ToolOutcome, Any]:
    state, same = _rebuild(journal)
    if len(journal.calls) > _CHECKPOINT_CALLS or journal.seconds > _CHECKPOINT_SECONDS:
        journal = _Journal(copy_state(state))  # (the next undo replays nothing of this)
    _attach(state, journal)
    if not same:
        error += (" (It was undone by replaying the episode's earlier calls, which did not all answer as they "
                  "did: the state is what they gave now.)")
    return ToolOutcome(error, False, "quota"), state


def invoke_within_quota(tool: Any, state: Any, arguments: Any) -> tuple[Any, Any]:
    """Run ``tool`` on ``state``: ``(outcome, the state to keep)``, the state checked before it is
    kept. After a tool that may change the state (not ``read_only``) the state is measured,
    stopping at :data:`MAX_STATE_BYTES`; over it (however much the one call grew it), or when it
    cannot be measured, the outcome is the quota error and the state to keep is exactly the state
    before the call: for a tracked state (:func:`track`) the state rebuilt by replaying its calls
    since its origin, else a copy taken before the call (:func:`~envfactory.state.copy_state`,
    memoized). A state that can be neither copied nor replayed (a value ``copy.deepcopy`` refuses)
    keeps a call that goes over, which its error says.

    Cost per writing call: the measure (linear in the state's size) and, for a tracked state, a
    copy of the call's arguments (a copy of the state every so many calls); for an untracked one a
    copy of the state. ``read_only`` tools add nothing (they are trusted not to write; on a
    copy-on-write state they are journaled too: the results a state records are replayed)."""
    j = _JOURNALS.get(id(state))
    if j is not None and j.state() is state:
        size, kept = 0, arguments
        if arguments.__class__ is dict:
            for v in arguments.values():  # the usual arguments (strings and numbers): a shallow copy
                c = v.__class__
                if c is str:
                    size += len(v) + 8
                elif c in _NUMBER or v is None:
                    size += 16
                else:
                    kept = _copy(arguments)
                    size = _walk(kept, _CHECKPOINT_BYTES)
                    break
            else:
                kept = arguments.copy()
        began = time.perf_counter()
        lg = j.ledger
        if lg is not None and not tool.read_only:
            lg.active = True
            try:
                out = tool.invoke(state, arguments)
            finally:
                lg.active = False
        else:
            out = tool.invoke(state, arguments)
        took = time.perf_counter() - began
        if not tool.read_only:
            if lg is None and j.big < ADOPT_AFTER:  # (as before: one full measure, stopping past the quota)
                sizer = _SIZERS.get(state.__class__) or _sizer_for(state.__class__)
                try:
                    measured = sizer(state, MAX_STATE_BYTES)
                except BaseException as exc:  # noqa: BLE001 - a value whose repr (or a class's own measure) fails
                    if stops_the_process(exc):
                        raise
                    return _undo_by_replay(j, tool, state_unmeasured_error(tool.name, exc))
                if measured > MAX_STATE_BYTES:
                    return _undo_by_replay(j, tool, state_quota_error(tool.name, measured))
                if measured >= LEDGER_BYTES:
                    j.big += 1
            else:
                error = _check_tracked(j, tool, state)
                if error is not None:
                    return _undo_by_replay(j, tool, error)
        elif not j.own:  # a plain state's reads change nothing: no need to replay them
            return out, state
        if out.kind == "invalid_arguments":  # (it ran nothing)
            return out, state
        j.calls.append((tool, kept, _answer(out)))
        j.seconds += took
        j.bytes += size
        lim = j.limits
        if not j.own and ((len(j.calls) >= _CHECKPOINT_CALLS or j.bytes >= _CHECKPOINT_BYTES
                           or j.seconds >= _CHECKPOINT_SECONDS) if lim is None else
                          (len(j.calls) >= lim[0] or j.bytes >= lim[1] or j.seconds >= lim[2])):
            began = time.perf_counter()
            new = _Journal(copy_state(state))
            new.big = j.big
            lg = j.ledger
            if lg is not None:  # the copy is O(state) anyway: the ledger is checked against the full measure
                if not lg.dead and _walk(state, None) == lg.total:
                    new.ledger = lg
                else:
                    lg.kill()
            new.limits = _limits(time.perf_counter() - began)
            _attach(state, new)
        return out, state
    if tool.read_only:
        return tool.invoke(state, arguments), state
    try:
        backup = copy_state(state)
    except BaseException as exc:  # noqa: BLE001 - a value that cannot be copied: the call runs without an undo
        if stops_the_process(exc):
            raise
        backup = None
    out = tool.invoke(state, arguments)
    error = _over_quota(tool, state, applied=backup is None)
    if error is None:
        return out, state
    return ToolOutcome(error, False, "quota"), state if backup is None else backup


def _over_quota(tool: Any, state: Any, applied: bool) -> str | None:
    """The quota error for ``state`` after a call of ``tool``, or ``None`` when within it."""
    return _measured(tool, state, applied)[1]


def _measured(tool: Any, state: Any, applied: bool) -> tuple[int, str | None]:
    """``(the state's size, the quota error or None)`` by the full measure (stopping past the quota)."""
    sizer = _SIZERS.get(state.__class__) or _sizer_for(state.__class__)
    limit = MAX_STATE_BYTES
    try:
        size = sizer(state, limit)
    except BaseException as exc:  # noqa: BLE001 - a value whose repr (or a class's own measure) fails
        if stops_the_process(exc):
            raise
        return -1, state_unmeasured_error(tool.name, exc, applied=applied)
    return size, None if size <= limit else state_quota_error(tool.name, size, applied=applied)


def _check_tracked(j: _Journal, tool: Any, state: Any) -> str | None:
    """The quota error after a writing call on a tracked state, or ``None``: by its ledger when it
    has one that vouches for the call and finds it within the quota, else by the full measure
    (a state found past :data:`LEDGER_BYTES` :data:`ADOPT_AFTER` times is adopted by a ledger at its
    next writing call)."""
    lg = j.ledger
    if lg is not None:
        try:
            size: int | None = lg.settle(MAX_STATE_BYTES)
        except _Over:
            size = None
        if size is not None and size <= MAX_STATE_BYTES:
            return None
        j.ledger = None  # (over the quota, or not vouched for: the full measure decides)
        lg.kill()
    elif j.adopts < _ADOPTIONS and not j.own and _adoptable(state.__class__):
        # a state found large by ADOPT_AFTER writing calls: adopted (its measure is the adoption's own walk)
        j.adopts += 1
        lg = _Ledger()
        try:
            lg.adopt(state, MAX_STATE_BYTES)
            j.ledger = lg
            return None
        except (_Refuse, _Over):  # (nothing changed: the full measure decides)
            lg.kill()
    size, error = _measured(tool, state, applied=False)
    if error is None and size >= LEDGER_BYTES:
        j.big += 1
    return error


def cut_outcomes(outcomes: list[ToolOutcome], room: int) -> tuple[list[ToolOutcome], int]:
    """:func:`cut_observations` over tool outcomes (the same list when nothing is cut)."""
    cut, room = cut_observations([o.content for o in outcomes], room)
    if cut is None:
        return outcomes, room
    return [o if c is o.content else ToolOutcome(c, o.ok, o.kind) for o, c in zip(outcomes, cut)], room
