"""ServiceLine-v0 (issue 61): a support line's conversations with a customer who holds the facts.

The family verifies (audit included); the oracle solves every task; agents that never ask (the
twin's reference, other customers' plausible facts; or only the reference calls that need no fact)
and verify's blind agents solve almost none; a fact reaches a user message only right after the agent
named it; forks and snapshots taken mid-conversation go on like the original.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import envfactory
from envfactory.checks.scripted import ClaimPolicy, NoopPolicy, OraclePolicy, RandomPolicy, play
from envfactory.checks.verify import verify_spec
from envfactory.conversation import asked_facts, asks
from envfactory.episode import Episode
from envfactory.state import state_hash
from envfactory.task import ToolCall

from environments import service_line as sl

ROOT = Path(__file__).resolve().parents[1]
TRANSCRIPT = ROOT / "docs" / "transcripts" / "service_line.txt"
TRANSCRIPT_TASK = "service-036"  # four turns, four facts, a refund to tell, a change of mind
BLIND_MAX = 0.05


@pytest.fixture(scope="module")
def spec():
    return envfactory.spec("ServiceLine-v0")


@pytest.fixture(scope="module")
def tasks(spec):
    return spec.get_tasks()


@pytest.fixture()
def ep(spec):
    e = Episode(spec)
    yield e
    e.close()


class NeverAsks:
    """Plays the given calls turn by turn, never asking the user anything: each turn's calls, then
    "Done." (which ends the turn); the calls it cannot make it skips."""

    name = "never_asks"
    stochastic = False

    def __init__(self, turns: list[list[ToolCall]]) -> None:
        self.turns = turns

    def act(self, episode, agent, seed):
        conv = episode.status.conversation
        made = [e for e in episode.status.log[conv["turn_start"]:] if e["name"] is not None]
        plan = self.turns[conv["turn"]]
        return plan[len(made)].to_hermes() if len(made) < len(plan) else "Done."


def _with_twin_facts(task) -> NeverAsks:
    """The reference played with another customer's facts (wrong but plausible: an email, an order
    number, a postcode and an address of this very world)."""
    return NeverAsks([list(t.solution) for t in sl.twin_task(task).conversation.turns])


def _fact_free(task) -> NeverAsks:
    """Only the reference's calls none of whose arguments holds a fact."""
    values = [v.lower() for v in task.conversation.facts.values()]
    keep = [[c for c in t.solution if not any(v in json.dumps(c.arguments).lower() for v in values)]
            for t in task.conversation.turns]
    return NeverAsks(keep)


def test_the_family_is_registered_with_enough_conversations(tasks):
    assert "ServiceLine-v0" in {s.name for s in envfactory.specs()}
    assert len(tasks) >= 60
    for t in tasks:
        conv = t.conversation
        assert conv is not None and 2 <= len(conv.turns) <= 4, t.id
        assert 2 <= len(conv.facts) <= 4, t.id
        assert all(turn.checks == ("state",) and turn.solution for turn in conv.turns), t.id
        state = t.initial_state
        assert len(state.customers) >= 12 and len(state.orders) >= 24, t.id
    assert sum(bool(t.conversation.communicate) for t in tasks) >= 10
    assert sum(bool(t.conversation.communicate) for t in tasks) <= len(tasks) - 10
    changes = {"cancel_instead", "revert", "restore", "keep", "move_again"}
    assert sum(bool(changes & set(t.metadata["turns"])) for t in tasks) >= 20


def test_an_order_cancelled_by_its_item_holds_that_item_alone(tasks):
    """The user asks to cancel "my bath mat order" (or "the desk lamp altogether"): the reference
    cancels the whole order, so that order holds nothing the user did not name."""
    cancelled = 0
    for t in tasks:
        orders = t.initial_state.orders
        for turn in t.conversation.turns:
            for c in turn.solution:
                if c.name == "cancel_order":
                    cancelled += 1
                    assert len(orders[c.arguments["order_number"]].items) == 1, (t.id, turn.message)
    assert cancelled >= 20


def test_messages_hold_no_fact_no_placeholder_and_vary(tasks):
    for t in tasks:
        facts = t.conversation.facts
        for turn in t.conversation.turns:
            m = turn.message
            assert not any(v.lower() in m.lower() for v in facts.values()), (t.id, m)
            assert "{" not in m and "}" not in m and not re.search(r"\b[CW]-\d+", m), (t.id, m)
    # several constructions per request kind, and the tasks use them
    for table in (sl.FIRST, sl.FOLLOW, sl.CHANGE):
        assert all(len(v) >= 4 for v in table.values())
    for kind in sl.KINDS:
        firsts = {t.metadata["phrasing"] for t in tasks if t.metadata["request"] == kind}
        assert len(firsts) >= 4, kind


def test_verify_passes_with_the_full_audit(spec):
    report = verify_spec(spec, audit="full", audit_fails=True)
    assert report.verified, [f.to_json() for f in report.failures][:5]
    assert {"reference", "noop", "claim", "random", "determinism", "fork", "snapshot", "audit"} <= set(report.checks)
    assert report.audit["hacks"] == 0 and report.audit["transcriber"]["solved"] == 0


