"""Per-session quotas: how large a world's state and a turn's observation may grow.

Both runtimes enforce the same quotas with the same code (the container's server runs a
:class:`~envfactory.world.LocalWorld` too), so a session over a quota gets the same observation
in-process and in a container:

* :data:`MAX_STATE_BYTES` (default 32 MiB, half a wire frame, so a state at its quota crosses
  between host and container in one reply; ``ENVFACTORY_MAX_STATE_BYTES``): the state's size as
  its dump would write it (:func:`state_size`). A tool call that would take the state past it is
  that call's error observation (kind ``quota``), and the state is as it was before the call; the
  other calls of the turn run. Counting what a dump writes, not what Python holds, is what holds
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
from enum import Enum
from typing import Any, Callable, Sequence

from pydantic import BaseModel

from .state import class_hook, copy_state
from .tooling import ToolOutcome

__all__ = ["MAX_STATE_BYTES", "MAX_OBSERVATION_CHARS", "STATE_QUOTA_PREFIX", "OBSERVATION_CUT", "state_size",
           "cut_observations", "invoke_within_quota", "cut_outcomes"]

MAX_STATE_BYTES = int(os.environ.get("ENVFACTORY_MAX_STATE_BYTES", 32 << 20))
MAX_OBSERVATION_CHARS = int(os.environ.get("ENVFACTORY_MAX_OBSERVATION_CHARS", 1 << 20))

BACKUP_FROM = 8
"""A copy to fall back on is kept before a call once the state is past 1/BACKUP_FROM of the quota."""

STATE_QUOTA_PREFIX = "Error: state quota exceeded"
OBSERVATION_CUT = ("\n[cut: this turn's tool observations reached their cap of "
                   "envfactory.quotas.MAX_OBSERVATION_CHARS characters (ENVFACTORY_MAX_OBSERVATION_CHARS)]")

_NUMBER = (int, float, bool)
_MODELS: set[type] = set()  # classes seen to be pydantic models
_SIZERS: dict[type, Callable[[Any, int | None], int]] = {}  # state class -> how to measure it


def state_size(state: Any, limit: int | None = None) -> int:
    """The bytes a JSON dump of ``state`` would write (a close estimate, computed without
    writing it): every string counted each time it occurs, as the dump writes it, ASCII at one
    byte a character, any other character at its ``\\uXXXX`` escape. Stops counting once past
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
            total += len(k) + 6 + (len(x) if x.isascii() else len(x.encode("utf-16-le", "surrogatepass")) * 3)
        elif c in _NUMBER or x is None:
            total += len(k) + 12
        else:
            return _walk(state, limit)
    return total


def _walk(state: Any, limit: int | None) -> int:
    """:func:`state_size` by walking the state (see there)."""
    cap = limit if limit is not None else 1 << 62
    total = 0
    stack: list[Any] = [state]
    path: set[int] = set()  # the containers being walked (a cycle is a reference in the dump)
    push, pop = stack.append, stack.pop
    while stack:
        v = pop()
        c = v.__class__
        if c is str:
            total += len(v) + 2 if v.isascii() else len(v.encode("utf-16-le", "surrogatepass")) * 3 + 2
        elif c in _NUMBER or v is None:
            total += 8
        elif c is _Leave:
            path.discard(v.id)
            continue
        else:
            i = id(v)
            if i in path:
                total += 16
                continue
            if c is dict:
                total += 2
                path.add(i)
                push(_Leave(i))
                for k, x in v.items():
                    total += len(k) + 4 if k.__class__ is str and k.isascii() else 16
                    if x.__class__ is str and x.isascii():
                        total += len(x) + 2
                    else:
                        push(x)
            elif c is list or c is tuple or c is set or c is frozenset:
                total += 2 + len(v)
                rest = None
                for x in v:  # strings inline (the common leaves): no trip through the stack
                    if x.__class__ is str and x.isascii():
                        total += len(x) + 2
                    elif rest is None:
                        rest = [x]
                    else:
                        rest.append(x)
                if rest:
                    path.add(i)
                    push(_Leave(i))
                    stack.extend(rest)
            elif c in _MODELS or isinstance(v, BaseModel):
                _MODELS.add(c)
                total += 2
                path.add(i)
                push(_Leave(i))
                for k, x in v.__dict__.items():
                    total += len(k) + 4
                    push(x)
            elif isinstance(v, (str, bytes, bytearray)):
                total += len(v) * 2 + 2
            elif isinstance(v, (_NUMBER, type, Enum)):
                total += 16
            elif isinstance(v, dict):  # a subclass: its items, as above
                total += 2
                path.add(i)
                push(_Leave(i))
                for k, x in v.items():
                    total += 16
                    push(k)
                    push(x)
            elif isinstance(v, (list, tuple, set, frozenset)):
                total += 2 + len(v)
                path.add(i)
                push(_Leave(i))
                stack.extend(v)
            else:  # any other Python object: its attributes (what a dump writes), else its repr
                d = getattr(v, "__dict__", None)
                total += 16
                if d.__class__ is dict:
                    path.add(i)
                    push(_Leave(i))
                    push(d)
                else:
                    total += len(repr(v))
        if total > cap:
            return total
    return total


