"""Read-only tasks of from_class environments: success needs the reads, not only the final state.

A task whose reference solution only reads (the answer is in a tool result) leaves the
state unchanged, so "the final state equals the reference's" holds for an agent that
does nothing. from_class adds the reads to the task's check: the results the reference's
reads return must appear among the results the episode's tool calls returned (recorded
with the state, carried by fork and snapshot, left out of the state's hash)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from envfactory import Episode  # noqa: E402
from envfactory.checks.scripted import ScriptPolicy, play  # noqa: E402
from envfactory.factory.from_class import ClassTask, Service, from_class  # noqa: E402
from envfactory.factory.classes.pystate import seen_results  # noqa: E402
from envfactory.state import copy_state, state_hash  # noqa: E402
from envfactory.task import call  # noqa: E402
from envfactory.checks.verify import verify_spec  # noqa: E402
from fixtures.third_party.ticket_api import TicketAPI  # noqa: E402

TICKETS = {"ticket_queue": [
    {"id": 1, "title": "printer", "description": "jam", "status": "Open", "priority": 2, "created_by": "agent"},
    {"id": 2, "title": "vpn", "description": "drops", "status": "Open", "priority": 4, "created_by": "agent"}]}


def _spec(*, facts=(), require_reads="auto", **task_opts):
    tasks = [ClassTask("read-vpn", "What does ticket 2 say?", TICKETS, [call("get_ticket", ticket_id=2)],
                       answer_facts=list(facts), **task_opts),
             ClassTask("close-1", "Close ticket 1.", TICKETS, [call("close_ticket", ticket_id=1)])]
    return from_class(Service(TicketAPI, loader="_load_scenario"), name="TicketReads-v0", domain="support",
                      tasks=tasks, validation="lax", require_reads=require_reads)


def _play(spec, task_id, actions):
    ep = Episode(spec)
    return play(ep, ScriptPolicy(list(actions), finish=True), task_id), ep


def test_noop_agent_earns_nothing_on_a_read_only_task():
    """Before: the reference only reads, so the final state equals the initial state and a
    no-op agent succeeded (verify's noop check failed on such tasks)."""
    report = verify_spec(_spec(), lambda: Episode(_spec()), api_checks=False, random_episodes=1)
    assert [f.to_json() for f in report.failures] == []
    out, _ = _play(_spec(), "read-vpn", [])
    assert not out.success and not any(out.rewards.values())


def test_the_read_must_be_made_an_equivalent_call_counts_a_guess_does_not():
    spec = _spec(facts=["drops"])
    guess, _ = _play(spec, "read-vpn", ["It says: drops"])  # the fact, without reading
    assert not guess.success
    other_read, _ = _play(spec, "read-vpn", [call("get_ticket", ticket_id=1).to_hermes(), "drops"])
    assert not other_read.success  # a read, but not the one with the answer
    same, _ = _play(spec, "read-vpn", [call("get_ticket", ticket_id="ticket_002").to_hermes(), "it drops"])
    assert same.success  # the same result, asked another way
    ref, _ = _play(spec, "read-vpn", [call("get_ticket", ticket_id=2).to_hermes(), "drops"])
    assert ref.success


def test_writing_tasks_keep_plain_state_equality_and_never_is_the_old_behaviour():
    spec = _spec()
    out, _ = _play(spec, "close-1", [call("close_ticket", ticket_id=1).to_hermes(), "done"])
    assert out.success
    assert spec.task("close-1").check is None  # the reference changes the state: nothing added
    assert spec.task("read-vpn").check is not None
    old = _spec(require_reads="never")
    assert old.task("read-vpn").check is None
    assert _play(old, "read-vpn", [])[0].success  # what a no-op agent earned before


def test_per_task_override():
    spec = _spec(require_reads=False)
    assert spec.task("read-vpn").check is None
    spec = from_class(Service(TicketAPI, loader="_load_scenario"), name="TicketReads-v0", domain="support",
                      tasks=[ClassTask("r", "Read ticket 1.", TICKETS, [call("get_ticket", ticket_id=1)],
                                       require_reads=False)], validation="lax")
    assert spec.task("r").check is None


def test_reads_are_carried_by_fork_and_snapshot_and_left_out_of_the_hash():
    spec = _spec()
    ep = Episode(spec)
    ep.reset(task="read-vpn")
    before = state_hash(ep._world.state())
    ep.step(call("get_ticket", ticket_id=2).to_hermes())
    state = ep._world.state()
    assert state_hash(state) == before  # a read does not change the world
    assert len(seen_results(state)) == 1
    fork = ep.fork()
    restored = Episode(spec)
    restored.restore(json.loads(json.dumps(ep.snapshot())))
    for e in (ep, fork, restored):
        e.step("Done.")
        assert e.success, e
    plain = copy_state(state)
    assert seen_results(plain) == seen_results(state)
    assert seen_results(spec.task("read-vpn").initial_state) == frozenset()


def test_synthesized_read_tasks_need_their_reads_too():
    import envfactory
    from envfactory.factory.from_class import ReadsCheck

    spec = envfactory.spec("Trading-v0")  # from_class(Brokerage, ...) with synthesized tasks
    reads = [t for t in spec.get_tasks() if isinstance(t.check, ReadsCheck)]
    assert len(reads) >= 5
    for t in reads[:5]:
        assert t.answer_facts
        assert not _play(spec, t.id, [" ".join(t.answer_facts)])[0].success  # stated without looking
        assert _play(spec, t.id, list(t.solution))[0].success


class _Hidden:
    """A class whose name starts with an underscore (its default key used to be a private field)."""

    def __init__(self, n: int = 0) -> None:
        self.n = n
        self.log = [self]  # shares itself: a state of objects, keyed by the class name

    def bump(self) -> int:
        """Add one."""
        self.n += 1
        return self.n


def test_a_class_named_with_an_underscore_gets_a_public_key():
    """Before: the key '_hidden' became a pydantic private name and building the state failed
    with 'Extra inputs are not permitted'."""
    spec = from_class(_Hidden, name="Hidden-v0", domain="x", config={"n": 1},
                      tasks=[ClassTask("b", "Bump.", {"n": 1}, [call("bump")])])
    ep = Episode(spec)
    ep.reset("b")
    assert ep.step(call("bump").to_hermes()).messages[0]["content"] == "2"
    assert ep.state.hidden.n == 2
