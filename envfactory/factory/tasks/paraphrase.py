"""An optional paraphrase pass over task instructions, by any chat model.

The language layer (:mod:`~envfactory.factory.tasks.realize`) words tasks from a few frames per kind. Where a chat model
is at hand (any OpenAI-compatible endpoint; ``agents.policies.openai_policy.OpenAIChat(...).complete`` is
one), :func:`paraphrase` asks it to reword each instruction as a person would, and keeps a
rewording only if it **keeps every fact the task depends on** (:func:`lost`):

* every id (``O-7``, ``BIN-3``), every quoted value (``'keep the old parts'``), every number
  (``$1,200`` and ``1200`` are the same number), and every capitalized name that is not the
  first word of a sentence;
* and it adds no id or number of its own.

A rewording must also keep a third of the request's content words and not run far longer than it
(:func:`strays`: a name kept and the request gone, or the request wrapped in a preamble and a
comment, is no rewording). One that passes then faces a **second pass** (:func:`maps_back`): the model is
shown the rewording and a numbered list of tasks, the original's own words among the most similar
instructions of the other tasks (a sibling that differs only in a condition, say), and it must pick
the original. A rewording that reads as another task, or an answer that names no number, is
refused. With no other task to tell it from (one task, no ``distractors``) the pass cannot be made
and the task keeps its own words (``back_map=False`` skips the pass).

A rewording that fails a check, or a model that fails (an exception from ``complete``), leaves
the task's own words; the report says which and why. Nothing else of a task changes: the same
reference solution and check apply, so every paraphrased task is still solvable and judged the
same way. Any chat model serves, an endpoint or a local one
(``agents.policies.users.PolicyChat(policy).complete``; offline, the embedded tiny model runs the
whole pass, quality not claimed).
"""

from __future__ import annotations

import random
import re
import zlib
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

from envfactory.task import Task

__all__ = ["paraphrase", "lost", "strays", "maps_back", "PROMPT", "BACK_PROMPT", "MIN_KEPT"]

PROMPT = ("Rewrite the request below the way a busy person would write it to an assistant: plain, "
          "natural English, one to three sentences. Keep every id, name, number, amount and quoted text "
          "exactly as written, keep every condition and exception, and add nothing. Reply with the "
          "rewritten request only.")

BACK_PROMPT = ("Below are a request and a numbered list of tasks. Which task does the request ask for? Reply "
               "with the task's number only.")

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


_WORD = re.compile(r"[a-z0-9$']+")
NO_OTHER = "nothing to map it back against (no other task)"


def _similar(original: str, others: Iterable[str], n: int) -> list[str]:
    """The ``n`` texts of ``others`` sharing the most words with ``original`` (Jaccard; ties by text)."""
    words = set(_WORD.findall(original.lower()))
    scored = []
    for o in set(others) - {original}:
        ow = set(_WORD.findall(o.lower()))
        scored.append((-len(words & ow) / max(1, len(words | ow)), o))
    return [o for _, o in sorted(scored)[:n]]


def maps_back(original: str, text: str, others: Iterable[str], complete: Callable[[list[dict[str, Any]]], str], *,
              choices: int = 4, key: str = "") -> tuple[bool, str]:
    """The second pass: shown ``text`` and ``original`` among the ``choices - 1`` most similar of
    ``others`` (numbered, in an order fixed by ``key``), does ``complete`` pick ``original``?
    ``(picked it, why not)``. No other text to tell it from: ``(False, reason)``."""
    options = [original, *_similar(original, others, max(0, choices - 1))]
    if len(options) < 2:
        return False, NO_OTHER
    random.Random(zlib.crc32(f"{key}/{original}".encode())).shuffle(options)
    listing = "\n".join(f"{i}. {o}" for i, o in enumerate(options, 1))
    answer = complete([{"role": "system", "content": BACK_PROMPT},
                       {"role": "user", "content": f"Request: {text}\n\nTasks:\n{listing}"}])
    m = re.search(r"\d+", answer or "")
    if m is None:
        return False, f"the second pass named no task ({(answer or '').strip()[:60]!r})"
    picked = int(m.group())
    if picked != options.index(original) + 1:
        return False, (f"read as another task ({options[picked - 1][:80]!r})" if 1 <= picked <= len(options)
                       else f"the second pass named no listed task ({picked})")
    return True, ""


