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

import contextlib
import copy
import json
import re
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field

from envfactory.definition import SpecError, ToolEnvSpec
from envfactory.factory import _callable
from envfactory.factory.from_mcp import (
    _SETUPS,
    MCPState,
    _Binding,
    _is_setup,
    _journal_key,
    _parameters,
    _PassThrough,
    _validator,
)
from envfactory.task import Task, ToolCall
from envfactory.tooling import Tool, ToolError

__all__ = ["OpenEnvState", "RewardCheck", "from_openenv", "openenv_task"]

Restore = Literal["replay"] | None


def _openenv() -> Any:
    try:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction
    except ImportError as exc:
        raise ImportError(f"from_openenv needs OpenEnv (pip install 'openenv>=0.10'; it has the import name of "
                          f"openenv-core, so give it a venv of its own): {exc}") from exc
    return Environment, CallToolAction, ListToolsAction


# -- the state ------------------------------------------------------------------------
class OpenEnvState(MCPState):
    """The task's ``reset`` keyword arguments, the journal of calls (``{"name", "arguments"}``) made
    since, and the ``reward`` and ``done`` the environment last reported (``reward``: the last one
    that was not ``None``). The live instance bound to this object is private, as for :class:`MCPState`."""

    reset_kwargs: dict[str, Any] = Field(default_factory=dict)
    reward: float | None = None
    done: bool = False


# -- one instance of the environment ----------------------------------------------------------
@dataclass
class _Seen:
    """What one call's observation said."""

    text: str
    is_error: bool
    reward: float | None = None
    done: bool = False


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _result_text(result: Any) -> tuple[str, bool]:
    """The text of a tool's result (a FastMCP ``CallToolResult``, its JSON form, or a plain value)."""
    if result is None:
        return "", False
    if isinstance(result, str):
        return result, False
    if isinstance(result, dict) and "content" not in result:
        return _dumps(result), False
    get = result.get if isinstance(result, dict) else lambda k, d=None: getattr(result, k, d)
    content = get("content")
    if content is None:
        return _dumps(result) if isinstance(result, (list, int, float, bool)) else str(result), False
    parts = []
    for c in content:
        kind = c.get("type") if isinstance(c, dict) else getattr(c, "type", None)
        text = c.get("text") if isinstance(c, dict) else getattr(c, "text", None)
        if kind == "text" and text is not None:
            parts.append(text)
        else:
            parts.append(_dumps(c if isinstance(c, dict) else c.model_dump(mode="json")))
    structured = get("structured_content", None)
    if structured is None and isinstance(result, dict):
        structured = result.get("structuredContent")
    if not parts and structured is not None:
        parts.append(_dumps(structured))
    return "\n".join(parts), bool(get("is_error", False) or get("isError", False))


def _observed(obs: Any, reward: Any = None, done: Any = None) -> _Seen:
    """A tool call's observation, read (an object, or its JSON form from a server): a
    ``CallToolObservation`` (its ``error``, else its ``result``), or the plain ``Observation`` an
    environment that overrides ``step`` returns (its fields other than ``done``/``reward`` as JSON);
    ``metadata["error"]`` is an error. ``reward``/``done``: the step's, when given apart (a server's)."""
    plain = isinstance(obs, dict)

    def get(key: str) -> Any:
        return obs.get(key) if plain else getattr(obs, key, None)

    reward = get("reward") if reward is None else reward
    reward = float(reward) if isinstance(reward, (int, float)) else None
    done = bool(get("done") if done is None else done)
    error = get("error")
    if error:
        message = error.get("message", error) if isinstance(error, dict) else getattr(error, "message", error)
        return _Seen(str(message), True, reward, done)
    metadata = get("metadata") or {}
    if isinstance(metadata, dict) and metadata.get("error"):
        return _Seen(str(metadata["error"]), True, reward, done)
    if ("tool_name" in obs or "result" in obs) if plain else "result" in getattr(type(obs), "model_fields", {}):
        text, is_error = _result_text(get("result"))
        return _Seen(text, is_error, reward, done)
    shown = dict(obs) if plain else obs.model_dump(mode="json")
    for key in ("done", "reward"):
        shown.pop(key, None)
    if not shown.get("metadata"):
        shown.pop("metadata", None)
    return _Seen(_dumps(shown), False, reward, done)


