"""SkyRL: any single-agent envfactory environment as a skyrl-gym ``BaseTextEnv``.

SkyRL-train's generator makes one environment per trajectory with
``skyrl_gym.make(env_class, env_config=..., extras=row)`` (``row``: the dataset row without its
``prompt``), calls ``init(prompt)`` for the opening conversation, then ``step(completion_text)``
after every completion, appending the returned ``observations`` (chat messages) until ``done``.
This module gives it envfactory's episodes::

    from envfactory.faces.skyrl import register_skyrl, skyrl_rows
    register_skyrl()                              # env_class "envfactory" in skyrl_gym's registry
    rows = skyrl_rows("FindLight-v0", split="rl")  # write them to parquet: SkyRL's dataset
    # generator.env_class "envfactory"; each row names its environment and task

* **Tasks.** Each row (:func:`skyrl_rows`) carries ``env_class: "envfactory"``, ``env_name`` and
  ``task_id`` (also under ``extra_info``, where SkyRL's recipes keep theirs); the environment plays
  that task (a named task is always played, whatever the split). A row with ``seed`` instead draws
  from ``split`` (default ``rl``: never an evaluation task unless asked for).
* **Tools.** SkyRL renders the conversation with the tokenizer's chat template and no ``tools``
  argument, so the opening system message carries the tool schemas in the Hermes/Qwen form
  (``<tools>...</tools>``; :func:`system_with_tools`); ``tools_in_prompt=False`` leaves it as it is.
* **Steps.** ``step(text)`` is one turn of the episode's referee (Hermes ``<tool_call>`` blocks, or
  the final answer); ``observations`` are the tool responses as ``tool`` messages (a conversation
  task's next user message as ``user``), ``reward`` the episode's (1.0 on success, at the end),
  ``metadata`` the step's counters. ``get_metrics()`` reports success, turns and tool errors.

Importing this module does not import skyrl_gym: the class is built on first use
(``EnvfactoryTextEnv``, a module attribute), so the entry point string
``"envfactory.faces.skyrl:EnvfactoryTextEnv"`` is all skyrl_gym's registry needs.
"""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["ENV_CLASS", "register_skyrl", "skyrl_rows", "system_with_tools", "text_env_class"]

ENV_CLASS = "envfactory"
ENTRY_POINT = "envfactory.faces.skyrl:EnvfactoryTextEnv"
DEFAULT_SPLIT = "rl"


def system_with_tools(system: str, tools: list[dict[str, Any]]) -> str:
    """``system`` followed by the tool schemas as Hermes (Qwen 2.5/3) chat templates show them."""
    if not tools:
        return system
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (f"{system}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n"
            "</tools>\n\nFor each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
            "<args-json-object>}\n</tool_call>")


def _opening(messages: list[dict[str, Any]], tools: list[dict[str, Any]], tools_in_prompt: bool
             ) -> list[dict[str, str]]:
    out = [{"role": m["role"], "content": m["content"]} for m in messages]
    if tools_in_prompt and out and out[0]["role"] == "system":
        out[0]["content"] = system_with_tools(out[0]["content"], tools)
    return out


def skyrl_rows(name: str, split: str = DEFAULT_SPLIT, *, tools_in_prompt: bool = True,
               tasks: list[str] | None = None) -> list[dict[str, Any]]:
    """SkyRL dataset rows, one per task of ``split`` (or the named ``tasks``): ``prompt`` (the opening
    system and user messages, the tools in the system message), ``env_class``, ``env_name``,
    ``task_id``, ``data_source`` and ``extra_info`` (the same names, and the split)."""
    from ..faces.gym_env import ToolGymEnv
    from ..registry import spec

    s = spec(name)
    ids = list(tasks) if tasks is not None else [t.id for t in s.get_tasks() if s.split(t.id) in _members(split)]
    env = ToolGymEnv(name, split="all")
    rows = []
    try:
        for task_id in ids:
            _, info = env.reset(options={"task": task_id})
            rows.append({"data_source": f"envfactory/{name}", "env_class": ENV_CLASS,
                         "prompt": _opening(info["messages"], info["tools"], tools_in_prompt),
                         "env_name": name, "task_id": task_id,
                         "extra_info": {"env_name": name, "task_id": task_id, "split": s.split(task_id),
                                        "tools_in_prompt": tools_in_prompt}})
    finally:
        env.close()
    return rows


