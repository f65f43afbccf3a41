"""``envfactory serve NAME --protocol openenv``: an environment as an OpenEnv server.

Built on ``openenv-core``'s own server library (``pip install 'envfactory[bench]'``): an
:class:`openenv.core.env_server.interfaces.Environment` subclass whose every instance plays
episodes of ``envfactory.make(NAME)``, served by ``openenv.core.env_server.http_server.create_app``
(FastAPI; the WebSocket ``/ws`` session protocol that ``EnvClient`` speaks, plus ``/reset``,
``/step``, ``/state``, ``/schema``, ``/metadata``, ``/health``). Nothing of the protocol is
re-implemented here, so any OpenEnv client plays unchanged: ``GenericEnvClient`` with plain dicts,
or a typed ``EnvClient`` subclass built on :class:`EnvfactoryAction` / :class:`EnvfactoryObservation`.

* **Sessions.** Each WebSocket connection gets its own environment instance (its own
  :class:`~envfactory.episode.Episode`, local or Docker runtime); at most ``max_sessions`` at once.
* **Splits.** The server serves one split (``--split``; default ``train``: the sft and rl tasks;
  ``sft``, ``rl``, ``eval``, ``all``): seeds draw from it and a task outside it is refused, so a
  client never meets an evaluation task unless the server was started for them. ``GET /tasks``
  (``?split=``) lists the served tasks; :meth:`EnvfactoryClient.list_tasks` calls it.
* **Reset.** ``reset(task_id=...)`` picks a task by id (``task`` is accepted too), ``reset(seed=...)``
  picks one as ``envfactory.make(NAME, split=...).reset(seed=...)`` does, from the served split or
  from ``reset(split=...)`` within it (``--split all`` and ``split="eval"``: an evaluation run);
  none of them: the server's ``--task`` / ``--seed``, else a random task of the split. The observation's ``text`` is the instruction; ``messages`` the
  opening messages (system prompt, instruction); ``tools`` the OpenAI tool schemas; ``task_id``,
  ``instruction``, ``system_prompt`` and ``max_turns`` say the rest.
* **Step.** The action is ``{"text": model text}`` (Hermes ``<tool_call>`` blocks, several per
  message, or a bare JSON call; no call ends the episode, as ``finish`` does) and/or
  ``{"tool_calls": [{"name", "arguments"} | OpenAI {"function": {...}}]}``. The observation is the
  tool responses (``text``: their contents, joined; ``messages``: the ``role: tool`` messages), and
  the step's ``reward`` and ``done`` are exactly ``envfactory.make(NAME).step``'s for the same action
  (reward sparse: 1.0 on success at the end); ``success`` and ``info`` (turn, tool calls/errors,
  ``ended_by`` at the end) come with it. A step after the end is a server error (the client raises).

* **MCP tools.** OpenEnv's MCP tool interface plays the same episode, one tool call a turn:
  ``POST /mcp`` (JSON-RPC ``tools/list``, ``tools/call``; ``openenv/session/create`` opens a
  session that a WebSocket joins with ``/ws?session_id=``: what ``openenv`` 0.10's
  ``MCPToolClient`` does), the WebSocket's ``{"type": "mcp"}`` messages, and ``step`` with a
  ``list_tools`` / ``call_tool`` action (openenv-core 0.3's ``MCPToolClient``). All of them run
  through openenv's own handlers: the environment offers its tools as an ``mcp_server``
  (:class:`_EpisodeTools`). A tool's own failure (bad arguments, an error it raised) is an error
  answer, which ``MCPToolClient.call_tool`` raises (``RuntimeError: Tool 'NAME' failed: ...``);
  the episode counts the turn, records the error as its tool message and goes on.
* **Task API.** ``openenv`` 0.10's routes ``GET /{env}/splits``, ``POST /{env}/tasks``,
  ``/{env}/num_tasks``, ``/{env}/task``, ``/{env}/task_range`` list the served split and the splits
  within it; ``reset(split=..., index=...)`` plays the ``index``-th task of that list.

Works on ``openenv-core`` 0.3 (the ``bench`` extra) and on ``openenv`` 0.10 (the same import name;
tested in a virtual environment of its own). OpenEnv's wire format drops ``Observation.metadata``;
the same facts are therefore observation fields (``metadata`` is filled too, for in-process users
of the class).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, cast

# first: openenv_types loads openenv-core (without its Gradio web UI), before the imports below would
from .openenv_types import EnvfactoryAction, EnvfactoryObservation

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (CallToolAction, CallToolObservation, ListToolsAction,
                                                ListToolsObservation, ToolError, ToolErrorType)
from openenv.core.env_server.mcp_types import Tool as McpTool
from openenv.core.env_server.types import EnvironmentMetadata, Observation, State

from ..definition import DEFAULT_SPLIT, DrawSplit, served_tasks, split_members, within_split
from ..env import EpisodeError
from .guard import (CONNECTION_HEADROOM, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_BODY,
                    SessionExpired, check_exposure, guard, is_loopback, per_client_default, resolve_token, scheme,
                    uvicorn_config)
from .tenants import WebSocketSessions

__all__ = ["EnvfactoryAction", "EnvfactoryObservation", "EnvfactoryEnvironment", "EnvfactoryClient", "build_app",
           "serve_openenv", "BackgroundServer", "serve_run", "ToolCallFailed"]


class ToolCallFailed(RuntimeError):
    """A tool call over ``/mcp`` that failed: the tool's own error (the episode played the turn),
    or no episode to play it in. openenv answers it as a JSON-RPC error with this message."""


def _error_type(text: str) -> Any:
    """The :class:`ToolErrorType` of a tool's error message."""
    return ToolErrorType.INVALID_ARGS if text.startswith("Error: invalid arguments") else \
        ToolErrorType.EXECUTION_ERROR


