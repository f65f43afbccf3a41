"""Compositional goal kinds from a small task grammar (issue 26), for table-backed spec families.

The kinds of :mod:`~envfactory.factory.tasks.kinds` are one sentence frame and one hop of look-up each. Here a task
is a *plan*, a small tree built from a few parts, which is evaluated against the state (to get the
reference solution) and realized in words (:func:`words`) separately:

* a **pick** is the one row of a table that is extreme by a value only a tool shows ("the
  customer with the highest loyalty points"); it fills a filter of a set or an argument of an
  action, so a later step depends on an earlier result;
* a **set** is the rows of a table that match filters (own values, a row named in words, or a
  pick); an **act** is an update operation with its arguments (values, or a pick);
* a **measure** is a number of a row (its own, or of the row it refers to, one read per row).

The kinds (:data:`KINDS`) combine them:

* ``chain``: find a pick, then act on the set that refers to it (or act with the pick as an
  argument); at difficulty 4+ two acts in turn ("..., then approve each of them");
* ``aggregate``: total, count or average a measure over a set before acting: "if ... is above N,
  A all of them; otherwise B only the one with the lowest ..." (or B all of them);
* ``exception``: every row of a set except those matching another description, or except the
  one that is extreme by a measure;
* ``recovery``: try A on every row of a set; where the tools refuse it (a precondition of the
  spec fails), B instead.

At difficulty 4+ the set of an ``aggregate``, ``exception`` or ``recovery`` task is itself named
through a pick when the spec allows it (a chain inside the other kind). Every task is kept only
if doing nothing and applying any of its writes to every row of the table both fail its check;
``metadata["plan"]`` holds the plan (:func:`solution` evaluates it on another state).
"""

from __future__ import annotations

import json
import random
import re
import zlib
from typing import Any

from envfactory.state import copy_state
from envfactory.task import Task, ToolCall
from envfactory.factory.spec_file import OperationSpec
from envfactory.factory.tasks.realize import Measure, Owner, Selection, amount, frame, plural
from envfactory.factory.tasks.draft import GOAL_MAX_TURNS, Draft
from envfactory.factory.tasks.words import fill_params, label, number_text, numeric_fields, phrase, violates

KindSynth = Any  # the synthesizer of .task_kinds (not imported: it imports this module)

__all__ = ["KINDS", "make", "solution", "words"]

KINDS = ("chain", "aggregate", "exception", "recovery")
"""The compositional kinds (listed in :data:`~envfactory.factory.spec_file.TASK_KINDS`)."""

Plan = dict[str, Any]


# -- evaluating a plan on a state ------------------------------------------------------
def _matches(row: dict, filters: dict[str, Any]) -> bool:
    return all(str(row.get(f)).lower() == str(v).lower() for f, v in filters.items())


def _pick_key(tables: dict, pick: Plan) -> str | None:
    """The one row of the pick's table (among those matching its filters) with the highest
    (or lowest) value; ``None`` on a tie or a missing number."""
    rows = {k: r for k, r in tables.get(pick["entity"], {}).items() if _matches(r, pick["filters"])}
    vals = {k: r.get(pick["field"]) for k, r in rows.items()}
    if len(vals) < 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals.values()):
        return None
    top = (max if pick["most"] else min)(vals.values())
    best = [k for k, v in vals.items() if v == top]
    return best[0] if len(best) == 1 else None


def _value(tables: dict, v: Any) -> Any:
    return _pick_key(tables, v["pick"]) if isinstance(v, dict) and "pick" in v else v


def _set_keys(tables: dict, st: Plan) -> list[str] | None:
    filters = {f: _value(tables, v) for f, v in st["filters"].items()}
    if any(v is None for v in filters.values()):
        return None
    return sorted(k for k, r in tables.get(st["entity"], {}).items() if _matches(r, filters))


def _measure(k: "KindSynth", tables: dict, e: str, key: str, m: Plan) -> Any:
    row = tables[e][key]
    if m["ref"] is None:
        return row.get(m["field"])
    return tables[k.env.entities[e].fields[m["ref"]].target].get(row.get(m["ref"]), {}).get(m["field"])