def _members(split: str) -> set[str]:
    from ..definition import split_members

    return set(split_members(split))


def register_skyrl(env_class: str = ENV_CLASS) -> str:
    """Register envfactory's environment in skyrl_gym's registry as ``env_class`` (once); returns it."""
    import skyrl_gym

    if env_class not in skyrl_gym.registry:
        skyrl_gym.register(id=env_class, entry_point=ENTRY_POINT)
    return env_class


def _pick(key: str, *places: Any, default: Any = None) -> Any:
    for place in places:
        if place is not None and hasattr(place, "get"):
            value = place.get(key)
            if value is not None:
                return value
    return default


@functools.cache
def text_env_class() -> type:
    """The ``BaseTextEnv`` subclass (skyrl_gym imported now; ``ImportError`` naming the package if
    it is not installed)."""
    try:
        from skyrl_gym.envs import base_text_env
    except ImportError as exc:
        raise ImportError(f"envfactory's SkyRL environment needs skyrl-gym (pip install 'skyrl-gym>=0.4'): "
                          f"{exc}") from exc
    from .gym_env import ToolGymEnv

    base: Any = base_text_env.BaseTextEnv  # (typed Any: mypy runs with or without skyrl-gym installed)
    step_output: Any = base_text_env.BaseTextEnvStepOutput

    class EnvfactoryTextEnv(base):
        """One trajectory of an envfactory environment (see :mod:`envfactory.faces.skyrl`).

        ``env_config`` (SkyRL's ``environment.skyrl_gym.envfactory`` section) may set ``env_name``,
        ``split``, ``runtime``, ``max_turns`` and ``tools_in_prompt``; the row's ``extras`` (or
        their ``extra_info``) name ``env_name`` and ``task_id`` (or ``seed``), and win."""

        def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
            super().__init__()
            extras = dict(extras or {})
            info = extras.get("extra_info")
            info = info if isinstance(info, dict) else {}
            places = (extras, info, env_config)
            self.env_name = _pick("env_name", *places)
            if not self.env_name:
                raise ValueError("envfactory's SkyRL environment needs an env_name (in the row, its extra_info, "
                                 "or the env_config)")
            self.task_id = _pick("task_id", *places)
            self.seed = _pick("seed", *places)
            self.tools_in_prompt = bool(_pick("tools_in_prompt", *places, default=True))
            limit = _pick("max_turns", env_config)  # the row's max_turns is SkyRL's own generation limit
            self.max_turns = int(_pick("max_turns", *places, default=0) or 0)
            self.gym = ToolGymEnv(str(self.env_name), split=str(_pick("split", *places, default=DEFAULT_SPLIT)),
                                  runtime=str(_pick("runtime", env_config, default="local")),
                                  max_turns=int(limit) if limit else None)
            self.result: dict[str, Any] = {}

        def init(self, prompt: Any = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
            if self.task_id is not None:
                _, info = self.gym.reset(options={"task": self.task_id})
            else:
                _, info = self.gym.reset(seed=None if self.seed is None else int(self.seed))
            self.task_id = info["task_id"]
            return _opening(info["messages"], info["tools"], self.tools_in_prompt), {
                "task_id": info["task_id"], "tools": info["tools"]}

        def step(self, action: str) -> Any:
            self.turns += 1
            _, reward, terminated, truncated, info = self.gym.step(action)
            observations = [{"role": m["role"], "content": m["content"]} for m in info["messages"]
                            if m["role"] != "assistant"]
            done = bool(terminated or truncated)
            metadata = {k: v for k, v in info.items() if k not in ("messages", "tools")}
            if done:
                self.result = {"success": float(bool(info.get("success"))), "reward": float(reward),
                               "turns": int(info.get("turn") or self.turns),
                               "tool_errors": int(info.get("tool_errors") or 0)}
            return step_output(observations=observations, reward=float(reward), done=done,
                                         metadata=metadata, postprocessed_action=None)

        def get_metrics(self) -> dict[str, Any]:
            return dict(self.result) or {"turns": self.turns}

        def close(self) -> None:
            self.gym.close()

    EnvfactoryTextEnv.__module__ = __name__
    EnvfactoryTextEnv.__qualname__ = "EnvfactoryTextEnv"  # pickled by reference: the module attribute
    return EnvfactoryTextEnv


def __getattr__(name: str) -> Any:
    if name == "EnvfactoryTextEnv":
        return text_env_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
