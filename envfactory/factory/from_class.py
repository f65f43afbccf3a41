"""Third-party Python classes, unchanged, as an environment.

A class keeps its state in instance attributes and exposes operations as
methods. :func:`from_class` turns one class, or several services that share an
episode, into an :class:`~envfactory.ToolEnvSpec`:

* an instance is built per initial configuration: ``cls(**config)``, or
  ``cls(**init)`` followed by a *loader* (``loader="_load_scenario"``, a method
  name, or ``loader(instance, config)``) for classes that load their scenario
  after construction. An instance that exposes no state after that is an error
  (:class:`~envfactory.SpecError` naming the class), never an empty world;
* the world's state is a :class:`~envfactory.factory.classes.pystate.PyState`: any picklable Python data
  (objects pointing into each other, ``random.Random``, sets, tuples, int and
  tuple dict keys, big ints, floats). Forks are copy-on-write: they share the
  values until a tool runs on one side, which then copies the whole object graph
  at once (as ``copy.deepcopy`` of the instances would); snapshots are a versioned JSON
  document that restores to an equal state, of the same types (see
  :mod:`~envfactory.factory.classes.pystate`). For one class whose attributes share nothing the state has a
  field per attribute (``state.cash``; names starting with ``_`` become
  ``private_<name>``); otherwise (several
  services, attributes that point into each other, ``state="objects"``) it has a
  field per service holding the live instance (``state.file_system.cwd``). The class's
  code only ever sees its own values, of its own types, live, forked or restored
  (``copy_on_write="containers"``, for multi-MB databases of dicts, trades that for forks
  whose first call copies only the dicts and lists it reaches);
* each public method becomes a tool (or, when the class marks its tools, as τ²-bench's
  ``@is_tool`` does, only the marked ones: :data:`TOOL_MARKS`): schema from the signature and the
  Google-style docstring; arguments passed as the agent sent them, the way the class would
  receive them, only their names checked (``validation="lax"``, default), checked strictly
  against the annotations (``"strict"``) or with pydantic's coercion (``"coerce"``); either way
  the method gets its own
  copy of any list or dict argument (a class may keep what it is given and change it later,
  which must change neither a reference solution nor the episode's messages); results rendered the
  project's way (default) or with ``render="str"``, ``"repr"`` or a function;
  an exception raised by the method becomes an error observation carrying the
  class's own message (``errors="message"``, default; ``"detailed"`` adds the
  tool name and exception type);
* tasks: given (a :class:`~envfactory.Task`, or a :class:`ClassTask` with a
  config per task), or synthesized by walking the tools (:mod:`~envfactory.factory.tasks.synthesis`)
  from configurations drawn from ``config``.
  A task whose reference solution only reads (the state ends as it began)
  succeeds only if the episode's tool calls returned what the reference's reads
  returned (:class:`ReadsCheck`, ``require_reads``), besides its answer facts.

The classes are never modified or subclassed.
"""

from __future__ import annotations

from envfactory.factory import _callable

import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import itertools
import json
import operator
import random
import re
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Literal, Mapping, Sequence, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model, model_validator
from pydantic_core import PydanticSerializationError

from envfactory.definition import SpecError, ToolEnvSpec
from envfactory.state import State, copy_state
from envfactory.task import Task, ToolCall
from envfactory.tooling import _REQUIRED, Tool, ToolError, _render_result, make_tool
from envfactory.factory.tasks.arguments import ArgSource
from envfactory.factory.tasks.success import ChangeCheck
from envfactory.factory.classes.compare import Compare, Comparison, MatchesReference
from envfactory.factory.classes.cow import (CowDict, CowList, armed, cow_canonical_json, cow_model, cow_state_size,
                                           _MODELS as _COW_MODELS)
from envfactory.factory.classes.pystate import (FORMAT_KEY, PyState, PyStateError, _NoGC, _plain, _plain_class, cow_state_copy, decode, encode, graph_copy,
                      lazy_state_copy, note_result, own, record_results, result_digest, seen_results, trusted_for)
from envfactory.factory.tasks.synthesis import SynthConfig, synthesize

__all__ = ["from_class", "Service", "ClassTask", "Synthesis", "ReadsCheck", "class_tools", "class_state_type",
           "observe_read_only", "TOOL_MARKS"]

READ_PREFIXES = ("get", "list", "find", "search", "show", "count", "describe", "check", "read",
                 "lookup", "view", "total", "report", "status", "is_", "has_", "peek")


def reads_by_name(method: str) -> bool:
    """The name rule for a tool nobody pinned and nothing observed: a :data:`READ_PREFIXES` word
    that starts the name as a word (``get_user``, ``getUser``, ``list``, ``is_open``), not as
    the start of a longer one (``checkout`` buys, ``reading_list_add`` is not ``read``)."""
    for p in READ_PREFIXES:
        if method.startswith(p):
            rest = method[len(p):]
            if p.endswith("_") or not rest or rest[0] == "_" or rest[0].isupper() or rest[0].isdigit():
                return True
    return False

Config = dict[str, Any] | Sequence[dict[str, Any]] | Callable[[random.Random], dict[str, Any]]
Loader = str | Callable[[Any, Any], Any]
Render = Literal["str", "repr"] | Callable[[Any], str] | None


@dataclass(frozen=True)
class Service:
    """One class of an environment made of several (or one class with its options).

    Attributes:
        cls: The class, unchanged.
        key: Its field in the state (default: the class name in snake_case).
        prefix: Prepended to its tool names (to resolve clashes between services).
        loader: ``None`` (``cls(**config)``), a method name (``cls(**init)`` then
            ``instance.<loader>(config)``) or ``loader(instance, config)``.
        init: Constructor arguments when a loader takes the configuration.
        include: Methods to expose (default: every public method, or the marked ones: ``tools_marked``).
        exclude: Methods to hide.
        read_only: Methods that never change the state (default: by name prefix).
        tools_marked: How the class marks its tools. ``True`` (default): if any public method
            carries one of the :data:`TOOL_MARKS` (τ²-bench's ``@is_tool`` sets ``__tool__``),
            only the marked methods become tools (a ``**kwargs`` dispatcher such as
            ``use_tool``, or ``update_db``, stays out); a method's mark of kind (``__tool_type__``:
            ``READ`` or ``THINK``, ``WRITE``; or ``__mutates_state__``) pins whether it only
            reads, unless ``read_only`` names it. An attribute name: the methods carrying that
            attribute (a :class:`~envfactory.SpecError` if none does). ``False``: every public method.
    """

    cls: type
    key: str | None = None
    prefix: str = ""
    loader: Loader | None = None
    init: dict[str, Any] | None = None
    include: Iterable[str] | None = None
    exclude: Iterable[str] = ()
    read_only: Iterable[str] | None = None
    tools_marked: str | bool = True


TOOL_MARKS = ("__tool__", "_is_tool", "is_tool")
"""Function attributes by which a class marks its tools (a true value), looked for when
``Service(tools_marked=True)`` (the default): τ²-bench's ``@is_tool(ToolType.READ)`` sets ``__tool__``."""
_TOOL_KINDS = ("__tool_type__", "_tool_type", "tool_type")
_READ_KINDS = frozenset(("read", "think"))  # (τ²-bench's ToolType: READ, WRITE, THINK, GENERIC)


def _marked_tools(cls: type, names: Sequence[str], mark: str | bool) -> tuple[list[str], dict[str, bool]]:
    """The methods among ``names`` that ``cls`` marks as its tools (all of them when it marks
    none and ``mark`` is ``True``), and whether each marked one only reads, where its mark says."""
    if mark is False:
        return list(names), {}
    funcs = {n: inspect.getattr_static(cls, n) for n in names}
    attrs = TOOL_MARKS if mark is True else (mark,)
    marked = [n for n in names if any(getattr(funcs[n], a, False) for a in attrs)]
    if not marked:
        if mark is True:
            return list(names), {}
        raise SpecError(f"{cls.__name__}: no public method carries the mark {mark!r} "
                        f"(Service(cls, tools_marked={mark!r})); its public methods are {list(names)}")
    reads: dict[str, bool] = {}
    for n in marked:
        f = funcs[n]
        mutates = getattr(f, "__mutates_state__", None)
        if isinstance(mutates, bool):
            reads[n] = not mutates
            continue
        kind = next((getattr(f, a) for a in _TOOL_KINDS if getattr(f, a, None) is not None), None)
        kind = getattr(kind, "value", kind)
        if isinstance(kind, str):
            if kind.lower() in _READ_KINDS:
                reads[n] = True
            elif kind.lower() == "write":
                reads[n] = False
    return marked, reads


@dataclass
class ClassTask:
    """A task whose initial state is built from a configuration (for several services:
    ``{service key: config}``), as :func:`from_class` builds every state.

    What the user must be told goes in ``answer_facts`` (a suite's own expected outputs, such
    as τ²-bench's ``outputs``), judged as every task's answer facts are
    (:meth:`~envfactory.Task.answer_ok`, with ``answer_rivals`` and ``answer_seen``): a task
    that only asks for information then needs the answer, so an agent that does nothing or
    only claims success fails it even where the state cannot tell. ``answer_seen=False`` for a
    fact the agent computes (a sum of several orders) rather than reads in one tool result.
    """

    id: str
    instruction: str
    config: Any
    solution: list[ToolCall] = field(default_factory=list)
    answer_facts: list[str] = field(default_factory=list)
    answer_rivals: list[str] | None = None
    """Values that contradict the facts (:attr:`~envfactory.Task.answer_rivals`); ``None``: from
    the tools' enums and the small numbers."""
    answer_seen: bool = True
    """Whether each fact must have been shown to the agent (:attr:`~envfactory.Task.answer_seen`)."""
    check: Callable[[Any], bool] | None = None
    difficulty: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    require_reads: bool | None = None
    """Whether success needs the reference's reads (see :class:`ReadsCheck`); ``None``: as
    ``from_class(require_reads=...)`` says."""


