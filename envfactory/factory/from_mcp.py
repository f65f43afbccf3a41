"""An existing MCP server, unchanged, as an environment: its tools become the environment's tools.

:func:`from_mcp` starts the server (a command, spoken to over stdio with the official
``mcp`` SDK), lists its tools and builds a :class:`~envfactory.ToolEnvSpec`:

* each MCP tool becomes a :class:`~envfactory.Tool` with the server's own JSON schema;
  arguments are checked against it (strictly: unknown arguments are errors) before the
  call goes to the server; an ``isError`` result (or a text starting with one of
  ``error_prefixes``) is a tool error observation, as for any envfactory tool;
* the state (:class:`MCPState`) is the *journal* of the state-changing calls made since
  the server was empty, plain JSON data. A live server process is bound to each state
  object (``MCPState`` keeps it in a private attribute); a state that has none (a fresh
  task start, a fork, a restored snapshot) gets one on its first call: a server process
  from a pool whose own state is rebuilt to the journal (see ``restore``);
* a task (:func:`mcp_task`) is an instruction, a setup (calls that seed the server: the
  task's initial state), a reference solution and a :class:`ReadCheck`: a call of one of
  the server's read tools and the text it must return. The expected text defaults to what
  the read tool returns after the reference solution (computed once, on a live server).

How a server's state is rebuilt (``restore``) decides what the environment can do:

* ``"files"``: the server keeps all its state in files under ``{state_dir}`` (a private
  folder per process, substituted into the command's arguments and environment) and
  re-reads them on every call (e.g. SQLite servers that open the database per call).
  Processes are pooled; a state is rebuilt by copying files (cached per journal, taken
  when a state is copied) and replaying the journal's remaining calls. Fast forks, resets
  and snapshots.
* ``"replay"``: the server is deterministic: the same calls on a fresh process give the
  same state. A state is rebuilt by replaying its journal on a new process.
* ``None`` (the default): neither is known. Fresh task starts work (a new process per
  episode, the setup played on it), but ``fork``, ``snapshot`` and ``restore`` raise
  :class:`NotImplementedError` naming what is missing.

The world is :class:`MCPWorld` (a :class:`~envfactory.world.LocalWorld` whose
fork/dump/load refuse what ``restore`` cannot do, and whose ``close`` hands the process
back). Importing this module adds the runtime ``"mcp"`` to
:data:`envfactory.registry.RUNTIMES`, so ``envfactory.make(NAME, runtime="mcp")`` plays
an episode in it; :func:`make_episode` does the same for an unregistered spec
(``Episode(spec, world=MCPWorld(spec))``). ``envfactory.make(NAME)`` (the local runtime)
works too, through the same process bindings.
"""

from __future__ import annotations

from envfactory.factory import _callable

import asyncio
import atexit
import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence, cast

from pydantic import PrivateAttr

from envfactory import registry
from envfactory.definition import SpecError, ToolEnvSpec
from envfactory.episode import Episode
from envfactory.state import State
from envfactory.task import Task, ToolCall
from envfactory.tooling import Tool, ToolError, _strip_titles  # pydantic titles dropped as for our own tools
from envfactory.world import LocalWorld

__all__ = ["from_mcp", "mcp_task", "ReadCheck", "MCPState", "MCPWorld", "MCPServerConfig", "make_episode",
           "list_server_tools", "close_all"]

Restore = Literal["files", "replay"] | None
READ_PREFIXES = ("get", "list", "find", "search", "show", "count", "describe", "read", "lookup", "view", "status")


# -- the state ------------------------------------------------------------------------
class MCPState(State):
    """The journal of state-changing calls (``{"name", "arguments"}``) since the server was empty.

    The live server process bound to this object is private (not data: never dumped,
    hashed or copied; a copy gets its own process on its first call)."""

    calls: list[dict[str, Any]] = []
    _live: Any = PrivateAttr(default=None)


