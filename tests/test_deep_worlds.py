"""Deeper worlds (issue 26): from difficulty 3 the tables that goal-level tasks act on hold 50
rows or more, a query shows one page of them at a time and says how to get the next, and the
references turn every page they need; the v0 step-only families stay exactly as they were."""

from __future__ import annotations

import hashlib
import json
import random
import re

import pytest

import envfactory
from benchmarks.frame_agent import FrameAgent
from envfactory.checks.scripted import OraclePolicy, play

FAMILIES = ["RetailOrders-v1", "Telecom-v0", "Library-v1"]
_FOOTER = re.compile(r"^page (\d+) of (\d+) \((\d+) matching\)(?:; call again with page=(\d+) for more)?$")


def _state(name: str, difficulty: int, seed: int = 0):
    return envfactory.spec(name).metadata["synth"].sample_state(random.Random(seed), difficulty)


def _acted_on(name: str) -> list[str]:
    """The tables an update tool (one taking a row id, not read-only) changes."""
    spec = envfactory.spec(name)
    writes = [t.schema()["function"]["parameters"]["properties"] for t in spec.tools_of().values() if not t.read_only]
    return [e for e in _state(name, 1).tables if any(f"{e}_id" in props for props in writes)]


@pytest.mark.parametrize("name", FAMILIES)
def test_tables_acted_on_hold_50_rows_or_more_from_difficulty_3_and_stay_small_below(name):
    tables = _acted_on(name)
    assert tables, name
    for e in tables:
        names = [r["name"] for r in _state(name, 5).tables[e].values() if isinstance(r.get("name"), str)]
        assert len({n.lower() for n in names}) == len(names)  # look-ups by name stay unambiguous
        for seed in range(3):
            assert len(_state(name, 1, seed).tables[e]) < 20
            assert len(_state(name, 2, seed).tables[e]) < 30
            sizes = [len(_state(name, d, seed).tables[e]) for d in (3, 4, 5)]
            assert sizes[0] >= 50 and sizes[2] >= 100, (name, e, sizes)


def test_a_query_shows_one_page_at_a_time_and_says_how_to_get_the_next():
    state = _state("RetailOrders-v1", 3)
    query = envfactory.spec("RetailOrders-v1").tools_of()["search_orders"]
    first = query.invoke(state, {}).content.splitlines()
    assert len(first) == 11
    n = len(state.tables["order"])
    pages = -(-n // 10)
    m = _FOOTER.match(first[-1])
    assert m and m.groups() == ("1", str(pages), str(n), "2"), first[-1]
    seen = [line.split(":")[0] for line in first[:-1]]
    for page in range(2, pages + 1):
        out = query.invoke(state, {"page": page}).content.splitlines()
        m = _FOOTER.match(out[-1])
        assert m and m.group(1) == str(page) and (m.group(4) is None) == (page == pages), out[-1]
        seen += [line.split(":")[0] for line in out[:-1]]
    assert sorted(seen) == sorted(f"order {k}" for k in state.tables["order"])
    # a listing of one page is just its rows, as before
    few = query.invoke(state, {"customer": "C-1", "status": "refunded"}).content
    assert "page" not in few


def test_an_out_of_range_page_is_an_error_observation_that_says_which_pages_exist():
    env = envfactory.make("RetailOrders-v1", split="all")
    task = next(t for t in envfactory.spec("RetailOrders-v1").get_tasks() if (t.difficulty or 0) >= 3)
    env.reset(task)
    n = len(task.initial_state.tables["order"])
    for page in (0, 99):
        res = env.step(f'<tool_call>{json.dumps({"name": "search_orders", "arguments": {"page": page}})}</tool_call>')
        text = "\n".join(str(m["content"]) for m in res.messages if m.get("role") == "tool")
        assert "out of range" in text and f"from 1 to {-(-n // 10)}" in text, text
        assert not env.done
    env.close()


def test_every_reference_earns_reward_1_and_some_tasks_need_several_pages():
    paged = 0
    for name in FAMILIES:
        env = envfactory.make(name, split="all")
        for task in envfactory.spec(name).get_tasks():
            out = play(env, OraclePolicy(), task.id)
            assert out.success and out.reward == 1.0, (task.id, out.ended_by, out.errors)
            paged += any("page" in c.arguments for c in task.solution)
        env.close()
    assert paged >= 3, paged


def test_the_frame_agent_reads_every_page_of_a_listing():
    env = envfactory.make("RetailOrders-v1", split="all")
    task = next(t for t in envfactory.spec("RetailOrders-v1").get_tasks() if (t.difficulty or 0) >= 3)
    env.reset(task)
    rows = FrameAgent(env).listing("search_orders", {})
    assert sorted(r["id"] for r in rows) == sorted(task.initial_state.tables["order"])
    env.close()


# sha256 of the step-only corpus families' tool schemas, task instructions, reference arguments
# and tool outputs, computed on main before deep worlds: the embedded tokenizer was trained on them
_CORPUS_DIGEST = "e619bb308f6ddf7bc4803f32dc0eed43b16dfba314b14a9aa053d394ef554b6d"


def test_the_corpus_families_keep_their_tasks_and_tool_outputs_byte_for_byte():
    from agents.models.tiny import CORPUS_ENVS

    h = hashlib.sha256()
    for name in sorted(CORPUS_ENVS):
        spec = envfactory.spec(name)
        if not str(spec.metadata.get("source", "")).startswith("spec file"):
            continue  # written in Python: no spec table to deepen
        tools = spec.tools_of()
        assert not any("page" in t.schema()["function"]["parameters"]["properties"] for t in tools.values())
        h.update(json.dumps([t.schema() for t in tools.values()], sort_keys=True).encode())
        for task in spec.get_tasks():
            h.update(task.instruction.encode())
            state = spec.start_state(task)
            for c in task.solution:
                h.update(json.dumps(c.arguments, sort_keys=True).encode())
                h.update(tools[c.name].invoke(state, c.arguments).content.encode())
    assert h.hexdigest() == _CORPUS_DIGEST
