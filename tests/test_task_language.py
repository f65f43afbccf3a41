"""The language layer of goal-level tasks (envfactory/factory/tasks/realize.py): the mechanical tells
that machine-written task text showed (issue 26: "of it", "its weight kg is", underscores,
op-name dumps like "Send to repair for every book", "whose author is Dick and status is
available", "a estimate", "1 nights") are held at zero over every goal-level task of every
table-backed family, and every kind is said in at least five ways in every family."""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections import Counter, defaultdict
from functools import lru_cache

import pytest

import envfactory
from envfactory.factory.tasks.arguments import FRESH_WORDS
from envfactory.factory.tasks.realize import FRAMES, Measure, Selection, Owner, a, amount, compare, is_plural

GOAL_KINDS = ("lookup", "conditional", "policy", "answer", "user", "multi_service",
              "chain", "aggregate", "exception", "recovery")  # the last four: envfactory/factory/tasks/grammar.py


def _quoted_removed(text: str) -> str:
    return re.sub(r"'[^']*'", "'…'", text)


def tells(instruction: str, op_names: list[str]) -> list[str]:
    """The mechanical tells found in one instruction (its quoted values aside)."""
    t = _quoted_removed(instruction)
    found = []
    checks = {
        "the ... of it": r"\bthe [a-z]+(?: [a-z]+)? of (?:it|them)\b",
        "more than 1 of": r"\bmore than [01] of\b",
        "underscore": r"_",
        "python literal": r"\b(None|True|False|null)\b",
        "spacing": r"\s{2,}|\s[,.;:?!]",
        "parenthesized dump": r"\(",
        "unit in a name": r"\b(kg|ml|km|gb|cuft) (is|are)\b",
        "whose ... and ... is": r"\bwhose [a-z ]+ is [^,.;:?]+ and (?!whose|that|in )[a-z]+(?: [a-z]+)? is\b",
        "which of every": r"\b(which of|among) (every|each)\b|^of (every|each)\b",
        "the ... of mine": r"\bthe (?![a-z]+ (?:of|on|for) )(?:[a-z]+ ){1,2}of mine\b",
        "lowercase start": r"^[a-z]",
        "lowercase I": r"\bi(?:'d|'m|'ll)? (?!\.)",
        "no final stop": r"[^.?!]$",
    }
    for name, rx in checks.items():
        if re.search(rx, t, flags=re.IGNORECASE if name not in ("python literal", "lowercase start", "lowercase I") else 0):
            found.append(name)
    # issue 59: raw placeholders, slot phrases glued into a formatted value, filler notes
    if any(unicodedata.category(c) == "Cc" and c not in "\n\t" for c in instruction):
        found.append("control character")
    if re.search(r"\$(?:the|that)\b|\byou found(?::|\d|-)|\{[A-Za-z_]\w*\}|'the [a-z ]+ you found'|"
                 r"\byou found (?:days?|nights?|months?|hours?|minutes?|packs?|points?|units?|dollars)\b",
                 instruction if "you found" in instruction else t):
        found.append("slot glue")
    if re.search("'(?:" + "|".join(FRESH_WORDS) + ")'", instruction):
        found.append("filler note")
    for w1, w2 in re.findall(r"\b([A-Za-z]+) ([A-Za-z]+)\b", t):
        if w1 == w2 and w1.lower() not in ("that", "had"):
            found.append(f"doubled word {w1!r}")
    for art, word in re.findall(r"\b(a|an) ([A-Za-z][\w-]*)", t):
        if a(word).split()[0] != art.lower() and word[0].islower():
            found.append(f"article {art} {word}")
    for noun in re.findall(r"\bits ([a-z]+(?: [a-z]+)?) is\b", t):
        if is_plural(noun):
            found.append(f"agreement its {noun} is")
    for first, noun in re.findall(r"(?<![\w.,$-])1 (?:([a-z]+) )?([a-z]+s)\b", t):
        if is_plural(noun) and first not in ("of", "is", "and", "or", "in", "for", "to", "per", "more", "less"):
            found.append("1 + plural")  # "1 nights", "1 labor hours"
    for op in op_names:
        words = op.replace("_", " ")
        if " " in words and re.search(rf"\b{re.escape(words)} for (every|each|all|the)\b", t, re.IGNORECASE):
            found.append(f"op name {op}")
    return found