@dataclass(frozen=True)
class Synthesis:
    """How :func:`from_class` synthesizes tasks when none are given (:mod:`~envfactory.factory.tasks.synthesis`).

    Attributes:
        arguments: Argument sources by ``"tool.param"`` or ``"param"`` (see :mod:`~envfactory.factory.tasks.arguments`):
            where the walks draw the values they call the tools with.
        n_tasks: How many tasks to synthesize (lazily, on first use).
        seed: Seeds the walks, and the configuration the tools are probed with.
    """

    arguments: dict[str, ArgSource] = field(default_factory=dict)
    n_tasks: int = 60
    seed: int = 0


class ReadsCheck:
    """A task's success check that looks at what the agent saw, not only at the world.

    Holds when the final state hashes to the reference's final state (or ``check``, when the
    task brought one, holds) *and* every result the reference solution's reads returned is
    among the results the episode's tool calls returned (recorded on the state by the tools,
    :func:`~envfactory.factory.classes.pystate.note_result`: forks and snapshots carry them; the state's hash ignores
    them). A read is a reference call that succeeded and left the state's hash unchanged;
    any call that returns the same text counts (``get_ticket(2)`` or ``get_ticket('ticket_002')``).
    """

    def __init__(self, reads: Sequence[tuple[str, str]], expected_hash: str | None = None,
                 check: Callable[[Any], bool] | None = None, *, expected: Any = None) -> None:
        self.reads = list(reads)  # (tool name, digest of its result)
        self.required = frozenset(d for _, d in self.reads)
        self._hash = expected_hash
        self.expected = expected  # the reference's final state: hashed when a judgment first needs it
        self.check = check

    @property
    def expected_hash(self) -> str | None:
        """The hash of the reference's final state (computed on first use from ``expected``)."""
        if self._hash is None and self.expected is not None:
            from envfactory.state import state_hash

            self._hash = state_hash(self.expected)
        return self._hash

    def __call__(self, state: Any) -> bool:
        from envfactory.state import state_hash

        if not self.required <= seen_results(state):
            return False
        if self.check is not None:
            return bool(self.check(state))
        return state_hash(state) == self.expected_hash

    def describe(self) -> dict[str, Any]:
        return {"reads": [{"tool": n, "result_digest": d} for n, d in self.reads],
                "state": "check" if self.check is not None else self.expected_hash}

    def __repr__(self) -> str:
        return f"ReadsCheck(reads={[n for n, _ in self.reads]})"


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


_RESERVED = frozenset(dir(PyState))


def _field_name(attr: str) -> str:
    name = "private" + attr if attr.startswith("_") else attr
    return f"attr_{name}" if name in _RESERVED or name.startswith("model_") else name


def _message(exc: BaseException) -> str:
    """The exception's own message (``KeyError('x')`` says ``x``, not ``'x'``)."""
    if len(exc.args) == 1 and isinstance(exc.args[0], str):
        return exc.args[0]
    return str(exc) or type(exc).__name__


class _AnyType:
    """Accepts every class (the fast argument check of a ``lax`` tool)."""

    def __contains__(self, item: Any) -> bool:
        return True


_ANY_TYPE = _AnyType()


class _LaxArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


def _shares(root: Any, values: Iterable[Any]) -> bool:
    """Whether the values reach one mutable object twice, or ``root`` itself."""
    seen: set[int] = {id(root)}
    stack = list(values)
    imm = (str, int, float, bool, type(None), bytes)
    while stack:
        v = stack.pop()
        if isinstance(v, imm) or isinstance(v, (type, enum.Enum)):
            continue
        if not isinstance(v, (tuple, frozenset)):
            if id(v) in seen:
                return True
            seen.add(id(v))
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        elif hasattr(v, "__dict__") and not callable(v):
            stack.extend(vars(v).values())
    return False


class _Part:
    """A service, resolved: its class, key, loader and the names of its tools."""

    def __init__(self, svc: Service, key: str) -> None:
        self.svc = svc
        self.cls = svc.cls
        self.key = key
        self.loaders = _loader_methods(svc.cls) if svc.loader is None else []  # for the error messages
        self.marked_reads: dict[str, bool] = {}  # what the class's tool marks say (set by _methods)

    def instance(self, config: Any) -> Any:
        svc, cls = self.svc, self.cls
        config = graph_copy(config)  # a loader may keep (and later change) what it is given
        if svc.loader is None:
            if config is not None and not isinstance(config, dict):
                raise SpecError(f"{cls.__name__}: a configuration is a dict of constructor arguments "
                                f"(or pass loader=...), got {type(config).__name__}")
            args = {**(svc.init or {}), **(config or {})}
            loaders = self.loaders
            try:
                inst = cls(**args)
            except TypeError as exc:
                if not loaders:
                    raise
                raise SpecError(f"{cls.__name__}: {cls.__name__}(**config) failed ({exc}); it looks like it loads its "
                                f"state in a method: pass loader={loaders[0]!r}") from exc
            how = f"{cls.__name__}(**config)"
            if not args and loaders and getattr(inst, "__dict__", None):
                # cls() with nothing: the state is what __init__ sets by itself, constants
                raise SpecError(f"{cls.__name__}: built as {cls.__name__}() with no configuration, its state "
                                f"holds only the constructor's constants ({', '.join(sorted(vars(inst)))}), and "
                                f"{cls.__name__}.{loaders[0]} looks like where it loads its state: pass "
                                f"loader={loaders[0]!r} (or give constructor arguments in config)")
        else:
            inst = cls(**(svc.init or {}))
            if isinstance(svc.loader, str):
                load = getattr(inst, svc.loader, None)
                if load is None:
                    raise SpecError(f"{cls.__name__} has no method {svc.loader!r} (the loader)")
                load({} if config is None else config)
                how = f"{cls.__name__}().{svc.loader}(config)"
            else:
                svc.loader(inst, {} if config is None else config)
                how = f"{cls.__name__}() and the loader"
        if not getattr(inst, "__dict__", None) and not any("__slots__" in vars(k) for k in type(inst).__mro__):
            hints = _loader_methods(cls, any_name=True)
            hint = (f"; if it loads its state in a method, pass loader={hints[0]!r}" if hints
                    else "; if it loads its state in a method, pass loader='<method name>'")
            raise SpecError(f"{cls.__name__}: the instance exposes no state after {how} "
                            f"(it has no attributes){hint}")
        return inst


def _loader_methods(cls: type, any_name: bool = False) -> list[str]:
    """Methods of ``cls`` that look like where it loads its state from a scenario: taking an
    argument, named ``*scenario*`` or privately ``_*load*``, ``_*setup*``, ``_*init*`` (a public
    ``load`` is more likely a tool), that the constructor does not call itself; with ``any_name``,
    any method named like a loader."""
    out: list[str] = []
    try:  # a method the constructor calls is how it builds its state, not a loader left out
        init = inspect.getattr_static(cls, "__init__", None)
        init_source = inspect.getsource(init) if inspect.isfunction(init) else ""
    except (OSError, TypeError):
        init_source = ""
    for k in cls.__mro__[:-1]:
        for n, v in vars(k).items():
            if not inspect.isfunction(v) or n.startswith("__") or n in out:
                continue
            if any_name:
                if re.search(r"load|setup|scenario|init_|from_", n):
                    out.append(n)
                continue
            if not ("scenario" in n or (n.startswith("_") and re.search(r"load|setup|init", n))):
                continue
            params = list(inspect.signature(v).parameters.values())[1:]
            if params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD) \
                    and not re.search(rf"\b{n}\b", init_source):
                out.append(n)
    return out


def _hint_for(p: inspect.Parameter, hints: dict[str, Any]) -> Any:
    if p.name in hints:
        return hints[p.name]
    d = p.default
    if d is not inspect.Parameter.empty and type(d) in (str, int, float, bool):
        return type(d)
    return Any


def _method_tool(cls: type, method: str, *, tool_name: str, read_only: bool, bind: Callable[..., Any],
                 validation: str, render: Render, errors: str) -> Tool:
    func = getattr(cls, method)
    sig = inspect.signature(func)
    params = list(sig.parameters.values())[1:]  # drop self
    try:
        hints = typing.get_type_hints(func)
    except Exception as exc:
        raise SpecError(f"{cls.__name__}.{method}: cannot resolve type hints: {exc}") from exc
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise SpecError(f"{cls.__name__}.{method}: *args/**kwargs cannot become a tool's schema "
                            f"({p.name}); leave it out: from_class(Service({cls.__name__}, exclude=[{method!r}]), "
                            f"...) (a class's options go in its Service), or mark the methods that are tools "
                            f"(Service(cls, tools_marked='<attribute>'))")
    renderer: Callable[[Any], Any] | None
    if render is None:
        renderer = None
    elif render == "str":
        renderer = str
    elif render == "repr":
        renderer = repr
    elif callable(render):
        renderer = render
    else:
        raise SpecError(f"render must be None, 'str', 'repr' or a function, got {render!r}")
    call = bind(func, renderer, errors == "message")
    call.__name__ = tool_name
    call.__doc__ = func.__doc__ or f"Call {cls.__name__}.{method}."
    # positional-only and oddly named, so that a method parameter may be called ``state``
    call.__signature__ = sig.replace(
        parameters=[inspect.Parameter("__world__", inspect.Parameter.POSITIONAL_ONLY)]
        + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is p.POSITIONAL_ONLY else p for p in params],
        return_annotation=inspect.Signature.empty)
    call.__annotations__ = {p.name: _hint_for(p, hints) for p in params}
    try:
        t = make_tool(call, name=tool_name, read_only=read_only)
    except (TypeError, NameError, ValueError) as exc:
        raise SpecError(f"{cls.__name__}.{method}: {exc}") from exc
    if validation == "strict":
        return t
    if validation not in ("coerce", "lax"):
        raise SpecError(f"validation must be 'strict', 'coerce' or 'lax', got {validation!r}")
    fields: dict[str, Any] = {}
    simple: dict[str, tuple[Any, Any]] = {}
    for p in params:
        default = ... if p.default is inspect.Parameter.empty else p.default
        tp = Any if validation == "lax" else call.__annotations__[p.name]
        fields[p.name] = (tp, Field(default))
        simple[p.name] = (_ANY_TYPE, _REQUIRED if default is ... else default)
    base = _LaxArgs if validation == "lax" else type("_CoerceArgs", (BaseModel,), {
        "model_config": ConfigDict(extra="forbid", arbitrary_types_allowed=True)})
    model: type[BaseModel] = create_model(f"{tool_name}_args", __base__=base, **fields)
    return Tool(name=t.name, description=t.description, fn=t.fn, parameters=t.parameters, args_model=model,
                finish=False, read_only=t.read_only, _arg_names=t._arg_names,
                _simple=simple if validation == "lax" else None)


