"""Task text has no unfilled slots, control characters, filler notes or numbered row names, and
a task's words say what its reference does (issue 59):

* a placeholder for a picked row survives phrasing (ITAssets-v0 showed "employee \\x00assigned to\\x00");
* a value found first ("the annual income you found") stands on its own, never inside a template's
  formatting of a value ("at $the annual income you found", "wed at the capacity you found:00");
* a written policy never asks for another action on the rows it protects (ProjectBoard-v1's "close
  them in review instead" failed the check when followed);
* "extend" never shortens ("extend the stay ... to 1 night" of a 3-night stay);
* the test over every family: 0 control characters and 0 unfilled slots in any text of any task
  of any registered environment; 0 filler notes and 0 numbered row names in goal-level tasks.
"""

from __future__ import annotations

import re
import time
import unicodedata
from functools import lru_cache
from pathlib import Path

import pytest

import envfactory
from envfactory.factory.from_spec import load_spec_file
from envfactory.factory.spec_file import EnvFile, OperationSpec
from envfactory.factory.tasks.arguments import FRESH_WORDS

SPECS = Path(__file__).resolve().parents[1] / "environments" / "specs"
GOAL_KINDS = ("lookup", "conditional", "policy", "answer", "user", "multi_service",
              "chain", "aggregate", "exception", "recovery")

# -- what a leftover looks like ------------------------------------------------------------------
# the generator's slots: "{field}" format fields of a template, "\x00...\x00" placeholders of a
# picked row (grammar.act_text), and "the <field> you found" values read in another service
# (kinds._transfer); glue is a slot phrase inside a value's formatting
SLOT_GLUE = {
    "format field": r"\{[A-Za-z_][A-Za-z0-9_]*\}",
    "currency glued to a slot": r"\$(?:the|that|a|an)\b",
    "slot then digit or colon": r"\byou found(?::|\d)",
    "slot then unit": r"\byou found (?:days?|nights?|months?|hours?|minutes?|packs?|points?|units?|dollars|kg|ml)\b",
    "slot in a compound": r"\byou found-",
    "quoted slot": r"'the [a-z ]+ you found'",
}


def control_characters(text: str) -> list[str]:
    """Characters of Unicode category Cc other than newline and tab."""
    return [c for c in text if unicodedata.category(c) == "Cc" and c not in "\n\t"]


def unfilled(text: str) -> list[str]:
    """The leftovers in ``text``; a quoted literal the user dictates may hold braces (a BFCL user
    asks for the content 'Omega Industries is skyrocketing at ${price} per share!')."""
    unquoted = re.sub(r"(?<!\w)'[^'\n]*'(?!\w)", "'…'", text)
    found = [name for name, rx in SLOT_GLUE.items()
             if re.search(rx, unquoted if name == "format field" else text)]
    return found + (["control character"] if control_characters(text) else [])


FILLER = re.compile("'(?:" + "|".join(FRESH_WORDS) + ")'")  # "with the note 'falcon'"


def texts(task) -> dict[str, str]:
    """Every text of a task an agent or a user reads: instruction, private notes, answer facts,
    conversation messages, the user's facts and persona."""
    out = {"instruction": task.instruction}
    out.update({f"private[{k}]": v for k, v in (task.private or {}).items()})
    out.update({f"answer_facts[{i}]": f for i, f in enumerate(task.answer_facts or [])})
    if task.conversation is not None:
        out.update({f"turn[{i}]": u.message for i, u in enumerate(task.conversation.turns)})
        out.update({f"facts[{k}]": str(v) for k, v in task.conversation.facts.items()})
        out["persona"] = task.conversation.persona
    return out


def names_numbered_row(task, said: str, env: EnvFile | None) -> list[str]:
    """The numbered names of the task's tables that ``said`` names: values a deep world numbered
    when a field's list of unique values ran out ("Film Club 5", "Invoice 42 6"), or a field's
    description numbered for want of a seed rule ("visit note 46"); a value the spec file lists
    ("Invoice 42") is no tell, nor a rating after a name ("ingredient cocoa 5 out of 5")."""
    tables = getattr(task.initial_state, "tables", None)
    if env is None or not isinstance(tables, dict):
        return []
    out = set()
    for e, rows in tables.items():
        ent = env.entities.get(e)
        if ent is None:
            continue
        for row in rows.values():
            for f, v in row.items():
                gen = ent.seed.fields.get(f)
                if isinstance(v, str) and re.search(r"\w \d+$", v) and not (gen and gen.choice and v in gen.choice):
                    out.add(v)
    return sorted(v for v in out if re.search(rf"(?<!\w){re.escape(v)}(?!\w| out of)", said))