_STOP = frozenset("a an the of to in on for and or but is are be was it its this that these those with by at as "
                  "me my i you your we our please can could would will do does any all every each there their "
                  "them they from which who whose what how".split())
MIN_KEPT = 1 / 3
"""The least share of the request's content words (stop words aside, compared by their first five
letters) a rewording keeps: below it, it no longer says what to do ("Benedikt, no." for "Tell me how
many tickets of subscriber Benedikt there are": a name kept, the request gone)."""


def _content(text: str) -> set[str]:
    return {w[:5] for w in _WORD.findall(text.lower()) if w not in _STOP and not w.isdigit()}


def strays(original: str, candidate: str) -> str | None:
    """Why ``candidate`` is no rewording of ``original`` though it keeps its facts, or ``None``: it
    keeps too few of its content words (:data:`MIN_KEPT`), or it is far longer (more than twice
    the request and 80 characters more: a preamble, the request and a comment on it)."""
    words = _content(original)
    kept = len(words & _content(candidate))
    if words and kept < MIN_KEPT * len(words):
        return f"kept too little of the request ({kept} of {len(words)} content words)"
    if len(candidate) > 2 * len(original) and len(candidate) > len(original) + 80:
        return f"far longer than the request ({len(candidate)} characters for {len(original)})"
    return None


def paraphrase(tasks: Iterable[Task], complete: Callable[[list[dict[str, Any]]], str], *,
               tries: int = 2, back_map: bool = True, choices: int = 4,
               distractors: Sequence[str] = ()) -> tuple[list[Task], dict[str, Any]]:
    """Each task reworded by ``complete`` (messages in, text out) where the rewording keeps every
    fact (:func:`lost`) and, with ``back_map``, the model maps it back to the task among similar
    ones (:func:`maps_back`), else as it was; and a report: ``{"kept": n, "reworded": n,
    "refused": [{"id", "reasons"}], "errors": [{"id", "error"}]}``. A reworded task carries its
    own words in ``metadata["worded_by_layer"]``.

    Args:
        tasks: The tasks (any kind; only the instruction is reworded).
        complete: The chat model, e.g. ``agents.policies.openai_policy.OpenAIChat(url, model).complete``.
        tries: Attempts per task before its own words are kept.
        back_map: Make the second pass.
        choices: Tasks listed in the second pass (the original and the most similar others).
        distractors: More instructions to choose the second pass's others from (besides the
            other tasks given), e.g. the rest of the environment's tasks.
    """
    tasks = list(tasks)
    pool = [t.instruction for t in tasks] + list(distractors)
    out: list[Task] = []
    report: dict[str, Any] = {"kept": 0, "reworded": 0, "refused": [], "errors": []}
    for task in tasks:
        chosen = None
        reasons: list[str] = []
        if back_map and all(o == task.instruction for o in pool):  # no second pass can be made: not asked
            report["refused"].append({"id": task.id, "reasons": [NO_OTHER]})
            report["kept"] += 1
            out.append(task)
            continue
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
            if not reasons and (loose := strays(task.instruction, text)):
                reasons = [loose]
            if not reasons and back_map:
                try:
                    ok, why = maps_back(task.instruction, text, pool, complete, choices=choices, key=task.id)
                except Exception as exc:  # noqa: BLE001 -- any backend's failure keeps the task's own words
                    report["errors"].append({"id": task.id, "error": f"{type(exc).__name__}: {exc}"})
                    break
                if not ok:
                    reasons = [why]
                    continue
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
