"""Rubrics: weighted, named criteria over a finished episode, beside the sparse task reward.

The reward an :class:`~envfactory.Episode` gives is the sparse task completion (1 or 0,
judged from the true final state). A :class:`Rubric` adds other measures of the same
episode, each a named :class:`Criterion` with a weight, scored in [0, 1] from what the
episode really did: its final state, each agent's transcript, the final answer, the call log,
the task and its success. Criteria are plain functions (or an LLM judge, see
``agents.policies.judge.LLMJudge``). Nothing here replaces the task reward unless asked for::

    rubric = Rubric([task_success(), no_tool_errors(weight=0.2), at_most_calls(6, weight=0.2)])
    grade = rubric.grade(episode)          # after the episode ended
    grade.parts                            # {"task_success": 1.0, "no_tool_errors": 0.0, ...}
    grade.score                            # the weighted mean, in [0, 1]

``agents.rollout.rollout(..., rubric=rubric)`` records each rollout's grade, and makes
``grade.score`` the trajectory's reward only with ``rubric_as_reward=True``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..env import EpisodeError, Message
from ..task import Task

__all__ = ["Criterion", "Rubric", "Grade", "Finished", "task_success", "no_tool_errors", "at_most_calls",
           "answer_mentions"]


@dataclass(frozen=True)
class Finished:
    """What a criterion sees of one finished episode (taken from the episode, never from claims)."""

    task: Task
    state: Any
    success: bool
    answer: str | None
    ended_by: str | None
    transcripts: dict[str, list[Message]]
    log: list[dict[str, Any]]


@dataclass(frozen=True)
class Criterion:
    """A named measure of a finished episode: ``score(finished) -> float`` in [0, 1], and its weight."""

    name: str
    score: Callable[[Finished], float]
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("a criterion needs a name")
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"criterion {self.name!r}: weight must be a finite number >= 0, got {self.weight!r}")


@dataclass(frozen=True)
class Grade:
    """A rubric's verdict on one episode: each criterion's score, their weighted mean, and the errors
    of criteria that failed to score (such a criterion scores 0, never raises out of :meth:`Rubric.grade`)."""

    parts: dict[str, float]
    score: float
    errors: dict[str, str] = field(default_factory=dict)


class Rubric:
    """Weighted criteria (see the module docstring).

    Args:
        criteria: The criteria, with distinct names and at least one positive weight.
    """

    def __init__(self, criteria: Sequence[Criterion]) -> None:
        criteria = list(criteria)
        names = [c.name for c in criteria]
        if not criteria or len(set(names)) != len(names):
            raise ValueError(f"a rubric needs criteria with distinct names, got {names}")
        if not sum(c.weight for c in criteria) > 0:
            raise ValueError("a rubric needs at least one criterion with a positive weight")
        self.criteria = criteria

    def grade(self, episode: Any) -> Grade:
        """Score a finished :class:`~envfactory.Episode` on every criterion.

        Raises:
            EpisodeError: the episode has not ended (there is nothing final to grade yet).
        """
        if not episode.done:
            raise EpisodeError(f"{episode.spec.name}: the episode has not ended; grade it after its end")
        status = episode.status
        finished = Finished(task=episode.task, state=episode.state, success=bool(episode.success),
                            answer=status.answer, ended_by=status.ended_by,
                            transcripts={a: list(episode.transcript(a)) for a in episode.agents},
                            log=status.log)
        parts: dict[str, float] = {}
        errors: dict[str, str] = {}
        for c in self.criteria:
            try:
                value = float(c.score(finished))
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"scored {value}, outside [0, 1]")
            except Exception as exc:  # noqa: BLE001 - a broken criterion scores 0 and says why
                errors[c.name] = f"{type(exc).__name__}: {exc}"
                value = 0.0
            parts[c.name] = value
        total = sum(c.weight for c in self.criteria)
        score = sum(c.weight * parts[c.name] for c in self.criteria) / total
        return Grade(parts=parts, score=score, errors=errors)


# -- criteria everyone needs -------------------------------------------------------------------
def task_success(weight: float = 1.0) -> Criterion:
    """The sparse task completion itself (1 or 0), as one criterion among others."""
    return Criterion("task_success", lambda f: 1.0 if f.success else 0.0, weight)


def no_tool_errors(weight: float = 1.0) -> Criterion:
    """1 when no tool call failed (invalid arguments, tool errors, unknown tools), else 0."""
    return Criterion("no_tool_errors", lambda f: 0.0 if any(not e["ok"] for e in f.log) else 1.0, weight)


def at_most_calls(limit: int, weight: float = 1.0) -> Criterion:
    """1 within ``limit`` tool calls, falling linearly to 0 at twice the limit (efficiency)."""
    if limit < 1:
        raise ValueError("at_most_calls needs a limit of at least 1")

    def score(f: Finished) -> float:
        n = len(f.log)
        return 1.0 if n <= limit else max(0.0, 1.0 - (n - limit) / limit)

    return Criterion("at_most_calls", score, weight)


def answer_mentions(facts: Sequence[str] | None = None, weight: float = 1.0) -> Criterion:
    """The share of ``facts`` (default: the task's answer facts) the final answer names
    (case-insensitive); 1 when there is nothing to name."""

    def score(f: Finished) -> float:
        wanted = [str(x) for x in (facts if facts is not None else f.task.answer_facts)]
        if not wanted:
            return 1.0
        said = (f.answer or "").lower()
        return sum(w.lower() in said for w in wanted) / len(wanted)

    return Criterion("answer_mentions", score, weight)
