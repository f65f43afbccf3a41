"""How a table-backed spec file reads in words and rules, for goal-level tasks
(:mod:`~envfactory.factory.tasks.kinds`): entity labels, the look-ups that find a row by name, whether a row is a
person (who can play the simulated user), the phrasing of an operation applied to some rows,
and the written policies (given in the file, or derived from its operations).
"""

from __future__ import annotations

import random
import re
from typing import Any

from envfactory.factory.tasks.arguments import FRESH_WORDS
from envfactory.factory.spec_file import EnvFile, OperationSpec, PolicyRule

__all__ = ["phrase", "with_finders", "default_policies", "policy_text", "violates", "label", "finder",
           "is_person", "numeric_fields", "fill_params", "number_text", "Slot", "transferable", "sensible"]


def label(env: EnvFile, e: str) -> str:
    return (env.entities[e].label or e).replace("_", " ")


def finder(env: EnvFile, e: str) -> OperationSpec | None:
    """A query on ``e`` that filters by name (how a row named in words is found)."""
    ent = env.entities[e]
    if "name" not in ent.fields or ent.fields["name"].type != "str":
        return None
    return next((op for op in env.operations if op.entity == e and op.kind == "query" and "name" in op.params), None)


_PEOPLE = frozenset("""
    adopter agent applicant athlete attendee author backer borrower buyer caller camper client contact
    courier customer developer diner doctor donor driver employee farmer guest homeowner landlord lawyer
    learner member mechanic nurse operator owner parent participant passenger patient patron person
    player policyholder reader renter resident rider seller shopper student subscriber teacher tenant
    traveler traveller user visitor volunteer
""".split())


def is_person(env: EnvFile, e: str) -> bool:
    """Whether rows of ``e`` are people who can play the user: the spec's ``person`` flag, else its
    name or label names a kind of person (a room or an event never says "Hi, I'm ...")."""
    ent = env.entities[e]
    if ent.person is not None:
        return ent.person
    words = set(e.lower().split("_")) | set((ent.label or "").lower().split())
    return bool(words & _PEOPLE)


def numeric_fields(env: EnvFile, e: str) -> list[str]:
    return [f for f, fs in env.entities[e].fields.items() if fs.type in ("int", "float")]


def fill_params(env: EnvFile, op: OperationSpec, rng: random.Random) -> dict[str, Any] | None:
    """Values for an update's own parameters (the same for every row it is applied to)."""
    ent = env.entities[op.entity]
    args: dict[str, Any] = {}
    for p in op.params:
        f, gen = ent.fields[p], ent.seed.fields.get(p)
        if f.type == "ref":
            return None
        if f.type == "enum":
            args[p] = rng.choice(f.choices)
        elif f.type == "bool":
            args[p] = rng.random() < 0.5
        elif f.type == "str":
            args[p] = rng.choice(list(gen.choice) if gen is not None and gen.choice else
                                 f.examples or free_text(p, f.description))
        else:
            lo, hi = gen.range if gen is not None and gen.range else (f.min or 1, f.max or 10)
            v = rng.randint(int(lo), int(hi))
            args[p] = float(v) if f.type == "float" else v
    return args


# what a task writes into a free-text field that neither seeds nor lists examples, by the field's
# words: a short note a person would write, never a filler word ("with the reason 'juniper'")
_FREE_TEXT: dict[str, list[str]] = {
    "reason": ["waiting on paperwork", "requested by the customer", "duplicate entry", "details still missing",
               "under review by the manager", "amount looks wrong"],
    "resolution": ["fixed after a restart", "settings corrected", "replaced the faulty part",
                   "resolved on the phone", "duplicate of an earlier report", "patched and redeployed"],
    "note": ["customer called to confirm", "follow up next week", "checked by the supervisor",
             "waiting for a reply", "handled at the front desk", "discussed on the phone"],
    "comment": ["looks good", "please double-check the dates", "approved after review", "needs a second look"],
    "summary": ["short call about next steps", "agreed on a follow-up meeting", "sent the updated quote"],
    "message": ["your request has been received", "please get in touch with us", "thanks for your patience"],
}


def free_text(p: str, description: str = "", fallback: list[str] | None = None) -> list[str]:
    """Values for a free-text parameter with no seeded choices or ``examples``: plausible short
    notes by the parameter's words (a reason, a resolution, a note, ...), else ``fallback`` (the
    first fresh words)."""
    words = set(re.findall(r"[a-z]+", f"{p.replace('_', ' ')} {description}".lower()))
    for key, values in _FREE_TEXT.items():
        if key in words or key + "s" in words:
            return list(values)
    return list(FRESH_WORDS[:10] if fallback is None else fallback)