def _measure_reads(k: "KindSynth", tables: dict, e: str, keys: list[str], m: Plan) -> list[ToolCall]:
    """One read per referenced row (each once) when the measure is a number of the row referred to."""
    if m["ref"] is None:
        return []
    target = k.env.entities[e].fields[m["ref"]].target
    return [ToolCall(m["read"], {f"{target}_id": r}) for r in dict.fromkeys(tables[e][key][m["ref"]] for key in keys)]


def _extreme(k: "KindSynth", tables: dict, e: str, keys: list[str], m: Plan, most: bool) -> str | None:
    vals = {key: _measure(k, tables, e, key, m) for key in keys}
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals.values()):
        return None
    top = (max if most else min)(vals.values())
    best = [key for key, v in vals.items() if v == top]
    return best[0] if len(best) == 1 else None


def _reads(k: "KindSynth", tables: dict, st: Plan) -> list[ToolCall]:
    """The calls that find a set's rows: each pick's listing, each named row's finder, the query."""
    calls: list[ToolCall] = []
    for f, v in st["filters"].items():
        if isinstance(v, dict):
            calls.append(ToolCall(v["pick"]["query"], dict(v["pick"]["filters"])))
        elif k.env.entities[st["entity"]].fields[f].type == "ref":
            calls += k._ref_text(tables, k.env.entities[st["entity"]].fields[f].target, v)[1]
    params = k._ops[st["query"]].params
    calls.append(ToolCall(st["query"], {f: _value(tables, v) for f, v in st["filters"].items() if f in params}))
    return calls


def _act(tables: dict, act: Plan, e: str, key: str, seen: list[ToolCall]) -> ToolCall | None:
    args = {p: _value(tables, v) for p, v in act["args"].items()}
    if any(v is None for v in args.values()):
        return None
    for v in act["args"].values():  # a pick as an argument: its listing, once
        if isinstance(v, dict):
            look = ToolCall(v["pick"]["query"], dict(v["pick"]["filters"]))
            if look not in seen:
                seen.append(look)
    return ToolCall(act["op"], {f"{e}_id": key, **args})


def _stages(k: "KindSynth", tables: dict, plan: list[Plan]) -> list[tuple[Plan, dict, list[ToolCall]]] | None:
    """Each part of ``plan`` with the tables it starts from (the state after the parts before
    it) and its calls; ``None`` when a part names nothing there or its calls fail."""
    out = []
    probe = k._state_type.model_construct(tables={x: {r: dict(v) for r, v in rows.items()} for x, rows in tables.items()},
                                          counters={})
    for part in plan:
        before = {x: {r: dict(v) for r, v in rows.items()} for x, rows in probe.tables.items()}
        calls = _part_solution(k, before, part)
        if calls is None:
            return None
        paged: list[ToolCall] = []
        for c in calls:  # each listing with every page of it the part needs
            paged += [c, *k.pages(probe, c)]
            if not k.tools[c.name].invoke(probe, c.arguments).ok:
                return None
        out.append((part, before, paged))
    return out


def solution(k: "KindSynth", tables: dict, plan: list[Plan]) -> list[ToolCall] | None:
    """The reference calls of ``plan`` (its parts in turn, each on the state the parts before it
    left) on the state whose tables are ``tables``; ``None``: the plan names nothing there (a tie
    decides a pick) or its calls fail."""
    stages = _stages(k, tables, plan)
    return None if stages is None else [c for _, _, calls in stages for c in calls]