def _finish_result(result: Any, renderer: Callable[[Any], Any] | None, world: Any = None) -> Any:
    """The observation (rendered as :class:`~envfactory.Tool` would), recorded on ``world``."""
    out = result if renderer is None else renderer(result)
    if out.__class__ is not str:
        out = _render_result(out)
    if world is not None and isinstance(world, PyState):
        note_result(world, out)
    return out


_SCALAR_ARGS = frozenset((str, int, float, bool, type(None)))


def _own_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments, the method's own: a class may keep (and later change) a list it is
    given, which must not be the reference solution's or the episode's message."""
    for v in kwargs.values():
        if v.__class__ not in _SCALAR_ARGS:
            return copy.deepcopy(kwargs)
    return kwargs


AfterCall = Callable[[dict[str, Any]], Any]


def _object_binder(key: str, after_call: AfterCall | None = None, keys: Sequence[str] = (),
                   seen: _AttributeTypes | None = None) -> Callable[..., Callable[..., Any]]:
    """Tools over the live instance held in the state's field ``key``; ``after_call`` gets the
    instances of the fields ``keys`` after every call of the method (returned or raised);
    ``seen`` learns the types the call left in the instance's attributes (a restore allows them)."""

    def bind(func: Callable[..., Any], renderer: Any, own_message: bool) -> Callable[..., Any]:
        def call(world: Any, /, **kwargs: Any) -> Any:
            own(world)
            wd = world.__dict__
            obj = wd[key]
            kwargs = _own_arguments(kwargs)
            try:
                try:
                    result = func(obj, **kwargs)
                finally:
                    if after_call is not None:
                        after_call({k: wd[k] for k in keys})
                    if seen is not None and (attrs := getattr(obj, "__dict__", None)) is not None:
                        seen.saw(attrs)
            except ToolError:
                raise
            except Exception as exc:
                if not own_message:
                    raise
                raise ToolError(_message(exc)) from exc
            return _finish_result(result, renderer, world)

        return call

    return bind


def _attribute_binder(cls: type, mapping: dict[str, str], copy_on_write: str = "state",
                      after_call: AfterCall | None = None, key: str = "",
                      seen: _AttributeTypes | None = None) -> Callable[..., Callable[..., Any]]:
    """Tools over a bare instance bound to the state's fields (one per attribute); ``after_call``
    gets ``{key: the instance}`` after every call of the method (returned or raised); ``seen``
    learns the types the call left in the attributes (a restore allows them).

    ``copy_on_write="state"``: the fields are the class's own values (a state shared with a
    fork is copied whole first, :func:`~envfactory.factory.classes.pystate.own`); ``"containers"``:
    the call runs :class:`~envfactory.factory.classes.cow.armed` (dicts and lists are copied as
    the call reaches them, so the class sees them as ``CowDict`` / ``CowList``)."""
    pairs = tuple(mapping.items())
    containers = copy_on_write == "containers"

    def bind(func: Callable[..., Any], renderer: Any, own_message: bool) -> Callable[..., Any]:
        def call(world: Any, /, **kwargs: Any) -> Any:
            kwargs = _own_arguments(kwargs)
            obj: Any = object.__new__(cls)
            d = obj.__dict__
            wd = world.__dict__
            try:
                if not containers:
                    own(world)  # shared with a fork: this state's own copy first (the class's own types)
                # copy on write per container: what the call reaches becomes this state's own
                with armed(world) if containers else contextlib.nullcontext():
                    for attr, fname in pairs:
                        d[attr] = wd[fname]
                    try:
                        try:
                            result = func(obj, **kwargs)
                        finally:
                            if after_call is not None:
                                after_call({key: obj})
                    finally:
                        for attr, fname in pairs:  # attributes may have been rebound, not only mutated
                            wd[fname] = d[attr]
                        if seen is not None:
                            seen.saw(d)
            except ToolError:
                raise
            except Exception as exc:
                if not own_message:
                    raise
                raise ToolError(_message(exc)) from exc
            if len(d) != len(pairs):
                new = sorted(set(d) - set(mapping))
                raise ToolError(f"{cls.__name__}.{func.__name__} added attributes {new} at run time; "
                                "build the environment with from_class(..., state='objects')")
            if containers and renderer is not None:
                result = _uncow(result)
            return _finish_result(result, renderer, world)

        return call

    return bind


def _uncow(value: Any) -> Any:
    """``value`` with any copy-on-write container in it as the plain dict or list it stands for
    (what a renderer is given: an exact ``type(x) == dict`` holds), ``value`` itself when it
    holds none."""
    if not _holds_cow(value, set()):
        return value
    return graph_copy(value)


def _holds_cow(v: Any, seen: set[int]) -> bool:
    cls = v.__class__
    if cls is CowDict or cls is CowList:
        return True
    if cls in _SCALAR_ARGS or id(v) in seen:
        return False
    seen.add(id(v))
    if cls is dict:
        return any(_holds_cow(x, seen) for x in v.values())
    if cls is list or cls is tuple or cls is set or cls is frozenset:
        return any(_holds_cow(x, seen) for x in v)
    if _plain_class(cls) or cow_model(cls):  # (a model copied on write holds copy-on-write containers)
        return _holds_cow(v.__dict__, seen)
    return False


class RestoreTypeError(PyStateError):
    """A loaded state document (a restored snapshot's state) holds a value of another type than the
    class gives that attribute; the message names the attribute, the type expected and what was found."""


_NUMBERS = frozenset((int, float))
_ANNOTATED = ConfigDict(arbitrary_types_allowed=True)


def _class_hints(cls: type) -> dict[str, Any]:
    """The class's annotations of instance attributes (its own, its bases', a dataclass's or a
    pydantic model's fields), ``ClassVar`` left out; none when they cannot be resolved."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a forward reference the class's module cannot resolve: its values' types decide
        return {}
    return {k: h for k, h in hints.items() if typing.get_origin(h) is not typing.ClassVar and h is not typing.ClassVar}


def _adapter(hint: Any) -> TypeAdapter[Any] | None:
    """pydantic's validator of ``hint`` (``None``: pydantic cannot make one; the values' types decide)."""
    for config in (_ANNOTATED, None):
        try:
            return TypeAdapter(hint, config=config)
        except Exception:  # a model or dataclass brings its own config; an annotation pydantic cannot validate
            continue
    return None


def _holds_models(schema: Any) -> bool:
    """Whether a pydantic core schema validates a model or a dataclass somewhere (strict validation
    then still accepts a dict of its fields in its place; its serializer, told to, refuses one)."""
    todo, seen = [schema], set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            if node.get("type") in ("model", "dataclass"):
                return True
            todo.extend(node.values())
        elif isinstance(node, (list, tuple)):
            todo.extend(node)
    return False


def _unexpected(text: str) -> str:
    """The first of pydantic's serializer warnings, without its preamble."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Pydantic serializer warnings")]
    return (lines[0] if lines else text)[:300]


def _kind(cls: type) -> type:
    """The class a value's type is compared by (copy-on-write containers are the dict or list they stand for)."""
    return dict if cls is CowDict else list if cls is CowList else cls


def _shown(v: Any) -> str:
    text = repr(v) if v.__class__ in (str, int, float, bool, range) else ""
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(v).__name__} {text}".rstrip()


def _first_error(exc: ValidationError) -> str:
    errs = exc.errors(include_url=False)
    if not errs:
        return str(exc)[:200]
    e = errs[0]
    where = ".".join(str(x) for x in e.get("loc", ()))
    found = _shown(e.get("input"))
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{where + ': ' if where else ''}{e.get('msg', '')}, found {found}{more}"


