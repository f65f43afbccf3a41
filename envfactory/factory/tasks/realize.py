"""The language layer of goal-level tasks: how a table-backed family's world is spoken of.

A task's words come from here, never from docstrings. The spec file gives the nouns (entity
labels), the operations' instruction templates and the field descriptions; this module turns
them into English a person would write:

* :class:`Measure`: how a number field is said: its noun ("fee", "leave days"), its unit
  ("kg", "minutes") or money ("$1,200"), and whether it counts things, so a comparison reads
  "its fee is at least $747", "it has at least 17 leave days" or "its weight is under 94 kg"
  instead of "its weight kg is at least 94".
* :class:`Selection`: a described set of rows (a noun, the rows it belongs to, states and
  attribute values), realized in several quantified forms with agreement: "every placed order
  of customer Kim", "all of customer Kim's placed orders", "the orders of customer Kim that
  are placed", "all my placed orders".
* sentence frames: several phrasings per task kind (:data:`FRAMES` counts them), drawn from
  the task's seeded RNG and recorded in ``metadata["phrasing"]``.

Inflection (plurals) uses the ``inflection`` package; articles and agreement are done here.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import inflection

__all__ = ["Measure", "Selection", "Owner", "plural", "is_plural", "a", "money", "amount", "compare",
           "rel_compare", "FRAMES", "frame", "thousands"]

# words ending in s that are singular (inflection would singularize them)
_SINGULAR_S = frozenset("""
    status bonus campus census chassis corpus focus genus virus series species analysis basis thesis
    diagnosis access address business process progress class glass pass gas bias canvas lens plus news
    surplus mileage always
""".split())
_STATUS_FIELDS = frozenset({"status", "state", "condition"})
_STAGE_FIELDS = frozenset({"stage", "phase"})
_YEARLIKE = re.compile(r"(^|_)(year|hour|number|id|code|zip)s?($|_)")
_ABBREVIATED = frozenset({"max", "min", "qty", "num", "pct", "avg"})
_UNIT_SUFFIX = {"kg": "kg", "ml": "ml", "km": "km", "gb": "GB", "cuft": "cubic feet"}
_UNIT_IN = re.compile(r"\bin (minutes|hours|days|nights|months|years|feet|kilograms|kilometres|kilometers|"
                      r"millilitres|milliliters|miles|hectares|cents|words|GB)\b")
_UNIT_SHORT = {"kilograms": "kg", "kilometres": "km", "kilometers": "km", "millilitres": "ml", "milliliters": "ml"}


def is_plural(noun: str) -> bool:
    """Whether a noun phrase's head is plural ("leave days", "seats left", "loyalty points")."""
    words = noun.lower().split()
    if not words:
        return False
    head = words[0] if len(words) > 1 and words[-1] in ("left", "done", "free", "open") else words[-1]
    return head.endswith("s") and head not in _SINGULAR_S and inflection.singularize(head) != head


def plural(noun: str) -> str:
    """The plural of a noun phrase (its last word inflected): "repair order" -> "repair orders"."""
    if is_plural(noun):
        return noun
    head, _, last = noun.rpartition(" ")
    return (head + " " if head else "") + inflection.pluralize(last)


def a(noun: str) -> str:
    """``noun`` with its indefinite article: "an order", "a unit", "an hour"."""
    w = noun.lower()
    vowel = w[:1] in "aeiou" and not re.match(r"u(ni|se|su|ti|ro)|one|eu", w) or re.match(r"hour|honest|honou?r", w)
    return ("an " if vowel else "a ") + noun