def _part_solution(k: "KindSynth", tables: dict, plan: Plan) -> list[ToolCall] | None:
    st = plan["set"]
    e = st["entity"]
    keys = _set_keys(tables, st)
    if not keys:
        return None
    calls = _reads(k, tables, st)
    plan_kind = plan["kind"]
    todo: list[tuple[Plan, list[str]]] = []
    if plan_kind == "chain":
        todo = [(a, keys) for a in plan["acts"]]
    elif plan_kind == "exception":
        ex = plan["except"]
        if "filters" in ex:
            drop = {key for key in keys if _matches(tables[e][key], ex["filters"])}
            for f, v in ex["filters"].items():
                if k.env.entities[e].fields[f].type == "ref":
                    calls[-1:-1] = k._ref_text(tables, k.env.entities[e].fields[f].target, v)[1]
        else:
            calls += _measure_reads(k, tables, e, keys, ex["measure"])
            one = _extreme(k, tables, e, keys, ex["measure"], ex["most"])
            if one is None:
                return None
            drop = {one}
        todo = [(plan["act"], [key for key in keys if key not in drop])]
    elif plan_kind == "aggregate":
        m = plan["measure"]
        calls += _measure_reads(k, tables, e, keys, m)
        vals = [_measure(k, tables, e, key, m) for key in keys]
        if m["agg"] != "count" and not all(isinstance(v, (int, float)) for v in vals):
            return None
        got = len(keys) if m["agg"] == "count" else sum(vals) if m["agg"] == "total" else sum(vals) / len(vals)
        if got > plan["above"]:
            todo = [(plan["then"], keys)]
        elif plan.get("only") is None:
            todo = [(plan["else"], keys)]
        else:
            only = plan["only"]
            calls += [c for c in _measure_reads(k, tables, e, keys, only["measure"]) if c not in calls]
            one = _extreme(k, tables, e, keys, only["measure"], only["most"])
            if one is None:
                return None
            todo = [(plan["else"], [one])]
    elif plan_kind == "recovery":
        out = []
        for key in keys:
            act = plan["try"] if _ok(k, tables, plan["try"], e, key) else plan["else"]
            out.append((act, [key]))
        todo = out
    for act, rows in todo:
        for key in rows:
            c = _act(tables, act, e, key, calls)
            if c is None:
                return None
            calls.append(c)
    return calls


def _ok(k: "KindSynth", tables: dict, act: Plan, e: str, key: str) -> bool:
    """Whether the tool accepts ``act`` on row ``key`` (refusal: a precondition fails)."""
    args = {p: _value(tables, v) for p, v in act["args"].items()}
    return k._probe(tables, act["op"], e, key, args)[0]


# -- words (one place, to be routed through the realizer later) ---------------------------
def words(k: "KindSynth", stages: list[tuple[Plan, dict]]) -> str:
    """The instruction of a plan's parts (each with the tables it starts from), in the language
    layer's words and frames (:mod:`~envfactory.factory.tasks.realize`): each part in one of its kind's frames, drawn
    from a generator seeded by the plan itself (stable across runs and hash seeds)."""
    return words_and_phrasing(k, stages)[0]


def words_and_phrasing(k: "KindSynth", stages: list[tuple[Plan, dict]], salt: str = "") -> tuple[str, int]:
    """:func:`words` and the frame of the first part (``metadata["phrasing"]``); ``salt`` (the
    task's id) lets equal plans of different tasks be said differently."""
    rng = random.Random(zlib.crc32((salt + json.dumps([p for p, _ in stages], sort_keys=True, default=str)).encode()))
    said = [_part_words(k, tables, part, rng) for part, tables in stages]
    text = said[0][0]
    for t, _ in said[1:]:
        joint = rng.choice(["After that, ", "Then, ", "Next, ", "Once that is done, ", "When you are done, "])
        text += " " + joint + (t if re.match(r"I\b", t) else t[0].lower() + t[1:])
    return text, said[0][1]


