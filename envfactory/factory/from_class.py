"""A third-party Python class, unchanged, as an environment.

The class keeps its state in instance attributes and exposes operations as
methods. :func:`from_class` turns it into an :class:`~envfactory.ToolEnvSpec`:

* the instance attributes (after ``cls(**config)``) become the fields of a
  generated :class:`~envfactory.State` model (names starting with ``_`` are
  kept as ``private_<name>``); their types come from the class's annotations
  when it has them;
* each public method becomes a tool: its schema comes from the signature and
  the Google-style docstring; when called, the tool binds a bare instance to the
  episode's state, calls the method, and writes the attributes back;
* an initial-configuration dict (or a function of a seeded RNG returning one)
  seeds the state; tasks are synthesized by walking the tools
  (:mod:`.tasks_synth`) unless given.

The class is never modified or subclassed; its exceptions become error
observations like any tool failure.
"""

from __future__ import annotations

import inspect
import json
import random
import typing
from typing import Any, Callable, Iterable, Sequence

from pydantic import create_model

from ..definition import ToolEnvSpec, SpecError
from ..state import State
from ..task import Task
from ..tooling import Tool, make_tool
from .arguments import ArgSource
from .tasks_synth import SynthConfig, synthesize

__all__ = ["from_class", "class_tools", "class_state_type"]

READ_PREFIXES = ("get", "list", "find", "search", "show", "count", "describe", "check", "read",
                 "lookup", "view", "total", "report", "status", "is_", "has_", "peek")

Config = dict[str, Any] | Sequence[dict[str, Any]] | Callable[[random.Random], dict[str, Any]]


def _field_name(attr: str) -> str:
    return "private" + attr if attr.startswith("_") else attr


def class_state_type(cls: type, probe: Any) -> tuple[type[State], dict[str, str]]:
    """A State model for the attributes of ``probe`` (an instance of ``cls``).

    Returns the model and ``{attribute: field}``.
    """
    attrs = getattr(probe, "__dict__", None)
    if attrs is None:
        raise SpecError(f"{cls.__name__}: instances need a __dict__ (classes with __slots__ are not "
                        "supported); wrap the class in a small adapter instead")
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        hints = {}
    fields: dict[str, Any] = {}
    mapping: dict[str, str] = {}
    for attr, value in attrs.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise SpecError(
                f"{cls.__name__}.{attr} holds {type(value).__name__}, which is not plain JSON data "
                f"({exc}); the state must be dicts, lists, strings, numbers, booleans or None"
            ) from None
        fname = _field_name(attr)
        mapping[attr] = fname
        fields[fname] = (hints.get(attr, Any), ...)
    model = create_model(f"{cls.__name__}State", __base__=State, **fields)
    model.__module__ = cls.__module__
    return model, mapping


def _method_tool(cls: type, method: str, mapping: dict[str, str], read_only: bool) -> Tool:
    func = getattr(cls, method)
    sig = inspect.signature(func)
    params = list(sig.parameters.values())[1:]  # drop self
    try:
        hints = typing.get_type_hints(func)
    except Exception as exc:
        raise SpecError(f"{cls.__name__}.{method}: cannot resolve type hints: {exc}") from exc
    pairs = tuple(mapping.items())

    def call(state: Any, **kwargs: Any) -> Any:
        obj = object.__new__(cls)
        d = obj.__dict__
        for attr, fname in pairs:
            d[attr] = getattr(state, fname)
        try:
            return func(obj, **kwargs)
        finally:
            for attr, fname in pairs:  # attributes may have been rebound, not only mutated
                object.__setattr__(state, fname, d[attr])

    call.__name__ = method
    call.__doc__ = func.__doc__
    call.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("state", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params)
    call.__annotations__ = {p.name: hints[p.name] for p in params if p.name in hints}
    return make_tool(call, name=method, read_only=read_only)


def class_tools(
    cls: type, mapping: dict[str, str], *, include: Iterable[str] | None = None,
    exclude: Iterable[str] = (), read_only: Iterable[str] | None = None,
) -> list[Tool]:
    """Tools for the public methods of ``cls`` (in definition order)."""
    names = list(include) if include is not None else [
        n for n, v in vars(cls).items() if not n.startswith("_") and inspect.isfunction(v)]
    skip = set(exclude)
    ro = set(read_only) if read_only is not None else None
    tools = []
    for n in names:
        if n in skip:
            continue
        is_ro = n in ro if ro is not None else n.startswith(READ_PREFIXES)
        tools.append(_method_tool(cls, n, mapping, is_ro))
    if not tools:
        raise SpecError(f"{cls.__name__} has no public methods to turn into tools")
    return tools


def _config_sampler(config: Config) -> Callable[[random.Random], dict[str, Any]]:
    if callable(config):
        return config
    if isinstance(config, dict):
        return lambda rng: config
    configs = list(config)
    if not configs:
        raise SpecError("from_class needs at least one initial configuration")
    return lambda rng: configs[rng.randrange(len(configs))]


def from_class(
    cls: type,
    *,
    name: str,
    domain: str,
    config: Config,
    description: str = "",
    tasks: Sequence[Task] | Callable[[], Sequence[Task]] | None = None,
    n_tasks: int = 60,
    seed: int = 0,
    arguments: dict[str, ArgSource] | None = None,
    templates: dict[str, str] | None = None,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    read_only: Iterable[str] | None = None,
    read_share: float = 0.2,
    max_turns: int = 20,
) -> ToolEnvSpec:
    """Build an environment from a class, leaving the class untouched.

    Args:
        cls: The class. ``cls(**config)`` must build a fresh instance.
        name: Registry name, ``Name-v0``.
        domain: Domain label.
        config: Initial configuration: a dict, a list of dicts (sampled), or
            ``f(rng) -> dict``.
        tasks: Tasks to use; by default ``n_tasks`` are synthesized lazily.
        arguments: Argument sources for synthesis (see :mod:`.arguments`).
        templates: Instruction templates by method name.
        include: Methods to expose (default: every public method).
        exclude: Methods to hide.
        read_only: Methods that never change the state (default: by name prefix).
    """
    sample = _config_sampler(config)
    probe = cls(**sample(random.Random(seed)))
    state_type, mapping = class_state_type(cls, probe)

    def make_state(cfg: dict[str, Any]) -> State:
        inst = cls(**cfg)
        return state_type.model_validate({f: getattr(inst, a) for a, f in mapping.items()})

    tools = class_tools(cls, mapping, include=include, exclude=exclude, read_only=read_only)
    synth = SynthConfig(
        sample_state=lambda rng: make_state(sample(rng)),
        arguments=dict(arguments or {}), templates=dict(templates or {}),
        read_share=read_share, prefix=name.split("-")[0].lower(),
    )
    spec = ToolEnvSpec(name=name, domain=domain, state_type=state_type, tools=tools, tasks=[],
                       description=description or (inspect.getdoc(cls) or "").split("\n")[0],
                       max_turns=max_turns, metadata={"synth": synth, "source": f"class {cls.__module__}."
                                                      f"{cls.__qualname__}"})
    spec.tasks = tasks if tasks is not None else (
        lambda: synthesize(spec.all_tools, synth, n_tasks, seed))
    return spec