_POSS = {"it": "its", "them": "their"}  # a pronoun target's possessive


class Slot(str):
    """Words standing for a value the agent finds first ("the balance due you found"). They are said
    on their own, never inside a template's formatting of a value: "$the annual income you found",
    "at the capacity you found:00", "the open cases you found days" (issue 59)."""


# words that may follow a value in a template without belonging to it ("rate it {rating} out of 5")
_FREE_AFTER = frozenset("in on at for to from with by and or of as out into then".split())


def _slot_fits(template: str, p: str) -> bool:
    """Whether every ``{p}`` of ``template`` stands on its own: no currency sign, quote, hyphen or
    time format glued to it, and no unit word after it."""
    spots = list(re.finditer(r"\{" + re.escape(p) + r"\}", template))
    for m in spots:
        before, after = template[:m.start()], template[m.end():]
        if before and not before[-1].isspace():
            return False
        nxt = re.match(r"(?:$|[,.;:!?](?:\s|$)|\s+([A-Za-z][\w()'-]*))", after)
        if nxt is None or (nxt.group(1) is not None and nxt.group(1) not in _FREE_AFTER):
            return False
    return bool(spots)


def _fit_slot(template: str, p: str) -> str | None:
    """``template`` with the formatting around ``{p}`` undone so that a :class:`Slot` stands on its
    own there ("a ${credit} credit" -> "a credit of {credit}", "${fee}" -> "{fee}", "'{note}'" ->
    "{note}", "{hour}:00" -> "{hour}", "{nights} nights" -> "{nights}"); ``None`` where it cannot."""
    f = re.escape("{" + p + "}")
    t = re.sub(rf"\ba \$?{f} ([a-z]+)\b(?! of\b)", rf"a \1 of {{{p}}}", template)
    t = re.sub(rf"\${f}|'{f}'", "{" + p + "}", t)
    t = re.sub(rf"{f}:00\b", "{" + p + "}", t)

    def unit(m: re.Match) -> str:
        word = m.group(1)
        plural = word.endswith("(s)") or word.endswith("s") and not word.endswith("ss")
        return m.group(0) if word in _FREE_AFTER or not (plural or word in _UNIT_WORDS) else "{" + p + "}"

    t = re.sub(rf"{f} ([a-z]+(?:\(s\))?)(?![\w-])", unit, t)
    return t if _slot_fits(t, p) else None


_UNIT_WORDS = frozenset("kg g ml km dollars".split())


_UP = frozenset("extend increase raise lengthen boost".split())
_DOWN = frozenset("reduce decrease lower shorten cut trim".split())


def sensible(op: OperationSpec, row: dict[str, Any], args: dict[str, Any]) -> bool:
    """Whether the words that say ``op`` fit what it does to ``row``: an act said with "extend",
    "raise", ... sets its number field above the row's value, one said with "reduce", "lower", ...
    below it ("extend the stay ... to 1 night" shortened a 3-night stay; issue 59). The verb is the
    instruction template's first word, else the operation name's."""
    verb = (op.instruction.split() or [""])[0].lower() if op.instruction else op.name.split("_")[0]
    if verb not in _UP and verb not in _DOWN:
        return True
    for p, v in args.items():
        now = row.get(p)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(now, bool) \
                or not isinstance(now, (int, float)) or any(e.field == p for e in op.effects):
            continue
        if (verb in _UP and v <= now) or (verb in _DOWN and v >= now):
            return False
    return True


_MONEYISH = frozenset("cost price fee fare amount total budget income balance rent charge payment salary "
                      "gross wage deductible premium fine estimate value".split())


def transferable(env: EnvFile, src: str, g: str, dst: str, p: str) -> bool:
    """Whether the value of field ``g`` of ``src`` makes sense as parameter ``p`` of ``dst``: the
    same kind of thing (money for money, days for days, a street for an address), not just the same
    type ("set the stock of each drug to the slots you found"; issue 59)."""
    from envfactory.factory.tasks.realize import Measure

    fg, fp = env.entities[src].fields[g], env.entities[dst].fields[p]
    if fg.type != fp.type:
        return False
    gw, pw = set(g.split("_")), set(p.split("_"))
    if fg.type == "str":
        return bool(gw & pw)
    mg, mp = Measure.of(g, fg.description or ""), Measure.of(p, fp.description or "")

    def money(m: Measure, words: set[str]) -> bool:
        return m.is_money or bool(words & _MONEYISH) and not m.unit and not m.count

    if money(mg, gw) or money(mp, pw):
        return money(mg, gw) and money(mp, pw)
    if mg.unit or mp.unit:
        return mg.unit == mp.unit
    return mg.noun.split()[-1] == mp.noun.split()[-1]