def _part_words(k: "KindSynth", tables: dict, plan: Plan, rng: random.Random) -> tuple[str, int]:
    env = k.env

    def value(v: Any) -> str:
        text = str(v).replace("_", " ")
        free = isinstance(v, str) and " " in text and "_" not in v and not re.match(r"[A-Z]", text)
        return f"'{text}'" if free else text  # free text is quoted, names are not

    def top(e: str, f: str, most: bool) -> str:
        """ "the highest fee", "the most open bays", "the fewest open bays" (the language layer's measure)."""
        m = Measure.of(f, env.entities[e].fields[f].description or "")
        if m.count:
            return f"the {'most' if most else 'fewest'} {m.noun}"
        return f"the {'highest' if most else 'lowest'} {m.noun}"

    def pick_text(p: Plan) -> str:
        among = " and".join(f" whose {f.replace('_', ' ')} is {value(v)}" for f, v in p["filters"].items())
        return f"the {label(env, p['entity'])}{among} with {top(p['entity'], p['field'], p['most'])}"

    def extreme_text(e: str, m: Plan, most: bool) -> str:
        if m["ref"] is None:
            return f"the one with {top(e, m['field'], most)}"
        target = env.entities[e].fields[m["ref"]].target
        return f"the one whose {label(env, target)} has {top(target, m['field'], most)}"

    def selection(e: str, filters: dict, found: str | None = None) -> Selection:
        ent = env.entities[e]
        owners, plain = [], []
        for f, v in filters.items():
            if isinstance(v, dict):
                owners.append(Owner(label(env, v["pick"]["entity"]), "", said=found or pick_text(v["pick"])))
            elif ent.fields[f].type == "ref":
                target = ent.fields[f].target
                text = k._ref_text(tables, target, v)[0]
                owners.append(Owner(label(env, target), text[len(label(env, target)) + 1:]))
            else:
                plain.append((f, ent.fields[f].type, v))
        return Selection.build(label(env, e), plain, owners)

    def act_text(act: Plan, target: str) -> str:
        op = k._ops[act["op"]]
        # a placeholder per picked argument, replaced by the pick's words once the act is phrased: letters
        # only, since phrasing rewrites a value's underscores ("\x00assigned_to\x00" came back as
        # "\x00assigned to\x00" and was never replaced; issue 59)
        marks = {p: f"\x00slot{chr(ord('a') + i)}\x00"
                 for i, p in enumerate(p for p, v in act["args"].items() if isinstance(v, dict))}
        text = phrase(env, op, target, {**act["args"], **marks})
        for p, mark in marks.items():
            tlabel = label(env, env.entities[op.entity].fields[p].target)
            text = text.replace(f"{tlabel} {mark}", mark).replace(mark, pick_text(act["args"][p]["pick"]))
        if "\x00" in text:
            raise ValueError(f"an unfilled placeholder in {text!r}")
        return text

    st = plan["set"]
    picked = next((v["pick"] for v in st["filters"].values() if isinstance(v, dict)), None)
    rows = selection(st["entity"], st["filters"],
                     found=None if picked is None else f"that {label(env, picked['entity'])}")
    kind = plan["kind"]
    if kind == "chain":
        target = rows.np(rng)[0]
        vp = act_text(plan["acts"][0], target)
        for act in plan["acts"][1:]:
            vp += ", then " + act_text(act, "each of them")
        if picked is None:  # the pick is an argument of the act: one request
            return frame("lookup", rng, vp=vp)
        return frame("chain", rng, pick=pick_text(picked), vp=vp)
    if picked is not None:  # a chain inside another kind: its first step said on its own
        lead, _ = frame("find", rng, pick=pick_text(picked))
    else:
        lead = ""
    if kind == "exception":
        ex = plan["except"]
        if "filters" in ex:
            e = st["entity"]
            parts = []
            for f, v in ex["filters"].items():
                if env.entities[e].fields[f].type == "ref":
                    parts.append("of " + k._ref_text(tables, env.entities[e].fields[f].target, v)[0])
                elif isinstance(v, bool):  # "those that are read", never "those whose read is True"
                    parts.append(f"that are {'' if v else 'not '}{f.replace('_', ' ')}")
                else:
                    parts.append(f"whose {f.replace('_', ' ')} is {value(v)}")
            but = "those " + " and ".join(parts)
        else:
            but = extreme_text(st["entity"], ex["measure"], ex["most"])
        leave = "leave them as they are" if "filters" in ex else "leave it as it is"
        text, i = frame("exception", rng, vp=act_text(plan["act"], rows.np(rng)[0]), but=but, leave=leave)
    elif kind == "aggregate":
        m = plan["measure"]
        n = number_text(plan["above"])
        if m["agg"] == "count":
            cond = "there is more than one of them" if plan["above"] == 1 else f"there are more than {n} of them"
        else:
            owner = st["entity"] if m["ref"] is None else env.entities[st["entity"]].fields[m["ref"]].target
            ms = Measure.of(m["field"], env.entities[owner].fields[m["field"]].description or "")
            # "their combined total", not "their total total"
            say = f"{m['agg'] if m['agg'] not in ms.noun.split() else {'total': 'combined'}.get(m['agg'], 'mean')} {ms.noun}"
            limit = n if ms.count else amount(ms, plan["above"])
            cond = f"their {say} is above {limit}" if m["ref"] is None else \
                f"the {say} of their {plural(label(env, owner))} is above {limit}"
        only = plan.get("only")
        other = "all of them" if only is None else (
            "only " + extreme_text(st["entity"], only["measure"], only["most"]))
        text, i = frame("aggregate", rng, sel=rows.np(rng)[0], cond=cond,
                        then=act_text(plan["then"], "each of them"), other=act_text(plan["else"], other))
    else:  # recovery
        text, i = frame("recovery", rng, vp=act_text(plan["try"], rows.np(rng)[0]),
                        alt=act_text(plan["else"], "that one"))
    return (lead + " " + text if lead else text), i


