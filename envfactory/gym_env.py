"""Gymnasium adapter: any envfactory environment as a ``gymnasium.Env[str, str]``.

Observations and actions are text. ``reset`` returns the user's instruction;
``step`` takes the agent's assistant turn as model text and returns the tool
responses, each wrapped as ``<tool_response>...</tool_response>``. ``info``
carries the full ``messages``, the tool ``tools`` schemas and the ``task_id``,
which is what an LLM agent actually consumes.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import gymnasium
from gymnasium import spaces

from .env import Environment

__all__ = ["ToolGymEnv", "TEXT_CHARSET", "MAX_TEXT_LENGTH"]

MAX_TEXT_LENGTH = 1 << 16

# Every character a model can write that Python round-trips through UTF-8:
# tab, newlines and the Basic Multilingual Plane minus control characters and
# surrogates. Rarer characters (emoji) in observations are replaced by U+FFFD.
TEXT_CHARSET = frozenset(
    ["\t", "\n", "\r"]
    + [chr(c) for c in range(0x20, 0x7F)]
    + [chr(c) for c in range(0xA0, 0xD800)]
    + [chr(c) for c in range(0xE000, 0xFFFE)]
)
_PROTO_OBS: spaces.Text | None = None
_PROTO_ACT: spaces.Text | None = None


def _text_space(proto: str) -> spaces.Text:
    # Building a Text space over ~55k characters takes tens of ms: build one
    # prototype per kind and give each env a shallow copy with its own RNG.
    global _PROTO_OBS, _PROTO_ACT
    if _PROTO_OBS is None:
        _PROTO_OBS = spaces.Text(MAX_TEXT_LENGTH, min_length=0, charset=TEXT_CHARSET)
        _PROTO_ACT = spaces.Text(1024, min_length=0, charset=TEXT_CHARSET)
    space = copy.copy(_PROTO_OBS if proto == "obs" else _PROTO_ACT)
    space._np_random = None
    return space


_OUTSIDE_CHARSET = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd]")


def _clean(text: str) -> str:
    """Fit text into the Text space: replace characters outside the charset, cap the length."""
    if _OUTSIDE_CHARSET.search(text) is not None:
        text = _OUTSIDE_CHARSET.sub("\ufffd", text)
    return text if len(text) <= MAX_TEXT_LENGTH else text[:MAX_TEXT_LENGTH]


def render_tool_messages(messages: list[dict[str, Any]]) -> str:
    """The observation text of a step: each tool response in a Hermes block."""
    if len(messages) == 1:
        return "<tool_response>\n" + messages[0]["content"] + "\n</tool_response>"
    return "\n".join(f"<tool_response>\n{m['content']}\n</tool_response>" for m in messages)


class ToolGymEnv(gymnasium.Env[str, str]):
    """A Gymnasium view of an envfactory environment.

    Args:
        env_name: Registered name (used by ``gymnasium.make``).
        env: An existing :class:`Environment` to wrap instead.
        runtime: Runtime for ``env_name`` (``local`` or ``docker``).
        render_mode: ``None`` or ``"ansi"`` (the transcript as text).
        **kwargs: Passed to :func:`envfactory.make`.

    ``reset(seed=s)`` picks the task deterministically from ``s``;
    ``options={"task": id_or_index}`` picks it explicitly.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        env_name: str | None = None,
        *,
        env: Environment | None = None,
        runtime: str = "local",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        if env is None:
            if env_name is None:
                raise TypeError("ToolGymEnv needs env_name or env")
            from .registry import make

            env = make(env_name, runtime=runtime, **kwargs)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.env = env
        self.render_mode = render_mode
        self.observation_space = _text_space("obs")
        self.action_space = _text_space("act")
        self._tools = env.tool_schemas()
        self._n_tasks = len(env.spec.get_tasks())

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            task = int(self.np_random.integers(self._n_tasks))
        messages = self.env.reset(task)
        info = {"task_id": self.env.task.id, "messages": list(self.env.messages), "tools": self._tools}
        return _clean(messages[-1]["content"]), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        r = self.env.step(action)
        info = r.info
        info["messages"] = self.env.messages[:]
        obs = render_tool_messages(r.messages)
        if _OUTSIDE_CHARSET.search(obs) is not None or len(obs) > MAX_TEXT_LENGTH:
            obs = _clean(obs)
        return obs, r.reward, r.terminated, r.truncated, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m['role']}] {m.get('content') or ''}" for m in self.env.messages)

    def close(self) -> None:
        self.env.close()
        super().close()
