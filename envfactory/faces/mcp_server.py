"""``envfactory serve NAME --protocol mcp``: an environment as a Model Context Protocol server.

Any MCP client (an IDE, an agent framework, the official SDK's ``ClientSession``)
can play an envfactory environment. Each MCP session plays one episode at a time
of ``envfactory.make(NAME)``; the referee (:class:`~envfactory.episode.Episode`)
runs here, so parsing, the turn limit, the log and the reward are exactly those of
``envfactory.make`` for the same calls.

What a client sees:

* the environment's tools (``spec.tool_schemas()``: names, descriptions, JSON
  schemas; ``readOnlyHint`` from ``Tool.read_only``), ``finish`` included;
* ``start_episode(task_id?, seed?, split?)``: starts (or restarts) the session's episode and
  returns the task instruction (structured: ``episode``, ``task_id``,
  ``instruction``, ``system_prompt``, ``tools``, ``max_turns``); a seed draws from the
  server's split (``--split``, default ``train``: sft and rl tasks), or from ``split``
  within it, and a task of another split is refused, so a client never meets an
  evaluation task unless the server serves them;
* ``list_tasks(split?)``: the tasks the server serves (``task_id``, ``split``, ``kind``,
  ``instruction``), optionally of one split within it;
* ``episode_status()``: ``task_id, done, terminated, truncated, reward, success,
  ended_by, turns, tool_calls, tool_errors`` (also the resource
  ``envfactory://episode/status``; the instruction is ``envfactory://episode/task``);
* ``end_episode(answer?)``: ends the episode the way an agent does by answering
  without a tool call (judged at once);
* every environment tool call is one turn of the episode: its observation is the
  text content, a failed call (invalid arguments, a tool error, an unknown tool)
  comes back with ``isError``, and ``_meta`` carries ``envfactory/reward``,
  ``envfactory/done``, ``envfactory/success`` and ``envfactory/ended_by`` (``None`` ones
  left out) with the episode id ``envfactory/episode``; ``start_episode``,
  ``episode_status``, ``end_episode`` and a refused call (the episode has ended, an unknown
  tool) carry the same ``_meta`` (the reward so far) whenever the session has an episode.

Which episode a request belongs to: ``_meta["envfactory/episode"]`` when the request
carries it (the id ``start_episode`` returns); else the HTTP session
(``Mcp-Session-Id``, handshake-era clients); else, over stdio, the one client of the
process. A stateless (2026-07-28 protocol) HTTP client has no session: it passes the
episode id in ``_meta``. With ``--task`` or ``--seed`` the first tool call starts an
episode by itself.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Iterator

from ..definition import DEFAULT_SPLIT, DrawSplit, SpecError, served_tasks, split_members, within_split
from ..episode import Episode
from ..env import EpisodeError
from ..task import ToolCall
from .guard import (CONNECTION_HEADROOM, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_BODY,
                    SessionExpired, _refuse, check_exposure, client_of, guard, per_client_default, resolve_token,
                    scheme, uvicorn_config)

__all__ = ["EpisodeService", "build_server", "build_http_app", "serve_stdio", "serve_http", "serve_run",
           "CONTROL_TOOLS", "EPISODE_META"]

EPISODE_META = "envfactory/episode"
CONTROL_TOOLS = ("start_episode", "episode_status", "end_episode", "list_tasks")
TASK_URI = "envfactory://episode/task"
STATUS_URI = "envfactory://episode/status"

_START_SCHEMA = {
    "type": "object",
    "properties": {
        "task_id": {"type": "string", "description": "The task to play (default: the server's --task, else "
                                                     "one drawn from seed)."},
        "seed": {"type": "integer", "description": "Picks the task of the split as "
                                                   "envfactory.make(NAME, split=...).reset(seed=seed) does."},
        "split": {"type": "string", "description": "The split to draw from or play (sft, rl, eval, train or "
                                                    "all) within the server's split (default: the server's)."},
    },
    "additionalProperties": False,
}
_LIST_SCHEMA = {
    "type": "object",
    "properties": {"split": {"type": "string", "description": "Only the tasks of this split (sft, rl, eval, train "
                                                           "or all) within the server's split."}},
    "additionalProperties": False,
}
_EMPTY_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
_END_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "description": "The final answer to the user."}},
    "additionalProperties": False,
}


class EpisodeService:
    """Episodes of one environment, keyed by the MCP session that plays them (protocol-free core).

    Args:
        name: A registered single-agent environment.
        runtime: Where worlds run (``local`` or ``docker``), as for :func:`envfactory.make`.
        task: The default task of ``start_episode`` (and of a tool call made before it).
        seed: The default seed (picks a task, as ``reset(seed=...)`` does).
        max_turns: Overrides the environment's turn limit.
        max_episodes: Live episodes at once. Beyond it the least recently used *finished* episode
            is released; with none finished a new episode is refused ("server full"): one client's
            sessions never evict another's live episode.
        split: The tasks served: ``train`` (sft and rl; the default), ``sft``, ``rl``, ``eval`` or
            ``all``. Seeds draw from it and a task outside it is refused.
        idle_timeout: Seconds an episode may go without a request before it is closed (its world
            released, by a background reaper or at the next request); a later request to it is a
            :class:`~envfactory.faces.guard.SessionExpired` error. ``None`` or 0: never.
        max_session_time: Seconds an episode may live (from its first start, restarts included),
            busy or not; then it is closed the same way. ``None`` or 0: no limit.
        max_episodes_per_client: Live episodes one client may hold at once (``None``: up to
            ``max_episodes``). Beyond it the client's own least recently used finished episode is
            released; with none finished its new episode is refused ("per client").

    Every method takes the ``client`` asking: an episode belongs to the client that started it,
    and another client naming it (by its id) is refused ("belongs to another client"): it can
    neither play, read, end, restart nor evict it. The MCP server passes the client of the request
    (the token it presented when the server has tokens, each token one client; else its MCP
    session, ``session:<id>``); ``None`` (a session-less client without a token, stdio) owns its
    episodes only through their ids.
    """

    _EXPIRED_KEPT = 4096  # closed episodes (and session keys) remembered, to say "expired" and not "unknown"


    def __init__(self, name: str, *, runtime: str = "local", task: str | None = None, seed: int | None = None,
                 max_turns: int | None = None, max_episodes: int = 256, split: DrawSplit = DEFAULT_SPLIT,
                 idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT, max_session_time: float | None = None,
                 max_episodes_per_client: int | None = None) -> None:
        from ..registry import spec as get_spec

        self.spec = get_spec(name)
        if self.spec.multi_agent:
            raise ValueError(f"{self.spec.name} is a team environment; serve --protocol mcp plays single-agent "
                             "environments (one MCP session is one agent)")
        clash = sorted(set(CONTROL_TOOLS) & set(self.spec.all_tools))
        if clash:
            raise ValueError(f"{self.spec.name} has tools named {clash}, which the MCP server uses for episode control")
        split_members(split)  # ValueError on an unknown split
        self.split = split
        if task is not None:
            self.spec.task_in_split(task, split)  # fail now on an unknown task, or one the split does not hold
        self.name, self.runtime, self.max_turns = self.spec.name, runtime, max_turns
        self.default_task, self.default_seed = task, seed
        if max_episodes < 1:
            raise ValueError("max_episodes must be at least 1")
        self.max_episodes = max_episodes
        if max_episodes_per_client is not None and max_episodes_per_client < 1:
            raise ValueError("max_episodes_per_client must be at least 1")
        self.max_episodes_per_client = max_episodes_per_client
        self.idle_timeout = idle_timeout or None
        self.max_session_time = max_session_time or None
        self._episodes: OrderedDict[str, Episode] = OrderedDict()  # episode id -> live episode
        self._by_key: dict[str, str] = {}                          # session key -> episode id
        self._last: dict[str, float] = {}                          # episode id -> time of its last request
        self._born: dict[str, float] = {}                          # episode id -> when it was made
        self._busy: dict[str, int] = {}                            # episode id -> requests in flight
        self._owner: dict[str, str | None] = {}                    # episode id -> the client that started it
        self._expired: OrderedDict[str, str] = OrderedDict()       # closed episode id / session key -> why
        self._lock = threading.RLock()
        self._stop = threading.Event()
        limits = [t for t in (self.idle_timeout, self.max_session_time) if t is not None]
        if limits:
            interval = min(max(min(limits) / 4, 0.05), 60.0)
            threading.Thread(target=_reaper, args=(weakref.ref(self), self._stop, interval), daemon=True,
                             name="envfactory-mcp-reaper").start()

    # -- tools ---------------------------------------------------------------
    def tool_list(self) -> list[dict[str, Any]]:
        """Every tool a client sees: the environment's (OpenAI schemas), then the control tools."""
        out = []
        for t in self.spec.tools_of().values():
            out.append({"name": t.name, "description": t.description, "input_schema": t.parameters,
                        "read_only": bool(t.read_only)})
        out += [
            {"name": "start_episode", "description": f"Start a new episode of {self.name} and get the task "
             "instruction. Any episode this session was playing is abandoned.", "input_schema": _START_SCHEMA,
             "read_only": False},
            {"name": "episode_status", "description": "The episode's state: whether it is done, its reward "
             "and success, turns played.", "input_schema": _EMPTY_SCHEMA, "read_only": True},
            {"name": "end_episode", "description": "End the episode by giving a final answer without a tool "
             "call; the task is judged now. In a conversation this ends your turn: the user's next "
             "message comes back as 'user', and the episode goes on.", "input_schema": _END_SCHEMA,
             "read_only": False},
            {"name": "list_tasks", "description": f"The tasks this server serves (its {self.split!r} split): "
             "task_id, split, kind and instruction.", "input_schema": _LIST_SCHEMA, "read_only": True},
        ]
        return out

    def list_tasks(self, split: str | None = None) -> list[dict[str, Any]]:
        """The served tasks (optionally those of ``split``, which must lie within the server's split)."""
        return served_tasks(self.spec, self.split, split)

    # -- episodes ------------------------------------------------------------
    def start(self, key: str | None, task_id: str | None = None, seed: int | None = None,
              split: str | None = None, *, client: str | None = None) -> dict[str, Any]:
        """Start (or restart) the episode of session ``key`` (an episode id restarts that episode;
        ``None``: a new, session-less episode): task ``task_id``, else the one ``seed`` draws from
        ``split`` (default: the served split; it must lie within it, ``ValueError`` otherwise), else
        the server's default task, else a random one."""
        draw = within_split(self.split, split)
        if task_id is None and seed is None and split is None:
            task_id, seed = self.default_task, self.default_seed
        if task_id is None:
            task = self.spec.draw_task(draw, seed)
        else:
            task = self.spec.task_in_split(task_id, draw)  # KeyError: unknown, or not in the split
        with self._lock:
            self._reap()
            eid = self._by_key.get(key) if key is not None else None
            if eid is None and key is not None and key in self._episodes:
                eid = key  # the episode's own id: restart it (was: a second episode under its id, the first leaked)
            ep = self._episodes.get(eid) if eid is not None else None
            if eid is not None and ep is not None:
                self._check_owner(eid, client)
            if eid is None or ep is None:  # (eid None: ep is None too)
                from ..registry import make

                self._client_room(client)
                self._make_room()
                ep = make(self.name, self.runtime, max_turns=self.max_turns, split=self.split)
                eid = key if key is not None and key.startswith("ep-") else "ep-" + secrets.token_hex(8)
                self._episodes[eid] = ep
                self._born[eid] = time.monotonic()
                self._owner[eid] = client
                if key is not None:
                    self._by_key[key] = eid
                    self._expired.pop(key, None)
                self._expired.pop(eid, None)
            self._episodes.move_to_end(eid)
            self._last[eid] = time.monotonic()
        with self._held(eid):
            messages = ep.reset(task.id)
        return {"episode": eid, "task_id": task.id, "instruction": messages[1]["content"],
                "system_prompt": messages[0]["content"],
                "tools": [s["function"]["name"] for s in ep.tool_schemas()], "max_turns": ep.status.max_turns}

    def _check_owner(self, eid: str, client: str | None) -> None:
        """Refuse ``client`` an episode another client started (with the lock held)."""
        owner = self._owner.get(eid)
        if owner is not None and owner != client:
            raise EpisodeError(f"episode {eid} belongs to another client: a client plays only the episodes it "
                               "started; call start_episode to play your own")

    def _client_room(self, client: str | None) -> None:
        """With the lock held, before ``client``'s new episode: at its per-client cap, release its
        own least recently used finished episode; with none, refuse."""
        cap = self.max_episodes_per_client
        if cap is None or client is None:
            return
        mine = [eid for eid, owner in self._owner.items() if owner == client]
        if len(mine) < cap:
            return
        for eid, ep in self._episodes.items():  # least recently used first
            if self._owner.get(eid) == client and ep.done and not self._busy.get(eid):
                self._drop(eid, f"episode {eid} was released: it had ended and its client needed room for a new "
                                "one; call start_episode to play another")
                return
        raise EpisodeError(f"too many episodes per client: this client holds {len(mine)} live episodes, the "
                           f"server's limit per client (--max-episodes-per-client {cap}); end one (end_episode) "
                           "and try again")

    def _make_room(self) -> None:
        """With the lock held, before a new episode: release the least recently used finished
        episode when full; with none, refuse (a live episode is never evicted for another)."""
        if len(self._episodes) < self.max_episodes:
            return
        for eid, ep in self._episodes.items():
            if ep.done and not self._busy.get(eid):
                self._drop(eid, f"episode {eid} was released: it had ended and the server needed room for a new "
                                "one; call start_episode to play another")
                return
        idle = f"one idles past {self.idle_timeout:g} s" if self.idle_timeout else "one ends and another starts"
        raise EpisodeError(f"server full: {len(self._episodes)} live episodes, the server's limit (--max-episodes); "
                           f"room frees when {idle}: try again later")

    def _drop(self, eid: str, why: str) -> None:
        """With the lock held: close episode ``eid`` and remember why for its id and session keys."""
        ep = self._episodes.pop(eid)
        self._last.pop(eid, None)
        self._born.pop(eid, None)
        self._busy.pop(eid, None)
        self._owner.pop(eid, None)
        for k in [k for k, v in self._by_key.items() if v == eid] + [eid]:
            self._by_key.pop(k, None)
            self._expired[k] = why
            self._expired.move_to_end(k)
        while len(self._expired) > self._EXPIRED_KEPT:
            self._expired.popitem(last=False)
        try:
            ep.close()
        except Exception:  # a world that cannot close (a lost container) is gone anyway
            pass

    def _reap(self) -> None:
        """With the lock held: close every episode with no request in flight that is idle past the
        timeout, or older than the session time limit."""
        now = time.monotonic()
        for eid, last in list(self._last.items()):
            if self._busy.get(eid):
                continue
            if self.idle_timeout is not None and now - last > self.idle_timeout:
                self._drop(eid, f"session expired: episode {eid} had no request for {now - last:.1f} s (the "
                                f"server's idle timeout is {self.idle_timeout:g} s) and was closed; call "
                                "start_episode to play another")
            elif self.max_session_time is not None and now - self._born.get(eid, now) > self.max_session_time:
                self._drop(eid, f"session expired: episode {eid} reached the server's session time limit "
                                f"({self.max_session_time:g} s, --max-session-time) and was closed; call "
                                "start_episode to play another")

    def reap(self) -> None:
        """Close every episode idle past ``idle_timeout`` or older than ``max_session_time`` (the
        background reaper calls this)."""
        with self._lock:
            self._reap()

    @contextmanager
    def _held(self, eid: str) -> Iterator[None]:
        """A request in flight on ``eid``: the reaper leaves it alone; its idle time starts after.
        An episode closed since it was looked up (the reaper runs on its own thread) is expired."""
        with self._lock:
            if eid not in self._episodes:
                raise SessionExpired(self._expired.get(eid, f"session expired: episode {eid} was closed"))
            self._busy[eid] = self._busy.get(eid, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                if eid in self._episodes:
                    self._busy[eid] -= 1
                    self._last[eid] = time.monotonic()

    def episode(self, key: str | None, *, autostart: bool = True, client: str | None = None) -> tuple[str, Episode]:
        """The episode of ``key`` (an episode id or a session key) that ``client`` started; with a
        default task, start one."""
        with self._lock:
            self._reap()
            if key is not None:
                eid = key if key in self._episodes else self._by_key.get(key)
                if eid is not None and eid in self._episodes:
                    self._check_owner(eid, client)
                    self._episodes.move_to_end(eid)
                    self._last[eid] = time.monotonic()
                    return eid, self._episodes[eid]
                if key in self._expired:
                    raise SessionExpired(self._expired[key])
        if autostart and (self.default_task is not None or self.default_seed is not None):
            info = self.start(key, client=client)
            return info["episode"], self._episodes[info["episode"]]
        if key is None:
            raise EpisodeError(
                "no episode: this request belongs to no session (a stateless client); call start_episode and "
                f"pass the episode id it returns as _meta[{EPISODE_META!r}] on every request")
        raise EpisodeError("no episode yet: call start_episode (task_id or seed) first")

    def status(self, key: str | None, *, client: str | None = None) -> dict[str, Any]:
        eid, ep = self.episode(key, autostart=False, client=client)
        status = ep.status
        log = status.log
        return {"episode": eid, "env": self.name, "task_id": ep.task.id if ep.task else None, "done": ep.done,
                "terminated": status.terminated, "truncated": status.truncated, "reward": ep.rewards[ep.agents[0]],
                "success": ep.success, "ended_by": status.ended_by, "answer": status.answer,
                "turns": status.turns_taken() if ep.task else 0, "max_turns": status.max_turns,
                "tool_calls": len(log), "tool_errors": sum(not e["ok"] for e in log),
                **({"user": _user_says(ep)} if _user_says(ep) else {})}

    def play(self, key: str | None, name: str, arguments: dict[str, Any] | None, *,
             client: str | None = None) -> tuple[str, bool, dict[str, Any]]:
        """One environment tool call as one turn: ``(observation, is_error, step info)``."""
        eid, ep = self.episode(key, client=client)
        if ep.done:
            raise EpisodeError(f"the episode has ended ({ep.status.ended_by}, reward {ep.rewards[ep.agents[0]]}); "
                               "call start_episode to play another")
        with self._held(eid):
            r = ep.step([ToolCall(name, dict(arguments or {}))])
        content = "\n".join(str(m.get("content", "")) for m in r.messages) or "(no output)"
        log = ep.status.log
        last = log[-1] if log else {"ok": False}
        return content, not last["ok"], self._step_meta(eid, ep, r.reward)

    def end(self, key: str | None, answer: str = "", *, client: str | None = None) -> dict[str, Any]:
        eid, ep = self.episode(key, client=client)
        if not ep.done:
            with self._held(eid):
                ep.step({"role": "assistant", "content": answer})
        return self.status(eid, client=client)

    def meta(self, key: str | None, *, client: str | None = None) -> dict[str, Any]:
        """The ``_meta`` of a control call (start, status, end): the episode id and where it stands,
        as an environment tool call's ``_meta`` says it (the reward so far)."""
        eid, ep = self.episode(key, autostart=False, client=client)
        return self._step_meta(eid, ep, ep.rewards[ep.agents[0]])

    @staticmethod
    def _step_meta(eid: str, ep: Episode, reward: float) -> dict[str, Any]:
        return {EPISODE_META: eid, "envfactory/reward": reward, "envfactory/done": ep.done,
                "envfactory/success": ep.success, "envfactory/ended_by": ep.status.ended_by}

    def instruction(self, key: str | None, *, client: str | None = None) -> str:
        _, ep = self.episode(key, client=client)
        return ep.transcript()[1]["content"]

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for ep in self._episodes.values():
                ep.close()
            self._episodes.clear()
            self._by_key.clear()
            self._last.clear()
            self._born.clear()
            self._busy.clear()
            self._owner.clear()


def _user_says(ep: Episode) -> str | None:
    """A conversation's user message the agent has not answered yet (after ``end_episode`` ended a
    turn), else ``None``."""
    if ep.task is None or ep.task.conversation is None or ep.done:
        return None
    last = ep.transcript()[-1]
    return last["content"] if last["role"] == "user" and ep.status.turns_taken() else None


def _reaper(ref: Any, stop: threading.Event, interval: float) -> None:
    """The idle reaper's loop; it ends with the service (closed, or collected)."""
    while not stop.wait(interval):
        service = ref()
        if service is None:
            return
        service.reap()
        del service


# -- the MCP server (official SDK, low-level Server) ---------------------------------
# what a client may name as an episode (the ids start_episode gives are ep- and 16 hex digits): short,
# so ids kept in memory (live and expired) stay small whatever a client sends
_EPISODE_ID = re.compile(r"ep-[A-Za-z0-9_-]{1,64}")


def _session_key(ctx: Any, stdio: bool) -> str | None:
    meta = ctx.meta
    if meta is not None:
        meta = meta if isinstance(meta, dict) else getattr(meta, "model_extra", None) or dict(meta)
        eid = meta.get(EPISODE_META)
        if isinstance(eid, str) and _EPISODE_ID.fullmatch(eid):  # an episode id, never another session's key
            return eid
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is not None:
        sid = headers.get("mcp-session-id")
        if sid:
            return "http:" + sid
    return "stdio" if stdio else None


def _client(ctx: Any) -> str | None:
    """The client of a request: the token it presented (a server with tokens), else its MCP
    session (``session:<id>``), else ``None`` (stdio, or a session-less client without a token)."""
    request = ctx.request
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict):
        client = client_of(scope)
        if client is not None:
            return client
    headers = getattr(request, "headers", None)
    sid = headers.get("mcp-session-id") if headers is not None else None
    return "session:" + sid if sid else None


