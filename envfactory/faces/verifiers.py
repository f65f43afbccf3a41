"""verifiers (prime-rl's environment library): any single-agent envfactory environment as a verifiers
0.4 environment.

verifiers 0.4 (``import verifiers.v1 as vf``) composes an environment from a *taskset* (the tasks,
their scoring), a *harness* (the program that plays a task: it calls the model through verifiers'
interception endpoint, which records every turn on the trace) and an ``Env`` (here ``EnvfactoryEnv``,
verifiers' single-agent case: one seat). ``vf.load_environment(config)`` finds a taskset by its id, a
top-level module (the id, ``-`` read as ``_``) that exports its ``Taskset`` subclass (and, optionally,
its ``Harness`` and ``Env``) in ``__all__``. This module is such a plugin, registered as the module
``envfactory_verifiers`` (taskset id ``envfactory-verifiers``) once its classes are built::

    from envfactory.faces.verifiers import load_environment
    env = load_environment("Counter-v0", split="rl")   # a vf.Env: EnvfactoryEnv, one seat

A process that resolves the id itself (``vf-eval``, prime-rl's environment workers) imports an
installed package instead: ``envfactory export Counter-v0 --verifiers DIR`` and ``pip install DIR``
give the taskset id ``envfactory-counter-v0``.

* **Tasks.** ``EnvfactoryTaskset`` yields one task per envfactory task of the configured ``split``
  (default ``rl``: never an evaluation task unless asked for; ``tasks`` names some instead). A
  task's data carries ``env_name``, ``task_id``, its ``split``, and as ``prompt`` the episode's
  opening system and user messages; its ``id`` is the envfactory task id.
* **Tools and turns.** ``EnvfactoryHarness`` (the taskset's bundled harness) runs in-process: it
  resets an envfactory episode to the task, sends the model the conversation with the episode's
  tool schemas as the request's ``tools`` (chat completions, through verifiers' interception
  endpoint), and steps every completion, its native tool calls or its text, through envfactory's
  referee; the tool responses (error observations for malformed calls, bad arguments, unknown
  tools) become ``tool`` messages of the next request, which replays each reply as the model gave
  it (its reasoning fields too), so verifiers' trace is one branch: one training sample an episode.
  The episode ends as envfactory says (an answer without a tool call, ``finish``, the turn limit).
* **Seat.** ``EnvfactoryEnv`` is verifiers' single-agent env with its seat on the subprocess
  runtime (verifiers' default seat runtime is Prime's remote sandbox, reached through a tunnel;
  this harness needs none).
* **Reward.** The task's ``@vf.reward`` ``envfactory`` is the episode's reward (1.0 on success,
  computed from the true final state by the referee, never from the model's claims); metrics
  ``success``, ``turns``, ``tool_calls`` and ``tool_errors``; ``trace.info["envfactory"]`` holds them
  with ``ended_by`` and ``task_id``.

:func:`export_verifiers_package` (``envfactory export NAME --verifiers DIR``) writes a pip-installable
package for one environment, in vf-init's layout, whose taskset id is its name
(``envfactory-counter-v0``). Importing this module does not import verifiers: the classes are built
on first use (module attributes), and :func:`verifiers_classes` says what to install if it is
missing.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["TASKSET_ID", "DEFAULT_SPLIT", "load_environment", "verifiers_classes", "verifiers_rows",
           "export_verifiers_package", "package_names",
           # verifiers' plugin loader reads the Taskset and Harness subclasses from __all__ (built on first use)
           "EnvfactoryTaskset", "EnvfactoryHarness", "EnvfactoryEnv"]

TASKSET_ID = "envfactory-verifiers"
# verifiers imports a taskset id as a top-level module (``-`` read as ``_``): this module is registered
# under that name by verifiers_classes(), in the process that uses it
ALIAS = "envfactory_verifiers"
DEFAULT_SPLIT = "rl"
_CLASSES = ("EnvfactoryData", "EnvfactoryTaskConfig", "EnvfactoryTasksetConfig", "EnvfactoryTask",
            "EnvfactoryTaskset", "EnvfactoryHarnessConfig", "EnvfactoryHarness", "EnvfactoryEnvConfig",
            "EnvfactoryEnv")


def verifiers_rows(name: str, split: str = DEFAULT_SPLIT, *, tasks: list[str] | None = None
                   ) -> list[dict[str, Any]]:
    """One row per task of ``split`` (or the named ``tasks``): ``env_name``, ``task_id``, ``split``,
    ``prompt`` (the episode's opening system and user messages) and ``tools`` (OpenAI
    function-calling schemas, as the model is sent them). Needs no verifiers."""
    from ..definition import split_members
    from ..registry import make, spec

    s = spec(name)
    if s.multi_agent:
        raise TypeError(f"{name} is a team environment; envfactory's verifiers environment plays one agent")
    members = set(split_members(split))
    ids = list(tasks) if tasks is not None else [t.id for t in s.get_tasks() if s.split(t.id) in members]
    episode = make(name, split="all")
    rows = []
    try:
        for task_id in ids:
            opening = episode.reset(task_id)
            rows.append({"env_name": name, "task_id": task_id, "split": s.split(task_id),
                         "prompt": [{"role": m["role"], "content": m["content"]} for m in opening],
                         "tools": episode.tool_schemas()})
    finally:
        episode.close()
    return rows


@functools.cache
def verifiers_classes() -> dict[str, type]:
    """The verifiers classes, by name (verifiers imported now; ``ImportError`` naming the package if it
    is not installed)."""
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ImportError(f"envfactory's verifiers environment needs verifiers 0.4 (pip install "
                          f"'verifiers>=0.4,<0.5'; it pins mcp==2.0.0, so give it a venv of its own): {exc}"
                          ) from exc
    import sys

    from pydantic import Field

    sys.modules.setdefault(ALIAS, sys.modules[__name__])

    vfa: Any = vf  # (typed Any: mypy runs with or without verifiers installed)

    class EnvfactoryData(vfa.TaskData):
        """One envfactory task: the environment, the task, its split (and how to run it)."""

        env_name: str
        task_id: str
        split: str = DEFAULT_SPLIT
        runtime: str = "local"
        max_turns: int | None = None

    class EnvfactoryTaskConfig(vfa.TaskConfig):
        pass

    class EnvfactoryTasksetConfig(vfa.TasksetConfig):
        """``env_name`` (required), ``split`` (default ``rl``), ``tasks`` (ids; instead of the split),
        ``runtime`` (``local`` or ``docker``), ``max_turns`` (the episode's turn limit)."""

        env_name: str = ""
        split: str = DEFAULT_SPLIT
        tasks: list[str] | None = None
        runtime: str = "local"
        max_turns: int | None = Field(None, ge=1)
        task: EnvfactoryTaskConfig = EnvfactoryTaskConfig()

    class EnvfactoryTask(vfa.Task[EnvfactoryData, vfa.State, EnvfactoryTaskConfig]):
        """An envfactory task; its reward is the episode's, recorded by ``EnvfactoryHarness``."""

        @property
        def key(self) -> str:
            return f"{self.data.env_name}/{self.data.task_id}"

        @vfa.reward(weight=1.0)
        async def envfactory(self, trace: Any) -> float:
            return float(_result(trace).get("reward", 0.0))

        @vfa.metric
        async def episode(self, trace: Any) -> dict[str, float]:
            result = _result(trace)
            return {k: float(result.get(k) or 0) for k in ("success", "turns", "tool_calls", "tool_errors")}

    class EnvfactoryTaskset(vfa.Taskset[EnvfactoryTask, EnvfactoryTasksetConfig]):
        """The tasks of one envfactory environment's split (see :mod:`envfactory.faces.verifiers`)."""

        ENV_NAME: str = ""  # an exported package's environment and split, where the config names none
        SPLIT: str = DEFAULT_SPLIT

        def load(self) -> Any:
            config = self.config
            name = config.env_name or self.ENV_NAME
            if not name:
                raise ValueError("envfactory's verifiers taskset needs env_name (--env.taskset.env-name NAME, "
                                 "or load_environment(env_name=...))")
            split = config.split if "split" in config.model_fields_set else self.SPLIT
            for row in verifiers_rows(name, split, tasks=config.tasks):
                yield EnvfactoryTask(EnvfactoryData(
                    id=row["task_id"], name=f"{name}/{row['task_id']}", prompt=row["prompt"], env_name=name,
                    task_id=row["task_id"], split=row["split"], runtime=config.runtime,
                    max_turns=config.max_turns), config.task)

    class EnvfactoryHarnessConfig(vfa.HarnessConfig):
        pass

    class EnvfactoryHarness(vfa.Harness[EnvfactoryHarnessConfig]):
        """Plays one envfactory episode in-process, every model call through verifiers' interception
        endpoint (see :mod:`envfactory.faces.verifiers`)."""

        APPENDS_SYSTEM_PROMPT = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                         mcp_urls: dict[str, str], data: Any, tool_interception_url: str | None = None) -> Any:
            from openai import APIError, AsyncOpenAI

            from ..registry import make

            if not isinstance(data, EnvfactoryData):
                data = EnvfactoryData.model_validate(data.model_dump())
            kwargs: dict[str, Any] = {"split": "all", "runtime": data.runtime}
            if data.max_turns:
                kwargs["max_turns"] = data.max_turns
            episode = await asyncio.to_thread(make, data.env_name, **kwargs)
            client: Any = AsyncOpenAI(base_url=endpoint, api_key=secret)  # (Any: the messages are plain dicts)
            result: dict[str, Any] = {"task_id": data.task_id, "reward": 0.0, "success": False, "turns": 0,
                                      "tool_calls": 0, "tool_errors": 0, "ended_by": None}
            trace.info["envfactory"] = result
            try:
                opening = await asyncio.to_thread(episode.reset, data.task_id)
                messages = [{"role": m["role"], "content": m["content"]} for m in opening]
                while True:
                    try:
                        completion = await client.chat.completions.create(
                            model=ctx.model, messages=messages, tools=episode.tool_schemas())
                    except APIError:
                        if trace.stop_condition is not None:  # a @vf.stop or a limit refused the turn
                            result["ended_by"] = f"verifiers stop: {trace.stop_condition}"
                            break
                        raise
                    assistant = _assistant(completion)
                    step = await asyncio.to_thread(episode.step, assistant)
                    # the reply replayed as the model gave it (its reasoning too: verifiers' trace matches
                    # each request's prefix to the turns it recorded, and a changed message breaks it)
                    messages += [_replayed(completion, assistant), *_answers(assistant, step.messages)]
                    info = step.info
                    result.update(turns=int(info.get("turn") or result["turns"] + 1),
                                  tool_calls=int(info.get("tool_calls") or 0),
                                  tool_errors=int(info.get("tool_errors") or 0))
                    if step.terminated or step.truncated:
                        result.update(reward=float(step.reward), success=bool(info.get("success")),
                                      ended_by=info.get("ended_by") or ("turn limit" if step.truncated else None))
                        break
            finally:
                await client.close()
                await asyncio.to_thread(episode.close)
            return vfa.ProgramResult(exit_code=0, stdout=json.dumps(result), stderr="")

    class EnvfactoryEnvConfig(vfa.EnvConfig):
        """verifiers' single-agent config, its one seat (``agent``) on the subprocess runtime: the
        harness runs in the rollout's own process and needs no sandbox (verifiers' default seat
        runtime is Prime's, a remote sandbox reached through a tunnel)."""

        agent: vfa.AgentConfig = vfa.AgentConfig(runtime=vfa.SubprocessConfig())

    class EnvfactoryEnv(vfa.Env[EnvfactoryEnvConfig]):
        """verifiers' ``SingleAgentEnv`` with :class:`EnvfactoryEnvConfig`: one seat plays the task."""

        async def run(self, task: Any, agents: Any) -> None:
            await agents.agent.run(task)

    classes: dict[str, type] = {c.__name__: c for c in (EnvfactoryData, EnvfactoryTaskConfig, EnvfactoryTasksetConfig,
                                        EnvfactoryTask, EnvfactoryTaskset, EnvfactoryHarnessConfig,
                                        EnvfactoryHarness, EnvfactoryEnvConfig, EnvfactoryEnv)}
    for c in classes.values():
        c.__module__ = __name__
        c.__qualname__ = c.__name__
    return classes


