"""Gymnasium adapter: any single-agent envfactory environment as a ``gymnasium.Env[str, str]``.

Observations and actions are text. ``reset`` returns the user's instruction;
``step`` takes the agent's assistant turn as model text and returns the tool
responses, each wrapped as ``<tool_response>...</tool_response>``.

``info`` of ``reset`` carries the opening ``messages`` (system, user), the tool
``tools`` schemas and the ``task_id``, which is what an LLM agent consumes.
``info`` of ``step`` carries what the step added to the conversation,
``messages`` (the assistant turn and its tool responses), with the step's
counters (``turn``, ``round``, ``tool_calls``, ``tool_errors``, ``parse_errors``,
``task_id``; at the end ``success``, ``answer``, ``ended_by``). The reset
messages followed by every step's messages are the whole conversation; read it
at no cost with ``env.unwrapped.messages`` (the live list: copy it before
changing it). Copying the whole conversation into every ``info`` would make an
episode quadratic in its length.

Tasks come from one split: ``gymnasium.make("envfactory/NAME", split="eval")``
(default ``"train"``: the sft and rl tasks; ``"sft"``, ``"rl"``, ``"eval"``, ``"all"``), so
training through this face never meets an evaluation task unless it asks for one.
``reset(seed=s)`` picks the same task as ``envfactory.make(name, split=...).reset(seed=s)``
(:func:`envfactory.episode.task_for_seed`, the one seeding rule); ``reset()``
without a seed draws the next task of the split from the env's seeded ``np_random``;
``options={"task": id_or_index}`` picks one explicitly (any split).
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import gymnasium
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory

from ..episode import Episode

__all__ = ["ToolGymEnv", "TEXT_CHARSET", "MAX_TEXT_LENGTH", "make_vector_env"]

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
# The spaces get the characters in one fixed order (a sorted string, not the set): an
# AsyncVectorEnv's shared memory carries observations as indexes into that order, and a set's
# order differs between processes (string hashing is salted per process).
_CHARS = "".join(sorted(TEXT_CHARSET))
_PROTO_OBS: spaces.Text | None = None
_PROTO_ACT: spaces.Text | None = None


class ToolText(spaces.Text):
    """The text space of envfactory observations and actions (a plain Gymnasium ``Text``).

    A subclass only so that AsyncVectorEnv's shared memory can refuse it: Gymnasium reads a
    ``Text`` batch out of shared memory once, when the vector env is built, and hands back those
    stale strings on every step (65,536 tabs). :func:`make_vector_env` passes text through pipes.

    Its ``repr`` names the character set instead of spelling its ~63,000 characters out."""

    def __repr__(self) -> str:
        if self.character_set == TEXT_CHARSET:
            chars = f"TEXT_CHARSET: tab, newlines and printable BMP, {len(TEXT_CHARSET)} characters"
        else:
            chars = f"{len(self.character_set)} characters"
        return f"ToolText({self.min_length}, {self.max_length}, charset=<{chars}>)"


@create_shared_memory.register(ToolText)
def _no_shared_memory(space: ToolText, n: int = 1, ctx: Any = None) -> Any:
    raise TypeError("envfactory's text observations cannot travel through AsyncVectorEnv's shared memory "
                    "(Gymnasium reads Text from it only once); use gymnasium.make_vec(id, num_envs) "
                    "(envfactory's vector entry point), or vectorization_mode='async' with "
                    "vector_kwargs={'shared_memory': False}")


def make_vector_env(num_envs: int = 1, *, env_name: str, asynchronous: bool = True,
                    **kwargs: Any) -> gymnasium.vector.VectorEnv:
    """``gymnasium.make_vec("envfactory/<Name>", num_envs)``: ``num_envs`` episodes of ``env_name``,
    each in a worker process (``asynchronous=False``: in this process, one after another), text
    passed through pipes. ``kwargs`` go to each :class:`ToolGymEnv` (e.g. ``split``, ``runtime``).
    ``reset(seed=s)`` seeds episode ``i`` with ``s + i``, as Gymnasium's vector envs do."""
    kwargs.pop("max_episode_steps", None)  # the episode has its own turn limit (max_turns)
    fns = [functools.partial(ToolGymEnv, env_name, **kwargs) for _ in range(num_envs)]
    if asynchronous:
        return gymnasium.vector.AsyncVectorEnv(fns, shared_memory=False)
    return gymnasium.vector.SyncVectorEnv(fns)