def phrase(env: EnvFile, op: OperationSpec, target: str, args: dict[str, Any]) -> str:
    """What applying ``op`` to ``target`` (words: "it", "every order whose ...") means, in
    the words of the operation's instruction template, else in words made from its name
    ("send_to_repair" -> "send <target> to repair", "change_cabin" -> "change the cabin of
    <target> to <value>"; "its cabin" when the target is "it")."""
    noun = label(env, op.entity)
    idp = "{" + f"{op.entity}_id" + "}"
    values = {k: ("none" if v is None else v.replace("_", " ") if isinstance(v, str) else v) for k, v in args.items()}
    template = op.instruction
    for k in [k for k, v in args.items() if isinstance(v, Slot)]:
        template = template and _fit_slot(template, k)  # a value found first, said on its own
    if template and idp in template:
        # the template's name for the row goes with its id ("leave request {leave_id}" of a leave)
        text = re.sub(rf"(?:\b{re.escape(noun)}(?:\s+[a-z]+)?\s+|\b{re.escape(op.entity)}\s+)?{re.escape(idp)}",
                      target.replace("\\", "\\\\"), template)
        try:
            text = text.format(**values)
        except (KeyError, IndexError, ValueError):
            pass
        else:
            if target in _POSS:  # "the refills of it" -> "its refills", "... of them" -> "their ..."
                text = re.sub(rf"\bthe ([a-z][a-z ]*?) (?:of|on|for) {target}\b", rf"{_POSS[target]} \1", text)
            return _agree(text)
    return _from_name(env, op, target, args)


def _agree(text: str) -> str:
    """A template's numbers agree with their nouns: "1 packs" -> "1 pack", "3 night(s)" -> "3 nights"
    ("set the refills of it to 2" became "set its refills to 2" before)."""
    import inflection

    text = re.sub(r"\b(\d+(?:\.\d+)?) ([a-z]+)\(s\)", lambda m: f"{m[1]} {m[2] if m[1] == '1' else m[2] + 's'}", text)
    # "1 packs" -> "1 pack", "1 labor hours" -> "1 labor hour" (a noun of two words)
    def one(m: re.Match) -> str:
        first, noun = m[1], m[2]
        if first and first.strip() in _FUNCTION_WORDS:
            return m[0]
        single = inflection.singularize(noun)
        return m[0] if single == noun else f"1 {first}{single}"

    return re.sub(r"(?<![\w.,$-])1 ((?:[a-z]+ )?)([a-z]+s)\b", one, text)


_FUNCTION_WORDS = frozenset("of is was has and or in on at for to per by with as than from into day time more less "
                            "every each its their this that".split())


def _from_name(env: EnvFile, op: OperationSpec, target: str, args: dict[str, Any]) -> str:
    from envfactory.factory.tasks.realize import Measure, amount  # the language layer (imported on first use)

    def poss(thing: str) -> str:
        return f"{_POSS[target]} {thing}" if target in _POSS else f"the {thing} of {target}"

    def value(p: str, v: Any) -> str:
        fs = env.entities[op.entity].fields.get(p)
        if isinstance(v, str) and fs is not None and fs.type in ("int", "float"):
            return v                                    # words standing for a number: "the miles you found"
        if isinstance(v, bool) or v is None:
            return "none" if v is None else ("yes" if v else "no")
        if fs is not None and fs.type in ("int", "float"):
            return amount(Measure.of(p, fs.description or ""), v)
        return str(v).replace("_", " ")

    words = op.name.split("_")
    ent_words = op.entity.split("_")
    verb, rest = words[0], words[1:]
    left = dict(args)
    if rest[-len(ent_words):] == ent_words:           # cancel_meeting, refund_ticket
        rest = rest[:-len(ent_words)]
        out = " ".join([verb, *rest, target]) if rest else f"{verb} {target}"
    elif verb in ("mark", "flag") and rest:             # mark_attended: "mark <t> as attended"
        out = f"{verb} {target} as {' '.join(rest)}"
    elif verb == "make" and rest:                       # make_available
        out = f"make {target} {' '.join(rest)}"
    elif rest[:1] == ["to"]:                            # send_to_repair
        out = f"{verb} {target} to {' '.join(rest[1:])}"
    elif rest in (["in"], ["out"], ["up"], ["off"]):    # check_in: "check it in", "check in every ticket ..."
        # (a long object goes after the particle: "check every ticket of event Food Fair in" met a
        # frame's "in the events records" as "Food Fair in in the events records")
        out = f"{verb} {target} {rest[0]}" if target in _POSS else f"{verb} {rest[0]} {target}"
    elif len(left) == 1 and rest[-len(next(iter(left)).split("_")):] == next(iter(left)).split("_"):
        # change_cabin(cabin), set_driver_status(status): "change its cabin to business"
        p = next(iter(left))
        v = left.pop(p)
        if isinstance(v, bool):
            return f"{verb} {target} as {'' if v else 'not '}{p.replace('_', ' ')}"
        prep = "as" if verb in ("record", "log") else "to"
        return f"{verb} {poss(p.replace('_', ' '))} {prep} {value(p, v)}"
    elif verb == "add" and rest:                        # add_miles: "add miles to <t>"
        out = f"add {' '.join(rest)} to {target}"
    elif rest and len(left) == 1 and isinstance(next(iter(left.values())), (int, float)) \
            and not isinstance(next(iter(left.values())), bool):   # extend_stay(nights): "extend its stay to 4 nights"
        p, v = left.popitem()
        return f"{verb} {poss(' '.join(rest))} to {value(p, v)}"
    elif rest:                                          # freeze_membership: "freeze its membership"
        out = f"{verb} {poss(' '.join(rest))}"
    else:
        out = f"{verb} {target}"
    for p, v in left.items():
        if isinstance(v, bool):
            out += f", making it {'' if v else 'not '}{p.replace('_', ' ')}"
        else:
            out += f", setting {'its' if target == 'it' else 'the'} {p.replace('_', ' ')} to {value(p, v)}"
    return out


