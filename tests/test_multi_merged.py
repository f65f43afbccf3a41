"""A coordination task one agent cannot finish within the turn budget, even holding every tool
and every private note (envfactory.checks.merged): MultiPipeline-v0's rush tasks (4-5 orders, the
truck leaves at the end of round N + 3, each clerk does one job per round). The team pipelines the
three stations and ships in time; one merged agent, playing the strongest way it can (every
remaining call every turn), does one job per round and misses the truck; given the time, it does
the whole task, so what it lacks is the budget, not a tool or a note."""

import pytest

import envfactory
from envfactory.checks.merged import IDLE, MERGED, GreedyMergedPolicy, merged_spec
from envfactory.checks.scripted import OraclePolicy, play
from envfactory.episode import Episode
from envfactory.task import ToolCall

SPEC = envfactory.spec("MultiPipeline-v0")
RUSH = [t for t in SPEC.get_tasks() if t.metadata.get("goal") == "rush"]


def test_there_are_rush_tasks_with_more_jobs_than_rounds():
    assert len(RUSH) >= 3
    for t in RUSH:
        assert t.initial_state.one_job and t.initial_state.deadline == t.metadata["deadline"]
        assert t.metadata["jobs"] > t.metadata["deadline"]  # 3 jobs per order, one per round for one agent
        assert t.metadata["deadline"] <= SPEC.max_turns


@pytest.mark.parametrize("task", RUSH, ids=lambda t: t.id)
def test_the_team_ships_everything_before_the_truck_leaves(task):
    out = play(envfactory.make_multi("MultiPipeline-v0"), OraclePolicy(), task.id, mode="aec")
    assert out.success and out.errors == {}
    ships = [e["round"] for e in out.log if e["name"] == "ship_parcel"]
    assert len(ships) == len([c for c in task.solution if c.name == "ship_parcel"])
    assert max(ships) <= task.metadata["deadline"]


@pytest.mark.parametrize("task", RUSH, ids=lambda t: t.id)
def test_one_agent_holding_every_tool_and_note_misses_the_deadline(task):
    merged = merged_spec(SPEC, [task])
    assert set(merged.tools_of(MERGED)) >= {"register_order", "pack_order", "ship_parcel", "list_stock"}
    assert not merged.tools_of(IDLE).keys() - {"send_message", "read_messages", "finish"}
    mine = merged.get_tasks()[0]
    assert "Order details" in mine.private[MERGED]  # intake's notes are its own: nothing to relay
    out = play(Episode(merged), GreedyMergedPolicy(), mine.id)
    assert not out.success
    jobs = [e for e in out.log if e["ok"] and e["name"] in ("register_order", "pack_order", "ship_parcel")]
    assert len({e["round"] for e in jobs}) == len(jobs)  # one job per round, however many it sends
    shipped = [e for e in jobs if e["name"] == "ship_parcel"]
    assert len(shipped) < len([c for c in mine.solution if c.name == "ship_parcel"])
    # given the time (no truck to catch), the same agent and policy do the whole task
    lifted = merged_spec(SPEC, [task], deadline=0)
    assert play(Episode(lifted), GreedyMergedPolicy(), task.id).success


def test_a_second_job_in_the_same_round_is_refused():
    task = RUSH[0]
    merged = merged_spec(SPEC, [task])
    ep = Episode(merged)
    ep.reset(task.id)
    o = task.solution[1].arguments  # intake's first registration
    two = (ToolCall("register_order", o).to_hermes() + ToolCall("register_order", o).to_hermes())
    r = ep.act(MERGED, two)
    assert r.messages[0]["content"].startswith("Registered") and "one job" not in r.messages[0]["content"]
    assert "only once per round" in r.messages[1]["content"]