@lru_cache(maxsize=1)
def _goal_tasks() -> list[tuple[str, str, str, object, list[str]]]:
    """Every goal-level task of every table-backed family (those with a task supply)."""
    out = []
    for spec in sorted(envfactory.specs(), key=lambda s: s.name):
        if (getattr(spec, "metadata", None) or {}).get("supply") is None:
            continue
        ops = [s["function"]["name"] for s in spec.tool_schemas()]
        for t in spec.get_tasks():
            kind = (t.metadata or {}).get("kind")
            if kind in GOAL_KINDS:
                out.append((spec.name, kind, t.instruction, (t.metadata or {}).get("phrasing"), ops))
    return out


@pytest.mark.slow
def test_no_mechanical_tells_in_any_goal_level_task():
    tasks = _goal_tasks()
    assert len(tasks) > 3000  # every table-backed family's goal-level tasks
    bad = [(name, kind, text, tells(text, ops)) for name, kind, text, _, ops in tasks if tells(text, ops)]
    counts = Counter(t for *_, ts in bad for t in ts)
    assert not bad, f"{len(bad)} of {len(tasks)} tasks show tells {dict(counts)}; e.g. {bad[:5]}"


@pytest.mark.slow
def test_every_kind_has_five_phrasings_in_every_family():
    """A task's frame is drawn from its kind's frames whatever the family (realize.frame), so over
    all families every kind shows five or more; and a family's own supply shows them too."""
    seen: dict[str, set] = defaultdict(set)
    for _, kind, _, phrasing, _ in _goal_tasks():
        assert phrasing is not None, kind
        seen[kind].add(phrasing)
    assert set(seen) == set(GOAL_KINDS)
    assert all(len(ps) >= 5 for ps in seen.values()), {k: sorted(ps) for k, ps in seen.items()}
    for name in ("RetailOrders-v1", "Telecom-v0"):
        for kind in ("lookup", "conditional", "user", "exception"):
            supply = envfactory.task_supply(name, difficulty=2, seed=7, kinds=[kind])
            assert len({t.metadata["phrasing"] for t in itertools.islice(supply, 30)}) >= 5, (name, kind)


def test_the_tells_test_finds_the_old_machine_text():
    """Each tell, on the sentences issue 26 quoted from the text this layer replaced."""
    old = {
        "if its fee is at least 747, mark it as a no-show; otherwise set the fee of it to $841.": "the ... of it",
        "Send to repair for every book whose author is Dick and status is available.": "whose ... and ... is",
        "Check the loyalty points of the customer named Dalia. If its weight kg is at least 94, ship it.":
            "unit in a name",
        "Of every visit of the pet owner named Fabian, which one has the highest fee?": "which of every",
        "How many repair orders whose status is in_progress are there?": "underscore",
        "Quote a estimate on every order.": "article a estimate",
        "Extend the stay of every guest to 1 nights.": "1 + plural",
        "Finish each repair order with 1 labor hours.": "1 + plural",
        "Update the value (value 2) of every deal.": "parenthesized dump",
        "If there are more than 1 of them, approve each of them.": "more than 1 of",
        "For every member: if they have 3 credits, set the plan of them to plus.": "the ... of it",
        # issue 59
        "I need you to assign all devices that are in stock to employee \x00assigned to\x00.": "control character",
        "Look up borrower Bruno and note the annual income. Then counter buyer Gideon's offers at "
        "$the annual income you found.": "slot glue",
        "Using the capacity of event Film Club, move the meetings of room Boreal to wed at the capacity "
        "you found:00.": "slot glue",
        "Then change all rentals for customer Ivan that are active to the open cases you found days.": "slot glue",
        "Please put payslip PS-3 on hold with the reason 'juniper'.": "filler note",
    }
    for text, tell in old.items():
        assert tell in tells(text, ["send_to_repair"]), (text, tells(text, []))
    assert "op name send_to_repair" in tells("Send to repair for every book.", ["send_to_repair"])
    assert tells("Could you cancel every placed order of customer Kim?", ["cancel_order"]) == []


