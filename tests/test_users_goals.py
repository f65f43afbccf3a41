"""Users with goals (issue 26, tau2-style): the scripted user has a persona and a goal it
volunteers (never the facts that identify it), answers what it is asked, may give a wrong value
once and correct it, and must confirm before an irreversible action; all of it a function of the
state, so forks and snapshots replay it exactly."""

from __future__ import annotations

import json

import pytest

import envfactory
from envfactory.checks.scripted import NoopPolicy, OraclePolicy, play
from envfactory.factory.from_spec import load_spec_file
from envfactory.factory.tasks.user_goals import irreversible
from envfactory.users import CONFIRM, GOAL, PERSONA, SLIP, USER_TOOL, user_turn

FAMILIES = ("RetailOrders-v1", "Telecom-v0")


def _user_tasks(name: str) -> list:
    return [t for t in envfactory.spec(name).get_tasks() if t.metadata.get("kind") == "user"]


def _with(key: str):
    """A user task (of either family) whose user's script has ``key``, and its family."""
    for name in FAMILIES:
        for t in _user_tasks(name):
            if key in t.initial_state.user:
                return name, t
    pytest.fail(f"no user task with {key}")


def _ask(ep, question: str) -> str:
    call = json.dumps({"name": USER_TOOL, "arguments": {"question": question}})
    return ep.step(f"<tool_call>{call}</tool_call>").messages[0]["content"]


def test_the_user_volunteers_part_of_its_goal_but_not_who_it_is():
    user = {"name": "Kim", "order status": "placed", PERSONA: "a gold customer with 3 orders",
            GOAL: "I'd like you to cancel my orders with the status I have in mind."}
    reply = user_turn(dict(user), "Hello! How can I help you today?")
    assert "gold customer with 3 orders" in reply and user[GOAL] in reply
    # neither a fact nor the names of its facts: the agent has to know what to ask for (issue 61)
    assert "Kim" not in reply and "placed" not in reply and "name" not in reply and "order status" not in reply
    # and it answers what it is asked, as before
    assert user_turn(dict(user), "What is your name?") == "My name is Kim."
    assert user_turn(dict(user), "Which order status do you mean?") == "My order status is placed."
    # in a real episode too: the goal on an open question, the name only when asked for
    name, task = _with(GOAL)
    ep = envfactory.make(name, split="all")
    ep.reset(task=task.id)
    opening = _ask(ep, "How can I help?")
    assert task.initial_state.user[GOAL] in opening and task.initial_state.user["name"] not in opening
    ep.close()


def test_a_correcting_user_gives_a_wrong_value_then_the_right_one_identically_after_fork_and_restore():
    name, task = _with(SLIP)
    right, wrong = task.initial_state.user["name"], task.initial_state.user[SLIP].split("=", 1)[1]
    ep = envfactory.make(name, split="all")
    ep.reset(task=task.id)
    assert _ask(ep, "What is your name?") == f"My name is {wrong}."
    # the wrong value names no one: looking it up finds nothing
    people = next(rows for rows in ep.state.tables.values() if any(r.get("name") == right for r in rows.values()))
    assert wrong.lower() not in {str(r.get("name")).lower() for r in people.values()}
    child = ep.fork()
    snap = json.loads(json.dumps(ep.snapshot()))
    restored = envfactory.make(name, split="all")
    restored.restore(snap)
    fixed = f"Sorry, I meant {right}. My name is {right}."
    assert [_ask(e, "Could you repeat your name?") for e in (ep, child, restored)] == [fixed] * 3
    assert _ask(ep, "What is your name?") == f"My name is {right}."  # corrected once, then plain
    # any other question after the slip carries the correction first
    other = envfactory.make(name, split="all")
    other.reset(task=task.id)
    _ask(other, "What is your name?")
    assert _ask(other, "How can I help?").startswith(f"Sorry, I told you the wrong name earlier: it is {right}")
    # deterministic: a fresh episode hears the same
    again = envfactory.make(name, split="all")
    again.reset(task=task.id)
    assert _ask(again, "What is your name?") == f"My name is {wrong}."
    for e in (ep, child, restored, other, again):
        e.close()


def test_an_irreversible_action_needs_the_users_yes_first():
    name, task = _with(CONFIRM)
    assert task.initial_state.user[CONFIRM] in {c.name for c in task.solution}
    # the reference asks for the confirmation before the first irreversible call
    first_act = next(i for i, c in enumerate(task.solution) if c.name == task.initial_state.user[CONFIRM])
    assert any(c.name == USER_TOOL and "go ahead" in c.arguments["question"] for c in task.solution[:first_act])
    # without it the action is refused (an observation), and the task fails
    unconfirmed = [c for c in task.solution if not (c.name == USER_TOOL and "go ahead" in c.arguments["question"])]
    ep = envfactory.make(name, split="all")
    ep.reset(task=task.id)
    seen = [ep.step(c.to_hermes()).messages[0]["content"] for c in unconfirmed]
    assert any("has not confirmed this yet" in s for s in seen), seen
    r = ep.step("Done.")
    assert r.done and r.reward == 0.0
    # with it, the same calls succeed
    assert play(envfactory.make(name, split="all"), OraclePolicy(), task.id).success
    # a task whose user need not confirm: the same tool is never refused there
    plain = next((t for t in _user_tasks(name) if CONFIRM not in t.initial_state.user), None)
    if plain is not None:
        assert play(envfactory.make(name, split="all"), OraclePolicy(), plain.id).success


@pytest.mark.parametrize("name", FAMILIES)
def test_every_user_task_is_solved_by_its_reference_and_not_by_doing_nothing(name):
    tasks = _user_tasks(name)
    assert tasks and all(PERSONA in t.initial_state.user and GOAL in t.initial_state.user for t in tasks)
    ep = envfactory.make(name, split="all")
    for t in tasks:
        assert play(ep, OraclePolicy(), t.id).reward == 1.0, t.id
        assert play(ep, NoopPolicy(), t.id).reward == 0.0, t.id
    ep.close()


def test_which_actions_are_irreversible_comes_from_the_spec():
    env = load_spec_file("environments/specs/retail.yaml")
    ops = {op.name: op for op in env.operations}
    assert irreversible(env, ops["cancel_order"]) and irreversible(env, ops["refund_order"])
    assert not irreversible(env, ops["ship_order"]) and not irreversible(env, ops["mark_delivered"])
    assert not irreversible(env, ops["restock_product"]) and not irreversible(env, ops["get_order"])
