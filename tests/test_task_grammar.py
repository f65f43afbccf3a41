"""Compositional goal kinds from the task grammar (issue 26, envfactory.factory.tasks.grammar):
every kind is made by several families, its reference earns 1 through the episode API, doing
nothing and acting on every row earn 0, and the row a chain picks decides what it acts on."""

from __future__ import annotations

import copy
import json

import pytest

import envfactory
from envfactory.checks.scripted import NoopPolicy, OraclePolicy, ScriptPolicy, play
from envfactory.factory.tasks import grammar as task_grammar
from envfactory.task import ToolCall

FAMILIES = ["RetailOrders-v1", "AutoRepair-v0", "Telecom-v0", "Loans-v0", "CarRental-v0", "Cinema-v0"]


def _grammar_tasks(name: str) -> list:
    return [t for t in envfactory.spec(name).get_tasks() if t.kind in task_grammar.KINDS]


def _synth(name: str):
    return envfactory.spec(name).metadata["supply"].__self__  # the family's KindSynth


def test_every_compositional_kind_is_made_by_several_families():
    made = {kind: [n for n in FAMILIES if any(t.kind == kind for t in _grammar_tasks(n))] for kind in task_grammar.KINDS}
    for kind, names in made.items():
        assert len(names) >= 3, (kind, names)


def test_hard_compositional_tasks_are_long_and_name_their_parts():
    tasks = [t for n in FAMILIES for t in _grammar_tasks(n)]
    hard = [t for t in tasks if t.difficulty >= 4]
    assert sum(len(t.solution) for t in tasks if t.difficulty >= 3) / len([t for t in tasks if t.difficulty >= 3]) >= 6
    assert sum(len(t.solution) >= 10 for t in hard) / len(hard) >= 0.2
    for t in tasks:
        assert t.metadata["kind"] == t.kind and t.metadata["plan"] and t.metadata["grammar"][0] == t.kind


@pytest.mark.parametrize("name", FAMILIES[:4])
def test_reference_earns_one_and_noop_and_act_on_every_row_earn_zero(name):
    spec = envfactory.spec(name)
    tools = spec.tools_of()
    ep = envfactory.make(name, split="all")
    for kind in task_grammar.KINDS:
        for task in [t for t in _grammar_tasks(name) if t.kind == kind][:2]:
            out = play(ep, OraclePolicy(), task.id)
            assert out.success and out.reward == 1.0, (task.id, task.instruction, out.ended_by, out.errors)
            assert play(ep, NoopPolicy(), task.id).reward == 0.0, task.id
            rows = json.loads(task.initial_state.model_dump_json())["tables"]
            writes = {}
            for c in task.solution:
                if not tools[c.name].read_only:
                    ident = next(a for a in c.arguments if a.endswith("_id"))
                    args = {a: v for a, v in c.arguments.items() if a != ident}
                    writes[(c.name, json.dumps(args, sort_keys=True))] = (c.name, ident, args)
            assert writes, task.id
            for op, ident, args in writes.values():
                entity = ident[: -len("_id")]
                # the shortcut: this write on every row of its table, all in one turn
                every = "".join(ToolCall(op, {ident: key, **args}).to_hermes() for key in sorted(rows[entity]))
                out = play(ep, ScriptPolicy([every], finish=True), task.id)
                assert out.reward == 0.0, (task.id, op, task.instruction)


def test_the_picked_row_decides_what_a_chain_acts_on():
    checked = 0
    for name in FAMILIES:
        k = _synth(name)
        for task in [t for t in _grammar_tasks(name) if t.kind == "chain"]:
            plan = task.metadata["plan"]
            picks = [v["pick"] for v in plan[0]["set"]["filters"].values() if isinstance(v, dict)]
            if not picks:
                continue
            pick = picks[0]
            tables = json.loads(task.initial_state.model_dump_json())["tables"]
            k._state_type = type(task.initial_state)
            assert task_grammar.solution(k, tables, plan) == task.solution
            chosen = task_grammar._pick_key(tables, pick)

            def targets(calls):
                return {(c.name, v) for c in calls for a, v in c.arguments.items()
                        if a.endswith("_id") and not k.tools[c.name].read_only}

            moved = False
            for rival, row in tables[pick["entity"]].items():
                if rival == chosen or not all(str(row.get(f)) == str(v) for f, v in pick["filters"].items()):
                    continue
                other = copy.deepcopy(tables)
                values = [r[pick["field"]] for r in tables[pick["entity"]].values()]
                other[pick["entity"]][rival][pick["field"]] = max(values) + 1 if pick["most"] else min(values) - 1
                assert task_grammar._pick_key(other, pick) == rival
                calls = task_grammar.solution(k, other, plan[:1])
                if calls is not None:
                    assert targets(calls) != targets(task_grammar.solution(k, tables, plan[:1])), (task.id, rival)
                    moved = True
            assert moved, task.id
            checked += 1
    assert checked >= 3