def test_measures_speak_with_units_money_and_counts():
    fee = Measure.of("fee", "visit fee in dollars")
    assert compare(fee, "it", "at_least", 1200) == "its fee is at least $1,200"
    weight = Measure.of("weight_kg", "weight collected in kilograms")
    assert compare(weight, "it", "below", 94) == "its weight is below 94 kg"
    leave = Measure.of("leave_days", "remaining leave days")
    assert compare(leave, "it", "at_least", 17) == "it has at least 17 leave days"
    miles = Measure.of("miles", "loyalty miles")
    assert compare(miles, "its traveller", "at_least", 4303) == "its traveller has at least 4303 miles"
    assert amount(Measure.of("nights", "nights booked"), 1) == "1 night"
    assert amount(Measure.of("length", "length of the session in hours"), 1) == "1 hour"
    assert amount(Measure.of("boat_length", "boat length in feet"), 1) == "1 foot"
    assert amount(Measure.of("volume_ml", "volume in millilitres"), 1) == "1 ml"
    assert compare(Measure.of("max_kg", "capacity"), "it", "at_least", 3000) == "its capacity is at least 3000 kg"
    assert compare(Measure.of("prep_minutes", "typical preparation time in minutes"), "it", "at_least", 30) == \
        "its prep time is at least 30 minutes"
    assert Measure.of("model_year", "model year").yearlike and amount(Measure.of("model_year", ""), 2019) == "2019"


def test_a_selection_is_said_in_several_agreeing_forms():
    import random

    sel = Selection.build("repair order", [("status", "enum", "awaiting_approval")], [Owner("customer", "Kim")])
    forms = {sel.np(random.Random(i))[0] for i in range(60)}
    assert len(forms) >= 5
    assert "every repair order of customer Kim that is awaiting approval" in forms
    assert any(f.startswith("all of customer Kim's repair orders that are awaiting approval") for f in forms)
    placed = Selection.build("order", [("status", "enum", "placed")], [])
    assert "every placed order" in {placed.np(random.Random(i))[0] for i in range(40)}
    depot = Selection.build("truck", [("status", "enum", "depot")], [])
    assert all("that is depot" not in depot.np(random.Random(i))[0] for i in range(20))
    assert all(len(fs) >= 5 for fs in FRAMES.values())


@pytest.mark.slow
def test_a_family_supply_shows_five_phrasings_of_every_kind_it_makes():
    """Per family, not only pooled: every tenth family with a task supply, each goal-level kind it
    makes shows five or more phrasings within 40 of its supply's tasks."""
    specs = [s for s in sorted(envfactory.specs(), key=lambda s: s.name)
             if (getattr(s, "metadata", None) or {}).get("supply") is not None]
    short = []
    for spec in specs[::10]:
        for kind in [k for k in GOAL_KINDS if k in spec.metadata.get("kinds", [])]:
            phrasings: set = set()
            try:
                for t in itertools.islice(envfactory.task_supply(spec.name, difficulty=2, seed=3, kinds=[kind]), 40):
                    phrasings.add(t.metadata["phrasing"])
                    if len(phrasings) >= 5:
                        break
            except (RuntimeError, ValueError):
                continue  # the family cannot make this kind at difficulty 2
            if len(phrasings) < 5:
                short.append((spec.name, kind, sorted(phrasings)))
    assert not short, short