def build_server(service: EpisodeService, *, stdio: bool) -> Any:
    """An ``mcp.server.Server`` (low-level) that plays ``service``'s episodes."""
    import mcp_types as types
    from mcp.server import Server

    tools = [types.Tool(name=t["name"], description=t["description"], input_schema=t["input_schema"],
                        annotations=types.ToolAnnotations(read_only_hint=t["read_only"]))
             for t in service.tool_list()]
    env_tools = set(service.spec.tools_of())

    def text(s: str, *, error: bool = False, meta: dict[str, Any] | None = None,
             structured: dict[str, Any] | None = None) -> Any:
        return types.CallToolResult(content=[types.TextContent(type="text", text=s)], is_error=error,
                                    structured_content=structured, _meta=meta)

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: Any) -> Any:
        key, client = _session_key(ctx, stdio), _client(ctx)
        args = dict(params.arguments or {})
        try:
            if params.name == "start_episode":
                unknown = set(args) - {"task_id", "seed", "split"}
                if unknown:
                    return text(f"Error: unexpected argument(s) {sorted(unknown)}", error=True)
                info = service.start(key, args.get("task_id"), args.get("seed"), args.get("split"), client=client)
                return text(info["instruction"], structured=info, meta=service.meta(info["episode"], client=client))
            if params.name == "episode_status":
                st = service.status(key, client=client)
                return text(json.dumps(st), structured=st, meta=service.meta(st["episode"], client=client))
            if params.name == "list_tasks":
                unknown = set(args) - {"split"}
                if unknown:
                    return text(f"Error: unexpected argument(s) {sorted(unknown)}", error=True)
                rows = service.list_tasks(args.get("split"))
                return text(json.dumps(rows), structured={"tasks": rows})
            if params.name == "end_episode":
                st = service.end(key, str(args.get("answer", "")), client=client)
                return text(json.dumps(st), structured=st, meta=service.meta(st["episode"], client=client))
            if params.name not in env_tools:
                return text(f"Error: unknown tool '{params.name}'. Available tools: "
                            f"{', '.join(t.name for t in tools)}.", error=True, meta=standing(key, client))
            if service.runtime == "local":
                out, failed, meta = service.play(key, params.name, args, client=client)
            else:  # a container world blocks on I/O: keep the event loop free
                import anyio

                out, failed, meta = await anyio.to_thread.run_sync(
                    functools.partial(service.play, key, params.name, args, client=client))
            return text(out, error=failed, meta=meta)
        except (EpisodeError, KeyError, ValueError, SpecError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            return text(f"Error: {msg}", error=True, meta=standing(key, client))

    def standing(key: str | None, client: str | None) -> dict[str, Any] | None:
        """The ``_meta`` of a refused call: where the session's episode stands, if it has one."""
        try:
            return service.meta(key, client=client)
        except EpisodeError:
            return None

    async def list_resources(ctx: Any, params: Any) -> Any:
        return types.ListResourcesResult(resources=[
            types.Resource(name="task", uri=TASK_URI, description="The instruction of the current episode's task",
                           mime_type="text/plain"),
            types.Resource(name="status", uri=STATUS_URI, description="The current episode's status (JSON)",
                           mime_type="application/json")])

    async def read_resource(ctx: Any, params: Any) -> Any:
        from mcp.shared.exceptions import MCPError

        key, client = _session_key(ctx, stdio), _client(ctx)
        uri = str(params.uri)
        try:
            if uri == TASK_URI:
                body, mime = service.instruction(key, client=client), "text/plain"
            elif uri == STATUS_URI:
                body, mime = json.dumps(service.status(key, client=client)), "application/json"
            else:
                raise MCPError(code=-32602, message=f"unknown resource {uri}")
        except EpisodeError as exc:
            raise MCPError(code=-32602, message=str(exc)) from None
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=mime, text=body)])

    return Server(f"envfactory-{service.name}", version="0.1.0",
                  instructions=f"Episodes of the envfactory environment {service.name} ({service.spec.domain}). "
                               "Call start_episode, then the environment's tools; finish (or end_episode) "
                               "ends the episode; episode_status reports the reward.",
                  on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
                  on_read_resource=read_resource)


