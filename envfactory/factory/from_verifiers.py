"""A verifiers 0.4 tool server, unchanged, as an environment: its ``@vf.tool`` methods become tools.

verifiers 0.4 keeps a task's tools in a ``vf.Toolset`` subclass: its methods marked ``@vf.tool``
(the tool name: the method's, or ``@vf.tool(name=...)``; the description: its docstring) read and
write ``self.state``, an instance of the toolset's ``vf.State`` model (pydantic), which verifiers
serves over MCP and syncs per rollout. :func:`from_verifiers` builds an envfactory environment on
the same methods with :func:`~envfactory.factory.from_class`: the state is that ``State`` model,
one per episode (copied for forks and snapshots as any state is), and each call runs the method
with ``self.state`` bound to the episode's state (an ``async`` tool runs to completion on an event
loop of its own). Tasks are ``ClassTask``\\ s whose ``config`` is the initial state (a dict the
``State`` model validates), or synthesized by walking the tools as :func:`from_class` does.

It needs verifiers where it runs (``pip install 'verifiers>=0.4,<0.5'``; it pins ``mcp==2.0.0``,
so give it a virtual environment of its own); importing this module does not import verifiers.
"""

from __future__ import annotations

from envfactory.factory import _callable

import asyncio
import concurrent.futures
import functools
import inspect
from typing import Any

from ..definition import ToolEnvSpec

__all__ = ["from_verifiers", "toolset_tools"]


def _verifiers() -> Any:
    try:
        from verifiers.v1.mcp import server, toolset
        from verifiers.v1.state import state_cls
        from verifiers.v1.utils.decorators import discover_decorated
    except ImportError as exc:
        raise ImportError(f"from_verifiers needs verifiers 0.4 (pip install 'verifiers>=0.4,<0.5'; it pins "
                          f"mcp==2.0.0, so give it a venv of its own): {exc}") from exc
    return server, toolset, state_cls, discover_decorated


def toolset_tools(toolset: Any) -> dict[str, str]:
    """``{tool name: method name}`` of a ``vf.Toolset`` subclass (or instance): its ``@vf.tool``
    methods, as verifiers advertises them."""
    _, toolset_module, _, discover_decorated = _verifiers()
    cls = toolset if isinstance(toolset, type) else type(toolset)
    if not (isinstance(cls, type) and issubclass(cls, toolset_module.Toolset)):
        raise TypeError(f"from_verifiers needs a verifiers.v1.Toolset subclass, got {toolset!r}")
    names: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for attr, fn in vars(klass).items():
            if callable(fn) and getattr(fn, "tool", False) is True:
                names[getattr(fn, "tool_name", None) or attr] = attr
    if not names:
        raise ValueError(f"{cls.__name__} has no @vf.tool method")
    return names


def _run(result: Any) -> Any:
    """An ``async`` tool's coroutine run to completion (in a thread of its own when this thread's loop runs)."""
    if not inspect.isawaitable(result):
        return result

    async def wait() -> Any:
        return await result

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def from_verifiers(toolset: Any, *, name: str, domain: str = "verifiers", config: Any = None,
                   **kwargs: Any) -> ToolEnvSpec:
    """An environment whose tools are ``toolset``'s ``@vf.tool`` methods (a ``vf.Toolset`` subclass,
    or an instance made with its config) and whose state is its ``vf.State`` model.

    Args:
        toolset: The toolset class (made with its config type's defaults) or instance.
        name: Registry name, ``Name-v0``.
        domain: Domain label.
        config: Initial states for synthesized tasks (dicts the ``State`` model validates; a list is
            sampled), as :func:`~envfactory.factory.from_class`'s ``config``; default: the model's
            defaults.
        **kwargs: Passed to :func:`~envfactory.factory.from_class` (``tasks``, ``synthesis``,
            ``validation``, ``read_only``, ``errors``, ``max_turns``, ...).
    """
    from .from_class import from_class

    server, _, state_cls, _ = _verifiers()
    tools = toolset_tools(toolset)
    cls = toolset if isinstance(toolset, type) else type(toolset)
    made: Any = cls  # (Any: a Toolset's classmethods are verifiers')
    instance = toolset if not isinstance(toolset, type) else made(made._config_cls()())
    state_type = state_cls(cls)
    call_state = server._call_state  # the context variable behind Toolset.state

    def method(tool: str, attr: str) -> Any:
        fn = getattr(cls, attr)
        sig = inspect.signature(fn)

        def call(self: Any, *args: Any, **kw: Any) -> Any:
            token = call_state.set(self.state)
            try:
                return _run(fn(instance, *args, **kw))
            finally:
                call_state.reset(token)

        functools.update_wrapper(call, fn)
        call.__name__ = call.__qualname__ = tool
        call.__signature__ = sig  # type: ignore[attr-defined]  # (self, ...) as the method's
        return call

    def __init__(self: Any) -> None:
        self.state = state_type()

    namespace: dict[str, Any] = {"__init__": __init__, "__doc__": cls.__doc__ or f"verifiers toolset {cls.__name__}",
                                 "__module__": cls.__module__}
    namespace.update({tool: method(tool, attr) for tool, attr in tools.items()})
    adapter = type(cls.__name__, (), namespace)

    def load(obj: Any, initial: Any) -> None:
        obj.state = state_type.model_validate(initial or {})

    return from_class(adapter, name=name, domain=domain, config=config if config is not None else {}, loader=load,
                      **kwargs)


_callable(__name__)