# -- building plans ------------------------------------------------------------------------
def _queries(k: "KindSynth", e: str) -> list[OperationSpec]:
    return [op for op in k.env.operations if op.entity == e and op.kind == "query"]


def _picks(k: "KindSynth", tables: dict, target: str, rng: random.Random) -> list[Plan]:
    """Picks over ``target`` that name one row: by each number, highest or lowest, over the
    whole table (a query called with no filter lists it) or one enum value of it."""
    out = []
    qs = _queries(k, target)
    rows = tables.get(target, {})
    for h in numeric_fields(k.env, target):
        for most in (True, False):
            for q in qs:
                options: list[dict] = [{}]
                for p in q.params:
                    if k.env.entities[target].fields[p].type == "enum":
                        options += [{p: v} for v in sorted({r.get(p) for r in rows.values()}, key=str) if v is not None]
                for filt in options:
                    pick = {"entity": target, "query": q.name, "filters": filt, "field": h, "most": most}
                    if _pick_key(tables, pick) is not None:
                        out.append(pick)
                break  # one listing is enough
    rng.shuffle(out)
    return out


def _pick_sets(k: "KindSynth", tables: dict, e: str, rng: random.Random, ok: Any) -> list[Plan]:
    """Sets of ``e`` named through a pick: the rows that refer to the picked row (and maybe
    share one more value), each passing ``ok``."""
    ent = k.env.entities[e]
    out = []
    for q in _queries(k, e):
        # a reference the query cannot filter by is filtered by the agent from the listing
        for r in [p for p, fs in ent.fields.items() if fs.type == "ref"]:
            for pick in _picks(k, tables, ent.fields[r].target, rng)[:6]:
                extra = [p for p in q.params if p != r and p != "name" and ent.fields[p].type in ("enum", "bool")]
                if r not in q.params and not extra:
                    continue  # the listing must narrow the rows somewhat
                for more in [None, *extra]:
                    filters: dict[str, Any] = {r: {"pick": pick}}
                    if more is not None:
                        chosen = _pick_key(tables, pick)
                        vals = sorted({str(row.get(more)) for row in tables[e].values() if row.get(r) == chosen})
                        if not vals:
                            continue
                        v = rng.choice(vals)
                        filters[more] = next(row[more] for row in tables[e].values() if str(row.get(more)) == v)
                    st = {"entity": e, "query": q.name, "filters": filters}
                    keys = _set_keys(tables, st)
                    if keys and len(keys) < len(tables[e]) and all(ok(key) for key in keys) and \
                            _rivalled(tables, st, r, _pick_key(tables, pick), ok):
                        out.append(st)
    rng.shuffle(out)
    return out


def _rivalled(tables: dict, st: Plan, r: str, chosen: str | None, ok: Any) -> bool:
    """Whether another row of the pick's table, had it been picked, would name rows the act
    applies to as well: the pick decides which rows are acted on."""
    pick = st["filters"][r]["pick"]
    rest = {f: v for f, v in st["filters"].items() if f != r}
    named: dict[Any, list[str]] = {}
    for key, row in tables[st["entity"]].items():
        if _matches(row, rest) and row.get(r) not in (None, chosen) and \
                _matches(tables[pick["entity"]].get(row[r], {}), pick["filters"]):
            named.setdefault(row[r], []).append(key)
    return any(all(ok(key) for key in keys) for keys in named.values())