class _AttributeTypes:
    """What each attribute of one class may hold when a state is loaded from a document: its
    annotation (checked with pydantic's ``TypeAdapter``, strict) when the class annotates it and
    the values the class starts with satisfy it, and in any case a value of a type the attribute
    started with in some configuration (ints and floats count as one), or was given by one of the
    class's own methods in this process; an attribute that starts as ``None`` is not constrained
    by its type (the class fills it later), only by its annotation. A value that is a pydantic
    model is validated with its model as well (its records, to the bottom), unless the class's
    own starting value fails that."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.hints = _class_hints(cls)
        self.kinds: dict[str, set[type]] = {}  # attribute -> the types its values have had
        self.free: set[str] = set()  # attributes that started as None
        self.always: set[str] | None = None  # attributes every configuration's instance starts with
        self.adapters: dict[str, TypeAdapter[Any] | None] = {}
        self.dumped: set[str] = set()  # annotated attributes whose annotation holds models: also serialized
        self.pristine: dict[str, BaseModel] = {}  # a starting model value, to check the model check on
        self.models_ok: dict[str, bool] = {}

    def learn(self, attrs: Mapping[str, Any]) -> None:
        """The attributes of an instance as a configuration built it."""
        self.always = set(attrs) if self.always is None else self.always & attrs.keys()
        for attr, v in attrs.items():
            kinds = self.kinds.setdefault(attr, set())
            if v is None:
                self.free.add(attr)
            kinds.add(_kind(v.__class__))
            if attr not in self.adapters:
                hint = self.hints.get(attr)
                adapter = self.adapters[attr] = None if hint is None else _adapter(hint)
                if adapter is not None and _holds_models(adapter.core_schema):
                    self.dumped.add(attr)
            adapter = self.adapters[attr]
            if adapter is not None:
                try:
                    self._annotated(attr, adapter, v)
                except Exception:  # the class's own values contradict its annotation: the annotation is not believed
                    self.adapters[attr] = None
            if isinstance(v, BaseModel) and attr not in self.pristine and attr not in self.models_ok:
                self.pristine[attr] = v

    def saw(self, attrs: Mapping[str, Any]) -> None:
        """The attributes after a call of one of the class's methods (their types become allowed)."""
        kinds = self.kinds
        for attr, v in attrs.items():
            known = kinds.get(attr)
            if known is None:
                kinds[attr] = {_kind(v.__class__)}
            elif v.__class__ not in known:
                known.add(_kind(v.__class__))

    def _expected(self, attr: str) -> str:
        hint = self.hints.get(attr) if self.adapters.get(attr) is not None else None
        if hint is not None:
            plain = isinstance(hint, type) and not typing.get_args(hint)
            return f"{hint.__name__ if plain else str(hint).replace('typing.', '')} (its annotation)"
        kinds = self.kinds.get(attr, set())
        names = sorted({k.__name__ for k in kinds} | ({"float"} if kinds & _NUMBERS else set()))
        return " or ".join(names) + " (the type it starts with)"

    def check(self, attr: str, v: Any, where: str) -> None:
        """Raise :class:`RestoreTypeError` unless ``v`` may be attribute ``attr``'s value."""
        kinds = self.kinds.get(attr)
        if kinds is None:
            raise RestoreTypeError(f"{where}: {self.cls.__name__} has no attribute {attr!r} "
                                   f"(its attributes: {sorted(self.kinds)})")
        cls = _kind(v.__class__)
        if attr not in self.free and cls not in kinds and not (cls in _NUMBERS and kinds & _NUMBERS):
            raise RestoreTypeError(f"{where}: expected {self._expected(attr)}, found {_shown(v)}")
        adapter = self.adapters.get(attr)
        if adapter is not None:
            try:
                self._annotated(attr, adapter, v)
            except ValidationError as exc:
                raise RestoreTypeError(f"{where}: expected {self._expected(attr)}, {_first_error(exc)}") from None
            except Exception as exc:  # pydantic's serializer found another type than the annotation's in it
                raise RestoreTypeError(f"{where}: expected {self._expected(attr)}, found {_shown(v)}: "
                                       f"{_unexpected(str(exc))}") from None
        if isinstance(v, BaseModel) and self._model_checked(attr, type(v)):
            why = _model_fault(v)
            if why is not None:
                raise RestoreTypeError(f"{where}: its {type(v).__name__} does not validate against its model: {why}")

    def _annotated(self, attr: str, adapter: TypeAdapter[Any], v: Any) -> None:
        """Raise unless ``v`` is of ``attr``'s annotation: it validates strictly and, where the
        annotation holds models, serializes as them (a dict of a model's fields in a model's place
        validates, and would stay a dict)."""
        with _NoGC():
            adapter.validate_python(v, strict=True)
            if attr in self.dumped:
                adapter.dump_python(v, warnings="error")

    def _model_checked(self, attr: str, model: type[BaseModel]) -> bool:
        """Whether values of ``attr`` are checked against their model: only if a starting value
        (of that model) passes the check itself (decided once, at the first restore)."""
        ok = self.models_ok.get(attr)
        if ok is None:
            start = self.pristine.pop(attr, None)  # (not kept once decided: it may be a multi-MB database)
            ok = self.models_ok[attr] = start is None or type(start) is not model or _model_fault(start) is None
        return ok


def _model_fault(v: BaseModel) -> str | None:
    """Why ``v`` (a pydantic model, its records to the bottom) does not validate strictly against
    its own model (``None``: it does)."""
    unexpected = None
    try:
        with _NoGC():  # (a multi-MB database: collections triggered by the copies only rescan live objects)
            try:  # the serializer refuses a dict where a record's model belongs (strict validation takes it)
                dumped = v.model_dump(warnings="error")
            except PydanticSerializationError as exc:
                unexpected, dumped = exc, v.model_dump(warnings=False)
            type(v).model_validate(dumped, strict=True)
    except ValidationError as exc:  # (named by the validator where it can: the field, the type found)
        return _first_error(exc)
    except Exception as exc:  # a value the model cannot even dump (a foreign type, an attribute missing)
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None if unexpected is None else _unexpected(str(unexpected))


class _StateTypes:
    """The restore check of a ``from_class`` state: per attribute (a state of attributes, ``mapping``
    ``{attribute: field}``) or per service (a state of objects, ``services`` ``{field: class}``: the
    field holds an instance of its class, whose attributes are checked likewise)."""

    def __init__(self, mapping: Mapping[str, str] | None, services: Mapping[str, type]) -> None:
        self.mapping = dict(mapping) if mapping else None
        self.tables = {key: _AttributeTypes(c) for key, c in services.items()}

    def check_fields(self, document: Mapping[str, Any]) -> None:
        """Raise :class:`RestoreTypeError` naming the attributes a document lacks or has too many of."""
        if self.mapping is None:
            return
        (table,) = self.tables.values()
        names = {f: a for a, f in self.mapping.items()}
        given = {k for k in document if k[:1] != "$"}
        missing = sorted(names[f] for f in names.keys() - given)
        extra = sorted(given - names.keys())
        if missing or extra:
            raise RestoreTypeError(f"{table.cls.__name__}: " + "; ".join(
                ([f"attributes missing: {missing}"] if missing else [])
                + ([f"attributes it does not have: {extra}"] if extra else [])))

    def check(self, state: PyState) -> None:
        d = state.__dict__
        if self.mapping is not None:
            (table,) = self.tables.values()
            for attr, fname in self.mapping.items():
                table.check(attr, d[fname], f"attribute {attr!r} of {table.cls.__name__}")
            return
        for key, table in self.tables.items():
            obj = d[key]
            if not isinstance(obj, table.cls):
                raise RestoreTypeError(f"field {key!r}: expected a {table.cls.__name__}, found {_shown(obj)}")
            attrs = getattr(obj, "__dict__", None)
            if attrs is None:
                continue
            missing = sorted(a for a in table.always or () if a not in attrs)
            if missing:
                raise RestoreTypeError(f"field {key!r}: the {table.cls.__name__} lacks attributes {missing}")
            for attr, v in attrs.items():
                table.check(attr, v, f"attribute {attr!r} of {key}, a {table.cls.__name__}")


class _ClassState(PyState):
    """A ``from_class`` state: a state loaded from a document (a restored snapshot's) holds, in
    each attribute, a value of the type the class gives it (:class:`_StateTypes`), or is refused
    (:class:`RestoreTypeError`, a ``ValueError``) before anything uses it."""

    __restore_types__: ClassVar[_StateTypes | None] = None

    @model_validator(mode="wrap")
    @classmethod
    def _typed_load(cls, data: Any, handler: Any) -> Any:
        types = cls.__restore_types__
        if types is None or not (isinstance(data, dict) and FORMAT_KEY in data):
            return handler(data)
        types.check_fields(data)
        out = handler(data)
        types.check(out)
        return out


def class_state_type(cls: type, probe: Any, copy_on_write: str = "state") -> tuple[type[PyState], dict[str, str]]:
    """A state model with one field per attribute of ``probe`` (an instance of ``cls``).

    Returns the model and ``{attribute: field}``. Its forks are copy on write: whole
    (``copy_on_write="state"``: the first tool call on a shared state copies it, as the class's
    own types) or per container (``"containers"``: :mod:`~envfactory.factory.classes.cow`).
    """
    if copy_on_write not in ("state", "containers"):
        raise SpecError(f"copy_on_write must be 'state' or 'containers', got {copy_on_write!r}")
    attrs = getattr(probe, "__dict__", None)
    if attrs is None:
        raise SpecError(f"{cls.__name__}: instances need a __dict__ for a state of attributes; "
                        "use from_class(..., state='objects')")
    mapping = {attr: _field_name(attr) for attr in attrs}
    fields: dict[str, Any] = {f: (Any, ...) for f in mapping.values()}
    model = create_model(f"{cls.__name__}State", __base__=_ClassState, **fields)
    model.__module__ = cls.__module__
    model.__pystate_trusted__ = trusted_for([cls])
    if copy_on_write == "state":
        model.__state_copy__ = staticmethod(lazy_state_copy)  # every tool here calls own() first
        model.__pystate_graph__ = True  # (which copies it as one graph: as copy.deepcopy of the instance)
        return model, mapping
    model.__state_copy__ = staticmethod(cow_state_copy)  # copy on write per container: the tools run armed
    model.__state_size__ = staticmethod(cow_state_size)  # (the quota's measure, shared containers remembered)
    model.__canonical_json__ = staticmethod(cow_canonical_json)  # (its hash, likewise)
    return model, mapping