# -- the bugs, one by one ---------------------------------------------------------------------------
def _tasks(name: str):
    return envfactory.spec(name).get_tasks()


def test_a_picked_row_placeholder_survives_an_underscored_parameter():
    """ITAssets-v0's assign_device(assigned_to): phrasing turned the placeholder's "_" into a space,
    so five tasks kept raw NUL placeholders instead of "the employee with ..."."""
    tasks = _tasks("ITAssets-v0")
    bad = [t.instruction for t in tasks if "\x00" in t.instruction]
    assert not bad, bad
    assigned = [t.instruction for t in tasks if (t.metadata or {}).get("kind") in GOAL_KINDS
                and "assign" in t.instruction and "employee" in t.instruction]
    assert assigned  # the acts over a picked employee are still made


def test_a_found_value_stands_on_its_own_in_a_formatted_template():
    from envfactory.factory.tasks.words import Slot, phrase

    env = load_spec_file(SPECS / "utilities.yaml")

    def op(instruction: str, params: list[str]) -> OperationSpec:
        return OperationSpec(name="record_payment", kind="update", entity="invoice", params=params,
                             description="x", instruction=instruction)

    found = Slot("the balance due you found")
    cases = {
        "record a ${amount} payment on invoice {invoice_id}": "record a payment of the balance due you found on",
        "re-bill invoice {invoice_id} at ${amount}": "at the balance due you found",
        "move invoice {invoice_id} to {amount}:00": "to the balance due you found",
        "bill invoice {invoice_id} for {amount} units": "for the balance due you found",
        "note '{amount}' on invoice {invoice_id}": "note the balance due you found on",
    }
    for template, want in cases.items():
        text = phrase(env, op(template, ["amount"]), "every issued invoice", {"amount": found})
        assert want in text and not unfilled(text), (template, text)
    # where a slot cannot stand on its own in the template, the words come from the operation's name
    text = phrase(env, op("book a {amount}-hour slot for invoice {invoice_id}", ["amount"]), "it", {"amount": found})
    assert not unfilled(text) and "you found" in text, text
    # a plain value keeps its formatting
    assert phrase(env, op("record a ${amount} payment on invoice {invoice_id}", ["amount"]), "it",
                  {"amount": 40}) == "record a $40 payment on it"


def test_a_value_is_carried_across_services_only_to_a_field_of_its_kind():
    """"Set the stock of each drug to the slots you found": a count of one thing is not a count of
    another; money goes to money, days to days, a street to an address."""
    from envfactory.factory.tasks.words import transferable

    for family, src, g, dst, p, ok in [
        ("HomeServices-v0", "subscriber", "balance_due", "ticket", "credit", True),
        ("CareNetwork-v0", "doctor", "slots", "drug", "stock", False),
        ("MobilityDesk-v0", "adjuster", "open_cases", "rental", "rental_days", False),
        ("HomeBuying-v0", "buyer", "budget", "loan", "term_months", False),
        ("TravelDesk-v0", "traveller", "miles", "guest", "nights", False),
    ]:
        env = _env_file(family)
        src_e = next(e for e in env.entities if e.endswith(src))
        dst_e = next(e for e in env.entities if e.endswith(dst))
        assert transferable(env, src_e, g, dst_e, p) is ok, (family, g, p)


@pytest.mark.parametrize("name", ["EventPlanner-v0", "HomeBuying-v0", "HomeServices-v0", "MobilityDesk-v0",
                                  "CareNetwork-v0"])
def test_no_slot_glue_in_the_families_that_showed_it(name):
    """7 tasks read "at $the annual income you found", "wed at the capacity you found:00"."""
    bad = [(t.id, k, v) for t in _tasks(name) for k, v in texts(t).items() if unfilled(v)]
    assert not bad, bad