def _plain_set(k: "KindSynth", tables: dict, e: str, want: int, rng: random.Random, ok: Any) -> Plan | None:
    sel = k._selection(tables, e, want, rng, ok=lambda key, r: ok(key))
    return None if sel is None else {"entity": e, "query": sel["op"].name, "filters": dict(sel["filters"])}


def _sets(k: "KindSynth", tables: dict, e: str, d: int, rng: random.Random, ok: Any, *, pick: bool) -> list[Plan]:
    """Candidate sets of ``e``: through a pick first when ``pick``, else a plain selection."""
    out = _pick_sets(k, tables, e, rng, ok)[:4] if pick else []
    plain = _plain_set(k, tables, e, d + 1, rng, ok)
    return out + ([plain] if plain else [])


def _fills(k: "KindSynth", op: OperationSpec, rng: random.Random, tables: dict) -> Plan | None:
    """An act of ``op``: its own values, or a pick for its one reference parameter."""
    ent = k.env.entities[op.entity]
    refs = [p for p in op.params if ent.fields[p].type == "ref"]
    if not refs:
        args = fill_params(k.env, op, rng)
        return None if args is None else {"op": op.name, "args": args}
    if len(refs) > 1:
        return None
    rest = OperationSpec(name=op.name, kind=op.kind, entity=op.entity, description=op.description,
                         params=[p for p in op.params if p not in refs])
    args = fill_params(k.env, rest, rng)
    picks = _picks(k, tables, ent.fields[refs[0]].target, rng)
    if args is None or not picks:
        return None
    return {"op": op.name, "args": {**args, refs[0]: {"pick": picks[0]}}}


def _allowed(k: "KindSynth", tables: dict, act: Plan, e: str, key: str) -> bool:
    """``act`` succeeds on ``key``, changes it, and no policy forbids it."""
    args = {p: _value(tables, v) for p, v in act["args"].items()}
    if any(v is None for v in args.values()):
        return False
    return k._applies(tables, k._ops[act["op"]], key, args) and \
        not any(violates(p, act["op"], tables[e][key]) for p in k.policies)


def _measures(k: "KindSynth", e: str) -> list[Plan]:
    return [{"ref": ref, "read": None if read is None else read.name, "field": g} for ref, read, g in k._measures(e)]


def _chain(k: "KindSynth", tables: dict, d: int, rng: random.Random) -> Plan | None:
    for e in k._entities(rng):
        acts = k._acts(e)
        for op in rng.sample(acts, len(acts)):
            act = _fills(k, op, rng, tables)
            if act is None:
                continue
            has_pick = any(isinstance(v, dict) for v in act["args"].values())
            ok = lambda key: _allowed(k, tables, act, e, key)  # noqa: E731
            for st in _sets(k, tables, e, d, rng, ok, pick=True):
                picked = any(isinstance(v, dict) for v in st["filters"].values())
                if not (picked or has_pick):
                    continue
                plan: Plan = {"kind": "chain", "set": st, "acts": [act]}
                if d >= 4:  # a second act on the same rows, after the first
                    for op2 in rng.sample(acts, len(acts)):
                        act2 = _fills(k, op2, rng, tables) if op2.name != op.name else None
                        if act2 is not None:
                            plan["acts"] = [act, act2]
                            if _replays(k, tables, plan):
                                break
                    else:
                        plan["acts"] = [act]
                return plan
    return None


def _replays(k: "KindSynth", tables: dict, plan: Plan) -> bool:
    return solution(k, tables, [plan]) is not None


