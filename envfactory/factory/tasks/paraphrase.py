"""An optional paraphrase pass over task instructions, by any chat model.

The language layer (:mod:`~envfactory.factory.tasks.realize`) words tasks from a few frames per kind. Where a chat model
is at hand (any OpenAI-compatible endpoint; ``agents.policies.openai_policy.OpenAIChat(...).complete`` is
one), :func:`paraphrase` asks it to reword each instruction as a person would, and keeps a
rewording only if it **keeps every fact the task depends on** (:func:`lost`):

* every id (``O-7``, ``BIN-3``), every quoted value (``'keep the old parts'``), every number
  (``$1,200`` and ``1200`` are the same number), and every capitalized name that is not the
  first word of a sentence;
* and it adds no id or number of its own.

A rewording that fails the check, or a model that fails (an exception from ``complete``), leaves
the task's own words; the report says which and why. Nothing else of a task changes: the same
reference solution and check apply, so every paraphrased task is still solvable and judged the
same way.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, Iterable

from envfactory.task import Task

__all__ = ["paraphrase", "lost", "PROMPT"]

PROMPT = ("Rewrite the request below the way a busy person would write it to an assistant: plain, "
          "natural English, one to three sentences. Keep every id, name, number, amount and quoted text "
          "exactly as written, keep every condition and exception, and add nothing. Reply with the "
          "rewritten request only.")

_ID = re.compile(r"\b[A-Z]{1,5}-\d+\b")
_QUOTED = re.compile(r"'[^']*'")
_NUMBER = re.compile(r"(?<![\w-])\$?\d[\d,]*(?:\.\d+)?")
_NAME = re.compile(r"(?<![.?!:]\s)(?<!^)\b[A-Z][a-z][\w-]*")


def _numbers(text: str) -> Counter:
    return Counter(float(m.replace("$", "").replace(",", "")) for m in _NUMBER.findall(_ID.sub(" ", text)))


def _names(text: str) -> set[str]:
    plain = _QUOTED.sub(" ", text)
    return {m for m in _NAME.findall(plain) if m not in ("I", "Then", "If", "Otherwise", "After", "Hi", "Hello")}


def lost(original: str, candidate: str) -> list[str]:
    """What ``candidate`` lost or added against ``original`` (empty: it keeps every fact)."""
    out = []
    ids, got_ids = Counter(_ID.findall(original)), Counter(_ID.findall(candidate))
    out += [f"id {i}" for i in sorted(set(ids) - set(got_ids))]
    out += [f"added id {i}" for i in sorted(set(got_ids) - set(ids))]
    quoted = [q for q in _QUOTED.findall(original) if q not in candidate and q.replace("'", '"') not in candidate]
    out += [f"quoted {q}" for q in quoted]
    nums, got = _numbers(_QUOTED.sub(" ", original)), _numbers(_QUOTED.sub(" ", candidate))
    out += [f"number {n:g}" for n in sorted(set(nums) - set(got))]
    out += [f"added number {n:g}" for n in sorted(set(got) - set(nums))]
    out += [f"name {n}" for n in sorted(_names(original)) if n not in candidate]
    if not candidate.strip():
        out.append("empty")
    return out


def paraphrase(tasks: Iterable[Task], complete: Callable[[list[dict[str, Any]]], str], *,
               tries: int = 2) -> tuple[list[Task], dict[str, Any]]:
    """Each task reworded by ``complete`` (messages in, text out) where the rewording keeps every
    fact (:func:`lost`), else as it was; and a report: ``{"kept": n, "reworded": n, "refused":
    [{"id", "reasons"}], "errors": [{"id", "error"}]}``. A reworded task carries its own words in
    ``metadata["worded_by_layer"]``.

    Args:
        tasks: The tasks (any kind; only the instruction is reworded).
        complete: The chat model, e.g. ``agents.policies.openai_policy.OpenAIChat(url, model).complete``.
        tries: Attempts per task before its own words are kept.
    """
    out: list[Task] = []
    report: dict[str, Any] = {"kept": 0, "reworded": 0, "refused": [], "errors": []}
    for task in tasks:
        chosen = None
        reasons: list[str] = []
        for attempt in range(tries):
            messages = [{"role": "system", "content": PROMPT}, {"role": "user", "content": task.instruction}]
            if attempt and reasons:
                messages.append({"role": "user", "content": "Your last rewrite lost or changed: "
                                 + "; ".join(reasons) + ". Try again, keeping them exactly."})
            try:
                text = complete(messages).strip().strip('"').strip()
            except Exception as exc:  # any backend's failure keeps the task's own words
                report["errors"].append({"id": task.id, "error": f"{type(exc).__name__}: {exc}"})
                break
            reasons = lost(task.instruction, text)
            if not reasons:
                chosen = text
                break
        if chosen is None:
            if reasons:
                report["refused"].append({"id": task.id, "reasons": reasons})
            report["kept"] += 1
            out.append(task)
            continue
        report["reworded"] += 1
        meta = {**(task.metadata or {}), "worded_by_layer": task.instruction}
        out.append(task.model_copy(update={"instruction": chosen, "metadata": meta}))
    return out, report