class _EpisodeTool:
    """One tool as openenv's MCP handlers read a FastMCP tool: ``name``, ``description``,
    ``parameters`` (its JSON schema) and ``fn``, which plays the call as a turn of the episode."""

    def __init__(self, env: "EnvfactoryEnvironment", name: str, description: str, parameters: dict[str, Any]):
        self.name, self.description, self.parameters = name, description, parameters
        self.inputSchema = parameters

        async def fn(**arguments: Any) -> dict[str, Any]:
            return await env._mcp_call(name, arguments)

        self.fn = fn


class _EpisodeTools:
    """The ``mcp_server`` of an :class:`EnvfactoryEnvironment`: openenv's ``/mcp`` handler (and the
    WebSocket's ``mcp`` messages) list its tools (``list_tools()``, as FastMCP 3's) and call them
    (each tool's ``fn``), so ``tools/list`` and ``tools/call`` reach the session's episode."""

    def __init__(self, env: "EnvfactoryEnvironment") -> None:
        self._env = env

    async def list_tools(self) -> list[_EpisodeTool]:
        return [_EpisodeTool(self._env, t.name, t.description, t.parameters)
                for t in self._env.spec.tools_of().values()]


class EnvfactoryEnvironment(Environment):
    """Episodes of one envfactory environment behind OpenEnv's ``Environment`` interface.

    Args:
        name: A registered single-agent environment.
        runtime: ``local`` or ``docker`` (as for :func:`envfactory.make`).
        task / seed: The default task of a ``reset()`` that names none.
        max_turns: Overrides the environment's turn limit.
        split: The tasks served (``train``, the default: sft and rl; ``sft``, ``rl``, ``eval``,
            ``all``): seeds draw from it, a task outside it is refused.
        idle_timeout: Seconds a session may go without a request; the next one finds it closed
            (:class:`~envfactory.faces.guard.SessionExpired`, "session expired"). ``None``: never.
        max_session_time: Seconds a session may last, busy or not; its next request after that
            finds it closed the same way. ``None``: no limit.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # every instance owns its own Episode (and world)

    def __init__(self, name: str = "Counter-v0", runtime: str = "local", task: str | None = None,
                 seed: int | None = None, max_turns: int | None = None, split: DrawSplit = DEFAULT_SPLIT,
                 idle_timeout: float | None = None, max_session_time: float | None = None) -> None:
        super().__init__()
        split_members(split)  # ValueError on an unknown split
        self.split = split
        from ..registry import spec as get_spec

        self.spec = get_spec(name)
        if self.spec.multi_agent:
            raise ValueError(f"{self.spec.name} is a team environment; serve --protocol openenv plays "
                             "single-agent environments (one OpenEnv session is one agent)")
        self.name, self.runtime, self.max_turns = self.spec.name, runtime, max_turns
        self.default_task, self.default_seed = task, seed
        self._episode: Any = None  # made on the first reset (OpenEnv's stateless routes build and drop instances)
        self._episode_id: str | None = None
        self._steps = 0
        self._tool_errors = 0  # the episode's count so far (its info counts them cumulatively)
        self._last_failed = False  # whether the last step's tool call(s) failed
        self.mcp_server = _EpisodeTools(self)  # openenv's MCP handlers find the tools here
        self._pool: ThreadPoolExecutor | None = None
        # one request at a time, and close() (openenv-core's reaper, on another thread) waits for
        # the one in flight: a world is never closed under a step
        self._lock = threading.RLock()
        self.idle_timeout = idle_timeout
        self.max_session_time = max_session_time
        self._last = self._born = time.monotonic()
        self._expired: str | None = None  # why this session is closed, once it is

    def _touch(self) -> None:
        """Every request: refused once the session is closed, or when it has been idle too long
        (then it is closed now, its world released)."""
        now = time.monotonic()
        if self._expired is None and self.idle_timeout and now - self._last > self.idle_timeout:
            self.close()
            self._expired = (f"session expired: no request for {now - self._last:.1f} s (the server's idle "
                             f"timeout is {self.idle_timeout:g} s); its episode was closed: open a new session")
        if self._expired is None and self.max_session_time and now - self._born > self.max_session_time:
            self.close()
            self._expired = (f"session expired: sessions last at most {self.max_session_time:g} s (the server's "
                             "--max-session-time); its episode was closed: open a new session")
        if self._expired is not None:
            raise SessionExpired(self._expired)
        self._last = now

    # -- the OpenEnv interface ---------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EnvfactoryObservation:
        with self._lock:
            return self._reset(seed, episode_id, **kwargs)

    def _reset(self, seed: int | None, episode_id: str | None, **kwargs: Any) -> EnvfactoryObservation:
        self._touch()
        task_id = kwargs.pop("task_id", None) or kwargs.pop("task", None)
        split = kwargs.pop("split", None) or None  # "": the served split (as the Task API's split="")
        index = kwargs.pop("index", None)
        if kwargs:
            raise ValueError(f"unexpected reset argument(s) {sorted(kwargs)}; use task_id, seed, split, index "
                             "or episode_id")
        draw = within_split(self.split, split)  # ValueError: a split the server does not serve
        if index is not None:  # the Task API's selection: the index-th task of list_tasks(split)
            if task_id is not None or seed is not None:
                raise ValueError("reset takes index (with split) or task_id or seed, not several")
            try:
                task_id = self._task_at(split, index)["task_id"]
            except IndexError as exc:  # a request's error (400), as an unknown task is
                raise ValueError(str(exc)) from None
        if task_id is None and seed is None and split is None:
            task_id, seed = self.default_task, self.default_seed
        if task_id is None:
            task = self.spec.draw_task(draw, seed)
        else:  # KeyError on an unknown task or one the split does not hold: an error reply, the session lives on
            task = self.spec.task_in_split(task_id, draw)
        if self._episode is None:
            from ..registry import make

            self._episode = make(self.name, self.runtime, max_turns=self.max_turns, split=self.split)
        ep = self._episode
        messages = ep.reset(task.id)
        self._episode_id = episode_id or "ep-" + uuid.uuid4().hex[:16]
        self._steps = 0
        self._tool_errors, self._last_failed = 0, False
        tools = ep.tool_schemas()
        meta = {"task_id": task.id, "instruction": messages[1]["content"], "tools": tools, "env": self.name}
        return EnvfactoryObservation(
            text=messages[1]["content"], messages=messages, task_id=task.id, instruction=messages[1]["content"],
            system_prompt=messages[0]["content"], tools=tools, max_turns=ep.status.max_turns, reward=0.0, done=False,
            metadata=meta)

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        with self._lock:
            return self._step(action)

    def _step(self, action: Any) -> Observation:
        kind = getattr(action, "type", None)
        if kind == "list_tools":
            action = ListToolsAction()
        elif kind == "call_tool":
            action = CallToolAction(tool_name=action.tool_name or "", arguments=action.arguments or {})
        if isinstance(action, ListToolsAction):  # openenv's MCP tool interface (MCPToolClient)
            return ListToolsObservation(tools=[
                McpTool(name=t.name, description=t.description, input_schema=t.parameters)
                for t in self.spec.tools_of().values()], reward=0.0, done=False)
        if isinstance(action, CallToolAction):
            return self._call_tool(action)
        self._touch()
        if self._episode is None or self._episode.task is None:
            if self.default_task is None and self.default_seed is None:
                raise EpisodeError(f"{self.name}: no episode yet; call reset (task_id or seed) first")
            self.reset()
        ep = self._episode
        if isinstance(action, dict):  # an in-process caller may pass the wire form
            action = EnvfactoryAction(**action)
        if action.tool_calls:
            act: Any = {"role": "assistant", "content": action.text, "tool_calls": action.tool_calls}
        else:
            act = action.text
        errors_before = self._tool_errors  # the episode counts them cumulatively
        r = ep.step(act)  # EpisodeError after the end: an error reply
        self._steps += 1
        self._tool_errors = int(r.info.get("tool_errors", errors_before))
        self._last_failed = self._tool_errors > errors_before
        done = bool(r.terminated or r.truncated)
        text = "\n".join(str(m.get("content", "")) for m in r.messages)
        info = {k: v for k, v in r.info.items() if k != "success"}
        return EnvfactoryObservation(text=text, messages=r.messages, task_id=ep.task.id, reward=float(r.reward),
                                     done=done, success=ep.success if done else None, info=info,
                                     metadata={"terminated": r.terminated, "truncated": r.truncated})

    def _call_tool(self, action: Any) -> Observation:
        """One MCP tool call as one turn of the episode (``MCPToolClient.call_tool``): the tool's
        output (or its error observation) is the result; ``reward`` and ``done`` are the step's.
        No episode, a finished one or an unknown tool: a framework error the client raises."""
        name = action.tool_name
        if name not in self.spec.tools_of():
            return CallToolObservation(tool_name=name, error=ToolError(
                error_type=ToolErrorType.TOOL_NOT_FOUND,
                message=f"unknown tool {name!r}; tools: {', '.join(self.spec.tools_of())}"), reward=0.0, done=False)
        try:
            obs = self.step(EnvfactoryAction(tool_calls=[{"name": name, "arguments": dict(action.arguments or {})}]))
        except EpisodeError as exc:
            return CallToolObservation(tool_name=name, error=ToolError(error_type=ToolErrorType.EXECUTION_ERROR,
                                                                       message=str(exc)), reward=0.0, done=False)
        meta = {"success": obs.success, **obs.info}
        if self._last_failed:  # the tool's own failure: an error MCPToolClient raises; the turn was played
            return CallToolObservation(tool_name=name, error=ToolError(error_type=_error_type(obs.text),
                                                                       message=obs.text),
                                       reward=obs.reward, done=obs.done, metadata=meta)
        return CallToolObservation(tool_name=name, result=obs.text, reward=obs.reward, done=obs.done, metadata=meta)

    async def _mcp_call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """``tools/call`` over ``/mcp`` (openenv's handler calls this as the tool's ``fn``): one
        turn of the episode. The result has MCP's ``CallToolResult`` shape (``content``, ``data``:
        the tool's output, which ``MCPToolClient.call_tool`` returns) and ``meta`` says the step's
        ``reward``, ``done`` and ``success``. A tool's own failure, a call without an episode or
        after its end raise :class:`ToolCallFailed`: openenv answers a JSON-RPC error with its
        message, which ``MCPToolClient.call_tool`` raises."""
        action = EnvfactoryAction(tool_calls=[{"name": name, "arguments": dict(arguments)}])
        try:
            obs: Any = self.step(action) if self._inline else await self._off_loop(functools.partial(self.step, action))
        except EpisodeError as exc:
            raise ToolCallFailed(str(exc)) from None
        if self._last_failed:
            raise ToolCallFailed(obs.text)
        return {"content": [{"type": "text", "text": obs.text}], "structured_content": None, "data": obs.text,
                "is_error": False, "meta": {"reward": obs.reward, "done": obs.done, "success": obs.success,
                                            **obs.info}}

    # -- openenv 0.10's Task API (GET /{env}/splits, POST /{env}/tasks, ...) -------------------------
    def list_splits(self) -> list[dict[str, Any]]:
        """The served split, then the splits within it that hold tasks (``sft``, ``rl``, ``eval``),
        each with its task count; ``type``: ``train`` for training splits, else ``test``."""
        out = []
        for n in [self.split] + [m for m in split_members(self.split) if m != self.split]:
            try:
                within_split(self.split, n)  # a held-out family/kind split holds only itself
            except ValueError:
                continue
            count = len(self.spec.tasks_in(cast(DrawSplit, n)))
            if count or n == self.split:
                kind = "train" if set(split_members(n)) <= {"sft", "rl"} else "test"
                out.append({"name": n, "type": kind, "num_tasks": count})
        return out

    def list_tasks(self, split: str = "") -> list[dict[str, Any]]:
        """The tasks of ``split`` (``""``: the served split), in order: ``index``, ``task_id``,
        ``split`` (the task's own), ``kind``, ``instruction``. A split the server does not serve:
        ``ValueError`` (400)."""
        return [{"index": i, **t} for i, t in enumerate(served_tasks(self.spec, self.split, split or None))]

    def num_tasks(self, split: str = "") -> int:
        return len(self.list_tasks(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return self._task_at(split, index)

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        return self.list_tasks(split)[start:stop]

    def _task_at(self, split: str | None, index: int) -> dict[str, Any]:
        tasks = self.list_tasks(split or "")
        if not isinstance(index, int) or not 0 <= index < len(tasks):
            raise IndexError(f"task index {index!r} is out of range: the {split or self.split!r} split of "
                             f"{self.name} holds {len(tasks)} tasks")
        return tasks[index]

    # a local world answers in microseconds: run it on the event loop, not through a thread hop;
    # a container world blocks on a socket: one thread per session keeps the loop free
    # (ENVFACTORY_OPENENV_INLINE=0 sends local steps through the thread too: the bench's A/B)
    @property
    def _inline(self) -> bool:
        return self.runtime == "local" and os.environ.get("ENVFACTORY_OPENENV_INLINE", "1") != "0"

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          **kwargs: Any) -> EnvfactoryObservation:
        if self._inline:
            return self.reset(seed=seed, episode_id=episode_id, **kwargs)
        return await self._off_loop(functools.partial(self.reset, seed=seed, episode_id=episode_id, **kwargs))

    async def step_async(self, action: EnvfactoryAction, timeout_s: float | None = None,
                         **kwargs: Any) -> EnvfactoryObservation:
        if self._inline:
            return self.step(action)
        return await self._off_loop(functools.partial(self.step, action))

    async def _off_loop(self, fn: Any) -> Any:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envfactory-openenv")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    @property
    def state(self) -> State:
        ep = self._episode
        if ep is None or ep.task is None:
            return State(episode_id=self._episode_id, step_count=0, env=self.name)
        status = ep.status
        log = status.log
        return State(episode_id=self._episode_id, step_count=self._steps, env=self.name, task_id=ep.task.id,
                     done=ep.done, terminated=status.terminated, truncated=status.truncated,
                     reward=ep.rewards[ep.agents[0]], success=ep.success, ended_by=status.ended_by,
                     turns=status.turns_taken(), max_turns=status.max_turns, tool_calls=len(log),
                     tool_errors=sum(not e["ok"] for e in log))

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self.name, description=f"envfactory environment {self.name} "
                                   f"({self.spec.domain}): {len(self.spec.get_tasks())} tasks, tools "
                                   f"{', '.join(self.spec.tools_of())}", version="0.1.0", author="envfactory")

    def close(self) -> None:
        """Release the episode (its world). The session is then closed: openenv-core calls this
        when the WebSocket ends and when its reaper finds the session idle; a request that still
        reaches it is refused as expired."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._expired is None:
            self._expired = ("session expired: the server closed this session (idle past its timeout, "
                             "or released); open a new session")
        if self._episode is not None:
            self._episode.close()
            self._episode = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def __getattr__(name: str) -> Any:
    """``EnvfactoryClient`` lives in :mod:`.openenv_client`, loaded on first use: a server never
    imports openenv-core's client side (``requests``, its container providers)."""
    if name == "EnvfactoryClient":
        from .openenv_client import EnvfactoryClient

        return EnvfactoryClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_app(name: str, *, runtime: str = "local", task: str | None = None, seed: int | None = None,
              max_turns: int | None = None, max_sessions: int = 256, split: DrawSplit = DEFAULT_SPLIT,
              token: str | None = None, max_body: int = DEFAULT_MAX_BODY,
              idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT, max_session_time: float | None = None,
              local_only: bool = False, max_sessions_per_client: int | None = None) -> Any:
    """The FastAPI app (``openenv-core``'s ``create_app``) serving ``name``, plus ``GET /tasks``.

    ``max_sessions`` WebSocket sessions at once (openenv-core refuses more: ``CAPACITY_REACHED``);
    one idle for ``idle_timeout`` seconds is closed (openenv-core's reaper, and the session's own
    check at its next request: "session expired"), and so is one older than ``max_session_time``
    at its next request (or when it idles), and an expired session's connection is closed after
    it says so (code 1008), releasing its slot; with tokens (``token="A,B"``: each one client) a
    client holds at most ``max_sessions_per_client`` sessions (beyond: 429; by default an equal
    share of ``max_sessions`` among the tokens, :func:`~envfactory.faces.guard.per_client_default`);
    at most ``max_sessions`` plus ``CONNECTION_HEADROOM`` authorized requests and sessions are
    served at once (beyond: 503); an HTTP body over
    ``max_body`` bytes is 413;
    with ``token`` every request must carry it (``Authorization: Bearer``; else 401); ``local_only``
    (a loopback server) refuses web pages (a foreign ``Host`` or ``Origin``: 403). The
    returned app is openenv-core's behind those guards (:func:`envfactory.faces.guard.guard`)."""
    from fastapi import HTTPException
    from openenv.core.env_server.types import ConcurrencyConfig

    idle_timeout = idle_timeout or None  # 0: never
    probe = EnvfactoryEnvironment(name, runtime, task, seed, max_turns, split)  # fail now: unknown env, team env
    if task is not None:
        probe.spec.task_in_split(task, split)  # unknown task, or one the split does not hold
    factory = functools.partial(EnvfactoryEnvironment, name, runtime, task, seed, max_turns, split, idle_timeout,
                                max_session_time or None)
    app = create_app(factory, EnvfactoryAction, EnvfactoryObservation, env_name=probe.name,
                     concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions,
                                                          session_timeout=idle_timeout))

    # a request the episode refuses (a step before reset, after the end, an unknown task or split)
    # is the client's error: 4xx with the message, never a bare 500
    async def _refused(request: Any, exc: Exception) -> Any:
        from fastapi.responses import JSONResponse

        status = 409 if isinstance(exc, EpisodeError) else 400
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return JSONResponse(status_code=status, content={"detail": msg, "error": type(exc).__name__})

    for kind in (EpisodeError, KeyError, ValueError):
        app.add_exception_handler(kind, _refused)

    @app.get("/tasks")
    def list_tasks(split: Optional[str] = None) -> dict[str, Any]:
        try:
            return {"env": probe.name, "served_split": probe.split, "tasks": served_tasks(probe.spec, probe.split, split)}
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None

    token = resolve_token(token)
    if max_sessions_per_client is None:
        max_sessions_per_client = per_client_default(max_sessions, token)
    server = _env_server(app)
    sessions = WebSocketSessions(
        app, max_sessions_per_client, live_sessions=None if server is None else (lambda: server._sessions),
        joins=server is not None and hasattr(server, "_session_websocket_attachments"))
    return guard(sessions, token=token, max_body=max_body, local_only=local_only,
                 max_in_flight=max_sessions + CONNECTION_HEADROOM)