def thousands(x: Any, group: bool) -> str:
    """A number as a person writes it: no trailing .0, grouped by thousands where asked."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    if group and abs(x) >= 1000:
        return f"{x:,}"
    return str(x)


def money(x: Any) -> str:
    return "$" + thousands(x, True)


@dataclass(frozen=True)
class Measure:
    """How a number field is spoken of (see the module docstring)."""

    noun: str
    unit: str = ""
    is_money: bool = False
    count: bool = False
    yearlike: bool = False

    @classmethod
    def of(cls, name: str, description: str = "") -> "Measure":
        """From a field's name and description: ``weight_kg`` -> "weight" in kg; ``fee`` described
        "... in dollars" -> money; ``leave_days`` -> a count of "leave days"."""
        words = name.split("_")
        unit = ""
        if len(words) > 1 and words[-1] in _UNIT_SUFFIX:
            unit = _UNIT_SUFFIX[words.pop()]
        desc = description.lower()
        is_money = "dollar" in desc and "cents" not in desc
        m = _UNIT_IN.search(desc)
        if not unit and not is_money and m:
            unit = _UNIT_SHORT.get(m.group(1), m.group(1))
        noun = " ".join(words)
        if noun in _ABBREVIATED and description and len(description.split()) <= 3 and not re.search(r"[\d(]", description):
            noun = description.lower()                    # max_kg, described "capacity": "capacity"
        if unit and noun.split()[-1] == unit:  # prep_minutes in minutes: "prep time"; minutes: "length"
            rest = noun.split()[:-1]
            noun = " ".join(rest + ([] if rest and rest[-1].endswith("time") else ["time"])) if rest else "length"
        count = not is_money and not unit and is_plural(noun)
        return cls(noun=noun, unit=unit, is_money=is_money, count=count, yearlike=bool(_YEARLIKE.search(name)))

    @property
    def plural(self) -> bool:
        return is_plural(self.noun) and not self.count


def amount(m: Measure, value: Any) -> str:
    """A value with its unit: "$1,200", "94 kg", "17 leave days", "3"."""
    if m.is_money:
        return money(value)
    text = thousands(value, not m.yearlike and isinstance(value, (int, float)) and abs(value) >= 10000)
    if m.unit:
        return f"{text} {_unit_for(m.unit, value)}"
    if m.count:
        return f"{text} {_singular(m.noun) if value == 1 else m.noun}"
    return text


def _unit_for(unit: str, value: Any) -> str:
    """ "1 hour", "1 foot", "2 hours": a unit agrees with its number (kg, ml, GB never change)."""
    if value != 1 or not unit.endswith("s") and unit != "feet":
        return unit
    return {"feet": "foot", "cubic feet": "cubic foot"}.get(unit, unit[:-1])


def _singular(noun: str) -> str:
    words = noun.split()
    i = 0 if len(words) > 1 and words[-1] in ("left", "done", "free", "open") else len(words) - 1
    words[i] = inflection.singularize(words[i])
    return " ".join(words)


_CMP = {  # (count form, measure forms)
    "at_least": (["at least {n}"], ["at least {v}", "{v} or more"]),
    "below": (["fewer than {n}"], ["below {v}", "under {v}", "less than {v}"]),
    "above": (["more than {n}"], ["above {v}", "more than {v}"]),
}


def compare(m: Measure, whose: str, op: str, value: Any, rng: random.Random | None = None) -> str:
    """A clause comparing a row's number to ``value``: ``whose`` is the row's possessor ("it",
    "they" for a person, "its traveller"): "its fee is at least $747", "their fee is at least
    $747", "its traveller has at least 4,303 miles"."""
    counts, measures = _CMP[op]
    pick: Callable[[list[str]], str] = (lambda xs: rng.choice(xs)) if rng is not None else (lambda xs: xs[0])
    if m.count:
        n = amount(m, value)
        # a named row is one thing whatever its name ends in ("guest Bo Evans has", not "have")
        has = "has" if whose == "it" or (whose != "they" and (not is_plural(whose) or re.search(r"[A-Z]", whose))) \
            else "have"
        return f"{whose} {has} " + pick(counts).format(n=n)
    poss = {"it": "its", "they": "their"}.get(whose, f"{whose}'s")
    verb = "are" if m.plural else "is"
    return f"{poss} {m.noun} {verb} " + pick(measures).format(v=amount(m, value))


def rel_compare(m: Measure, op: str, value: Any) -> str:
    """The same comparison as a relative clause on rows: "with more than 2 packs", "whose fee is
    above $500"."""
    counts, measures = _CMP[op]
    if m.count:
        return "with " + counts[0].format(n=amount(m, value))
    return f"whose {m.noun} {'are' if m.plural else 'is'} " + measures[0].format(v=amount(m, value))