def _text_space(proto: str) -> spaces.Text:
    # Building a Text space over ~55k characters takes tens of ms: build one
    # prototype per kind and give each env a shallow copy with its own RNG.
    global _PROTO_OBS, _PROTO_ACT
    if _PROTO_OBS is None or _PROTO_ACT is None:
        _PROTO_OBS = ToolText(MAX_TEXT_LENGTH, min_length=0, charset=_CHARS)
        _PROTO_ACT = ToolText(1024, min_length=0, charset=_CHARS)
    space = copy.copy(_PROTO_OBS if proto == "obs" else _PROTO_ACT)
    space._np_random = None  # type: ignore[assignment]  # gymnasium seeds it lazily from None
    return space


_OUTSIDE_CHARSET = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd]")


def _clean(text: str) -> str:
    """Fit text into the Text space: replace characters outside the charset, cap the length."""
    if _OUTSIDE_CHARSET.search(text) is not None:
        text = _OUTSIDE_CHARSET.sub("\ufffd", text)
    return text if len(text) <= MAX_TEXT_LENGTH else text[:MAX_TEXT_LENGTH]


def render_tool_messages(messages: list[dict[str, Any]]) -> str:
    """The observation text of a step: each tool response in a Hermes block; a conversation's next
    user message as it is."""
    if len(messages) == 1 and messages[0]["role"] == "tool":
        return "<tool_response>\n" + messages[0]["content"] + "\n</tool_response>"
    return "\n".join(m["content"] if m["role"] == "user" else f"<tool_response>\n{m['content']}\n</tool_response>"
                     for m in messages)


_outside = _OUTSIDE_CHARSET.search
_ROOM = MAX_TEXT_LENGTH - len("<tool_response>\n\n</tool_response>")


class ToolGymEnv(gymnasium.Env[str, str]):
    """A Gymnasium view of a single-agent envfactory environment (see the module docstring).

    Args:
        env_name: Registered name (used by ``gymnasium.make``).
        env: An existing one-agent :class:`~envfactory.Episode` to wrap instead.
        runtime: Runtime for ``env_name`` (``local`` or ``docker``).
        split: The tasks ``reset`` draws from (``train``, the default: sft and rl; ``sft``,
            ``rl``, ``eval``, ``all``); with ``env``, that episode's own split counts.
        render_mode: ``None`` or ``"ansi"`` (the transcript as text).
        **kwargs: Passed to :func:`envfactory.make`.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        env_name: str | None = None,
        *,
        env: Episode | None = None,
        runtime: str = "local",
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        if env is None:
            if env_name is None:
                raise TypeError("ToolGymEnv needs env_name or env")
            from ..registry import make

            env = make(env_name, runtime=runtime, **kwargs)
        if env.spec.multi_agent:
            raise TypeError(f"{env.spec.name} is a team environment; use its PettingZoo views "
                            "(envfactory.faces.pettingzoo_env.env / parallel_env)")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        env._write_transcripts_eagerly()  # step() reads every turn's messages
        self.env = env
        self.render_mode = render_mode
        self.observation_space = _text_space("obs")
        self.action_space = _text_space("act")
        self._tools = env.tool_schemas()
        self._seen = 0

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The whole conversation so far (the live list; copy it before changing it)."""
        return self.env.transcript() if self.env.task is not None else []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        draw = None
        if task is None:  # the episode draws from its split (never eval unless it asked for eval)
            draw = seed if seed is not None else int(self.np_random.integers(1 << 62))
        messages = self.env.reset(task, seed=draw)
        self._seen = len(messages)
        running = self.env.task
        assert running is not None  # reset() just started it
        # a conversation's tools of later turns are not shown yet (the step's info says when they appear)
        tools = self._tools if running.conversation is None else self.env.tool_schemas()
        info = {"task_id": running.id, "messages": messages, "tools": tools}
        return _clean(messages[-1]["content"]), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        env = self.env
        # Episode.step's one-role turn, without the dispatch and the StepResult
        new, reward, terminated, truncated, info = env._solo_turn(action)
        transcript = env._tx[env._solo_agent]  # env.transcript(), without the checks (written eagerly)
        info["messages"] = transcript[self._seen:]
        self._seen = len(transcript)
        if "user_turn" in info:  # a conversation's next turn: the tools it shows now
            info["tools"] = env.tool_schemas()
        if len(new) == 1 and new[0]["role"] == "tool":  # the usual single response, checked alone
            c = new[0]["content"]
            if len(c) <= _ROOM and (c.isascii() and c.isprintable() or _outside(c) is None):
                return "<tool_response>\n" + c + "\n</tool_response>", reward, terminated, truncated, info
        return _clean(render_tool_messages(new)), reward, terminated, truncated, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        messages = self.env.transcript() if self.env.task is not None else []
        return "\n".join(f"[{m['role']}] {m.get('content') or ''}" for m in messages)

    def close(self) -> None:
        self.env.close()
        super().close()