def _env_server(app: Any) -> Any:
    """openenv's ``HTTPEnvServer`` behind ``app`` (``create_app`` keeps it only in its routes'
    closures: found there), for its live session ids; ``None`` if this openenv hides it otherwise."""
    for route in getattr(app, "routes", ()):
        stack, seen = [getattr(route, "endpoint", None)], set()
        while stack:
            fn = stack.pop()
            for cell in getattr(fn, "__closure__", None) or ():
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if isinstance(getattr(value, "_sessions", None), dict) and hasattr(value, "_create_session"):
                    return value
                if callable(value) and getattr(value, "__closure__", None) and id(value) not in seen:
                    seen.add(id(value))
                    stack.append(value)
    return None


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def _server(name: str, host: str, kw: dict[str, Any], app: Any = None) -> Any:
    """The uvicorn server of ``app``, else of ``build_app(name, **kw)``, refused beyond loopback
    without a token."""
    import uvicorn

    allow_no_token = kw.pop("allow_no_token", False)
    tls = {"tls_cert": kw.pop("tls_cert", None), "tls_key": kw.pop("tls_key", None),
           "header_timeout": kw.pop("header_timeout", DEFAULT_HEADER_TIMEOUT)}
    check_exposure(host, resolve_token(kw.get("token")), allow_no_token)
    if app is None:
        app = build_app(name, **kw, local_only=is_loopback(host))
    return uvicorn.Server(uvicorn_config(app, max_body=kw.get("max_body", DEFAULT_MAX_BODY),
                                         max_sessions=kw.get("max_sessions", 256), **tls))


