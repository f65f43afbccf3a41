"""An OpenEnv environment, unchanged, as an envfactory environment: its MCP tools become the tools.

OpenEnv keeps a tool-use environment in an ``MCPEnvironment`` subclass (an ``Environment`` whose
tools are registered on a FastMCP server; ``step(ListToolsAction())`` lists them and
``step(CallToolAction(tool_name=..., arguments=...))`` calls one; each observation carries the
environment's own ``reward`` and ``done``). :func:`from_openenv` builds a
:class:`~envfactory.ToolEnvSpec` on such a class, in this process, with the machinery of
:func:`~envfactory.factory.from_mcp`:

* each tool the environment lists becomes a :class:`~envfactory.Tool` with its own JSON schema;
  arguments are checked against it (strictly: unknown arguments are errors) before the call goes
  to the environment, through its own ``step``; a failure it reports (the observation's ``error``,
  an ``isError`` result, an ``error`` in its ``metadata``) or raises is a tool error observation;
* the state (:class:`OpenEnvState`) is the ``reset`` keyword arguments of the task, the *journal*
  of the calls made since, and the ``reward`` and ``done`` the environment last reported, plain
  JSON data. A live instance of the class is bound to each state object (one per episode, made,
  ``reset`` and given the task's setup calls on its first use; ``close``\\ d with it);
* a task (:func:`openenv_task`) is an instruction, ``reset`` keyword arguments (the seed, the
  task id, the split and index: whatever the environment's ``reset`` takes), optional setup
  calls, a reference solution, and a :class:`RewardCheck`: success is the environment's own
  reward reaching ``min_reward`` (and, with ``done=True``, its having ended the episode); answer
  facts are checked as for any task. Once the environment reports ``done``, further calls are
  errors (call ``finish``), so the reward it gave at the end is the one judged.

Forks and snapshots (``restore``): an instance's tools are usually closures over the instance
and its server, which a copy would not rebind, so instances are never copied. With
``restore="replay"`` (the environment is deterministic: the same ``reset`` and calls on a fresh
instance give the same state) a copied or restored state gets a fresh instance that replays its
journal; without it (the default) fresh task starts work, and ``fork``, ``snapshot`` and
``restore`` raise :class:`NotImplementedError` naming what is missing, as :func:`from_mcp` does.
The world is :class:`~envfactory.factory.from_mcp.MCPWorld` (``envfactory.make(NAME,
runtime="mcp")``, or :func:`~envfactory.factory.from_mcp.make_episode` for an unregistered spec);
``envfactory.make(NAME)`` works too.

A running OpenEnv server works the same way, given its base URL: each episode is a session of its
own (openenv's ``GenericEnvClient`` over the server's WebSocket, in simulation mode: the server makes
an instance per session), the tools are those its ``list_tools`` step lists, each call a
``call_tool`` step whose reward and done are the server's (``headers`` carry a token; so may the
URL's password, which is never shown). The server must allow as many sessions as episodes (and
forks) are live at once. Note that OpenEnv's server steps an ``MCPEnvironment`` through
``step_async``: an environment that sets its reward in an overridden ``step`` only must override
``step_async`` alike to report it over the wire.

It needs OpenEnv where it runs (``pip install 'openenv>=0.10'``; it has the import name of
``openenv-core``, which the ``bench`` extra pins, so give it a virtual environment of its own);
importing this module does not import openenv.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from envfactory.definition import SpecError, ToolEnvSpec
from envfactory.factory import _callable
from envfactory.factory.from_mcp import (
    _journal_key,
    _parameters,
    _PassThrough,
    _validator,
)
from envfactory.tooling import Tool, ToolError

from .sessions import (
    Conn,
    OpenEnvState,
    Restore,
    _Fresh,
    _Instance,
    _openenv,
    _Remote,
    _Runtime,
)
from .tasks import RewardCheck, _build_tasks, openenv_task

__all__ = ["OpenEnvState", "RewardCheck", "from_openenv", "openenv_task"]


# -- tools --------------------------------------------------------------------------------
def _openenv_tool(rt: _Runtime, t: Any) -> Tool:
    name = t.name
    params = _parameters(getattr(t, "input_schema", None) or getattr(t, "inputSchema", None))
    problems = _validator(params)

    def call(state: OpenEnvState, **arguments: Any) -> str:
        bad = problems(arguments)
        if bad:
            names = ", ".join(n + ("" if n in params["required"] else "?") for n in params["properties"])
            raise ToolError(f"invalid arguments for tool '{name}': {'; '.join(bad)}. Expected arguments: ({names}).")
        if state.done:
            raise ToolError(f"the episode is over: the environment reported done (reward {state.reward}); "
                            "call finish")
        b = rt.live(state)
        seen = cast(Conn, b.conn).step(name, arguments)
        state.calls.append({"name": name, "arguments": copy.deepcopy(arguments)})
        b.key = _journal_key(state.calls)
        if seen.reward is not None:
            state.reward = seen.reward
        state.done = seen.done
        if seen.is_error:
            raise ToolError(seen.text.removeprefix("Error: "))
        return seen.text

    call.__name__ = name
    desc = " ".join((getattr(t, "description", None) or name).split())
    return Tool(name=name, description=desc, fn=call, parameters=params, args_model=_PassThrough,  # type: ignore[arg-type]
                read_only=name in rt.read_only, _arg_names=tuple(params["properties"]), _simple=None)


# -- the factory ------------------------------------------------------------------------------
def _shown_url(url: str) -> str:
    """``url`` without its userinfo (a token may ride there): for labels and messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _connector(source: Any, init: dict[str, Any], timeout: float | None,
               headers: dict[str, str] | None) -> tuple[Callable[[], Conn], str]:
    """How to get one episode's environment (an instance, or a server session), and its label."""
    environment, _, _ = _openenv()
    if isinstance(source, str):
        if not re.match(r"^(https?|wss?)://", source):
            raise TypeError(f"from_openenv needs an OpenEnv Environment class (an MCPEnvironment subclass) or a "
                            f"server's base URL (http://...), got {source!r}")
        if init:
            raise TypeError("from_openenv: init is for a class; a server makes its own instances")
        return (lambda: _Remote(source, timeout, headers)), _shown_url(source)
    if headers:
        raise TypeError("from_openenv: headers are for a server's URL; a class runs in this process")
    if isinstance(source, environment):
        raise TypeError(f"from_openenv needs the environment's class (or a function making an instance), not an "
                        f"instance: it makes one per episode; got {source!r}")
    if isinstance(source, type):
        if not issubclass(source, environment):
            raise TypeError(f"from_openenv needs an OpenEnv Environment class (an MCPEnvironment subclass), "
                            f"got {source.__name__}")
        cls = source
        return (lambda: _Instance(lambda: cls(**init), timeout)), f"{source.__module__}.{source.__qualname__}"
    if callable(source):
        if init:
            raise TypeError("from_openenv: init is for a class; a function making the environment takes none")
        return (lambda: _Instance(source, timeout)), getattr(source, "__qualname__", repr(source))
    raise TypeError(f"from_openenv needs an OpenEnv Environment class (an MCPEnvironment subclass), got {source!r}")