def _exception(k: "KindSynth", tables: dict, d: int, rng: random.Random) -> Plan | None:
    for e in k._entities(rng):
        ent = k.env.entities[e]
        for op in rng.sample(k._acts(e), len(k._acts(e))):
            act = _fills(k, op, rng, tables)
            if act is None:
                continue
            ok = lambda key: _allowed(k, tables, act, e, key)  # noqa: E731
            for st in _sets(k, tables, e, d, rng, ok, pick=d >= 4 and rng.random() < 0.7):
                keys = _set_keys(tables, st) or []
                if len(keys) < 3:
                    continue
                options: list[dict] = []
                for f, fs in ent.fields.items():
                    if f in st["filters"] or f == "name" or fs.type not in ("enum", "str", "bool", "ref"):
                        continue
                    for v in sorted({tables[e][key].get(f) for key in keys}, key=str):
                        drop = [key for key in keys if tables[e][key].get(f) == v]
                        if v is not None and 0 < len(drop) < len(keys) - 1:
                            if fs.type == "ref" and not k._ref_text(tables, fs.target, v)[1]:
                                continue  # the excepted row is named in words, found by its finder
                            if k._numbered(tables, e, f, v):
                                continue  # never "except those of event Film Club 5"
                            options.append({"filters": {f: v}})
                for m in _measures(k, e):
                    for most in (True, False):
                        if _extreme(k, tables, e, keys, m, most) is not None:
                            options.append({"measure": m, "most": most})
                if options:
                    return {"kind": "exception", "set": st, "except": rng.choice(options), "act": act}
    return None


def _aggregate(k: "KindSynth", tables: dict, d: int, rng: random.Random) -> Plan | None:
    for e in k._entities(rng):
        acts = k._acts(e)
        if len(acts) < 2:
            continue
        for a, b in rng.sample([(x, y) for x in acts for y in acts if x is not y], min(6, len(acts) * (len(acts) - 1))):
            fa, fb = _fills(k, a, rng, tables), _fills(k, b, rng, tables)
            if fa is None or fb is None:
                continue
            ok = lambda key: _allowed(k, tables, fa, e, key) and _allowed(k, tables, fb, e, key)  # noqa: E731
            for st in _sets(k, tables, e, d, rng, ok, pick=d >= 4 and rng.random() < 0.7):
                keys = _set_keys(tables, st) or []
                if len(keys) < 2:
                    continue
                forms = [{"agg": "count", "ref": None, "read": None, "field": None}]
                for m in _measures(k, e):
                    if all(isinstance(_measure(k, tables, e, key, m), (int, float)) for key in keys):
                        forms += [{**m, "agg": "total"}, {**m, "agg": "average"}]
                m = rng.choice(forms)
                vals = [_measure(k, tables, e, key, m) for key in keys] if m["agg"] != "count" else []
                got = len(keys) if m["agg"] == "count" else sum(vals) if m["agg"] == "total" else sum(vals) / len(vals)
                # the threshold lands on either side of the value, never on it
                step = max(1, int(abs(got) * 0.25)) if m["agg"] != "count" else 1
                above = int(got) - step if rng.random() < 0.5 else int(got) + step
                if m["agg"] == "count":
                    above = max(1, above)  # ("more than 0": the rows are there, so no decision)
                if above == got or (above <= 0 and m["agg"] != "count" and min(vals) >= 0):
                    continue  # (an average of counts "above 0" decides nothing either)
                only = None
                if rng.random() < 0.5:
                    for mm in rng.sample(_measures(k, e), len(_measures(k, e))):
                        most = rng.random() < 0.5
                        if _extreme(k, tables, e, keys, mm, most) is not None:
                            only = {"measure": mm, "most": most}
                            break
                return {"kind": "aggregate", "set": st, "measure": m, "above": above, "then": fa, "else": fb,
                        "only": only}
    return None


def _recovery(k: "KindSynth", tables: dict, d: int, rng: random.Random) -> Plan | None:
    for e in k._entities(rng):
        acts = [op for op in k._acts(e) if op.preconditions]
        others = k._acts(e)
        for a in rng.sample(acts, len(acts)):
            fa = _fills(k, a, rng, tables)
            if fa is None:
                continue
            for b in rng.sample(others, len(others)):
                fb = _fills(k, b, rng, tables) if b is not a else None
                if fb is None:
                    continue

                def ok(key: str) -> bool:
                    if _ok(k, tables, fa, e, key):
                        return _allowed(k, tables, fa, e, key)
                    return _allowed(k, tables, fb, e, key)

                for st in _sets(k, tables, e, d, rng, ok, pick=d >= 4 and rng.random() < 0.7):
                    keys = _set_keys(tables, st) or []
                    tried = [_ok(k, tables, fa, e, key) for key in keys]
                    if any(tried) and not all(tried):
                        return {"kind": "recovery", "set": st, "try": fa, "else": fb}
    return None