class _Leave:
    """A marker on the walk's stack: the container ``id`` is walked (it leaves the path)."""

    __slots__ = ("id",)

    def __init__(self, i: int) -> None:
        self.id = i


def state_quota_error(name: str, size: int, applied: bool = False) -> str:
    """The error observation of a call that took the state past the quota: rolled back (the
    usual case), or ``applied`` when no copy was kept (a state under :data:`BACKUP_FROM` of
    the quota that one call took past all of it), which the message then says."""
    what = ("it was applied (the state was small enough before it that no copy was kept), so the state is now "
            "over the quota: until it is back under, every call that changes it and leaves it over is refused "
            "and undone" if applied else "it was not applied, and the state is as it was before it")
    return (f"{STATE_QUOTA_PREFIX}: this call of '{name}' would make the state more than "
            f"{MAX_STATE_BYTES} bytes as written by a dump (at least {size}); {what}. The quota is "
            "envfactory.quotas.MAX_STATE_BYTES (ENVFACTORY_MAX_STATE_BYTES).")


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


_last: tuple[Any, Any] = (None, 0)  # the state last measured after a call, and its size
# id(original) -> (original, the cap it was measured under, its size): the task states that
# reset copies, kept while small (at most _FRESH_MAX of them, each under _FRESH_BYTES)
_FRESH: dict[int, tuple[Any, int, int]] = {}
_FRESH_MAX = 256
_FRESH_BYTES = 1 << 16


def fresh_copy(copy: Any, original: Any) -> None:
    """Note that ``copy`` is a fresh copy of ``original`` (a task's initial state, copied by
    ``reset``), so that the first call on it takes the size measured before it from
    ``original``'s, measured once (the same dump, so the same size) instead of walking the copy.
    A wrong figure here could only change whether a backup copy is kept: the measure after
    every call, which enforces the quota, is always taken."""
    global _last
    cap = MAX_STATE_BYTES // BACKUP_FROM
    hit = _FRESH.get(id(original))
    if hit is None or hit[0] is not original or hit[1] != cap:
        sizer = _SIZERS.get(original.__class__) or _sizer_for(original.__class__)
        hit = (original, cap, sizer(original, cap))
        if hit[2] < _FRESH_BYTES:
            if len(_FRESH) >= _FRESH_MAX:
                _FRESH.clear()
            _FRESH[id(original)] = hit
    _last = (copy, hit[2])


def invoke_within_quota(tool: Any, state: Any, arguments: Any) -> tuple[Any, Any]:
    """Run ``tool`` on ``state``: ``(outcome, the state to keep)``. After a tool that may change the
    state (not ``read_only``) the state is measured; over :data:`MAX_STATE_BYTES`, the outcome is
    the quota error and the state to keep is a copy taken before the call. The copy is taken only
    when the state is already past :data:`BACKUP_FROM` of the quota (a copy on every call would
    cost a state's worth per call, and break a copy-on-write state's sharing); a single call that
    takes a smaller state past the whole quota stays applied, and its error says so (every later
    call that leaves the state over the quota is then refused and undone: the copy is kept)."""
    if tool.read_only:
        return tool.invoke(state, arguments), state
    limit = MAX_STATE_BYTES
    global _last
    known, size = _last
    sizer = _SIZERS.get(state.__class__) or _sizer_for(state.__class__)
    if known is not state:  # else: measured after the last call (only tools change a state)
        size = sizer(state, limit // BACKUP_FROM)
    backup = copy_state(state) if size > limit // BACKUP_FROM else None
    out = tool.invoke(state, arguments)
    size = sizer(state, limit)
    if size <= limit:
        _last = (state, size)
        return out, state
    _last = (None, 0)  # measured again before the next call
    return (ToolOutcome(state_quota_error(tool.name, size, applied=backup is None), False, "quota"),
            state if backup is None else backup)


def cut_outcomes(outcomes: list[ToolOutcome], room: int) -> tuple[list[ToolOutcome], int]:
    """:func:`cut_observations` over tool outcomes (the same list when nothing is cut)."""
    cut, room = cut_observations([o.content for o in outcomes], room)
    if cut is None:
        return outcomes, room
    return [o if c is o.content else ToolOutcome(c, o.ok, o.kind) for o, c in zip(outcomes, cut)], room