def _journal_key(calls: Sequence[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(list(calls), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# -- one server process, driven from a background event loop -----------------------------
class _Loop:
    """One asyncio loop in a daemon thread, shared by every connection of this process."""

    _instance: "_Loop | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="envfactory-mcp", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> "_Loop":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def run(self, coro: Any, timeout: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@dataclass(frozen=True)
class MCPServerConfig:
    """How to start one server process: ``command`` (argv), its extra environment and folder.

    ``{state_dir}`` in an argument or an environment value becomes the process's own
    temporary folder."""

    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    timeout: float = 30.0

    def resolved(self, state_dir: str) -> tuple[list[str], dict[str, str]]:
        from mcp.client.stdio import get_default_environment

        argv = [a.replace("{state_dir}", state_dir) for a in self.command]
        env = {**get_default_environment(), **{k: v.replace("{state_dir}", state_dir) for k, v in self.env}}
        return argv, env


_OPEN: "weakref.WeakSet[_Connection]" = weakref.WeakSet()


class _Connection:
    """A live server process with an initialized ``ClientSession`` (stdio)."""

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.state_dir = tempfile.mkdtemp(prefix="envf-mcp-")
        self._loop = _Loop.get()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._done: Any = None
        self.closed = False
        started = asyncio.run_coroutine_threadsafe(self._start(), self._loop.loop)
        try:
            started.result(config.timeout)
        except BaseException:
            self.close()
            raise
        _OPEN.add(self)

    async def _start(self) -> None:
        self._stop = stop = asyncio.Event()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._done = asyncio.ensure_future(self._serve(ready, stop))
        await ready

    async def _serve(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        argv, env = self.config.resolved(self.state_dir)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=self.config.cwd)
        try:
            with open(os.devnull, "w") as errlog:
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        self._session = session
                        ready.set_result(None)
                        await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits for the start
            if not ready.done():
                ready.set_exception(RuntimeError(f"the MCP server {' '.join(argv)!r} did not start: "
                                                 f"{type(exc).__name__}: {exc}"))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self._session = None

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """``(text, is_error)`` of one tools/call."""
        if self._session is None:
            raise RuntimeError("the MCP server process is gone")
        r = self._loop.run(self._session.call_tool(name, arguments), self.config.timeout)
        parts = []
        for c in r.content:
            parts.append(c.text if getattr(c, "type", None) == "text" else json.dumps(c.model_dump(mode="json")))
        if not parts and r.structured_content is not None:
            parts.append(json.dumps(r.structured_content, sort_keys=True))
        return "\n".join(parts), bool(r.is_error)

    def list_tools(self) -> list[Any]:
        out, cursor = [], None
        while True:
            import mcp_types as types

            params: Any = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            r = self._loop.run(self._session.list_tools(params=params), self.config.timeout)
            out.extend(r.tools)
            cursor = r.next_cursor
            if not cursor:
                return out

    # files of the server's state (restore="files")
    def save_files(self) -> dict[str, bytes]:
        out = {}
        for root, _, files in os.walk(self.state_dir):
            for f in files:
                p = os.path.join(root, f)
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, self.state_dir)] = fh.read()
        return out

    def load_files(self, files: dict[str, bytes]) -> None:
        for entry in os.listdir(self.state_dir):
            p = os.path.join(self.state_dir, entry)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
        for rel, data in files.items():
            p = os.path.join(self.state_dir, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as fh:
                fh.write(data)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if threading.current_thread() is self._loop.thread:  # (a finalizer run by the loop itself)
            if self._stop is not None:
                self._stop.set()
            return
        if (event := self._stop) is not None:
            async def stop() -> None:
                event.set()
                if self._done is not None:
                    try:  # shielded: a slow exit must not be cancelled half-way (the process would stay)
                        await asyncio.wait_for(asyncio.shield(self._done), 30)
                    except Exception:  # noqa: BLE001 - it goes on shutting down in the background
                        pass

            try:
                self._loop.run(stop(), 35)
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(self.state_dir, ignore_errors=True)


def close_all() -> None:
    """Stop every server process this interpreter started (also run at exit)."""
    for pool in list(_POOLS.values()):
        pool.drain()
    for conn in list(_OPEN):
        conn.close()


atexit.register(close_all)


# -- pools, bindings and rebuilding a state --------------------------------------------
class _Pool:
    """Server processes of one configuration. With ``restore="files"`` idle processes are reused
    (their files are replaced on the next binding); otherwise every binding gets a fresh one."""

    def __init__(self, config: MCPServerConfig, restore: Restore, max_idle: int = 4, cache_size: int = 2048) -> None:
        self.config, self.restore, self.max_idle = config, restore, max_idle
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self.files: dict[str, dict[str, bytes]] = {}  # journal key -> the server's files in that state
        self.cache_size = cache_size
        self.spawned = 0

    def acquire(self) -> _Connection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        conn = _Connection(self.config)
        self.spawned += 1
        if self.restore == "files":
            self.remember([], conn.save_files())  # the empty server
        return conn

    def release(self, conn: _Connection) -> None:
        if self.restore == "files" and not conn.closed:
            with self._lock:
                if len(self._idle) < self.max_idle:
                    self._idle.append(conn)
                    return
        conn.close()

    def remember(self, calls: Sequence[dict[str, Any]], files: dict[str, bytes]) -> None:
        with self._lock:
            if len(self.files) >= self.cache_size:
                self.files.pop(next(iter(self.files)))
            self.files.setdefault(_journal_key(calls), files)

    def drain(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()


_POOLS: dict[tuple[MCPServerConfig, Restore], _Pool] = {}


def _pool(config: MCPServerConfig, restore: Restore) -> _Pool:
    p = _POOLS.get((config, restore))
    if p is None:
        p = _POOLS.setdefault((config, restore), _Pool(config, restore))
    return p


class _Binding:
    """A state object's live process. Dropped with the state (the process goes back to its pool);
    a copy of the state does not share it (the copy's files are remembered at copy time)."""

    __slots__ = ("conn", "pool", "key", "__weakref__")

    def __init__(self, conn: _Connection, pool: _Pool, key: str) -> None:
        self.conn, self.pool, self.key = conn, pool, key
        weakref.finalize(self, pool.release, conn)

    def __deepcopy__(self, memo: Any) -> None:
        if self.pool.restore == "files" and self.key not in self.pool.files and not self.conn.closed:
            with self.pool._lock:
                if len(self.pool.files) >= self.pool.cache_size:
                    self.pool.files.pop(next(iter(self.pool.files)))
                self.pool.files[self.key] = self.conn.save_files()
        return None

    def __copy__(self) -> None:
        return None


class _Rebinds:
    """The part of a runtime that keeps a state's live connection (:meth:`live`); the runtime says
    how to make one (``bind``) and what is missing when it cannot (``missing``). Shared with
    :mod:`envfactory.factory.from_openenv`."""

    restore: Any

    def bind(self, state: Any) -> _Binding:
        raise NotImplementedError

    def missing(self, what: str) -> str:
        raise NotImplementedError

    def live(self, state: Any, *, keep: bool = True) -> _Binding:
        """The connection whose state is ``state``'s journal: its own while it holds, else a new one
        (refused for a copied or restored state when there is no ``restore``)."""
        b = state._live
        if b is not None and not b.conn.closed and b.key == _journal_key(state.calls):
            return b
        if self.restore is None and state.calls and not _is_setup(state):
            # a fresh task start replays its setup on a new connection; anything longer is a copy
            raise NotImplementedError(self.missing("rebuild a copied or restored state"))
        b = self.bind(state)
        if keep:
            state._live = b
        return b


@dataclass
class _Runtime(_Rebinds):
    """What the tools of one environment share: the server configuration and how to rebuild a state."""

    name: str
    config: MCPServerConfig
    restore: Restore
    read_only: frozenset[str]
    error_prefixes: tuple[str, ...]
    scrub: tuple[tuple[Any, str], ...]

    @property
    def pool(self) -> _Pool:
        return _pool(self.config, self.restore)

    def clean(self, text: str) -> str:
        for pattern, repl in self.scrub:
            text = pattern.sub(repl, text)
        return text

    def missing(self, what: str) -> str:
        return (f"{self.name}: cannot {what}: the MCP server {' '.join(self.config.command)!r} offers no way to save "
                "and load its state, and none was declared. Declare how to rebuild it: "
                "from_mcp(..., restore='files') if the server keeps all its state in files under {state_dir} "
                "and re-reads them on every call, or restore='replay' if replaying the same calls on a fresh "
                "server always gives the same state")

    def bind(self, state: MCPState) -> _Binding:
        """A process whose server state is the journal's (rebuilt as ``restore`` says)."""
        calls = state.calls
        pool = self.pool
        conn = pool.acquire()
        try:
            start = 0
            if self.restore == "files":
                for n in range(len(calls), -1, -1):
                    files = pool.files.get(_journal_key(calls[:n]))
                    if files is not None:
                        conn.load_files(files)
                        start = n
                        break
            for c in calls[start:]:
                conn.call(c["name"], c["arguments"])
            if self.restore == "files" and start < len(calls):
                pool.remember(calls, conn.save_files())
        except BaseException:
            pool.release(conn) if self.restore == "files" else conn.close()
            raise
        return _Binding(conn, pool, _journal_key(calls))



def _is_setup(state: MCPState) -> bool:
    """A state whose journal is a task's setup only (a fresh start: replaying the setup is how every
    task starts, whatever ``restore`` says)."""
    return _journal_key(state.calls) in _SETUPS


_SETUPS: set[str] = set()  # journal keys of every task setup


# -- tools --------------------------------------------------------------------------------
class _PassThrough:
    """``Tool.args_model`` for a server tool: arguments are checked against the server's JSON
    schema inside the call (the server's own schema is the contract)."""

    @classmethod
    def model_validate(cls, arguments: dict[str, Any]) -> Any:
        obj = object.__new__(cls)
        obj.__dict__.update(arguments)
        return obj


def _parameters(schema: dict[str, Any] | None) -> dict[str, Any]:
    s = _strip_titles(dict(schema or {}))
    s.pop("$schema", None)
    s["type"] = "object"
    s.setdefault("properties", {})
    s.setdefault("required", [])
    if "additionalProperties" not in s:
        s["additionalProperties"] = False  # strict, as envfactory tools are
    return s


def _validator(schema: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]]:
    import jsonschema

    v = jsonschema.Draft202012Validator(schema)

    def problems(arguments: dict[str, Any]) -> list[str]:
        out = []
        for e in sorted(v.iter_errors(arguments), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in e.absolute_path)
            out.append(f"argument '{where}': {e.message}" if where else e.message)
        return out

    return problems


def _server_tool(rt: _Runtime, t: Any) -> Tool:
    name = t.name
    params = _parameters(t.input_schema)
    problems = _validator(params)
    ro = name in rt.read_only

    def call(state: MCPState, **arguments: Any) -> str:
        bad = problems(arguments)
        if bad:
            names = ", ".join(n + ("" if n in params["required"] else "?") for n in params["properties"])
            raise ToolError(f"invalid arguments for tool '{name}': {'; '.join(bad)}. Expected arguments: ({names}).")
        b = rt.live(state)
        text, is_error = b.conn.call(name, arguments)
        if not ro:
            state.calls.append({"name": name, "arguments": arguments})
            b.key = _journal_key(state.calls)
        text = rt.clean(text)
        if is_error or text.startswith(rt.error_prefixes):
            raise ToolError(text[len("Error: "):] if text.startswith("Error: ") else text)
        return text

    call.__name__ = name
    desc = " ".join((t.description or t.title or name).split())
    return Tool(name=name, description=desc, fn=call, parameters=params, args_model=_PassThrough,  # type: ignore[arg-type]
                read_only=ro, _arg_names=tuple(params["properties"]), _simple=None)


def list_server_tools(command: str | Sequence[str], *, env: dict[str, str] | None = None,
                      cwd: str | None = None, timeout: float = 30.0) -> list[Any]:
    """The tools an MCP server offers (``mcp.types.Tool`` objects): starts it once, asks, stops it."""
    conn = _Connection(_config(command, env, cwd, timeout))
    try:
        return conn.list_tools()
    finally:
        conn.close()


def _config(command: str | Sequence[str], env: dict[str, str] | None, cwd: str | None,
            timeout: float) -> MCPServerConfig:
    if isinstance(command, str):
        if re.match(r"^https?://", command):
            raise NotImplementedError(
                "from_mcp over streamable HTTP: a remote server is one shared state that envfactory can neither "
                "start per episode nor reset; give the command that starts the server (stdio) instead")
        argv = shlex.split(command)
    else:
        argv = list(command)
    if not argv:
        raise SpecError("from_mcp needs a command that starts the server")
    return MCPServerConfig(tuple(argv), tuple(sorted((env or {}).items())), cwd, timeout)


# -- tasks ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadCheck:
    """Success: the read tool ``call`` returns ``expected`` (after ``scrub``) on the final state;
    with ``contains``, the text holds each of those strings instead. Evaluated on the state's
    live server (a state without one gets a process for the check and gives it back)."""

    call: ToolCall
    expected: str | None = None
    contains: tuple[str, ...] = ()
    runtime: Any = field(default=None, compare=False, repr=False)

    def observe(self, state: MCPState) -> str:
        rt = self.runtime
        b = rt.live(state, keep=state._live is not None)
        text, is_error = b.conn.call(self.call.name, dict(self.call.arguments))
        return rt.clean(text)

    def __call__(self, state: MCPState) -> bool:
        text = self.observe(state)
        if self.contains:
            return all(c in text for c in self.contains)
        return text == self.expected

    def describe(self) -> dict[str, Any]:
        return {"call": self.call.to_json(), "expected": self.expected, "contains": list(self.contains)}


def mcp_task(id: str, instruction: str, solution: Sequence[ToolCall], check: ToolCall, *,
             setup: Sequence[ToolCall] = (), expected: str | None = None, contains: Sequence[str] = (),
             answer_facts: Sequence[str] = (), metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task for :func:`from_mcp`: ``setup`` seeds the server (the initial state), ``solution`` is the
    reference, ``check`` a read-tool call whose text must be ``expected`` (default: what it returns after
    the reference solution) or contain each of ``contains``."""
    return {"id": id, "instruction": instruction, "solution": list(solution), "check": check,
            "setup": list(setup), "expected": expected, "contains": tuple(contains),
            "answer_facts": list(answer_facts), "metadata": dict(metadata or {})}


def _build_tasks(rt: _Runtime, tools: dict[str, Tool], raw: Sequence[dict[str, Any]]) -> list[Task]:
    out = []
    for d in raw:
        setup = [{"name": c.name, "arguments": dict(c.arguments)} for c in d["setup"]]
        _SETUPS.add(_journal_key(setup))
        initial = MCPState(calls=setup)
        if d["check"].name not in tools or not tools[d["check"].name].read_only:
            raise SpecError(f"{rt.name}: task {d['id']!r}: the check must call one of the server's read tools "
                            f"(declared read_only), not {d['check'].name!r}")
        expected = d["expected"]
        if expected is None and not d["contains"]:
            state = MCPState(calls=list(setup))
            for c in d["solution"]:
                out_ = tools[c.name].invoke(state, c.arguments)
                if not out_.ok:
                    raise SpecError(f"{rt.name}: task {d['id']!r}: the reference call {c.name} failed: {out_.content}")
            expected = ReadCheck(d["check"], runtime=rt).observe(state)
            del state
        check = ReadCheck(d["check"], expected, d["contains"], runtime=rt)
        out.append(Task(id=d["id"], instruction=d["instruction"], initial_state=initial, solution=d["solution"],
                        answer_facts=d["answer_facts"], check=check,
                        metadata={**d["metadata"], "check": check.describe()}))
    return out


# -- the world ------------------------------------------------------------------------------
class MCPWorld(LocalWorld):
    """The state of an episode of a :func:`from_mcp` environment, on a server process of its own.

    Fork, snapshot and restore work as the environment's ``restore`` allows; without one they
    raise :class:`NotImplementedError` naming what is missing. ``close`` gives the process back."""

    def __init__(self, spec: ToolEnvSpec, **_: Any) -> None:
        super().__init__(spec)
        rt = spec.metadata.get("mcp_runtime")
        if rt is None:
            raise SpecError(f"{spec.name} was not built by from_mcp; MCPWorld plays from_mcp environments")
        self._rt: _Runtime = rt

    def start(self, task: Task) -> None:
        super().start(task)
        self._rt.live(cast(MCPState, self.state()))  # the process now, not at the first call

    def fork(self) -> "MCPWorld":
        if self._rt.restore is None:
            raise NotImplementedError(self._rt.missing("fork the episode"))
        new = cast(MCPWorld, super().fork())
        new.__class__ = MCPWorld
        new._rt = self._rt
        return new

    def dump(self) -> Any:
        if self._rt.restore is None:
            raise NotImplementedError(self._rt.missing("snapshot the episode"))
        return super().dump()

    def load(self, task: Task, state: Any) -> None:
        if self._rt.restore is None:
            raise NotImplementedError(self._rt.missing("restore a snapshot"))
        super().load(task, state)

    def close(self) -> None:
        self._state = None  # the binding goes, and its process back to the pool


registry.RUNTIMES.setdefault("mcp", "envfactory.factory.from_mcp:MCPWorld")


def make_episode(spec: ToolEnvSpec, *, max_turns: int | None = None) -> Episode:
    """A live episode of a (registered or not) :func:`from_mcp` environment, in an :class:`MCPWorld`."""
    return Episode(spec, MCPWorld(spec), max_turns=max_turns)


# -- the factory ------------------------------------------------------------------------------
def from_mcp(
    command: str | Sequence[str],
    *,
    name: str,
    domain: str,
    tasks: Sequence[dict[str, Any]] | Callable[[], Sequence[dict[str, Any]]],
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    restore: Restore = None,
    read_only: Sequence[str] | None = None,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    error_prefixes: Sequence[str] = (),
    scrub: Sequence[tuple[str, str]] = (),
    description: str = "",
    system_prompt: str | None = None,
    max_turns: int = 20,
    timeout: float = 30.0,
) -> ToolEnvSpec:
    """Build an environment from an MCP server, leaving the server untouched.

    Args:
        command: The command that starts the server over stdio (a string, split like a shell
            would, or argv). ``{state_dir}`` in it (or in ``env``) is a private folder per process.
        name: Registry name, ``Name-v0``.
        domain: Domain label.
        tasks: :func:`mcp_task` dicts (or a function returning them: built on first use).
        env: Extra environment variables of the server process.
        restore: How a server state is rebuilt: ``"files"``, ``"replay"`` or ``None`` (see the module doc).
        read_only: Tools that never change the state (default: the server's ``readOnlyHint``
            annotations, else names starting with a read verb). Read-only calls are not journaled.
        include / exclude: Which server tools to expose.
        error_prefixes: Result texts starting with one of these are tool errors (for servers that
            report errors as ordinary text).
        scrub: ``(regex, replacement)`` pairs applied to every result text (e.g. dates), so
            observations and checks are reproducible.
    """
    config = _config(command, env, cwd, timeout)
    conn = _Connection(config)
    try:
        server_tools = conn.list_tools()
    finally:
        conn.close()
    chosen = [t for t in server_tools if (include is None or t.name in include) and t.name not in set(exclude)]
    if not chosen:
        raise SpecError(f"{name}: the MCP server offers no tools to expose")
    if read_only is None:
        ro = {t.name for t in chosen
              if (t.annotations is not None and t.annotations.read_only_hint) or t.name.startswith(READ_PREFIXES)}
    else:
        ro = set(read_only)
    rt = _Runtime(name, config, restore, frozenset(ro), tuple(error_prefixes),
                  tuple((re.compile(p), r) for p, r in scrub))
    tools = [_server_tool(rt, t) for t in chosen]
    spec = ToolEnvSpec(name=name, domain=domain, state_type=MCPState, tools=tools, tasks=[],
                       description=description or f"the MCP server {' '.join(config.command)}",
                       system_prompt=system_prompt, max_turns=max_turns,
                       metadata={"mcp_runtime": rt, "source": f"mcp {' '.join(config.command)}", "restore": restore})
    tool_map = {t.name: t for t in tools}
    spec.tasks = lambda: _build_tasks(rt, tool_map, tasks() if callable(tasks) else tasks)
    return spec


_callable(__name__)  # envfactory.factory.from_mcp may be this module: calling it calls from_mcp()
