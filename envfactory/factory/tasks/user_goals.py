"""What a simulated user with a goal brings to a ``user`` task (issue 26, tau2-style): a persona
made from their own row, the goal in their own words, a slip they correct, and which actions
they must confirm first. The scripted user that plays it is :func:`envfactory.users.user_turn`.

An action is **irreversible** (the user must confirm it) when it is a ``kind: delete``, or an
update that sets an enum field (a status) to a *terminal* value: one no other update of the
entity moves a row out of (no other update that sets that field accepts a row holding the
value). In the retail spec, ``cancel_order`` (-> cancelled) and ``refund_order`` (-> refunded)
are irreversible; ``ship_order`` (-> shipped, which ``mark_delivered`` moves on) is not.
"""

from __future__ import annotations

import random
from typing import Any

from envfactory.factory.tasks.realize import a as _a, plural
from envfactory.factory.spec_file import EnvFile, OperationSpec
from envfactory.factory.tasks.words import label

__all__ = ["irreversible", "persona", "misspell"]


def irreversible(env: EnvFile, op: OperationSpec) -> bool:
    """Whether ``op`` cannot be undone by another operation (see the module docstring)."""
    if op.kind == "delete":
        return True
    if op.kind != "update":
        return False
    fields = env.entities[op.entity].fields
    for f, v in op.set.items():
        if f not in fields or fields[f].type != "enum":
            continue
        out = [o for o in env.operations if o.entity == op.entity and o.kind == "update" and o.name != op.name
               and ((f in o.set and o.set[f] != v) or f in o.params)]
        if not any(_accepts(o, f, v) for o in out):
            return True
    return False


def _accepts(op: OperationSpec, f: str, v: Any) -> bool:
    """Whether ``op``'s preconditions on its own row allow field ``f`` to hold ``v``."""
    for c in op.preconditions:
        if c.on != "row" or c.field != f:
            continue
        for kind, operand in c.conditions():
            if (kind == "equals" and operand != v) or (kind == "not_equals" and operand == v) \
                    or (kind == "in" and v not in operand) or (kind == "not_in" and v in operand):
                return False
    return True


def persona(env: EnvFile, tables: dict, person: str, key: str, rows: str, ref: str) -> str:
    """Who the user is, from their row's own fields: "a gold customer with 3 orders", "an active
    subscriber on the Smart 25 plan with 2 tickets" (never their name)."""
    row = tables[person][key]
    ent = env.entities[person]
    adjectives = [str(row[f]).replace("_", " ") for f, fs in ent.fields.items()
                  if fs.type == "enum" and row.get(f) is not None]
    on = [f" on the {tables[fs.target][row[f]]['name']} {label(env, fs.target)}" for f, fs in ent.fields.items()
          if fs.type == "ref" and isinstance(tables.get(fs.target, {}).get(row.get(f), {}).get("name"), str)]
    n = sum(1 for r in tables[rows].values() if r.get(ref) == key)
    noun = label(env, rows)
    return f"{_a(' '.join([*adjectives, label(env, person)]))}{''.join(on[:1])} with {n} {noun if n == 1 else plural(noun)}"


def misspell(name: str, taken: set[str], rng: random.Random) -> str | None:
    """A plausible wrong version of ``name`` (one vowel changed) that names no one in ``taken``
    (lower-cased names): what a user says before correcting themselves."""
    options = [name[:i] + v + name[i + 1:] for i, ch in enumerate(name) if i and ch.lower() in "aeiouy"
               for v in "aeiouy" if v != ch.lower()]
    options = [o for o in options if o.lower() not in taken]
    return rng.choice(options) if options else None