def from_openenv(
    source: Any,
    *,
    name: str,
    tasks: Sequence[dict[str, Any]] | Callable[[], Sequence[dict[str, Any]]],
    domain: str = "openenv",
    init: dict[str, Any] | None = None,
    restore: Restore = None,
    read_only: Sequence[str] = (),
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    description: str = "",
    system_prompt: str | None = None,
    max_turns: int = 20,
    timeout: float | None = None,
    headers: dict[str, str] | None = None,
) -> ToolEnvSpec:
    """Build an environment from an OpenEnv environment class (or a running server), leaving it untouched.

    Args:
        source: An OpenEnv ``MCPEnvironment`` subclass (any ``Environment`` that answers
            ``ListToolsAction`` and ``CallToolAction``), made with ``init`` once per episode, or a
            function of no arguments making an instance; or the base URL of a running OpenEnv
            server (``http://host:port``), one session per episode.
        name: Registry name, ``Name-v0``.
        tasks: :func:`openenv_task` dicts (or a function returning them: built on first use).
        domain: Domain label.
        init: Keyword arguments of the class.
        restore: ``"replay"`` if the same ``reset`` and calls on a fresh instance always give the same
            state (forks, snapshots and restores then replay the journal); ``None``: they raise
            :class:`NotImplementedError` (see the module doc).
        read_only: Tools that never change the state (advisory: every call is journaled, since the
            environment's own ``step`` may count it).
        include / exclude: Which of the environment's tools to expose.
        timeout: Seconds a call may take (the environment's ``step(..., timeout_s=)``, a client's
            ``message_timeout_s``; default: theirs).
        headers: HTTP headers for a server (``{"Authorization": "Bearer TOKEN"}``).
    """
    if restore not in (None, "replay"):
        raise ValueError(f"from_openenv: restore must be None or 'replay', not {restore!r}")
    connect, label = _connector(source, dict(init or {}), timeout, headers)
    probe = connect()
    try:
        listed = probe.list_tools()
    finally:
        probe.close()
    chosen = [t for t in listed if (include is None or t.name in include) and t.name not in set(exclude)]
    if not chosen:
        raise SpecError(f"{name}: the OpenEnv environment {label} offers no tools to expose (ListToolsAction "
                        "listed none: is it an MCPEnvironment?)")
    rt = _Runtime(name, label, _Fresh(connect, restore), restore, frozenset(read_only))
    tools = [_openenv_tool(rt, t) for t in chosen]
    spec = ToolEnvSpec(name=name, domain=domain, state_type=OpenEnvState, tools=tools, tasks=[],
                       description=description or f"the OpenEnv environment {label}",
                       system_prompt=system_prompt, max_turns=max_turns,
                       metadata={"mcp_runtime": rt, "source": f"openenv {label}", "restore": restore})
    spec.tasks = lambda: _build_tasks(tasks() if callable(tasks) else tasks)
    return spec


_callable(__name__)  # envfactory.factory.from_openenv may be this module: calling it calls from_openenv()