def _methods(part: _Part, include: Iterable[str] | None, exclude: Iterable[str]) -> list[str]:
    """The methods that become tools: ``include``, else the public ones (or those the class
    marks as its tools, :func:`_marked_tools`), less ``exclude``; what the marks say of reading
    is kept on the part (``part.marked_reads``)."""
    cls = part.cls
    part.marked_reads = {}
    if include is not None:
        names = list(include)
    else:  # public functions of the class and its (Python) bases, bases first, in definition order
        names = []
        for k in reversed(cls.__mro__[:-1]):
            names += [n for n, v in vars(k).items() if not n.startswith("_") and inspect.isfunction(v)
                      and n not in names and inspect.isfunction(inspect.getattr_static(cls, n))]
        names, part.marked_reads = _marked_tools(cls, names, part.svc.tools_marked)
    for n in names:
        if not callable(getattr(cls, n, None)):
            raise SpecError(f"{cls.__name__} has no method {n!r}")
    skip = set(exclude)
    return [n for n in names if n not in skip and part.svc.prefix + n not in skip]


def class_tools(
    cls: type, mapping: dict[str, str], *, include: Iterable[str] | None = None,
    exclude: Iterable[str] = (), read_only: Iterable[str] | None = None, copy_on_write: str = "state",
    validation: str = "lax",
) -> list[Tool]:
    """Tools for the public methods of ``cls`` (in definition order), over a state of attributes
    (:func:`class_state_type`'s, made with the same ``copy_on_write``)."""
    part = _Part(Service(cls), "")
    ro = set(read_only) if read_only is not None else None
    tools = [_method_tool(cls, n, tool_name=n, read_only=(n in ro if ro is not None
                                                          else part.marked_reads.get(n, reads_by_name(n))),
                          bind=_attribute_binder(cls, mapping, copy_on_write), validation=validation, render=None,
                          errors="detailed") for n in _methods(part, include, exclude)]
    if not tools:
        raise SpecError(f"{cls.__name__} has no public methods to turn into tools")
    return tools


def observe_read_only(tools: Sequence[Tool], synth: SynthConfig, *, seed: int = 0, walks: int = 24,
                      length: int = 6, references: Sequence[tuple[Callable[[], State], Sequence[ToolCall]]] = (),
                      ) -> dict[str, bool | None]:
    """Which tools change the state, by watching them rather than by their names.

    First the ``references`` (a task's initial state, made on demand, and its reference
    solution): valid calls in an order that works, so a writer that refuses random arguments
    (``checkout`` of an empty cart, ``mv`` of a file that is not there) is seen writing. Then
    random walks (``walks`` of ``length`` calls, arguments drawn as task synthesis
    draws them) from sampled initial states; a tool that changed the state once is
    not read-only; one that ran without error and never changed it is, if that was in a
    reference or in two different random calls (other arguments, or another state): a writer
    can leave a state as it was for one drawn call (``mv`` of a file onto itself). A call that
    returns an error-shaped value (``"Error: ..."``, ``{"error": ...}``) without changing
    the state shows nothing either way: a tool seen only so is undecided (``None``; a
    method that answers a wrong argument with an error value would otherwise look like a
    reader). Tools that never ran without raising are left out (their names decide).

    States are read once per set of values: walks from one configuration share its base
    (copy on write), its JSON and argument candidates are found once (a walk draws from its
    initial state), a hash once per state; a call's effect is found by comparing the values
    (:func:`_differs`: ``==`` where they are equal, a walk down where they are not), the hashes
    compared only where that cannot tell, for a tool not yet seen changing the state."""
    from envfactory.state import state_hash
    from envfactory.factory.tasks.arguments import draw_arguments

    rng = random.Random(f"observe/{seed}")
    changed: set[str] = set()
    ran: dict[str, set[tuple[str, tuple[Any, ...]]]] = {}  # tool -> the walks' calls it left the state unchanged in
    quiet: set[str] = set()  # left the state unchanged in a reference's call
    failed: set[str] = set()  # answered with an error-shaped value, state unchanged
    known: dict[tuple[int, ...], _Seen] = {}
    by_name = {t.name: t for t in tools}
    for make, calls in references:
        state = make()
        for c in calls:
            t = by_name.get(c.name)
            if t is None:  # not one of these tools: the rest of this reference is not run
                break
            trial = copy_state(state)
            out = t.invoke(trial, c.arguments)
            if not out.ok:
                continue
            differs = _state_differs(trial, state)
            if differs or (differs is None and state_hash(trial) != state_hash(state)):
                changed.add(t.name)
                state = trial
            elif _error_shaped(out.content):
                failed.add(t.name)
            else:
                quiet.add(t.name)  # a task author's valid call that left the state as it was
    bases = 0
    for _ in range(walks):
        state = synth.sample_state(rng)
        start = _seen(known, state)  # arguments are drawn from the walk's initial state
        if start.no < 0:
            start.no, bases = bases, bases + 1
        at: tuple[Any, ...] = (start.no,)  # which state a call ran on: the base and the writes since
        for _ in range(length):
            t = tools[rng.randrange(len(tools))]
            args = draw_arguments(t.name, t.parameters, start.doc, synth.arguments, rng, start.pools)
            if args is None:
                continue
            trial = copy_state(state)
            out = t.invoke(trial, args)
            if not out.ok:
                continue
            differs = _state_differs(trial, state)
            if differs or (differs is None and (t.name in changed
                                                or state_hash(trial) != _seen(known, state).hash())):
                changed.add(t.name)  # (a tool seen changing the state once is not hashed again)
                state = trial
                at += ((t.name, _call_key(args)),)
            elif _error_shaped(out.content):
                failed.add(t.name)
            else:
                ran.setdefault(t.name, set()).add((_call_key(args), at))
    seen: dict[str, bool | None] = {n: None for n in failed}
    seen.update({n: None for n, calls in ran.items() if len(calls) < 2})  # one quiet random call: undecided
    seen.update({n: True for n, calls in ran.items() if len(calls) >= 2})
    seen.update({n: True for n in quiet})
    seen.update({n: False for n in changed})
    return seen


def _call_key(arguments: Mapping[str, Any]) -> str:
    """Which call this was, for telling two quiet calls of one tool apart."""
    try:
        return json.dumps(arguments, sort_keys=True, default=repr)
    except (TypeError, ValueError):  # keys that cannot be sorted, say
        return repr(arguments)


class _Seen:
    """What :func:`observe_read_only` reads of one set of field values: its JSON (arguments are
    drawn from it) and the candidates found in it so far, and its hash, each when first asked."""

    def __init__(self, state: State) -> None:
        self.state = state  # keeps the values (and so the ids the key is made of) alive
        self.no = -1  # its number among the walks' initial states, once one starts from it
        self._doc: Any = None
        self.pools: dict[tuple[str, str], list[Any]] = {}
        self._hash: str | None = None

    @property
    def doc(self) -> Any:
        if self._doc is None:
            self._doc = json.loads(self.state.model_dump_json())
        return self._doc

    def hash(self) -> str:
        from envfactory.state import state_hash

        if self._hash is None:
            self._hash = state_hash(self.state)
        return self._hash


def _seen(known: dict[tuple[int, ...], _Seen], state: State) -> _Seen:
    key = tuple(map(id, state.__dict__.values()))
    got = known.get(key)
    if got is None:
        got = known[key] = _Seen(state)
        while len(known) > 16:
            known.pop(next(iter(known)))
    return got


_SCALARS = (str, int, float, bool, type(None), bytes)
_AS_PLAIN: dict[type, type] = {CowDict: dict, CowList: list}  # copy-on-write containers compare as plain ones


def _differs(a: Any, b: Any, pairs: dict[int, int] | None = None, back: dict[int, int] | None = None
             ) -> bool | None:
    """Whether two values would write different canonical JSON (``True``), the same (``False``),
    or ``None`` where this cannot tell without serializing (objects with their own ``__eq__``
    that differ, sets of objects, references shared differently on the two sides).

    Values equal by ``==`` count as the same (compared at C speed; as the copy-on-write state's
    own equality says: a ``1`` replaced by ``1.0``, or an object whose ``__eq__`` ignores an
    attribute, is not seen); where they are not, the walk goes down only along what differs, so
    a call that changed one record of a multi-MB database is told from a read without
    serializing either state. Objects reached again (cycles, shared references) are compared
    once; ``pairs``/``back`` pair up the containers met so far on the two sides."""
    if a is b:
        return False
    cls = a.__class__
    if cls is b.__class__ and cls not in _SCALARS:
        model = _COW_MODELS.get(cls)
        if model or (model is None and cow_model(cls)):
            return _model_differs(a, b, pairs, back)
    if cls is CowDict or cls is CowList or b.__class__ is CowDict or b.__class__ is CowList:
        cow = _cow_differs(a, b, pairs, back)
        if cow is not _UNLIKE:
            return cow
    try:
        if bool(a == b):
            return False
    except Exception:  # an __eq__ that raises or returns an array
        return None
    cls, cls_b = _AS_PLAIN.get(a.__class__, a.__class__), _AS_PLAIN.get(b.__class__, b.__class__)
    if cls is not cls_b or cls in _SCALARS:
        return not (cls is float and a != a and b != b)  # (NaN, written alike)
    if pairs is None or back is None:
        pairs, back = {}, {}
    ia, ib = id(a), id(b)
    if ia in pairs or ib in back:  # met before: compared there (or shared differently: the hash decides)
        return False if pairs.get(ia) == ib and back.get(ib) == ia else None
    pairs[ia], back[ib] = ib, ia
    unsure = False
    if cls is dict:
        if len(a) != len(b) or a.keys() != b.keys():
            return True
        for k, x in a.items():
            d = _differs(x, b[k], pairs, back)
            if d:
                return True
            unsure = unsure or d is None
        return None if unsure else False
    if cls is list or cls is tuple:
        if len(a) != len(b):
            return True
        for x, y in zip(a, b):
            d = _differs(x, y, pairs, back)
            if d:
                return True
            unsure = unsure or d is None
        return None if unsure else False
    if getattr(cls, "__eq__", object.__eq__) is object.__eq__ and _plain_class(cls):
        return _differs(vars(a), vars(b), pairs, back)  # a plain object without an equality: its attributes
    if (cls is set or cls is frozenset) and {e.__class__ for e in a} | {e.__class__ for e in b} <= {str, int}:
        return True  # unequal sets of strings and numbers
    return None  # unequal by an owner's equality: that says nothing of what the snapshot writes