def test_a_written_policy_never_asks_for_another_action_on_the_rows_it_protects():
    """A policy task's check wants the protected rows left as they are, so a policy that says what
    to do with them instead ("close them in review instead") fails the agent that follows it."""
    import yaml

    for path in sorted(SPECS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for rule in doc.get("policies") or []:
            text = rule.get("text") or ""
            assert not re.search(r"\binstead\b", text), (path.name, text)
    spec = envfactory.spec("ProjectBoard-v1")
    policy = [t for t in spec.get_tasks() if (t.metadata or {}).get("kind") == "policy"]
    assert policy and all("leave them as they are" in t.metadata["policy"] for t in policy)
    assert "leave them as they are" in spec.render_system_prompt()


def _env_file(name: str) -> EnvFile | None:
    """The spec file (with its look-ups) a goal-level family's tasks are made from."""
    supply = (envfactory.spec(name).metadata or {}).get("supply")
    return None if supply is None else supply.__self__.env


def _direction(op: OperationSpec) -> int:
    """+1 for an act said with "extend", -1 for one said with "reduce" (its template's first word,
    else its name's), else 0."""
    verb = op.instruction.split()[0] if op.instruction else op.name.split("_")[0]
    return {"extend": 1, "reduce": -1}.get(verb.lower(), 0)


@pytest.mark.parametrize("name", ["TravelDesk-v0", "Hotel-v1", "Parking-v0"])
def test_extend_never_shortens(name):
    """"Extend the stay ... to 1 night" shortened a 3-night stay: an act said with "extend" sets
    a number above the row's own, one said with "reduce" below it."""
    env = _env_file(name)
    ops = {op.name: op for op in env.operations if op.kind == "update" and _direction(op)}
    assert ops, name  # the family has an "extend" or a "reduce"
    bad, seen = [], 0
    for t in envfactory.spec(name).get_tasks():
        if (t.metadata or {}).get("kind") not in GOAL_KINDS:
            continue  # a walk says "change the number of nights of a stay"
        tables = t.initial_state.tables
        for c in t.solution:
            op = ops.get(c.name)
            if op is None:
                continue
            seen += 1
            row = tables[op.entity].get(c.arguments.get(f"{op.entity}_id"), {})
            for p in op.params:
                if isinstance(row.get(p), (int, float)) and (c.arguments[p] - row[p]) * _direction(op) <= 0:
                    bad.append((t.id, c.name, c.arguments, row, t.instruction))
    assert seen and not bad, (seen, bad[:3])


def test_sensible_reads_the_verb_that_is_said():
    from envfactory.factory.tasks.words import sensible

    extend = OperationSpec(name="extend_stay", kind="update", entity="guest", params=["nights"], description="x")
    assert not sensible(extend, {"nights": 3}, {"nights": 1}) and sensible(extend, {"nights": 3}, {"nights": 4})
    reduce = OperationSpec(name="reduce_fine", kind="update", entity="citation", params=["fine"], description="x",
                           instruction="reduce the fine on citation {citation_id} to ${fine}")
    assert not sensible(reduce, {"fine": 50}, {"fine": 80}) and sensible(reduce, {"fine": 50}, {"fine": 20})
    neutral = OperationSpec(name="extend_rental", kind="update", entity="rental", params=["rental_days"],
                            description="x", instruction="change rental {rental_id} to {rental_days} days")
    assert sensible(neutral, {"rental_days": 5}, {"rental_days": 2})  # "change ... to 2 days" says no direction
    adds = OperationSpec(name="raise_limit", kind="update", entity="card", params=["limit"], description="x",
                         effects=[{"field": "limit", "add": "limit"}])
    assert sensible(adds, {"limit": 500}, {"limit": 100})  # an amount added, not the new value


@pytest.mark.parametrize("name", ["Clinic-v1", "Payroll-v0", "Telecom-v0", "UtilityBilling-v0"])
def test_free_text_arguments_are_notes_not_filler_words(name):
    """6.9% of goal-level tasks wrote a filler word into a note ("with the reason 'juniper'")."""
    bad = [t.instruction for t in _tasks(name) if FILLER.search(t.instruction)]
    assert not bad, bad[:3]


@pytest.mark.parametrize("name", ["PetShelter-v1", "Events-v1", "Kitchen-v0"])
def test_goal_level_tasks_never_name_a_numbered_row(name):
    """4.2% of goal-level tasks named a row a deep world numbered ("Film Club 5", "Mochi 2")."""
    bad = []
    env = _env_file(name)
    for t in _tasks(name):
        if (t.metadata or {}).get("kind") not in GOAL_KINDS:
            continue
        said = " ".join(texts(t).values())
        bad += [(t.id, v, t.instruction) for v in names_numbered_row(t, said, env)]
    assert not bad, bad[:3]


# -- every family -----------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _every_task() -> tuple[list, float]:
    start = time.perf_counter()
    out = [(spec.name, t) for spec in envfactory.specs() for t in spec.get_tasks()]
    return out, time.perf_counter() - start


@pytest.mark.slow
def test_no_control_characters_or_unfilled_slots_in_any_task_of_any_family():
    """Every registered environment, single- and multi-agent, every task, every text (about 3-4
    minutes on two shared cores: marked slow)."""
    tasks, _ = _every_task()
    names = {n for n, _ in tasks}
    assert len(names) >= 120 and any(getattr(envfactory.spec(n), "multi_agent", False) for n in names)
    bad = [(n, t.id, k, unfilled(v), v[:160]) for n, t in tasks for k, v in texts(t).items() if unfilled(v)]
    assert not bad, f"{len(bad)} texts with leftovers; e.g. {bad[:5]}"


@pytest.mark.slow
def test_no_filler_notes_or_numbered_row_names_in_any_goal_level_task():
    tasks, _ = _every_task()
    goal = [(n, t) for n, t in tasks if (t.metadata or {}).get("kind") in GOAL_KINDS]
    assert len(goal) > 3000
    filler = [(n, t.instruction) for n, t in goal if any(FILLER.search(v) for v in texts(t).values())]
    numbered = []
    envs: dict = {}
    for n, t in goal:
        if n not in envs:
            envs[n] = _env_file(n)
        said = " ".join(texts(t).values())
        hits = names_numbered_row(t, said, envs[n])
        if hits:
            numbered.append((n, hits, t.instruction))
    assert not filler, f"{len(filler)} of {len(goal)} goal-level tasks carry a filler note; e.g. {filler[:3]}"
    assert not numbered, f"{len(numbered)} of {len(goal)} goal-level tasks name a numbered row; e.g. {numbered[:3]}"


@pytest.mark.slow
def test_directional_words_match_the_reference_in_every_family():
    """No reference of any spec family moves a number against its act's verb ("extend" shortening)."""
    from envfactory.factory.tasks.words import sensible

    tasks, _ = _every_task()
    bad = []
    envs: dict = {}
    for n, t in tasks:
        if n not in envs:
            envs[n] = _env_file(n)
        if envs[n] is None or (t.metadata or {}).get("kind") not in GOAL_KINDS:
            continue
        ops = {op.name: op for op in envs[n].operations}
        for c in t.solution:
            op = ops.get(c.name)
            if op is None or op.kind != "update":
                continue
            row = t.initial_state.tables[op.entity].get(c.arguments.get(f"{op.entity}_id"), {})
            if not sensible(op, row, {k: v for k, v in c.arguments.items() if k in op.params}):
                bad.append((n, t.id, c.name, t.instruction))
    assert not bad, bad[:5]


def test_an_excepted_flag_is_said_as_a_state_not_a_python_literal():
    """An exception over a bool field read "skip those whose read is True" (Mailbox-v1)."""
    tasks = [t for t in _tasks("Mailbox-v1") if (t.metadata or {}).get("kind") in GOAL_KINDS]
    bad = [t.instruction for t in tasks if re.search(r"\b(True|False)\b", t.instruction)]
    assert not bad, bad[:3]
    assert any(re.search(r"those that are (?:not )?read\b", t.instruction) for t in tasks)


def test_a_named_row_has_whatever_its_name_ends_in():
    """ "when guest Bo Evans have at least 2 nights": a name ending in s is not a plural."""
    from envfactory.factory.tasks.realize import Measure, compare

    nights = Measure.of("nights", "nights booked")
    assert compare(nights, "guest Bo Evans", "at_least", 2) == "guest Bo Evans has at least 2 nights"
    assert compare(nights, "its guests", "at_least", 2) == "its guests have at least 2 nights"
    assert compare(nights, "they", "below", 2) == "they have fewer than 2 nights"


def test_a_phrasal_verb_keeps_its_particle_next_to_it_before_a_long_object():
    """ "check all tickets for the event named Food Fair in in the events records" (EventPlanner-v0)."""
    from envfactory.factory.tasks.words import phrase

    env = load_spec_file(SPECS / "events.yaml")
    op = OperationSpec(name="check_in", kind="update", entity="ticket", description="x")
    assert phrase(env, op, "it", {}) == "check it in"
    assert phrase(env, op, "all tickets of event Food Fair", {}) == "check in all tickets of event Food Fair"