def _url(server: Any, host: str, sock: socket.socket) -> str:
    return f"{scheme(server.config.ssl_certfile)}://{host}:{sock.getsockname()[1]}"


def serve_openenv(name: str, host: str = "127.0.0.1", port: int = 8000, *, ready: Any = None, app: Any = None,
                  **kw: Any) -> None:
    """Serve until interrupted (``port=0``: a free port). The URL goes to stderr once the server
    listens (``ready(url)`` is called too, when given). ``kw``: :func:`build_app`'s,
    ``allow_no_token`` (serve beyond loopback without a token), ``tls_cert`` / ``tls_key``
    (PEM files: HTTPS and WSS) and ``header_timeout`` (seconds for a request head to arrive).
    ``app``: one :func:`build_app` already built from the same ``kw``
    (with ``local_only=is_loopback(host)``); it is served as is, ``kw`` then only giving the token
    the exposure check looks for and uvicorn's limits (``max_body``, ``max_sessions``)."""
    server = _server(name, host, kw, app)
    sock = _listen(host, port)
    url = _url(server, host, sock)

    def announce() -> None:
        while not server.started and not server.should_exit:
            threading.Event().wait(0.01)
        if server.started:
            ws = url.replace("http", "ws", 1)
            print(f"envfactory: serving {name} over OpenEnv at {url} (WebSocket {ws}/ws)", file=sys.stderr,
                  flush=True)
            if ready is not None:
                ready(url)

    threading.Thread(target=announce, daemon=True).start()
    server.run(sockets=[sock])