_BUILDERS = {"chain": _chain, "aggregate": _aggregate, "exception": _exception, "recovery": _recovery}


# -- the task --------------------------------------------------------------------------------
def make(k: "KindSynth", kind: str, initial: Any, difficulty: int, rng: random.Random, task_id: str) -> Task | None:
    """One ``kind`` task on ``initial`` (``None`` when the state gives none, or when doing
    nothing or applying one of its writes to every row would pass its check)."""
    k._memo = {}
    tables = json.loads(initial.model_dump_json())["tables"]
    first = _BUILDERS[kind](k, tables, difficulty, rng)
    if first is None:
        return None
    plan = [first]
    # at difficulty 4+ the task goes on: one more part (two at 5, sometimes), of any kind, on the
    # state the earlier parts leave
    more = 0 if difficulty < 4 else 1 + (difficulty == 5 and rng.random() < 0.4)
    for _ in range(more):
        stages = _stages(k, tables, plan)
        if stages is None:
            return None
        after = _after(k, tables, stages)
        k._memo = {}
        for nxt in rng.sample(KINDS, len(KINDS)):
            part = _BUILDERS[nxt](k, after, 3, rng)
            if part is not None and _stages(k, tables, [*plan, part]) is not None:
                plan.append(part)
                break
    stages = _stages(k, tables, plan)
    if stages is None:
        return None
    final_tables = _after(k, tables, stages)
    for part, before, _ in stages:  # an act must not move what decided a pick on the way
        if any(_pick_key(final_tables, p) != _pick_key(before, p) for p in _picks_in(part)):
            return None
    calls = [c for _, _, cs in stages for c in cs]
    if len(calls) > max(k.env.max_turns, GOAL_MAX_TURNS) - 2:
        return None  # the reference and the answer must fit the turn limit with a turn to spare
    parts = [p["kind"] for p in plan] + (["pick"] if _picks_in(plan) else [])
    text, phrasing = words_and_phrasing(k, [(p, b) for p, b, _ in stages], salt=task_id)
    draft = Draft(kind, text, calls, guard=sorted({p["set"]["entity"] for p in plan}),
                   meta={"plan": plan, "grammar": parts, "phrasing": phrasing}, paged=True)
    task = k._finish(draft, initial, difficulty, task_id, accept=False)
    if task is None or _shortcut_passes(k, task):
        return None
    return task if k.accept(task) else None


def _after(k: "KindSynth", tables: dict, stages: list) -> dict:
    probe = k._state_type.model_construct(tables={x: {r: dict(v) for r, v in rows.items()} for x, rows in tables.items()},
                                          counters={})
    for _, _, calls in stages:
        for c in calls:
            k.tools[c.name].invoke(probe, c.arguments)
    return {x: {r: dict(v) for r, v in rows.items()} for x, rows in probe.tables.items()}


def _picks_in(node: Any) -> list[Plan]:
    if isinstance(node, dict):
        return [node["pick"]] if "pick" in node else [p for v in node.values() for p in _picks_in(v)]
    if isinstance(node, list):
        return [p for v in node for p in _picks_in(v)]
    return []


def _shortcut_passes(k: "KindSynth", task: Task) -> bool:
    """Whether applying one of the reference's writes (its operation and arguments) to every
    row of its table passes the check: then the task does not test which rows."""
    writes = {}
    for c in task.solution:
        op = k._ops.get(c.name)
        if op is not None and op.kind == "update":
            args = {a: v for a, v in c.arguments.items() if a != f"{op.entity}_id"}
            writes[(c.name, json.dumps(args, sort_keys=True))] = (op, args)
    for op, args in writes.values():
        s: Any = copy_state(task.initial_state)
        for key in sorted(s.tables.get(op.entity, {})):
            k.tools[op.name].invoke(s, {f"{op.entity}_id": key, **args})
        if task.check is not None and task.check(s):
            return True
    return False
