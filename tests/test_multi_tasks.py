"""Every coordination environment has >= 50 procedurally generated, seeded tasks (the hand-written
ones first, unchanged), reproducible across processes, distinct from each other. That each task's
joint reference solves it and that no-op, claim, random and lone agents fail is tests/test_multi_verify.py."""

import hashlib
import importlib
import json
import os
import subprocess
import sys

import pytest

import envfactory
from envfactory.state import canonical_json

COORDINATION = {"MultiDeal-v0": "environments.multi_deal", "MultiMeeting-v0": "environments.multi_meeting",
                "MultiPipeline-v0": "environments.multi_pipeline", "MultiRecords-v0": "environments.multi_records",
                "MultiRooms-v0": "environments.multi_rooms", "MultiSupport-v0": "environments.multi_support"}
GAMES = {"GameAuction-v0": "environments.game_auction", "GameBattleship-v0": "environments.game_battleship"}
# the hand-written tasks each environment had before generation, which must keep their ids and content
HAND_WRITTEN = {"MultiDeal-v0": 4, "MultiMeeting-v0": 4, "MultiPipeline-v0": 4, "MultiRecords-v0": 5,
                "MultiRooms-v0": 4, "MultiSupport-v0": 4}


def fingerprint(tasks) -> str:
    """Everything that defines the tasks (not the check functions, which are closures)."""
    rows = [[t.id, t.instruction, t.private, canonical_json(t.initial_state), [[c.agent, c.name, c.arguments] for c in t.solution],
             t.metadata] for t in tasks]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(COORDINATION))
def test_at_least_50_tasks_with_unique_ids_and_the_hand_written_ones_first(name):
    tasks = envfactory.spec(name).get_tasks()
    assert len(tasks) >= 50
    prefix = tasks[0].id.split("-")[0]
    assert [t.id for t in tasks] == [f"{prefix}-{k:03d}" for k in range(len(tasks))]
    n = HAND_WRITTEN[name]
    assert all("generator_seed" not in t.metadata for t in tasks[:n])
    assert all("generator_seed" in t.metadata for t in tasks[n:])


def test_hand_written_tasks_are_unchanged():
    """Training and tests name these tasks; generation only appends."""
    records = envfactory.spec("MultiRecords-v0").task("records-000")
    assert records.instruction == "Alice Chen has moved to the platform team; update her record."
    assert records.initial_state.employees["E-102"].name == "Alice Chen"
    deal = envfactory.spec("MultiDeal-v0").task("deal-003")
    assert deal.metadata["walk"] == {"trader_0": 6, "trader_1": 6} and deal.initial_state.pool["books"] == 4
    pipeline = envfactory.spec("MultiPipeline-v0").task("pipeline-003")
    assert len(pipeline.solution) == 12 and pipeline.initial_state.stock == {"MUG-RED": 10, "MUG-BLUE": 2,
                                                                            "TEAPOT": 3, "KETTLE": 1}


@pytest.mark.parametrize("name", sorted(COORDINATION) + sorted(GAMES))
def test_generated_tasks_are_distinct(name):
    tasks = envfactory.spec(name).get_tasks()
    worlds = {(t.instruction, json.dumps(t.private, sort_keys=True), canonical_json(t.initial_state))
              for t in tasks}
    assert len(worlds) == len(tasks), "two tasks are the same problem"
    assert len({json.dumps([[c.agent, c.name, c.arguments] for c in t.solution], sort_keys=True) for t in tasks}) >= 0.9 * len(tasks)


@pytest.mark.parametrize("name", sorted(COORDINATION) + sorted(GAMES))
def test_task_generation_is_reproducible_in_process(name):
    module = importlib.import_module({**COORDINATION, **GAMES}[name])
    assert fingerprint(module.tasks()) == fingerprint(module.tasks()) == fingerprint(envfactory.spec(name).get_tasks())