def _result(trace: Any) -> dict[str, Any]:
    result = trace.info.get("envfactory")
    return result if isinstance(result, dict) else {}


def _assistant(completion: Any) -> dict[str, Any]:
    """The completion's message as the OpenAI-style assistant message envfactory's referee parses
    (arguments exactly as the model wrote them: malformed JSON is the referee's to judge)."""
    if not completion.choices:
        return {"role": "assistant", "content": ""}
    message = completion.choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    calls = [{"id": c.id, "type": "function",
              "function": {"name": c.function.name, "arguments": c.function.arguments}}
             for c in (message.tool_calls or []) if getattr(c, "function", None) is not None]
    if calls:
        out["tool_calls"] = calls
    return out


def _replayed(completion: Any, assistant: dict[str, Any]) -> dict[str, Any]:
    """The reply as the next request carries it: its content as given (``None`` stays ``None``), its
    calls, and the reasoning fields a server added (``reasoning_content``, ``reasoning``)."""
    out = dict(assistant)
    if completion.choices:
        message = completion.choices[0].message
        out["content"] = message.content
        extra = getattr(message, "model_extra", None) or {}
        out.update({k: extra[k] for k in ("reasoning_content", "reasoning") if extra.get(k) is not None})
    return out


def _answers(assistant: dict[str, Any], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The referee's new messages as the next request's: a tool message answers the model's call of
    its id, or (an error observation for a call the referee could not read, whose id is its own)
    the model's first call not yet answered; one that answers no call of the model (a text-mode
    call that did not parse) is shown as a user message, as is a conversation's next user turn."""
    pending = [c["id"] for c in assistant.get("tool_calls", [])]
    out: list[dict[str, Any]] = []
    for m in new:
        if m["role"] != "tool":
            out.append({"role": m["role"], "content": m.get("content") or ""})
            continue
        cid = m.get("tool_call_id")
        if cid not in pending:
            if not pending:
                out.append({"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"})
                continue
            cid = pending[0]
        pending.remove(cid)
        out.append({"role": "tool", "tool_call_id": cid, "content": m.get("content") or ""})
    # every call of the request needs its answer on the wire (the referee answers each; this is a guard)
    out[:0] = [{"role": "tool", "tool_call_id": cid, "content": "Error: this call got no response."}
               for cid in pending]
    return out