def with_finders(env: EnvFile) -> EnvFile:
    """``env`` plus the look-ups a goal-level task needs: a ``find_<entity>s(name)`` query for
    every entity with a ``name`` field and no query by name (rows named in words, as people
    and products are, can be found), and a ``list_<entity>s`` query over the reference and
    enum fields of every entity that operations change but no query lists."""
    names = {op.name for op in env.operations}
    extra = []
    for e, ent in env.entities.items():
        if finder(env, e) is None and "name" in ent.fields and ent.fields["name"].type == "str":
            if f"find_{e}s" not in names:
                extra.append(OperationSpec(name=f"find_{e}s", kind="query", entity=e, params=["name"],
                                           description=f"Find {label(env, e)}s by name."))
        changed = any(op.entity == e and op.kind == "update" for op in env.operations)
        listed = any(op.entity == e and op.kind == "query" and set(op.params) - {"name"} for op in env.operations)
        params = [f for f, fs in ent.fields.items() if fs.type in ("ref", "enum", "bool")][:3]
        if changed and not listed and params and f"list_{e}s" not in names:
            extra.append(OperationSpec(name=f"list_{e}s", kind="query", entity=e, params=params,
                                       description=f"List {label(env, e)}s matching the filters."))
    return env.model_copy(update={"operations": list(env.operations) + extra}) if extra else env


def default_policies(env: EnvFile) -> list[PolicyRule]:
    """Up to two rules derived from the operations: an update with no parameters of its own,
    on an entity with a number field, must not be applied to rows whose number is above the
    middle of that field's seeded range."""
    rules: list[PolicyRule] = []
    used: set[str] = set()
    for op in env.operations:
        if op.kind != "update" or op.params or op.entity in used or not op.preconditions:
            continue
        ent = env.entities[op.entity]
        for g in numeric_fields(env, op.entity):
            if any(e.field == g for e in op.effects) or any(c.field == g for c in op.preconditions):
                continue
            gen = ent.seed.fields.get(g)
            if gen is None or not gen.range:
                continue
            lo, hi = gen.range
            if hi - lo < 2:
                continue
            rules.append(PolicyRule(operation=op.name, field=g, above=float(int((lo + hi) / 2))))
            used.add(op.entity)
            break
        if len(rules) == 2:
            break
    return rules


def policy_text(env: EnvFile, rule: PolicyRule) -> str:
    if rule.text:
        return rule.text
    from envfactory.factory.tasks.realize import Measure, a, rel_compare

    op = next(o for o in env.operations if o.name == rule.operation)
    noun = label(env, op.entity)
    if rule.above is not None:
        fs = env.entities[op.entity].fields[rule.field]
        cond = rel_compare(Measure.of(rule.field, fs.description or ""), "above", rule.above)
    else:
        cond = f"whose {rule.field.replace('_', ' ')} is {str(rule.equals).replace('_', ' ')}"
    return f"Never {phrase(env, op, f'{a(noun)} {cond}', {})}, even when asked: leave it as it is and say why."


def number_text(x: Any) -> str:
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def violates(rule: PolicyRule, op: str, row: dict[str, Any]) -> bool:
    if rule.operation != op:
        return False
    v = row.get(rule.field)
    if rule.above is not None:
        return isinstance(v, (int, float)) and v > rule.above
    return v == rule.equals