@dataclass(frozen=True)
class Owner:
    """A row the selected rows belong to: said by name ("customer Kim"), by id ("student ST-4"),
    or in words of its own (``said``: "that mechanic", "the mechanic with the most open bays")."""

    label: str
    name: str
    said: str | None = None

    def text(self, rng: random.Random, *, short: bool = False) -> str:
        """ "customer Kim", or (not ``short``, sometimes) "the customer named Kim"."""
        if self.said is not None:
            return self.said
        if short or re.match(r"^[A-Z]+-\d+$", self.name) or rng.random() < 0.6:
            return f"{self.label} {self.name}"
        return f"the {self.label} named {self.name}"


_ADJECTIVES = frozenset("""
    open closed ready due paid unpaid new free busy idle live late lost won sold done draft clean dirty spare
    vacant full empty active inactive pending available overdue urgent public private current valid void
""".split())
_STATE_WORDS = frozenset("in on off out awaiting checked not under at being fully partly".split())


def _adjectival(value: str) -> bool:
    """Whether a state value reads after "that is" ("placed", "in progress", "off duty"),
    rather than as a name ("depot", "no show": "whose status is depot")."""
    words = value.lower().replace("-", "_").split("_")
    if len(words) > 1:
        return words[0] in _STATE_WORDS
    w = words[0]
    return w in _ADJECTIVES or bool(re.search(r"(ed|ing|ive|able|ible|ent|ful|less|ous)$", w))


def _value_text(v: Any) -> str:
    return str(v).replace("_", " ")


@dataclass
class Selection:
    """A described set of rows of one entity (see the module docstring)."""

    noun: str
    owners: list[Owner] = field(default_factory=list)
    mine: bool = False
    states: list[tuple[str, Any]] = field(default_factory=list)   # (field, value): status-like
    wheres: list[tuple[str, Any]] = field(default_factory=list)   # (field, value)
    flags: list[tuple[str, bool]] = field(default_factory=list)   # (field, value) of bool fields
    tail: str = ""                                                # " with the status I have in mind"

    @classmethod
    def build(cls, noun: str, filters: Sequence[tuple[str, str, Any]], owners: Sequence[Owner], *,
              mine: bool = False) -> "Selection":
        """``filters``: (field, type, value) of the non-reference filters."""
        s = cls(noun=noun, owners=list(owners), mine=mine)
        for f, typ, v in filters:
            if typ == "bool":
                s.flags.append((f, bool(v)))
            elif typ == "enum" and (f in _STATUS_FIELDS or f in _STAGE_FIELDS):
                s.states.append((f, v))
            else:
                s.wheres.append((f, v))
        return s

    # -- pieces ------------------------------------------------------------------
    def _adjective(self) -> str:
        """A one-word state before the noun ("placed orders"), when there is exactly one."""
        if len(self.states) == 1 and self.states[0][0] in _STATUS_FIELDS:
            v = str(self.states[0][1])
            if re.fullmatch(r"[a-z]+", v) and _adjectival(v):
                return v + " "
        return ""

    def _relatives(self, plural_rows: bool, adjective_used: bool) -> str:
        be = "are" if plural_rows else "is"
        parts: list[str] = []
        for f, v in self.states:
            if adjective_used and f in _STATUS_FIELDS:
                continue
            if f in _STAGE_FIELDS:
                parts.append(f"in the {_value_text(v)} {f}")
            elif _adjectival(str(v)):
                parts.append(f"that {be} {_value_text(v)}")
            else:
                parts.append(f"whose {f} is {_value_text(v)}")
        for f, on in self.flags:
            parts.append(f"that {be} {'' if on else 'not '}{f.replace('_', ' ')}")
        for f, v in self.wheres:
            text = _value_text(v)
            if isinstance(v, str) and " " in text and "_" not in v and not re.match(r"[A-Z]", text):
                text = f"'{text}'"  # free text ("whose note is 'use the side entrance'"), not a name
            parts.append(f"whose {f.replace('_', ' ')} is {text}")
        if not parts:
            return ""
        return " " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])

    # -- the forms -----------------------------------------------------------------
    def np(self, rng: random.Random, *, form: str | None = None, plural_only: bool = False) -> tuple[str, bool]:
        """The rows as a quantified noun phrase, and whether it is grammatically plural
        (``plural_only``: a plural form, for "which of ...", "among ...")."""
        forms = ([] if plural_only else ["every", "each"]) + ["all"] + ([] if self.mine else ["the"]) + \
            (["poss"] if self.owners or self.mine else [])
        form = form or rng.choice(forms)
        adj = self._adjective() if rng.random() < 0.7 else ""
        plural_rows = form in ("all", "the", "poss")
        noun = plural(self.noun) if plural_rows else self.noun
        rel = self._relatives(plural_rows, bool(adj)) + self.tail
        owners = [o.text(rng, short=form == "poss" and i == 0) for i, o in enumerate(self.owners)]
        if form == "poss":
            if self.mine:
                head = rng.choice(["my "] if plural_only else ["all my ", "my ", "each of my "])
                plural_rows = head != "each of my "
                rel = self._relatives(plural_rows, bool(adj)) + self.tail
                of = "".join(f" of {o}" for o in owners)
                return f"{head}{adj}{plural(self.noun)}{of}{rel}", plural_rows
            first, rest = owners[0], owners[1:]
            of = "".join(f" of {o}" for o in rest)
            head = "all of " if not plural_only and rng.random() < 0.5 else ""
            return f"{head}{first}'s {adj}{noun}{of}{rel}", True
        prep = rng.choice([" of ", " for "]) if owners else ""
        of = (prep + " and ".join(owners)) if owners else ""
        if self.mine:
            of += " of mine"
        det = {"every": "every ", "all": "all ", "the": "the ", "each": "each "}[form]
        return f"{det}{adj}{noun}{of}{rel}", plural_rows