class _Instance:
    """One instance of the environment class, driven through its own ``reset`` and ``step``
    (the ``conn`` of a from_mcp binding)."""

    def __init__(self, make: Callable[[], Any], timeout: float | None) -> None:
        self.env = make()
        self.timeout = timeout
        self.closed = False

    def reset(self, kwargs: dict[str, Any]) -> Any:
        return self.env.reset(**copy.deepcopy(kwargs))

    def step(self, name: str, arguments: dict[str, Any]) -> _Seen:
        _, call_tool, _ = _openenv()
        try:
            action = call_tool(tool_name=name, arguments=copy.deepcopy(arguments))
            obs = (self.env.step(action) if self.timeout is None else
                   self.env.step(action, timeout_s=self.timeout))
        except Exception as exc:  # noqa: BLE001 - the environment's own fault: an observation
            return _Seen(f"{type(exc).__name__}: {exc}", True)
        return _observed(obs)

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        seen = self.step(name, arguments)
        return seen.text, seen.is_error

    def list_tools(self) -> list[Any]:
        _, _, list_tools = _openenv()
        obs = self.env.step(list_tools())
        error = (getattr(obs, "metadata", None) or {}).get("error")
        if error:
            raise SpecError(f"the OpenEnv environment could not list its tools: {error}")
        return list(getattr(obs, "tools", None) or [])

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):  # closing is best effort
            self.env.close()


class _Remote:
    """One session of a running OpenEnv server (``GenericEnvClient`` over its WebSocket: the server
    makes an instance of its environment for the session), driven as :class:`_Instance` is."""

    def __init__(self, url: str, timeout: float | None, headers: dict[str, str] | None) -> None:
        from openenv.core.generic_client import GenericEnvClient

        kwargs: dict[str, Any] = {"base_url": url}
        if timeout is not None:
            kwargs["message_timeout_s"] = timeout
        if headers:
            kwargs["headers"] = dict(headers)
        self.client = GenericEnvClient(**kwargs).sync()
        self.closed = False
        try:
            self.client.connect()
        except BaseException:
            self.close()
            raise

    def reset(self, kwargs: dict[str, Any]) -> Any:
        return self.client.reset(**copy.deepcopy(kwargs))

    def step(self, name: str, arguments: dict[str, Any]) -> _Seen:
        try:
            r = self.client.step({"type": "call_tool", "tool_name": name, "arguments": copy.deepcopy(arguments)})
        except Exception as exc:  # noqa: BLE001 - the server's refusal: an observation
            return _Seen(f"{type(exc).__name__}: {exc}", True)
        return _observed(r.observation or {}, r.reward, r.done)

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        seen = self.step(name, arguments)
        return seen.text, seen.is_error

    def list_tools(self) -> list[Any]:
        r = self.client.step({"type": "list_tools"})
        obs = r.observation or {}
        error = (obs.get("metadata") or {}).get("error") or (getattr(r, "metadata", None) or {}).get("error")
        if error:
            raise SpecError(f"the OpenEnv server could not list its tools: {error}")
        return [types.SimpleNamespace(name=t.get("name", ""), description=t.get("description", ""),
                                      input_schema=t.get("input_schema", t.get("inputSchema")))
                for t in obs.get("tools") or []]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):  # closing is best effort
            self.client.close()


Conn = _Instance | _Remote


