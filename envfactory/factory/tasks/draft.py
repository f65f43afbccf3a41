"""A goal-level task before it is finished (its check built from the reference's changes):
what :mod:`~envfactory.factory.tasks.kinds` and :mod:`~envfactory.factory.tasks.grammar` both make."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envfactory.task import ToolCall

__all__ = ["Draft", "GOAL_MAX_TURNS"]

GOAL_MAX_TURNS = 32
"""The turn limit of a goal-level family (at least; a spec file may give more): a reference and
its closing answer fit it with a turn to spare, so a difficulty-5 task can chain three parts over
paged listings."""


@dataclass
class Draft:
    kind: str
    instruction: str
    calls: list[ToolCall]
    guard: list[str] = field(default_factory=list)     # tables whose every row the check pins
    facts: list[str] = field(default_factory=list)
    rivals: list[str] | None = None
    seen: bool = True
    user: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    paged: bool = False                                 # whether ``calls`` turn every page they need
