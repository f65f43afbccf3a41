"""Where an OpenEnv environment's instance lives for an episode: in this process (a class, made
and ``reset`` per episode, its tools called through its own ``step``) or a session of a running
server (openenv's ``GenericEnvClient``); what its observations mean (a tool's text, its error, the
environment's ``reward`` and ``done``); and the state that carries them (:class:`OpenEnvState`).
See :mod:`envfactory.factory.from_openenv`."""

from __future__ import annotations

import contextlib
import copy
import json
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import Field

from envfactory.definition import SpecError
from envfactory.factory.from_mcp import MCPState, _Binding, _journal_key, _Rebinds

__all__ = ["Conn", "OpenEnvState", "Restore"]

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
class _Runtime(_Rebinds):
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

