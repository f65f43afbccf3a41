"""NeMo Gym: any single-agent envfactory environment as a NeMo Gym resources server.

NeMo Gym (``pip install nemo-gym``) trains and evaluates with three kinds of server: a model
server (``/v1/responses``), an agent server (``/run``: seed the resources server's session, loop
model and tools, then ``/verify``) and a *resources server*, which holds the tools and the
verifier. This module is the resources server: a ``SimpleResourcesServer`` of NeMo Gym whose
sessions are episodes of one registered environment (``env_name`` in its config)::

    from envfactory.faces.nemo_gym import nemo_gym_rows, resources_server_class
    rows = nemo_gym_rows("Counter-v0", split="rl")   # NeMo Gym's dataset (JSONL), one row a task
    Server = resources_server_class()                # nemo_gym imported now
    # Server.run_webserver() under NeMo Gym's launcher, config: env_name: Counter-v0

* **Sessions.** A rollout's session is NeMo Gym's own (the signed session cookie, whose
  ``session_id`` the agent carries from ``/seed_session`` through the tool calls to ``/verify``);
  each holds one :class:`~envfactory.episode.Episode`. ``POST /seed_session`` with the dataset
  row (``task_id``, else ``seed``, optional ``split``; NeMo Gym's ``SimpleAgent`` posts the whole
  row) resets the session's episode to that task, drawn as ``envfactory serve`` draws: the server
  serves ``split`` (config; default ``train``) and refuses a task outside it. It answers the
  ``task_id``, ``instruction``, ``system_prompt``, ``tools`` and ``max_turns``.
* **Tools.** Each environment tool (``finish`` included) is one endpoint, ``POST /<name>``, whose
  body is the call's arguments (one JSON object; its JSON schema is the endpoint's request body in
  the OpenAPI document) and which plays one turn of the episode, as ``make(NAME).step`` does.
  The answer is ``{"output": observation}``, or ``{"error": observation}`` when the episode judged
  the call a failure (invalid arguments, a tool error, an unknown tool: ``POST /<any other
  name>`` is a turn too, as a call of an unknown tool is in ``make``), with ``"done": true`` once
  the call ended the episode (``finish``, the turn limit). All of these are HTTP 200: an agent
  hands the body to the model as the tool's output. A body that is not a JSON object is a 400,
  and a call with no episode in its session (never seeded, expired, or one already ended) a 409,
  each with an ``error`` naming it; neither is a turn.
* **Verify.** ``POST /verify`` (the agent's ``response``) ends the episode with the response's
  final assistant message as the answer, unless it has ended already (``finish``, the turn limit),
  and answers NeMo Gym's verify response with ``reward``: the episode's task-completion reward
  (1.0 on success), plus ``task_id``, ``success``, ``ended_by``, ``turns``, ``tool_calls`` and
  ``tool_errors``. Verifying again gives the same reward; a session never seeded is a 409.
* **Seeding errors.** An unknown task (or one outside the served split) is a 404 and a bad split a
  400, each ``{"error": ...}`` naming it (with the nearest task ids); a server at its
  ``max_episodes`` with no finished episode to release is a 503.

Ended episodes stay until room is needed (``max_episodes``: the least recently used finished
one goes first) or they idle past ``idle_timeout`` seconds; the engine is
:class:`~envfactory.faces.mcp_server.EpisodeService`, the same as ``envfactory serve --protocol
mcp``'s. Blocking episode work runs in Starlette's thread pool, off NeMo Gym's event loop.

Importing this module does not import nemo_gym: :func:`resources_server_class` builds the
classes on first use (``EnvfactoryResourcesServer`` and ``EnvfactoryResourcesServerConfig`` are
module attributes built then), and says which package to install when it is missing.
Tested with nemo-gym 0.4.0, the newest release whose Python floor (3.12) a machine here has;
0.5 and later require Python 3.13.14 or newer.
"""