class _Fresh:
    """Where a binding's instance (or server session) comes from and goes back to: a new one each
    time, closed after."""

    def __init__(self, connect: Callable[[], Conn], restore: Restore) -> None:
        self.connect, self.restore = connect, restore
        self.files: dict[str, Any] = {}  # (from_mcp's _Binding looks here; instances have no files)
        self.spawned = 0

    def acquire(self) -> Conn:
        self.spawned += 1
        return self.connect()

    def release(self, conn: Conn) -> None:
        conn.close()


@dataclass
class _Runtime:
    """What the tools of one environment share (the ``mcp_runtime`` :class:`MCPWorld` plays)."""

    name: str
    label: str
    pool: _Fresh
    restore: Restore
    read_only: frozenset[str]

    def clean(self, text: str) -> str:
        return text

    def missing(self, what: str) -> str:
        return (f"{self.name}: cannot {what}: the OpenEnv environment {self.label} offers no way to save and load "
                "its state (its instances are not copied: their tools are bound to them). Declare how to rebuild "
                "it: from_openenv(..., restore='replay') if the same reset and calls on a fresh instance always "
                "give the same state")

    def bind(self, state: OpenEnvState) -> _Binding:
        """A fresh instance, ``reset`` with the state's arguments and given its journal's calls."""
        conn = self.pool.acquire()
        try:
            conn.reset(state.reset_kwargs)
            for c in state.calls:
                conn.step(c["name"], c["arguments"])
        except BaseException:
            conn.close()
            raise
        return _Binding(cast(Any, conn), cast(Any, self.pool), _journal_key(state.calls))

    def live(self, state: OpenEnvState, *, keep: bool = True) -> _Binding:
        b = state._live
        if b is not None and not b.conn.closed and b.key == _journal_key(state.calls):
            return b
        if self.restore is None and state.calls and not _is_setup(state):
            raise NotImplementedError(self.missing("rebuild a copied or restored state"))
        b = self.bind(state)
        if keep:
            state._live = b
        return b


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


# -- tasks ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardCheck:
    """Success: the environment's own last reward is at least ``min_reward`` (with ``done``: and it
    reported the episode done)."""

    min_reward: float = 1.0
    done: bool = False

    def __call__(self, state: OpenEnvState) -> bool:
        if self.done and not state.done:
            return False
        return state.reward is not None and state.reward >= self.min_reward

    def describe(self) -> dict[str, Any]:
        return {"min_reward": self.min_reward, "done": self.done}


def openenv_task(id: str, instruction: str, solution: Sequence[ToolCall], *, reset: dict[str, Any] | None = None,
                 setup: Sequence[ToolCall] = (), min_reward: float = 1.0, done: bool = False,
                 answer_facts: Sequence[str] = (), metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task for :func:`from_openenv`: ``reset`` is passed to the environment's ``reset`` (its seed,
    task id, ...), ``setup`` calls follow it (the initial state), ``solution`` is the reference,
    success is the environment's own reward reaching ``min_reward`` (with ``done``: and the
    environment having ended the episode) and the answer holding ``answer_facts``."""
    return {"id": id, "instruction": instruction, "solution": list(solution), "reset": dict(reset or {}),
            "setup": list(setup), "check": RewardCheck(float(min_reward), bool(done)),
            "answer_facts": list(answer_facts), "metadata": dict(metadata or {})}


def _build_tasks(raw: Sequence[dict[str, Any]]) -> list[Task]:
    out = []
    for d in raw:
        setup = [{"name": c.name, "arguments": dict(c.arguments)} for c in d["setup"]]
        _SETUPS.add(_journal_key(setup))
        check = d["check"]
        out.append(Task(id=d["id"], instruction=d["instruction"],
                        initial_state=OpenEnvState(calls=setup, reset_kwargs=d["reset"]), solution=d["solution"],
                        answer_facts=d["answer_facts"], check=check,
                        metadata={**d["metadata"], "check": check.describe(), "reset": d["reset"]}))
    return out


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