def serve_stdio(service: EpisodeService) -> None:
    """Serve over this process's stdin/stdout until the client closes it."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(service, stdio=True)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


class TransportSessions:
    """ASGI middleware over the MCP SDK's app, inside the token check: an MCP transport session
    (an opening request, without ``Mcp-Session-Id``) takes no episode slot. The SDK caps its
    transport sessions in total (``max_sessions``); one client's bare ``initialize`` calls filled
    that cap and every other client got 503 until the idle timeout (30 min; issue 63). Here a
    client (a token) holds at most ``per_client`` transport sessions and all of them at most
    ``cap``: an opening request beyond either first closes the least recently used session that
    holds no live episode (the client's own first), and is refused (429 per client, 503 in
    total) only when every one holds a live episode. Episodes themselves are counted by
    :class:`EpisodeService` (``start_episode``: ``max_episodes``, ``max_episodes_per_client``)."""

    def __init__(self, app: Any, server: Any, service: EpisodeService, cap: int, per_client: int | None) -> None:
        self.app, self.server, self.service = app, server, service
        self.cap, self.per_client = cap, per_client
        self.sessions: OrderedDict[str, str | None] = OrderedDict()  # session id -> its client, least recent first
        self.closed = 0  # sessions closed to make room (tests)

    def _live(self) -> dict[str, Any]:
        manager = getattr(self.server, "_session_manager", None)
        live = getattr(manager, "_server_instances", None)
        return live if isinstance(live, dict) else {}

    def _holds_episode(self, sid: str) -> bool:
        svc = self.service
        with svc._lock:
            eid = svc._by_key.get("http:" + sid)
            ep = svc._episodes.get(eid) if eid is not None else None
            return ep is not None and eid is not None and (not ep.done or bool(svc._busy.get(eid)))

    async def _close_one(self, candidates: list[str]) -> bool:
        manager = getattr(self.server, "_session_manager", None)
        live = self._live()
        for sid in candidates:
            if self._holds_episode(sid):
                continue
            self.sessions.pop(sid, None)
            transport = live.get(sid)
            if transport is not None and manager is not None:
                await manager._discard_session(sid, transport)
            self.closed += 1
            return True
        return False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sid = None
        for name, value in scope.get("headers", ()):
            if name == b"mcp-session-id":
                sid = value.decode("latin-1")
        if sid is not None or scope.get("method") != "POST":
            if sid is not None and sid in self.sessions:
                self.sessions.move_to_end(sid)
            await self.app(scope, receive, send)
            return
        client = client_of(scope)
        live = self._live()
        for old in [k for k in self.sessions if k not in live]:  # closed by the SDK (idle, DELETE)
            del self.sessions[old]
        if client is not None and self.per_client is not None:
            mine = [k for k, c in self.sessions.items() if c == client]
            if len(mine) >= self.per_client and not await self._close_one(mine):
                await _refuse(scope, send, 429, {
                    "error": "too many sessions",
                    "detail": f"this client holds {len(mine)} MCP sessions with live episodes, the server's limit "
                              f"per client (--max-episodes-per-client {self.per_client}); end one and try again"})
                return
        if len(live) >= self.cap:
            order = [k for k, c in self.sessions.items() if c == client] + \
                [k for k, c in self.sessions.items() if c != client]
            if not await self._close_one(order):
                await _refuse(scope, send, 503, {"error": "server full",
                                                 "detail": f"{len(live)} MCP sessions, each with a live episode"})
                return

        async def noted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message.get("status", 500) < 400:
                for name, value in message.get("headers", ()):
                    if name.lower() == b"mcp-session-id":
                        self.sessions[value.decode("latin-1")] = client
            await send(message)

        await self.app(scope, receive, noted)


def build_http_app(service: EpisodeService, host: str = "127.0.0.1", *, json_response: bool = False,
                   token: str | None = None, max_body: int = DEFAULT_MAX_BODY) -> Any:
    """The streamable-HTTP ASGI app: the MCP SDK's own (its body cap ``max_body``, session idle
    timeout ``service.idle_timeout``), behind :class:`TransportSessions` (transport sessions take
    no episode slot; each client's are capped), the cap on authorized requests served at once and
    the token when one is given (``token``, else ``$ENVFACTORY_TOKEN``). Without
    ``max_episodes_per_client``, a client may hold an equal share of ``max_episodes`` among the
    tokens (:func:`~envfactory.faces.guard.per_client_default`)."""
    token = resolve_token(token)
    if service.max_episodes_per_client is None:
        service.max_episodes_per_client = per_client_default(service.max_episodes, token)
    cap = service.max_episodes + CONNECTION_HEADROOM
    server = build_server(service, stdio=False)
    app = server.streamable_http_app(host=host, json_response=json_response, max_request_body_size=max_body,
                                     session_idle_timeout=service.idle_timeout, max_sessions=cap)
    app = TransportSessions(app, server, service, cap, service.max_episodes_per_client if token else None)
    return guard(app, token=token, max_body=None, max_in_flight=cap)


def serve_http(service: EpisodeService, host: str = "127.0.0.1", port: int = 8000, *,
               ready: Any = None, json_response: bool = False, token: str | None = None,
               max_body: int = DEFAULT_MAX_BODY, allow_no_token: bool = False, tls_cert: str | None = None,
               tls_key: str | None = None, header_timeout: float = DEFAULT_HEADER_TIMEOUT) -> None:
    """Serve over streamable HTTP at ``http://host:port/mcp`` (``port=0``: a free port). The URL is
    written to stderr once the server listens (``ready(url)`` is called too, when given). Beyond
    loopback a token is required unless ``allow_no_token``; ``tls_cert`` / ``tls_key`` (PEM
    files) serve HTTPS."""
    import anyio
    import uvicorn

    token = resolve_token(token)
    check_exposure(host, token, allow_no_token)
    app = build_http_app(service, host, json_response=json_response, token=token, max_body=max_body)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    real_port = sock.getsockname()[1]
    config = uvicorn_config(app, max_body=max_body, max_sessions=service.max_episodes, lifespan="on",
                            tls_cert=tls_cert, tls_key=tls_key, header_timeout=header_timeout)
    url = f"{scheme(tls_cert)}://{host}:{real_port}/mcp"
    userver = uvicorn.Server(config)

    async def main() -> None:
        async def announce() -> None:
            while not userver.started:
                await anyio.sleep(0.01)
            print(f"envfactory: serving {service.name} over MCP (streamable HTTP) at {url}", file=sys.stderr,
                  flush=True)
            if ready is not None:
                ready(url)

        async with anyio.create_task_group() as tg:
            tg.start_soon(announce)
            await userver.serve(sockets=[sock])

    anyio.run(main)


# -- CLI: envfactory serve NAME --protocol mcp ----------------------------------------
def _idle_timeout(args: argparse.Namespace) -> float | None:
    """``--idle-timeout``, or by default: the network default, and never over stdio (one client,
    the parent process, which may well think for longer)."""
    if args.idle_timeout is not None:
        return args.idle_timeout or None
    return None if args.transport == "stdio" else DEFAULT_IDLE_TIMEOUT


def serve_run(args: argparse.Namespace) -> tuple[int, Any, str]:
    """``envfactory serve NAME --protocol mcp`` (its arguments: :data:`envfactory.cli.serve.SERVE`)."""
    try:
        service = EpisodeService(args.name, runtime=args.runtime, task=args.task, seed=args.seed,
                                 max_turns=args.max_turns, max_episodes=args.max_episodes, split=args.split,
                                 idle_timeout=_idle_timeout(args), max_session_time=args.max_session_time,
                                 max_episodes_per_client=args.max_episodes_per_client)
    except (KeyError, ValueError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        return 2, {"error": msg}, f"error: {msg}"
    try:
        if args.transport == "stdio":
            if getattr(args, "json", False):
                msg = "--json cannot be used with the stdio transport: stdout carries the MCP protocol"
                return 2, {"error": msg}, f"error: {msg}"
            serve_stdio(service)
            os.dup2(sys.stderr.fileno(), 1)  # stdout was the protocol channel: nothing more goes there
            sys.stdout = sys.stderr
            return 0, {"served": service.name, "transport": "stdio"}, ""
        serve_http(service, args.host, args.port, token=args.token, max_body=args.max_body,
                   allow_no_token=args.allow_no_token, tls_cert=args.tls_cert, tls_key=args.tls_key,
                   header_timeout=args.header_timeout)
        return 0, {"served": service.name, "transport": "streamable-http"}, ""
    except KeyboardInterrupt:
        return 0, {"served": service.name}, ""
    finally:
        service.close()