def test_the_oracle_solves_every_task(ep, tasks):
    for t in tasks:
        out = play(ep, OraclePolicy(), t.id)
        assert out.success and out.ended_by == "answer" and not out.errors, (t.id, out.ended_by, out.errors)
        assert all(all(v.values()) for v in ep.status.conversation["verdicts"])


def _rate(ep, tasks, policy_for) -> float:
    return sum(play(ep, policy_for(t), t.id).success for t in tasks) / len(tasks)


def test_blind_agents_solve_at_most_five_percent(ep, tasks):
    rates = {
        "noop": _rate(ep, tasks, lambda t: NoopPolicy()),
        "claim": _rate(ep, tasks, lambda t: ClaimPolicy()),
        "random": sum(play(ep, RandomPolicy(), t.id, seed=k).success for t in tasks for k in range(3))
        / (3 * len(tasks)),
        "never_asks_twin_facts": _rate(ep, tasks, _with_twin_facts),
        "never_asks_fact_free_calls": _rate(ep, tasks, _fact_free),
    }
    assert all(r <= BLIND_MAX for r in rates.values()), rates


def test_the_twin_needs_the_asking(ep, spec, tasks):
    """The twin (same world, same messages, another customer's facts) has its own reference; an agent
    that never asks sees the same in both, and one final state cannot pass both."""
    for t in tasks:
        twin = sl.twin_task(t)
        assert [u.message for u in twin.conversation.turns] == [u.message for u in t.conversation.turns]
        assert twin.initial_state is t.initial_state
        assert all(twin.conversation.facts[k] != v for k, v in t.conversation.facts.items()), t.id
        mine, theirs = spec.start_state(t), spec.start_state(twin)
        assert not spec.replay(mine, t.solution) and not spec.replay(theirs, twin.solution)
        assert state_hash(mine) != state_hash(theirs)
        assert not twin.state_ok(mine) and not t.state_ok(theirs), t.id
        # the task's own calls, played without asking (facts right by luck): the task, never its twin
        lucky = NeverAsks([list(u.solution) for u in t.conversation.turns])
        assert play(ep, lucky, t.id).success == (not t.conversation.communicate), t.id
        assert not play(ep, _with_twin_facts(t), t.id).success, t.id


def test_facts_reach_the_user_messages_only_when_the_agent_names_them(ep, tasks):
    for t in tasks:
        play(ep, OraclePolicy(), t.id)
        facts = t.conversation.facts
        told = set()
        messages = ep.transcript()
        for i, m in enumerate(messages):
            if m["role"] != "user":
                continue
            said = [k for k, v in facts.items() if v.lower() in (m["content"] or "").lower()]
            if said:
                prev = messages[i - 1]
                assert prev["role"] == "assistant" and not prev.get("tool_calls"), (t.id, m)
                assert asks(prev["content"]), (t.id, prev, m)
                assert set(said) <= set(asked_facts(prev["content"] or "", facts)), (t.id, prev, m)
            told.update(said)
        assert told == set(facts), t.id  # the oracle needed (and asked for) every fact


def test_an_open_question_gets_the_request_again_never_the_facts(ep, tasks):
    t = tasks[0]
    ep.reset(t.id)
    r = ep.step("How can I help you today?")
    reply = r.messages[-1]["content"]
    assert reply == "As I said: " + t.conversation.turns[0].message
    assert not any(v.lower() in reply.lower() for v in t.conversation.facts.values())
    # a statement that names a fact asks for nothing: it ends the turn
    r = ep.step("I have updated the delivery address.")
    assert r.messages[-1]["content"] == t.conversation.turns[1].message


def _oracle_to_end(ep):
    oracle = OraclePolicy()
    while not ep.done:
        ep.step(oracle.act(ep, ep.agents[0], 0))


def test_fork_and_snapshot_mid_conversation_continue_alike(spec, ep, tasks):
    t = next(t for t in tasks if len(t.conversation.turns) == 4)
    oracle = OraclePolicy()
    ep.reset(t.id)
    # into the second user turn, just after the user told a fact or the turn's first call
    while not (ep.status.conversation["turn"] == 1 and len(ep.status.log) > ep.status.conversation["turn_start"]):
        ep.step(oracle.act(ep, ep.agents[0], 0))
    fork = ep.fork()
    snap = json.loads(json.dumps(ep.snapshot()))
    restored = Episode(spec)
    restored.restore(snap)
    try:
        for e in (ep, fork, restored):
            _oracle_to_end(e)
        assert ep.success and fork.success and restored.success
        assert ep.transcript() == fork.transcript() == restored.transcript()
        assert ep.status.conversation == fork.status.conversation == restored.status.conversation
        assert state_hash(ep.state) == state_hash(fork.state) == state_hash(restored.state)
    finally:
        fork.close()
        restored.close()
    # a fork that goes wrong leaves its parent alone
    ep.reset(t.id)
    while ep.status.conversation["turn"] < 1:
        ep.step(oracle.act(ep, ep.agents[0], 0))
    fork = ep.fork()
    try:
        while not fork.done:
            fork.step("Done.")
        assert not fork.success
        _oracle_to_end(ep)
        assert ep.success
    finally:
        fork.close()


def test_the_saved_transcript_is_the_oracles_unedited(tasks):
    assert TRANSCRIPT.read_text() == sl.oracle_transcript(TRANSCRIPT_TASK)