# -- sentence frames per kind ------------------------------------------------------
# Each frame is a format string; the fields each kind fills are named in its comment.
FRAMES: dict[str, list[str]] = {
    # {vp}: the verb phrase over the selection ("cancel every placed order of customer Kim")
    "lookup": ["{Vp}.", "Please {vp}.", "Could you {vp}?", "I need you to {vp}.", "{Vp}, please.",
               "Can you {vp} for me?"],
    # {sel}: the selection; {a}/{b}: the two actions on "it"; {c}/{nc}: the condition and its negation
    "conditional": ["For {sel}: if {c}, {a}; otherwise {b}.",
                    "Go through {sel}. If {c}, {a}; if not, {b}.",
                    "Look at {sel} one at a time: {a} when {c}, and {b} when {nc}.",
                    "Please handle {sel} like this: where {c}, {a}; everywhere else, {b}.",
                    "Check {sel}. Any one where {c}: {a}. The rest: {b}.",
                    "I'd like you to review {sel}; if {c}, {a}, and if {nc}, {b}."],
    # {q}: a count question's rows ("placed orders of customer Kim")
    "count": ["How many {q} are there?", "Count the {q} for me.", "What is the number of {q}?",
              "Tell me how many {q} there are.", "How many {q} do we have?"],
    # {sel}: the rows; {m}: the measure's noun
    "total": ["What is the total {m} of {sel}?", "Add up the {m} of {sel}. What do you get?",
              "What is the combined {m} across {sel}?", "Tell me the sum of the {m} over {sel}.",
              "What do {sel} come to in {m}, all together?"],
    # {sel}: the rows; {sup}: "the highest fee", "the most loyalty points"
    "most": ["Of {sel}, which one has {sup}? Answer with its id.",
             "Which of {sel} has {sup}? Give me its id.",
             "Among {sel}, find the one with {sup} and tell me its id.",
             "I need the id of whichever of {sel} has {sup}.",
             "Look through {sel}: which has {sup}? Reply with the id."],
    # {sel}; {r}: the referenced thing ("traveller"); {sup}
    "join": ["Of {sel}, which one is for the {r} with {sup}? Answer with its id.",
             "Which of {sel} belongs to the {r} with {sup}? Give me its id.",
             "Among {sel}, one is linked to the {r} with {sup}. Which one? Reply with its id.",
             "Find which of {sel} goes with the {r} that has {sup}, and tell me its id.",
             "I need the id of the one among {sel} that belongs to the {r} with {sup}."],
    # {role}: "a customer"; {vp}: the verb phrase over "my ..." rows
    "user": ["Hi, I'm {role} here. Please {vp}. Ask me for anything you need to know.",
             "Hello! I'm {role}. Could you {vp}? Ask me if you need any details.",
             "Hi there, {role} here. I'd like you to {vp}. Just ask if something is unclear.",
             "Good morning. As {role}, I'd like you to {vp}. Feel free to ask me questions.",
             "Hey, I'm {role}. Can you {vp}? I'll answer whatever you need to ask."],
    # {src}/{dst}: services; {who}: the named row; {m}: its measure; {vp}: the act over the selection
    "transfer": ["In the {src} records, look up the {m} of {who}. Then, in the {dst} records, {vp}.",
                 "Find {who}'s {m} in the {src} records, then {vp} in the {dst} records.",
                 "First check the {src} records for the {m} of {who}; then, over in the {dst} records, {vp}.",
                 "Using the {m} of {who} from the {src} records, {vp} in the {dst} records.",
                 "Look up {who} in the {src} records and note the {m}. In the {dst} records, {vp}."],
    # the grammar kinds (task_grammar.py). {pick}: "the mechanic with the most open bays"; {vp}: the act
    "chain": ["Find {pick}. Then {vp}.", "First find {pick}; once you know which one it is, {vp}.",
              "Look up {pick}, then {vp}.", "Start by finding {pick}. After that, {vp}.",
              "Work out {pick} and then {vp}.", "Which is {pick}? Find out, then {vp}."],
    "find": ["Find {pick}.", "First find {pick}.", "Start by finding {pick}.", "Look up {pick} first.",
             "Work out {pick}."],
    # {vp}: the act over the rows; {but}: the exception; {leave}: "leave them as they are"
    "exception": ["{Vp}, except {but}: {leave}.", "{Vp}, but not {but}: {leave}.",
                  "Except for {but}, {vp}.", "Please {vp}. Leave out {but}.", "{Vp}; skip {but}.",
                  "I'd like you to {vp}, with one exception: {but}. {Leave}."],
    # {sel}: the rows; {cond}: over them as a group; {then}/{other}: the two ways to act
    "aggregate": ["Look at {sel}. If {cond}, {then}; otherwise {other}.",
                  "Check {sel}: if {cond}, {then}. If not, {other}.",
                  "Consider {sel}. When {cond}, {then}; when not, {other}.",
                  "Go over {sel} together. If {cond}, {then}; else {other}.",
                  "Take {sel} as a group: if {cond}, {then}, and otherwise {other}."],
    # {vp}: the act to try; {alt}: the alternative on "that one"
    "recovery": ["Try to {vp}. Wherever the system refuses, {alt} instead.",
                 "Please {vp}. If the system refuses any of them, {alt} instead.",
                 "Attempt to {vp}; for any the system won't allow, {alt} instead.",
                 "{Vp}. Where that is not allowed, {alt} instead.",
                 "I'd like you to {vp}. Any that can't be done that way: {alt} instead."],
    # {who}; {src}/{dst}; {c}: "their loyalty points are at least 888"; {a}/{b}: acts over the rows
    "switch": ["Check {who} in the {src} records. If {c}, {a} in the {dst} records; otherwise {b} there.",
               "Look up {who} in the {src} records: if {c}, then in the {dst} records {a}; if not, {b} there.",
               "In the {src} records, see whether {c}. If so, {a} in the {dst} records; "
               "if not, {b} there.",
               "Depending on the {src} records: when {c}, {a} in the {dst} records, "
               "and otherwise {b} there.",
               "Please look at {who} in the {src} records first. {C}? Then {a} in the {dst} records. "
               "Otherwise {b} there."],
}


def frame(kind: str, rng: random.Random, **fill: str) -> tuple[str, int]:
    """One of ``kind``'s frames filled in (``Vp``/``C`` are ``vp``/``c`` capitalized), and its index."""
    i = rng.randrange(len(FRAMES[kind]))
    extra = {k[0].upper() + k[1:]: v[0].upper() + v[1:] for k, v in fill.items() if v}
    return FRAMES[kind][i].format(**fill, **extra), i