_UNLIKE = object()


def _pair(a: Any, b: Any, pairs: dict[int, int], back: dict[int, int]) -> Any:
    """Pair up ``a`` and ``b`` (see :func:`_differs`): ``None`` when newly paired, else whether
    they differ as they were met before."""
    ia, ib = id(a), id(b)
    if ia in pairs or ib in back:  # met before: compared there (or shared differently: the hash decides)
        return False if pairs.get(ia) == ib and back.get(ib) == ia else None
    pairs[ia], back[ib] = ib, ia
    return _UNLIKE


def _model_differs(a: Any, b: Any, pairs: dict[int, int] | None, back: dict[int, int] | None) -> bool | None:
    """:func:`_differs` of two models of one class (:func:`~envfactory.factory.classes.cow.cow_model`),
    field by field, as a snapshot writes them: which fields were set, their extra and private
    values, their fields' values (each compared apart, not by the model's ``==``, which leaves
    out which fields were set). A τ²-shaped database, one model of nested models, is so
    compared along what a call changed, without serializing either side."""
    if a.__pydantic_fields_set__ != b.__pydantic_fields_set__:
        return True
    if pairs is None or back is None:
        pairs, back = {}, {}
    met = _pair(a, b, pairs, back)
    if met is not _UNLIKE:
        return met
    da, db = a.__dict__, b.__dict__
    if len(da) != len(db) or da.keys() != db.keys():
        return True
    unsure = False
    for x, y in ((a.__pydantic_extra__, b.__pydantic_extra__), (a.__pydantic_private__, b.__pydantic_private__)):
        if x is not y:
            d = _differs(x, y, pairs, back)
            if d:
                return True
            unsure = unsure or d is None
    for k, x in da.items():
        y = db[k]
        if x is not y:
            d = _differs(x, y, pairs, back)
            if d:
                return True
            unsure = unsure or d is None
    return None if unsure else False


def _cow_differs(a: Any, b: Any, pairs: dict[int, int] | None, back: dict[int, int] | None) -> Any:
    """:func:`_differs` of two dicts or two lists of which one at least is a copy-on-write
    container (a copy of the other, or of what the other was copied from): the entries that
    are not the very same objects are found at C speed and compared one by one (not by the
    containers' ``==``, which would compare the models in them by theirs). ``_UNLIKE`` when
    they are not two dicts or two lists."""
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b) or dict.keys(a) != dict.keys(b):
            return True
        if pairs is None or back is None:
            pairs, back = {}, {}
        met = _pair(a, b, pairs, back)
        if met is not _UNLIKE:
            return met
        keys = list(dict.keys(a))
        if keys == list(dict.keys(b)):
            changed: Any = itertools.compress(keys, map(operator.is_not, dict.values(a), dict.values(b)))
        else:
            changed = [k for k in keys if dict.__getitem__(a, k) is not dict.__getitem__(b, k)]
        unsure = False
        for k in changed:
            d = _differs(dict.__getitem__(a, k), dict.__getitem__(b, k), pairs, back)
            if d:
                return True
            unsure = unsure or d is None
        return None if unsure else False
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return True
        if pairs is None or back is None:
            pairs, back = {}, {}
        met = _pair(a, b, pairs, back)
        if met is not _UNLIKE:
            return met
        unsure = False
        for x, y in zip(list.__iter__(a), list.__iter__(b)):
            if x is not y:
                d = _differs(x, y, pairs, back)
                if d:
                    return True
                unsure = unsure or d is None
        return None if unsure else False
    return _UNLIKE


def _state_differs(a: State, b: State) -> bool | None:
    """:func:`_differs` over two states' fields (each compared apart: a field holding a model
    database is compared along what differs, not by the model's ``==``)."""
    da, db = a.__dict__, b.__dict__
    if da.keys() != db.keys():
        return True
    pairs: dict[int, int] = {}
    back: dict[int, int] = {}
    unsure = False
    for k, x in da.items():
        d = _differs(x, db[k], pairs, back)
        if d:
            return True
        unsure = unsure or d is None
    return None if unsure else False


def _same_fields(a: State, b: State) -> bool:
    """Whether the two states' fields are equal by ``==`` (plain data compares by content; an
    object without ``__eq__`` only to itself, so it is left to the hashes)."""
    try:
        return bool(a.__dict__ == b.__dict__)
    except Exception:  # an __eq__ that raises or returns an array
        return False


_ERROR_START = re.compile(r"\s*(error\b|\{\s*['\"]error['\"]\s*:)", re.IGNORECASE)


def _error_shaped(text: str) -> bool:
    """Whether a method's result reads as a failure it returned rather than raised."""
    if _ERROR_START.match(text):
        return True
    if text[:1] == "{" and '"error"' in text:
        try:
            return "error" in json.loads(text)
        except ValueError:
            return False
    return False


def _config_sampler(config: Any) -> Callable[[random.Random], Any]:
    if callable(config):
        return config
    if isinstance(config, dict):
        return lambda rng: config
    configs = list(config)
    if not configs:
        raise SpecError("from_class needs at least one initial configuration")
    return lambda rng: configs[rng.randrange(len(configs))]