class BackgroundServer:
    """An OpenEnv server of ``name`` on a thread of this process (tests, benchmarks)::

        with BackgroundServer("Counter-v0") as url:
            with GenericEnvClient(base_url=url).sync() as env: ...

    ``kw``: :func:`build_app`'s (``token``, ``max_body``, ``idle_timeout``, ``max_sessions``, ...),
    ``allow_no_token``, ``tls_cert`` / ``tls_key`` and ``header_timeout``.
    """

    def __init__(self, name: str, host: str = "127.0.0.1", port: int = 0, **kw: Any) -> None:
        self._server = _server(name, host, kw)
        self.app = self._server.config.app
        self._sock = _listen(host, port)
        self.url = _url(self._server, host, self._sock)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        for _ in range(3000):
            if self._server.started:
                return self.url
            if not self._thread.is_alive():
                raise RuntimeError("the OpenEnv server did not start")
            threading.Event().wait(0.01)
        raise RuntimeError("the OpenEnv server did not start in 30 s")

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


# -- CLI: envfactory serve NAME --protocol openenv (arguments: envfactory.cli.serve.SERVE) ----
def serve_run(args: argparse.Namespace) -> tuple[int, Any, str]:
    build = dict(runtime=args.runtime, task=args.task, seed=args.seed, max_turns=args.max_turns,
                 max_sessions=args.max_episodes, split=args.split, token=args.token, max_body=args.max_body,
                 idle_timeout=DEFAULT_IDLE_TIMEOUT if args.idle_timeout is None else args.idle_timeout,
                 max_session_time=args.max_session_time, max_sessions_per_client=args.max_episodes_per_client)
    try:  # built once, before listening: an unknown environment, task or split is a usage error
        app = build_app(args.name, **build, local_only=is_loopback(args.host))
    except (KeyError, ValueError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        return 2, {"error": msg}, f"error: {msg}"
    try:
        serve_openenv(args.name, args.host, args.port, app=app, **build, allow_no_token=args.allow_no_token,
                      tls_cert=args.tls_cert, tls_key=args.tls_key, header_timeout=args.header_timeout)
    except KeyboardInterrupt:
        pass
    return 0, {"served": args.name, "protocol": "openenv"}, ""