# (no ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at run
# time, and the classes they name are local to resources_server_class)
import functools
import json
import re
from typing import Any, Optional

from ..definition import DEFAULT_SPLIT, DrawSplit
from ..env import EpisodeError

__all__ = ["RESERVED_PATHS", "nemo_gym_rows", "resources_server_class", "responses_tools"]

# the resources server's own routes in NeMo Gym 0.4 to 0.7 (a tool of the same name could not be served)
RESERVED_PATHS = frozenset({"seed_session", "verify", "aggregate_metrics", "close_session", "reverify_mode",
                            "mcp", "stats", "docs", "redoc", "openapi.json"})
DEFAULT_ROWS_SPLIT = "rl"
INSTALL = "pip install 'nemo-gym>=0.4' (Python 3.12 or newer)"


def responses_tools(schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat tool schemas (``{"type": "function", "function": {...}}``) in the flat
    Responses API shape NeMo Gym's ``responses_create_params.tools`` holds."""
    out = []
    for s in schemas:
        f = s.get("function", s)
        out.append({"type": "function", "name": f["name"], "description": f.get("description") or "",
                    "parameters": f.get("parameters") or {"type": "object", "properties": {}},
                    "strict": False})
    return out


def nemo_gym_rows(name: str, split: str = DEFAULT_ROWS_SPLIT, *,
                  tasks: Optional[list[str]] = None) -> list[dict[str, Any]]:
    """NeMo Gym dataset rows (write them as JSONL), one per task of ``split`` (or the named
    ``tasks``): ``responses_create_params`` (``input``: the episode's opening system and user
    messages; ``tools``: the environment's, Responses-shaped), ``env_name`` and ``task_id``.
    ``SimpleAgent`` posts the row to ``/seed_session``, which plays ``task_id``."""
    from ..definition import split_members
    from ..registry import make, spec

    s = spec(name)
    members = set(split_members(split))
    ids = list(tasks) if tasks is not None else [t.id for t in s.get_tasks() if s.split(t.id) in members]
    env = make(name, split="all")
    rows = []
    try:
        tools = responses_tools(env.tool_schemas())
        for task_id in ids:
            messages = env.reset(task=task_id)
            rows.append({"responses_create_params": {
                            "input": [{"role": m["role"], "content": m["content"]} for m in messages],
                            "tools": tools},
                         "env_name": s.name, "task_id": task_id})
    finally:
        env.close()
    return rows


def _final_answer(response: Any) -> str:
    """The text of the last assistant message of a Responses ``response`` (a model or a dict);
    ``""`` when its last output item is not one (the agent stopped on a tool call)."""
    if response is None:
        return ""
    data = response.model_dump() if hasattr(response, "model_dump") else response
    output = data.get("output") if isinstance(data, dict) else None
    if not output:
        return ""
    last = output[-1]
    if not isinstance(last, dict) or last.get("type") != "message" or last.get("role", "assistant") != "assistant":
        return ""
    content = last.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(c.get("text", "")) for c in content or [] if isinstance(c, dict) and c.get("type") == "output_text")