def from_class(
    cls: type | Service | Sequence[type | Service],
    *,
    name: str,
    domain: str,
    config: Config | None = None,
    loader: Loader | None = None,
    tasks: Sequence[Task | ClassTask] | Callable[[], Sequence[Task | ClassTask]] | None = None,
    synthesis: Synthesis = Synthesis(),
    validation: Literal["strict", "coerce", "lax"] = "lax",
    render: Render = None,
    errors: Literal["message", "detailed"] = "message",
    read_only: Iterable[str] | Literal["observe"] | None = "observe",
    require_reads: Literal["auto", "always", "never"] | bool = "auto",
    compare: Compare = "auto",
    state: Literal["auto", "attributes", "objects"] = "auto",
    copy_on_write: Literal["state", "containers"] = "state",
    after_call: AfterCall | None = None,
    trusted_modules: Iterable[str] = (),
    description: str = "",
    max_turns: int = 20,
) -> ToolEnvSpec:
    """Build an environment from one class or several services, leaving them untouched.

    Args:
        cls: The class, a :class:`Service`, or a list of them (one episode, several services).
            A class's own options (constructor arguments with a loader, a tool-name prefix,
            methods to include or exclude) go in its :class:`Service`.
        name: Registry name, ``Name-v0``.
        domain: Domain label.
        config: Initial configuration(s) for synthesized tasks: a dict, a list of dicts
            (sampled), or ``f(rng) -> dict``. For several services, each dict maps
            service keys to that service's configuration. Optional when ``tasks`` are given.
            A configuration object is read once: the state it builds is the shared base of every
            task and walk that uses that same object (copy on write), so give tasks on one
            database one object (``ClassTask(config=db)``) and do not change it afterwards.
        loader: For a single class: a method name, or ``loader(instance, config)``, that
            loads the configuration after ``cls()`` (classes that set their state in
            ``_load_scenario(config)``; constructor arguments: ``Service(cls, init=...)``).
        tasks: Tasks (:class:`~envfactory.Task` or :class:`ClassTask`), or a function
            returning them; by default ``synthesis.n_tasks`` are synthesized lazily.
        synthesis: How tasks are synthesized (:class:`Synthesis`: argument sources, how
            many, the seed).
        validation: ``"lax"`` (default: arguments passed as sent, as the class would receive
            them; only their names are checked: an unknown or a missing required argument is
            refused), ``"strict"`` (each argument must be of its annotated type) or
            ``"coerce"`` (pydantic's conversion). Lax is the default because the suites these
            classes come from call them so (BFCL evaluates the call as written, τ²-bench passes
            the arguments on) and their own data may contradict an annotation (BFCL's TicketAPI
            annotates ``ticket_id: int``; its gold calls ``close_ticket(ticket_id='ticket_001')``,
            which the class accepts): a check the class does not make must not turn a call it
            accepts, a gold call above all, into an error, nor the task's expected state into
            one where that call never happened. The schema agents see is the same in every mode.
        render: How results become observations: ``None`` (default: strings as they
            are, ``None`` as ``OK``, other values as JSON), ``"str"``, ``"repr"`` or a function.
        errors: ``"message"``: a method's exception shows as ``Error: <its message>``;
            ``"detailed"``: ``Error: tool 'x' failed: ValueError: <message>``.
        read_only: ``"observe"`` (the default): decided by watching random walks over the
            tools (:func:`observe_read_only`; a tool that never ran without raising falls back
            to its name, and so does one seen only returning an error-shaped value, ``"Error: ..."``
            or ``{"error": ...}``, which a ``UserWarning`` and ``spec.metadata["read_only_undecided"]``
            name); or the methods (or tool names) that never change the state; or
            ``None``: by name prefix (``get_``, ``list_``, ...). A :class:`Service`'s own
            ``read_only`` wins for its methods (it pins them; the others are observed).
        require_reads: Whether a given task's success also needs the results its reference
            solution's reads returned to appear among the episode's tool results
            (:class:`ReadsCheck`): ``"auto"`` (default) for tasks whose reference leaves the
            state unchanged (the answer is in a tool result, so the state alone cannot tell
            a no-op agent from one that looked), ``"always"`` (every task with reads),
            ``"never"`` (the final state and answer facts only). ``ClassTask.require_reads``
            overrides it per task.
        compare: What success compares between the final state and the state the reference
            solution produces, when a task brings no ``check`` (:mod:`~envfactory.factory.classes.compare`):
            ``"auto"`` (default), per class, the class's own ``__eq__`` if it defines one, else
            its public attributes (``_name`` attributes hold caches, clocks and ids, and the
            suites such classes come from leave them out), else (no public attribute) all of
            them; ``"public"``; ``"all"`` (the whole state's hash); ``{"ClassName": [attribute,
            ...]}``: every attribute but those, for that class wherever its objects are (per-run
            values: ``{"Entry": ["created"]}``); or ``f(final, expected) -> bool`` over each
            class's two instances. ``envfactory verify`` names the attributes two replays of a
            reference disagree on.
        state: ``"attributes"`` (a field per attribute), ``"objects"`` (a field per
            service, holding the live instance, copied as one graph) or ``"auto"``.
        copy_on_write: How a fork (and a task's start, a copy of its configuration's state)
            shares the values until a tool changes them. ``"state"`` (default): the first tool call
            on a shared state copies it whole, as one graph (as ``copy.deepcopy`` of the
            instances), so the class's code, its renderer and ``after_call`` only ever see the
            class's own values and types, live, forked or restored (BFCL's execution renders
            ``type(result) == dict`` results as JSON, anything else with ``str``). ``"containers"``
            (a state of attributes, for multi-MB databases of dicts): the first call copies only the
            dicts and lists it reaches, which the class's code then sees as ``CowDict`` /
            ``CowList`` (subclasses of dict and list: ``isinstance`` holds, an exact ``type(x) is
            dict`` does not; results reach a renderer as plain values), a restored state holds plain
            dicts and lists; the quota's measure and the hash reuse what forks share. A database
            held in one pydantic model (τ²-bench's ``self.db``) is copied per model alike: a model
            a call reaches is copied (its class kept), its dicts and lists as above
            (:func:`~envfactory.factory.classes.cow.cow_model`).
        after_call: ``after_call(instances)``, ``{service key: live instance}`` (for one class,
            its key alone), run after every call of a method, whether it returned or raised, and
            on every state built from a configuration (so an initial state starts as every call
            leaves it): coupled services kept in sync, as τ²-bench's telecom environment syncs
            the agent's database and the user's device after each tool call. It runs inside the
            call (its exception is the call's error), so reference replays (the tasks' expected
            states), forks and restored states all include it.
        trusted_modules: Modules (besides the classes' packages) whose classes a
            snapshot may rebuild (see :mod:`~envfactory.factory.classes.pystate`).
        description: One line about the environment (default: the class docstring's first line).
        max_turns: Assistant turns per episode.
    """
    if errors not in ("message", "detailed"):
        raise SpecError(f"errors must be 'message' or 'detailed', got {errors!r}")
    many = isinstance(cls, (list, tuple))
    raw: list[type | Service] = list(cls) if isinstance(cls, (list, tuple)) else [cast("type | Service", cls)]
    if not raw:
        raise SpecError("from_class needs at least one class")
    services = []
    for item in raw:
        svc = item if isinstance(item, Service) else Service(item)
        if not isinstance(svc.cls, type):
            raise SpecError(f"from_class takes classes or Service(...), got {svc.cls!r}")
        if many and loader is not None:
            raise SpecError("with several classes, give the loader per class: Service(cls, loader=...)")
        svc = dataclasses.replace(svc, loader=svc.loader if svc.loader is not None else loader,
                                  exclude=tuple(svc.exclude),
                                  read_only=svc.read_only if svc.read_only is not None else read_only)
        services.append(svc)
    parts: list[_Part] = []
    for svc in services:
        key = svc.key or _snake(svc.cls.__name__).lstrip("_")  # a private-looking class name: not a private field
        if not key.isidentifier() or key.startswith("_") or key in _RESERVED or key.startswith("model_"):
            raise SpecError(f"{svc.cls.__name__}: {key!r} cannot be a state field; give Service(key=...)")
        if any(p.key == key for p in parts):
            raise SpecError(f"two services have the key {key!r} ({svc.cls.__name__} and "
                            f"{next(p.cls.__name__ for p in parts if p.key == key)}); give Service(key=...)")
        parts.append(_Part(svc, key))
    classes = [p.cls for p in parts]
    label = classes[0].__name__ if len(classes) == 1 else " + ".join(c.__name__ for c in classes)

    task_items = None if tasks is None or callable(tasks) else list(tasks)
    if config is None:
        first = next((t for t in task_items or () if isinstance(t, ClassTask)), None)
        if first is None and (tasks is None or callable(tasks)):
            raise SpecError(f"{label}: from_class needs config= (or tasks with their configs)")
        config = first.config if first is not None else ({} if many else None)
    sample = _config_sampler(config) if config is not None else (lambda rng: None)

    def configs_of(cfg: Any) -> list[Any]:
        if not many:
            return [cfg]
        if cfg is None:
            cfg = {}
        if not isinstance(cfg, dict):
            raise SpecError(f"{label}: with several services a configuration maps service keys "
                            f"({[p.key for p in parts]}) to their configurations")
        unknown = set(cfg) - {p.key for p in parts}
        if unknown:
            raise SpecError(f"{label}: configuration for unknown services {sorted(unknown)}; "
                            f"the services are {[p.key for p in parts]}")
        return [cfg.get(p.key) for p in parts]

    seed = synthesis.seed
    probe_cfg = sample(random.Random(seed))
    probes = [p.instance(c) for p, c in zip(parts, configs_of(probe_cfg))]
    trusted = tuple(sorted(set(trusted_for(classes)) | set(trusted_modules)))
    graph = state == "objects" or many
    if state not in ("auto", "attributes", "objects"):
        raise SpecError(f"state must be 'auto', 'attributes' or 'objects', got {state!r}")
    if state == "auto" and not many:
        p0 = probes[0]
        graph = (getattr(p0, "__dict__", None) is None or any("__slots__" in vars(k) for k in type(p0).__mro__[:-1])
                 or _shares(p0, vars(p0).values()))
    if state == "attributes" and many:
        raise SpecError(f"{label}: several services need state='objects' (or 'auto')")

    if graph:
        fields: dict[str, Any] = {p.key: (Any, ...) for p in parts}
        model_name = "".join(c.__name__ for c in classes) + "State"
        state_type: type[PyState] = create_model(model_name, __base__=_ClassState, **fields)
        state_type.__module__ = classes[0].__module__
        state_type.__pystate_graph__ = True
        state_type.__state_copy__ = staticmethod(lazy_state_copy)  # every tool here calls own() first
        mapping: dict[str, str] = {}
    else:
        state_type, mapping = class_state_type(classes[0], probes[0], copy_on_write)
    state_type.__pystate_trusted__ = trusted
    # what a restored state's attributes may hold: learnt from every configuration built (and every call)
    restore_types = _StateTypes(None if graph else mapping, {p.key: p.cls for p in parts})
    cast("type[_ClassState]", state_type).__restore_types__ = restore_types

    def build_state(instances: list[Any]) -> State:
        if after_call is not None:  # a configuration's instances start in sync, as every call leaves them
            after_call({p.key: inst for p, inst in zip(parts, instances)})
        if graph:
            for p, inst in zip(parts, instances):
                attrs = getattr(inst, "__dict__", None)
                if attrs is not None:
                    restore_types.tables[p.key].learn(attrs)
            return state_type.model_validate({p.key: inst for p, inst in zip(parts, instances)})
        inst = instances[0]
        attrs = vars(inst)
        if attrs.keys() != mapping.keys():
            raise SpecError(f"{label}: this configuration gives attributes {sorted(attrs)}, another gave "
                            f"{sorted(mapping)}; build with from_class(..., state='objects')")
        restore_types.tables[parts[0].key].learn(attrs)
        return state_type.model_validate({f: attrs[a] for a, f in mapping.items()})

    # id(configuration) -> (it, the state it builds, whether the quota's measure of it is remembered)
    bases: dict[int, tuple[Any, State, bool]] = {}

    def make_state(cfg: Any) -> State:
        """The initial state of a configuration: built once per configuration object (the last
        few kept), every later call a copy-on-write copy of that one base, so the tasks and the
        read-only observation of one multi-MB database share it until a tool changes their copy."""
        kept = bases.get(id(cfg))
        if kept is None or kept[0] is not cfg:
            kept = (cfg, build_state([p.instance(c) for p, c in zip(parts, configs_of(cfg))]), False)
            bases.pop(id(cfg), None)
            bases[id(cfg)] = kept
            while len(bases) > 8:  # configurations drawn afresh each time (config=f(rng)) are not kept
                bases.pop(next(iter(bases)))
        elif not graph and not kept[2] and copy_on_write == "containers":
            # A base shared by a second state is measured for the state quota now, while the
            # environment is built: its containers' sizes are remembered (cow_state_size), so
            # the first writing call of an episode measures only what it changed, not the
            # database (0.7-1.1 s on a 4.8 MB one, paid by whichever episode wrote first). (A
            # state of objects is copied whole by its first call and measured whole: nothing kept.)
            cow_state_size(kept[1])
            kept = bases[id(cfg)] = (cfg, kept[1], True)
        return copy_state(kept[1])

    probe_state = build_state(probes)
    if probe_cfg is not None:  # the probe's configuration is read once: its state is that configuration's base
        bases[id(probe_cfg)] = (probe_cfg, probe_state, False)
    comparison = Comparison([(p.key if graph else "", p.cls) for p in parts], probes, compare, mapping, trusted)
    walked: set[int] = set()
    if not all(_plain(v, walked) for v in probe_state.__dict__.values()):  # (plain data is its own document)
        try:  # fail now, naming the place, rather than at the first snapshot
            doc = encode(probe_state.__dict__, trusted)
            again = encode(decode(doc, trusted), trusted)
        except PyStateError as exc:
            raise SpecError(f"{label}: its state cannot be carried through snapshots: {exc}") from None
        if again != doc:
            raise SpecError(f"{label}: its state does not survive a snapshot round trip unchanged")

    observe = isinstance(read_only, str) and read_only == "observe"
    if observe:
        services = [dataclasses.replace(p.svc, read_only=None if p.svc.read_only == "observe" else p.svc.read_only)
                    for p in parts]
        for p, svc in zip(parts, services):
            p.svc = svc
    tools: list[Tool] = []
    owner: dict[str, str] = {}
    pinned: set[str] = set()  # a Service's own read_only decides its tools; observation, the rest
    for part in parts:
        svc = part.svc
        ro = set(svc.read_only) if svc.read_only is not None else None
        types_of = restore_types.tables[part.key]
        bind = (_object_binder(part.key, after_call, [p.key for p in parts], types_of) if graph
                else _attribute_binder(part.cls, mapping, copy_on_write, after_call, part.key, types_of))
        for m in _methods(part, svc.include, svc.exclude):
            tname = svc.prefix + m
            if tname in owner:
                raise SpecError(
                    f"{label}: tool name {tname!r} comes from both {owner[tname]} and {part.cls.__name__}."
                    f"{m}; give one service a prefix (Service({part.cls.__name__}, prefix="
                    f"'{part.key}_')) or exclude one")
            owner[tname] = f"{part.cls.__name__}.{m}"
            marked = part.marked_reads.get(m)
            if ro is not None:  # the Service's (or from_class's) read_only pins it
                is_ro = m in ro or tname in ro
                pinned.add(tname)
            elif marked is not None:  # so does the class's own mark of kind (@is_tool(ToolType.READ))
                is_ro = marked
                pinned.add(tname)
            else:
                is_ro = reads_by_name(m)
            tools.append(_method_tool(part.cls, m, tool_name=tname, read_only=is_ro, bind=bind,
                                      validation=validation, render=render, errors=errors))
    if not tools:
        raise SpecError(f"{label} has no public methods to turn into tools")

    if require_reads is True or require_reads is False:
        require_reads = "always" if require_reads else "never"
    if require_reads not in ("auto", "always", "never"):
        raise SpecError(f"require_reads must be 'auto', 'always' or 'never', got {require_reads!r}")
    by_name = {t.name: t for t in tools}

    def with_reads(task: Task, wanted: bool | None) -> Task:
        """The task, its check made a :class:`ReadsCheck` when its reads are required, and a
        :class:`~envfactory.factory.classes.compare.MatchesReference` when ``compare`` is not the whole state."""
        if isinstance(task.check, ReadsCheck):
            return task
        need_reads = not (wanted is False or (wanted is None and require_reads == "never"))
        need_match = not comparison.whole and (task.check is None or isinstance(task.check, ChangeCheck))
        if not need_reads and not need_match:
            return task
        from envfactory.state import state_hash

        def unchanged(state: Any, before: Any) -> bool:
            """Whether ``state`` is still the world ``before`` (a copy-on-write copy of it taken
            then, which no tool touches) was: equal fields by ``==`` (plain data, without
            serializing a multi-MB database), else as the comparison says."""
            if comparison.whole:  # the whole state: what would hash differently, found without hashing
                differs = _state_differs(state, before)
                if differs is not None:
                    return not differs
            return _same_fields(state, before) or comparison.same(state, before)

        s = record_results(copy_state(task.initial_state))
        start = copy_state(s)
        reads: list[tuple[str, str]] = []
        for c in task.solution:
            t = by_name.get(c.name)
            if t is None:  # not ours to judge: the replay at registration reports it
                return task
            before = copy_state(s)
            out = t.invoke(s, c.arguments)
            if out.ok and unchanged(s, before):
                reads.append((c.name, result_digest(out.content)))
        check = task.check
        if need_match:
            check = (comparison.narrow(task.check, s) if isinstance(task.check, ChangeCheck)
                     else MatchesReference(s, comparison))
        if not need_reads or not reads or (wanted is None and require_reads == "auto"
                                            and not unchanged(s, start)):
            return task if check is task.check else task.model_copy(update={"check": check})
        expected: dict[str, Any] = ({"expected": s} if type(s).__hash_on_demand__
                                    else {"expected_hash": state_hash(s)})
        return task.model_copy(update={"check": ReadsCheck(reads, check=check, **expected),
                                       "initial_state": record_results(copy_state(task.initial_state))})

    def to_task(t: Task | ClassTask) -> Task:
        if isinstance(t, Task):
            return with_reads(t, None)
        if isinstance(t, ClassTask):
            return with_reads(Task(id=t.id, instruction=t.instruction, initial_state=make_state(t.config),
                                   solution=list(t.solution), answer_facts=list(t.answer_facts),
                                   answer_rivals=None if t.answer_rivals is None else list(t.answer_rivals),
                                   answer_seen=t.answer_seen, check=t.check, difficulty=t.difficulty,
                                   metadata=dict(t.metadata)), t.require_reads)
        raise SpecError(f"{label}: {t!r} is neither a Task nor a ClassTask")

    synth = SynthConfig(
        sample_state=lambda rng: make_state(sample(rng)),
        arguments=dict(synthesis.arguments), prefix=name.split("-")[0].lower(),
    )
    undecided: list[str] = []
    if observe:
        references: list[tuple[Callable[[], State], Sequence[ToolCall]]] = []
        for given in task_items or ():  # (tasks given as a callable stay lazy: only walks observe them)
            if isinstance(given, ClassTask):
                references.append((functools.partial(make_state, given.config), given.solution))
            elif isinstance(given, Task):
                references.append((functools.partial(copy_state, given.initial_state), given.solution))
        seen = observe_read_only(tools, synth, seed=seed, references=references)
        for t in tools:
            if t.name in pinned:
                continue
            verdict = seen.get(t.name)
            if verdict is not None:
                t.read_only = verdict
            elif t.name in seen:
                undecided.append(t.name)
        if undecided:
            undecided.sort()
            warnings.warn(
                f"{label}: could not observe whether {', '.join(undecided)} change the state (every random "
                f"call that did not raise answered with an error value, or one call alone left the state as it "
                f"was, which a writer can do, and no task's reference showed what it does); their names "
                f"decide (read-only: {[n for n in undecided if by_name[n].read_only]}); pin the read-only "
                f"methods with read_only=[...] or Service(cls, read_only=[...]), or give Synthesis(arguments=...) "
                f"that make them succeed", UserWarning, stacklevel=2)
    spec = ToolEnvSpec(name=name, domain=domain, state_type=state_type, tools=tools, tasks=[],
                       description=description or (inspect.getdoc(classes[0]) or "").split("\n")[0],
                       max_turns=max_turns,
                       metadata={"synth": synth, "state_from_config": make_state, "compare": comparison,
                                 "read_only_undecided": undecided,
                                 "services": {p.key: f"{p.cls.__module__}.{p.cls.__qualname__}" for p in parts},
                                 "source": "class " + ", ".join(f"{c.__module__}.{c.__qualname__}"
                                                                for c in classes)})
    if task_items is not None:
        spec.tasks = [to_task(t) for t in task_items]
    elif callable(tasks):
        spec.tasks = lambda: [to_task(t) for t in tasks()]
    else:
        def synthesized() -> list[Task]:
            made = synthesize(spec.all_tools, synth, synthesis.n_tasks, seed)
            if not made:
                raise SpecError(_no_tasks(f"{name} ({label})", tools, synth, seed))
            return [with_reads(t, None) for t in made]

        spec.tasks = synthesized
    return spec


