"""Read-only tasks of an imported class checked by their answer: the facts the user must be
told (a suite's own expected outputs, τ²-bench's ``outputs``) go in ``ClassTask.answer_facts``,
judged as every task's answer facts are; and a class synthesis finds no task for says why."""

from __future__ import annotations

import pytest

from envfactory import Episode, SpecError
from envfactory.checks.scripted import ClaimPolicy, NoopPolicy, OraclePolicy, play
from envfactory.checks.verify import verify_spec
from envfactory.factory.from_class import ClassTask, from_class
from envfactory.task import call


class Store:
    """A store's orders."""

    def __init__(self, orders=None):
        self.orders = dict(orders or {})

    def get_order(self, order_id: str) -> dict:
        """Look up an order.

        Args:
            order_id: The order.
        """
        if order_id not in self.orders:
            return {"error": "no such order"}
        return self.orders[order_id]

    def cancel_order(self, order_id: str) -> str:
        """Cancel an order.

        Args:
            order_id: The order.
        """
        self.orders[order_id]["status"] = "cancelled"
        return "ok"


CFG = {"orders": {"W1": {"status": "pending", "total": 431.07}, "W2": {"status": "delivered", "total": 12.5}}}
ASK = "What do my orders W1 and W2 cost together?"


def _spec(**extra):
    # require_reads=False: the answer alone must tell a looker from an agent that did nothing
    return from_class(Store, name="Store-v0", domain="shop", read_only=["get_order"], tasks=[
        ClassTask("ask", ASK, CFG, solution=[call("get_order", order_id="W1"), call("get_order", order_id="W2")],
                  require_reads=False, **extra),
        ClassTask("cancel", "Cancel order W2.", CFG, solution=[call("cancel_order", order_id="W2")])])


def test_expected_outputs_check_a_read_only_task_a_noop_and_a_claim_fail():
    # the total is computed from two results, not read in one: answer_seen=False
    spec = _spec(answer_facts=["443.57"], answer_seen=False)
    task = spec.get_tasks()[0]
    assert task.answer_facts == ["443.57"] and task.answer_seen is False
    ep = Episode(spec)
    assert play(ep, OraclePolicy(), "ask").success
    assert not play(ep, NoopPolicy(), "ask").success
    assert not play(ep, ClaimPolicy(), "ask").success
    assert not task.success(task.fresh_state(), "They cost 400 together.")
    report = verify_spec(spec, make_env=lambda: Episode(spec), api_checks=False, audit="quick", audit_fails=True)
    assert report.verified, report.failures


def test_a_fact_read_in_a_result_must_have_been_shown():
    spec = from_class(Store, name="Store-v0", domain="shop", read_only=["get_order"], tasks=[
        ClassTask("ask", "What does order W1 cost?", CFG, solution=[call("get_order", order_id="W1")],
                  answer_facts=["431.07"], require_reads=False, answer_rivals=[])])
    task = spec.get_tasks()[0]
    assert task.answer_rivals == []
    ep = Episode(spec)
    assert play(ep, OraclePolicy(), "ask").success
    ep.reset("ask")  # the right figure, guessed without looking: nothing shown, nothing earned
    ep.step("It costs 431.07.")
    assert ep.status.judge()[0] is False


def test_without_outputs_verify_still_reports_the_read_only_task_as_passable_by_doing_nothing():
    spec = _spec()
    report = verify_spec(spec, make_env=lambda: Episode(spec), api_checks=False, audit=None)
    assert not report.verified
    assert {(f.check, f.task) for f in report.failures} >= {("noop", "ask"), ("claim", "ask")}


class Counter:
    """A counter."""

    def __init__(self, n: int = 0):
        self.n = n

    def get_n(self) -> int:
        """The value."""
        return self.n


def test_a_class_synthesis_finds_no_task_for_says_why_naming_its_tools():
    spec = from_class(Counter, name="Counter-v0", domain="x", config={"n": 3})
    with pytest.raises(SpecError, match=r"Counter-v0 \(Counter\): task synthesis found no task \(get_n: reads only"):
        spec.get_tasks()
    with pytest.raises(SpecError, match="tasks=\\[ClassTask"):
        Episode(spec).reset()