@functools.cache
def resources_server_class() -> type:
    """``EnvfactoryResourcesServer``, a NeMo Gym ``SimpleResourcesServer`` subclass (nemo_gym
    imported now; ``ImportError`` naming the package if it is not installed). Its config class is
    the class's ``config`` field type, also the module attribute ``EnvfactoryResourcesServerConfig``."""
    try:
        from nemo_gym.base_resources_server import (BaseResourcesServerConfig, BaseSeedSessionRequest,
                                                    BaseSeedSessionResponse, BaseVerifyRequest,
                                                    BaseVerifyResponse, SimpleResourcesServer)
        from nemo_gym.server_utils import SESSION_ID_KEY
    except ImportError as exc:
        raise ImportError(f"envfactory's NeMo Gym resources server needs nemo-gym ({INSTALL}): {exc}") from exc
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from pydantic import ConfigDict, PrivateAttr
    from starlette.concurrency import run_in_threadpool

    from .guard import DEFAULT_IDLE_TIMEOUT
    from .mcp_server import CONTROL_TOOLS, EpisodeService

    base_config: Any = BaseResourcesServerConfig  # (typed Any: mypy runs with or without nemo-gym installed)
    base_server: Any = SimpleResourcesServer
    base_seed: Any = BaseSeedSessionRequest
    base_seeded: Any = BaseSeedSessionResponse
    base_verify: Any = BaseVerifyRequest
    base_verified: Any = BaseVerifyResponse

    class EnvfactoryResourcesServerConfig(base_config):
        """NeMo Gym config of the envfactory resources server (``resources_servers.<name>`` in YAML)."""

        env_name: str
        runtime: str = "local"
        split: DrawSplit = DEFAULT_SPLIT
        max_turns: Optional[int] = None
        max_episodes: int = 1024
        idle_timeout: Optional[float] = DEFAULT_IDLE_TIMEOUT

    class EnvfactorySeedSessionRequest(base_seed):
        """The dataset row (``nemo_gym_rows``): ``task_id``, else ``seed`` (and ``split``); the rest is kept."""

        model_config = ConfigDict(extra="allow")
        task_id: Optional[str] = None
        seed: Optional[int] = None
        split: Optional[str] = None

    class EnvfactorySeedSessionResponse(base_seeded):
        task_id: str
        instruction: str
        system_prompt: str
        tools: list[str]
        max_turns: int

    class EnvfactoryVerifyRequest(base_verify):
        model_config = ConfigDict(extra="allow")

    class EnvfactoryVerifyResponse(base_verified):
        model_config = ConfigDict(extra="allow")
        task_id: Optional[str] = None
        success: Optional[bool] = None
        ended_by: Optional[str] = None
        turns: int = 0
        tool_calls: int = 0
        tool_errors: int = 0

    def error(status: int, message: str) -> Any:
        return JSONResponse(status_code=status, content={"error": message})

    class EnvfactoryResourcesServer(base_server):
        """A NeMo Gym resources server playing episodes of ``config.env_name`` (see
        :mod:`envfactory.faces.nemo_gym`)."""

        config: EnvfactoryResourcesServerConfig
        _service: Any = PrivateAttr(default=None)

        def model_post_init(self, context: Any) -> None:
            super().model_post_init(context)
            cfg = self.config
            service = EpisodeService(cfg.env_name, runtime=cfg.runtime, max_turns=cfg.max_turns,
                                     max_episodes=cfg.max_episodes, split=cfg.split, idle_timeout=cfg.idle_timeout)
            clash = sorted(set(service.spec.all_tools) & RESERVED_PATHS)
            if clash:
                service.close()
                raise ValueError(f"{service.spec.name} has tools named {clash}, which are routes of NeMo Gym's "
                                 "resources server; rename them to serve it")
            self._service = service

        @property
        def service(self) -> Any:
            """The :class:`~envfactory.faces.mcp_server.EpisodeService` behind the sessions."""
            return self._service

        def tool_schemas(self) -> list[dict[str, Any]]:
            """The environment's tools, each served at ``POST /<name>`` (name, description, input_schema)."""
            return [t for t in self._service.tool_list() if t["name"] not in CONTROL_TOOLS]

        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()
            for tool in self.tool_schemas():
                body = {"content": {"application/json": {"schema": tool["input_schema"]}}, "required": False}
                app.post(f"/{tool['name']}", name=tool["name"], summary=tool["name"],
                         description=tool["description"], openapi_extra={"requestBody": body},
                         response_model=None)(self._tool_endpoint(tool["name"]))
            # any other name: a call of an unknown tool, a turn of the episode as in make()
            app.post("/{tool_name}", include_in_schema=False, response_model=None)(self.unknown_tool)
            return app

        def _tool_endpoint(self, name: str) -> Any:
            async def call_tool(request: Request) -> Any:
                return await self.play(request, name)

            call_tool.__name__ = f"tool_{name}"
            return call_tool

        async def unknown_tool(self, request: Request, tool_name: str) -> Any:
            return await self.play(request, tool_name)

        async def play(self, request: Request, name: str) -> Any:
            """One call of tool ``name`` with the request body as its arguments: one turn."""
            key = request.session[SESSION_ID_KEY]
            raw = await request.body()
            try:
                arguments = json.loads(raw) if raw.strip() else {}
            except (ValueError, UnicodeDecodeError) as exc:
                return error(400, f"malformed call of {name!r}: the body is not JSON ({exc}); send the tool's "
                                  "arguments as one JSON object")
            if arguments is None:
                arguments = {}
            if not isinstance(arguments, dict):
                return error(400, f"malformed call of {name!r}: the arguments must be one JSON object, not "
                                  f"{type(arguments).__name__}")
            try:
                _, ep = self._service.episode(key, autostart=False, client=key)
                if ep.done:
                    return error(409, f"the episode has ended ({ep.status.ended_by}, reward "
                                      f"{ep.rewards[ep.agents[0]]}): no more tool calls; POST /verify for its "
                                      "reward, or /seed_session to play another")
                observation, failed, meta = await run_in_threadpool(self._service.play, key, name, arguments,
                                                                    client=key)
            except EpisodeError as exc:
                return error(409, _no_episode(exc))
            out: dict[str, Any] = {"error" if failed else "output": observation}
            if meta.get("envfactory/done"):
                out["done"] = True
            return out

        async def seed_session(self, request: Request, body: EnvfactorySeedSessionRequest) -> Any:
            key = request.session[SESSION_ID_KEY]
            try:
                info = await run_in_threadpool(self._service.start, key, body.task_id, body.seed, body.split,
                                               client=key)
            except KeyError as exc:  # an unknown task, or one outside the served split
                text = str(exc.args[0] if exc.args else exc)
                return error(404, re.sub(r"start it with --split (\S+) or --split all",
                                         r"set split: \1 or split: all in the server's config", text))
            except ValueError as exc:  # an unknown split, or one outside the served split
                return error(400, str(exc))
            except EpisodeError as exc:  # server full
                return error(503, str(exc))
            return EnvfactorySeedSessionResponse(**{k: info[k] for k in ("task_id", "instruction", "system_prompt",
                                                                         "tools", "max_turns")})

        async def verify(self, request: Request, body: EnvfactoryVerifyRequest) -> Any:
            key = request.session[SESSION_ID_KEY]
            try:
                status = await run_in_threadpool(self._service.end, key, _final_answer(body.response), client=key)
            except EpisodeError as exc:
                return error(409, _no_episode(exc))
            facts = {k: status[k] for k in ("task_id", "success", "ended_by", "turns", "tool_calls", "tool_errors")}
            return EnvfactoryVerifyResponse(**{**body.model_dump(), **facts, "reward": float(status["reward"])})

    for cls in (EnvfactoryResourcesServer, EnvfactoryResourcesServerConfig, EnvfactorySeedSessionRequest,
                EnvfactorySeedSessionResponse, EnvfactoryVerifyRequest, EnvfactoryVerifyResponse):
        cls.__module__ = __name__
    return EnvfactoryResourcesServer


def _no_episode(exc: EpisodeError) -> str:
    """An EpisodeService refusal in NeMo Gym's words (its own speak of MCP's start_episode)."""
    text = str(exc)
    if text.startswith("no episode"):
        return "no episode in this session: POST /seed_session (the dataset row: task_id or seed) first"
    return text.replace("call start_episode", "POST /seed_session")


def __getattr__(name: str) -> Any:
    if name == "EnvfactoryResourcesServer":
        return resources_server_class()
    if name == "EnvfactoryResourcesServerConfig":
        server: Any = resources_server_class()
        return server.model_fields["config"].annotation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