def _no_tasks(label: str, tools: Sequence[Tool], synth: SynthConfig, seed: int, draws: int = 12) -> str:
    """Why task synthesis found nothing, tool by tool (from a few calls with drawn arguments
    on sampled states), and the ways out: the message of the error a synthesized environment
    with no task raises, instead of the engine's bare "needs at least one task"."""
    from envfactory.state import copy_state, state_hash
    from envfactory.factory.tasks.arguments import draw_arguments

    rng = random.Random(f"no-tasks/{seed}")
    why: list[str] = []
    for t in tools:
        drawn = ran = changed = 0
        for _ in range(draws):
            state = synth.sample_state(rng)
            args = draw_arguments(t.name, t.parameters, json.loads(state.model_dump_json()), synth.arguments, rng)
            if args is None:
                continue
            drawn += 1
            before = state_hash(state)
            trial = copy_state(state)
            if t.invoke(trial, args).ok:
                ran += 1
                changed += state_hash(trial) != before
        if not drawn:
            params = [f"{t.name}.{p}" for p in t.parameters.get("required", [])]
            why.append(f"{t.name}: no value to draw for {', '.join(params) or 'its arguments'} "
                       f"(nothing in the state fits; give Synthesis(arguments={{{params[0] if params else t.name!r}: "
                       f"[...]}}))" if params else f"{t.name}: no arguments could be drawn")
        elif not ran:
            why.append(f"{t.name}: failed on every drawn call")
        elif not changed:
            why.append(f"{t.name}: reads only (a look-up task needs a value of the state in its result "
                       "that the instruction does not give away)")
        else:
            why.append(f"{t.name}: changes the state, but no walk was kept (a change any call would make, "
                       "one a random agent reaches, or the same task again)")
    return (f"{label}: task synthesis found no task ({'; '.join(why)}); give tasks=[ClassTask(...)] "
            f"or argument sources and configurations that make the tools' calls tell apart")


_callable(__name__)  # envfactory.factory.from_class may be this module: calling it calls from_class()