def load_environment(env_name: str, split: str = DEFAULT_SPLIT, *, taskset_id: str = TASKSET_ID,
                     **taskset: Any) -> Any:
    """``env_name`` as a verifiers 0.4 environment (a ``vf.SingleAgentEnv`` over
    ``EnvfactoryTaskset`` and its ``EnvfactoryHarness``): ``vf.load_environment`` on a config naming
    this module's taskset. ``taskset`` sets more of its config: ``tasks``, ``runtime``,
    ``max_turns``."""
    verifiers_classes()
    import verifiers.v1 as vf

    vfa: Any = vf
    config = vfa.resolve_env_config({"taskset": {"id": taskset_id, "env_name": env_name, "split": split,
                                                 **taskset}})
    return vfa.load_environment(config)


# -- the package: envfactory export NAME --verifiers DIR -------------------------------------------
def package_names(name: str) -> tuple[str, str, str]:
    """``(distribution, module, class prefix)`` of ``name``'s verifiers package: ``Counter-v0`` is
    ``envfactory-counter-v0``, ``envfactory_counter_v0``, ``EnvfactoryCounterV0``."""
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name) if w]
    words = [w.lower() for part in words for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+[0-9]*|[0-9]+", part)]
    dash = "-".join(["envfactory", *words])
    return dash, dash.replace("-", "_"), "".join(w[:1].upper() + w[1:] for w in dash.split("-"))


_INIT = '''"""{name} (envfactory) as a verifiers 0.4 environment: taskset id ``{dash}``.

    import verifiers.v1 as vf
    env = vf.load_environment(vf.resolve_env_config({{"taskset": {{"id": "{dash}"}}}}))
    # vf-eval {dash} ...   (--env.taskset.split, --env.taskset.tasks, --env.taskset.max-turns)

Written by ``envfactory export {name} --verifiers``; see envfactory.faces.verifiers.
"""

from envfactory.faces.verifiers import verifiers_classes

_classes = verifiers_classes()


class {prefix}Taskset(_classes["EnvfactoryTaskset"]):
    """The tasks of {name} (default split: {split})."""

    ENV_NAME = "{name}"
    SPLIT = "{split}"


class {prefix}Harness(_classes["EnvfactoryHarness"]):
    """Plays one episode of {name} through envfactory's referee."""


class {prefix}Env(_classes["EnvfactoryEnv"]):
    """One seat, on the subprocess runtime (the harness runs in-process)."""


__all__ = ["{prefix}Taskset", "{prefix}Harness", "{prefix}Env"]
'''

_PYPROJECT = '''[project]
name = "{dash}"
version = "{version}"
description = "envfactory's {name} as a verifiers environment (taskset id {dash})"
requires-python = ">=3.11"
dependencies = ["envfactory", "verifiers>=0.4,<0.5"]

[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[tool.setuptools]
packages = ["{module}"]
'''

_README = '''# {dash}

envfactory's `{name}` as a verifiers 0.4 environment, written by `envfactory export {name} --verifiers`.
Its taskset id is `{dash}`: its tasks are {name}'s `{split}` split (`--env.taskset.split` to change it),
its harness plays each as an envfactory episode, its reward is the episode's (1.0 on success).

```bash
pip install .            # beside envfactory (pip install --no-deps . where envfactory is not on your index)
vf-eval {dash} -n 3      # or vf.load_environment(vf.resolve_env_config({{"taskset": {{"id": "{dash}"}}}}))
```
'''


def export_verifiers_package(name: str, directory: str | Path, *, split: str = DEFAULT_SPLIT,
                             version: str = "0.1.0", force: bool = False) -> Path:
    """Write ``name``'s verifiers package into ``directory`` (created; a non-empty one only with
    ``force``, its files of the same names replaced): ``pyproject.toml``, ``README.md`` and the
    module, whose ``__all__`` exports the taskset, its harness and its env. Returns the directory.
    Needs no verifiers to write."""
    from ..registry import spec

    s = spec(name)  # an unknown name raises here, naming the known ones
    if s.multi_agent:
        raise TypeError(f"{name} is a team environment; envfactory's verifiers environment plays one agent")
    from ..definition import split_members

    split_members(split)  # an unknown split raises, naming the splits
    out = Path(directory)
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} exists and is not empty; export into a new directory (or pass --force)")
    dash, module, prefix = package_names(name)
    fields = {"name": name, "dash": dash, "module": module, "prefix": prefix, "split": split, "version": version}
    (out / module).mkdir(parents=True, exist_ok=True)
    (out / "pyproject.toml").write_text(_PYPROJECT.format(**fields))
    (out / "README.md").write_text(_README.format(**fields))
    (out / module / "__init__.py").write_text(_INIT.format(**fields))
    return out


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        return verifiers_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