def test_task_generation_is_reproducible_across_processes():
    """Seeds are fixed strings, not hash() of anything: another process (another hash seed) builds the same tasks."""
    code = ("import importlib, json, sys; sys.path.insert(0, 'tests'); from test_multi_tasks import fingerprint, "
            "COORDINATION, GAMES; print(json.dumps({n: fingerprint(importlib.import_module(m).tasks()) "
            "for n, m in {**COORDINATION, **GAMES}.items()}))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.returncode == 0, out.stderr
    here = {n: fingerprint(envfactory.spec(n).get_tasks()) for n in {**COORDINATION, **GAMES}}
    assert json.loads(out.stdout) == here


@pytest.mark.parametrize("name", sorted(COORDINATION) + sorted(GAMES))
def test_reference_solutions_fit_the_round_limit_with_simultaneous_moves(name):
    """With simultaneous moves the oracle plays one step of the joint plan per round, and finishes after it
    (tasks whose reference is a turn-order schedule, ``metadata["modes"] == ["aec"]``, are verified in
    turn order only)."""
    spec = envfactory.spec(name)
    closing = 0 if spec.terminal is not None else 1  # a world that ends itself needs no finish round
    both = [t for t in spec.get_tasks() if "parallel" in t.metadata.get("modes", ("aec", "parallel"))]
    assert len(both) >= 45 and max(len(t.solution) for t in both) + closing <= spec.max_turns


MULTI_AGENT = sorted(s.name for s in envfactory.specs() if getattr(s, "multi_agent", False))
# the environments whose tasks once had a single instruction (variation only in private notes)
VARIED = {"MultiMeeting-v0": "goal", "MultiPipeline-v0": "goal", "MultiRooms-v0": "goal", "MultiSupport-v0": "goal",
          "GameBattleship-v0": "rule", "GameAuction-v0": "format"}


@pytest.mark.parametrize("name", MULTI_AGENT)
def test_every_multi_agent_environment_has_at_least_10_distinct_instructions(name):
    tasks = envfactory.spec(name).get_tasks()
    assert len({t.instruction for t in tasks}) >= 10, name


@pytest.mark.parametrize("name", sorted(VARIED))
def test_instructions_vary_in_the_goal_not_only_in_the_numbers(name):
    """With every number masked, at least 10 different instructions remain (not one frame with numbers
    swapped in), and the tasks name several goals (rules, formats), each with its own instruction."""
    import re

    tasks = envfactory.spec(name).get_tasks()
    frames = {re.sub(r"\d+", "#", t.instruction) for t in tasks}
    assert len(frames) >= 10, sorted(frames)
    goals = {t.metadata.get(VARIED[name]) for t in tasks if "generator_seed" in t.metadata}
    assert len(goals) >= (10 if name.startswith("Multi") else 4), goals
    by_goal: dict = {}
    for t in tasks:
        if "generator_seed" in t.metadata and t.id.split("-")[1] != "000":
            by_goal.setdefault(t.metadata[VARIED[name]], set()).add(re.sub(r"\d+", "#", t.instruction))
    for g, texts in by_goal.items():  # two goals never share an instruction
        others = set().union(*(v for k, v in by_goal.items() if k != g))
        assert not texts & others, (g, texts & others)


def test_meeting_goals_pick_one_hour_among_several_that_suit_everyone():
    """Where the calendars share several free hours, the goal (earliest, afternoon, not on Monday, a
    guest's preference...) decides, and a meeting at any other common hour fails the check."""
    from environments.multi_meeting import Meeting

    spec = envfactory.spec("MultiMeeting-v0")
    several = 0
    for t in spec.get_tasks():
        busy = t.initial_state.busy
        slots = [f"{d} {h}" for d in ("mon", "tue", "wed") for h in (9, 10, 11, 13, 14, 15, 16)]
        common = [s for s in slots if all(s not in busy[a] for a in busy)]
        target = next(c for c in t.solution if c.name == "schedule_meeting").arguments
        for slot in common:
            day, hour = slot.split()
            state = t.initial_state.model_copy(deep=True)
            state.meetings = [Meeting(id="MTG-9", day=day, hour=int(hour), accepted=["guest_0", "guest_1"])]
            assert t.check(state) == ((day, int(hour)) == (target["day"], target["hour"])), (t.id, slot)
        several += len(common) > 1
    assert several >= 25


def test_support_amounts_follow_the_goal_not_the_price():
    """Refunding the full price of the order(s) the reference refunds passes only where the goal owes
    the full price: a restocking fee, a price match, a coupon, a late credit or a cap changes it."""
    from environments.multi_support import Refund

    spec = envfactory.spec("MultiSupport-v0")
    differs = {}
    for t in spec.get_tasks()[4:]:
        orders = t.initial_state.orders
        state = t.initial_state.model_copy(deep=True)
        for k, c in enumerate(c for c in t.solution if c.name == "open_refund"):
            oid = c.arguments["order_id"]
            state.refunds[f"R-{k + 1}"] = Refund(id=f"R-{k + 1}", order_id=oid, amount_cents=orders[oid].amount_cents,
                                                reason="", status="refunded")
        differs.setdefault(t.metadata["goal"], []).append(not t.check(state))
    for goal in ("price_match", "coupon", "late"):
        assert all(differs[goal]), goal
    assert any(differs["restocking"]) and any(differs["cap"]) and not any(differs["batch"])


def test_pipeline_goals_are_not_met_by_shipping_every_order_as_noted():
    """Registering, packing and shipping every order just as intake's notes say (the plain goal) fails
    every other goal's check: the goal changes what must happen, not only the words."""
    import random

    from environments.multi_pipeline import WorkOrder, generate, outcome

    spec = envfactory.spec("MultiPipeline-v0")
    seen = set()
    for t in spec.get_tasks()[4:]:
        goal = t.metadata["goal"]
        placed, stock, param = generate(random.Random(f"MultiPipeline/{t.metadata['generator_seed']}"), goal)
        state = t.initial_state.model_copy(deep=True)
        for k, o in enumerate(placed, 1):
            _, q, addr, car = outcome("ship_all", None, o, stock)
            state.orders[f"WO-{k}"] = WorkOrder(id=f"WO-{k}", customer=o.customer, sku=o.sku, quantity=o.quantity,
                                                status="shipped", package=f"PKG-{k}", address=o.address, carrier=car)
        plain_ok = t.check(state)
        assert plain_ok == (goal in ("ship_all", "rush")), (t.id, goal)
        seen.add(goal)
    assert len(seen) >= 11
