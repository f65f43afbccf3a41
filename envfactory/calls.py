"""Tool calls and answer matching: what a task's reference solution and the final answer are made of
(the leaves :mod:`envfactory.task` and :mod:`envfactory.conversation` both build on)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolCall", "normalize_answer", "number_rivals", "fact_in"]


@dataclass(slots=True)
class ToolCall:
    """One call of a tool, as parsed from the agent's action or written in a solution.

    A plain dataclass rather than a pydantic model: the parser builds one per
    call on the step hot path, after checking the types itself. Inside a
    :class:`Task`, pydantic validates the fields.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    agent: str | None = None  # who makes the call, in a team's joint solution

    def to_json(self) -> dict[str, Any]:
        """``{"name", "arguments"}`` (and ``id``, ``agent`` when set)."""
        d: dict[str, Any] = {"name": self.name, "arguments": self.arguments}
        if self.id is not None:
            d["id"] = self.id
        if self.agent is not None:
            d["agent"] = self.agent
        return d

    def to_openai(self, call_id: str) -> dict[str, Any]:
        """This call in OpenAI ``tool_calls`` format (arguments as a JSON string)."""
        return {
            "id": self.id or call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }

    def to_hermes(self) -> str:
        """This call as Hermes/Qwen text: ``<tool_call>{...}</tool_call>``."""
        body = json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"


_WS = re.compile(r"\s+")


def normalize_answer(text: str) -> str:
    """Lower-case and collapse whitespace; the form answer facts are matched in."""
    return _WS.sub(" ", text.lower()).strip()


@functools.lru_cache(maxsize=4096)
def _fact_pattern(fact: str) -> re.Pattern[str]:
    """Where a normalized fact occurs in a normalized text: not inside a longer word or number
    before it (``2`` is not in ``12``), and a number not continued (``10`` is not in ``10.5``
    or ``100``); a word may go on (``mon`` is in ``monday``)."""
    head = r"(?<![a-z0-9])" if fact[:1].isalnum() else ""
    tail = r"(?![0-9]|[.,][0-9])" if fact[-1:].isdigit() else ""
    return re.compile(head + re.escape(fact) + tail)


@functools.lru_cache(maxsize=4096)
def _word_pattern(word: str) -> re.Pattern[str]:
    if word.isdigit():  # a number on its own: not a digit of an id (O-2), a date or a decimal (2.5)
        return re.compile(r"(?<![a-z0-9.\-])" + re.escape(word) + r"(?![a-z0-9\-]|[.,][0-9])")
    return re.compile(r"(?<![a-z0-9])" + re.escape(word) + r"(?![a-z0-9])")


def number_rivals(fact: str) -> list[str]:
    """The numbers an answer must not list besides a small whole-number ``fact`` (up to 50): the
    others from 0 to 12 (or to the fact plus 2), so a list of every count is no answer; none for
    any other fact."""
    if not fact.isdigit() or int(fact) > 50:
        return []
    return [str(i) for i in range(max(13, int(fact) + 3)) if i != int(fact)]


def fact_in(fact: str, text: str) -> bool:
    """Whether ``fact`` occurs in ``text`` (both normalized) as answer facts are matched."""
    return bool(fact) and _fact_pattern(fact).search(text) is not None
