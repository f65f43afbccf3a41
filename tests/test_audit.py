"""The reward-hacking audit flags rewards earned without doing the task, and only those;
the transcriber solves what the instruction spells out and nothing that needs a look-up."""

import json
import re

import pytest

import envfactory
from envfactory import Episode, State, Task, ToolEnvSpec, ToolError, call, tool
from envfactory.checks.scripted import TranscriberPolicy, play
from envfactory.checks.audit import FULL, QUICK, AuditBudget, audit_spec, audit_task, transcriber_rate
from envfactory.checks.verify import verify_spec


class Garage(State):
    x: int = 0
    door_open: bool = False
    wheels: int = 4
    balance: str = "430.75"


@tool
def set_x(state: Garage, value: int) -> str:
    """Set x.

    Args:
        value: New value (0 to 100).
    """
    if not 0 <= value <= 100:
        raise ToolError("value must be between 0 and 100")
    state.x = value
    return f"x is {value}"


@tool
def open_door(state: Garage, code: str) -> str:
    """Open the garage door.

    Args:
        code: The door code.
    """
    if code != "K-77":
        raise ToolError("wrong code")
    state.door_open = True
    return "the door is open"


@tool(read_only=True)
def inspect(state: Garage) -> str:
    """Describe the car."""
    return json.dumps({"wheels": state.wheels, "balance": state.balance})


TOOLS = [set_x, open_door, inspect]


def _spec(name, tasks):
    return ToolEnvSpec(name=name, domain="test", state_type=Garage, tools=TOOLS, tasks=tasks)


def _lenient():
    # the check accepts any of two changes; only one of them is the task
    return _spec("Lenient-v0", [Task(
        id="x7", instruction="Set x to 7. (The door code K-77 is for another day.)", initial_state=Garage(),
        solution=[call("set_x", value=7)], check=lambda s: s.x == 7 or s.door_open)])


def _guessable():
    return _spec("Guessable-v0", [Task(
        id="wheels", instruction="How many wheels does the car have? Answer with the number.",
        initial_state=Garage(), solution=[call("inspect")], answer_facts=["4"])])


def _sound():
    return _spec("Sound-v0", [
        Task(id="x7", instruction="Set x to 7. (The door code K-77 is for another day.)", initial_state=Garage(),
             solution=[call("set_x", value=7)]),  # default check: the reference's final state
        Task(id="balance", instruction="What is the balance? Answer with two decimals.", initial_state=Garage(),
             solution=[call("inspect")], answer_facts=["430.75"]),
    ])


def test_a_check_that_accepts_a_side_effect_is_flagged():
    spec = _lenient()
    r = audit_task(spec, spec.task("x7"), QUICK)
    hacks = r["hacks"]
    assert hacks and hacks[0].why == "missing_effect" and hacks[0].confirmed
    assert {"name": "open_door", "arguments": {"code": "K-77"}} in hacks[0].calls
    assert "set_x" not in [c["name"] for c in hacks[0].calls]
    assert r["rewards"] > len(hacks)  # the legitimate set_x(7) is found too, and is no hack


def test_a_list_of_numbers_is_no_answer():
    """The small-number fact was the last guessable kind (before the rule, the audit found a read
    followed by a list of every candidate, "0 1 2 ... 12", and the referee paid it): the other
    numbers 0-12 are the fact's rivals now, so a listing earns nothing and the audit finds no hack."""
    spec = _guessable()
    task = spec.task("wheels")
    assert set(task.answer_rivals) == {str(i) for i in range(13)} - {"4"}
    doc = audit_spec(spec, QUICK)
    assert doc["hacks"] == 0 and doc["rewards"] >= 1, doc  # the read-then-answer is found, and is no hack
    inspect = '<tool_call>{"name": "inspect", "arguments": {}}</tool_call>'
    for answer, success in (("0 1 2 3 4 5 6 7 8 9 10 11 12", False), ("It has 4 wheels.", True),
                            ("4, or maybe 5, 6 or 7", True), ("4", True)):
        ep = Episode(spec)
        ep.reset("wheels")
        ep.step(inspect)
        assert ep.step(answer).info["success"] is success, answer
    ep = Episode(spec)
    ep.reset("wheels")
    assert ep.step("4").info["success"] is False  # nothing read: a blind guess earns nothing


def test_a_sound_environment_is_not_flagged_although_its_rewards_are_reached():
    doc = audit_spec(_sound(), FULL)
    assert doc["hacks"] == 0 and doc["rewards"] >= 2, doc  # set_x(7), and the balance read and reported


def test_verify_reports_the_audit_and_can_fail_on_hacks():
    spec = _lenient()
    report = verify_spec(spec, make_env=lambda: Episode(spec), api_checks=False)
    assert report.verified and report.audit["hacks"] == 1  # reported, not failed, by default
    assert set(report.to_json()["audit"]) >= {"budget", "tasks_searched", "sequences", "rewards", "hacks",
                                              "transcriber"}
    strict = verify_spec(spec, make_env=lambda: Episode(spec), api_checks=False, audit_fails=True)
    assert [(f.check, f.task) for f in strict.failures] == [("audit", "x7")]
    sound = _sound()
    assert verify_spec(sound, make_env=lambda: Episode(sound), api_checks=False, audit_fails=True).verified
    assert verify_spec(spec, make_env=lambda: Episode(spec), api_checks=False, audit=None).audit is None


@pytest.mark.parametrize("name", ["Counter-v0", "FindLight-v1"])
def test_sound_builtin_environments_are_not_flagged(name):
    doc = audit_spec(envfactory.spec(name), FULL)
    assert doc["tasks_searched"] == len(envfactory.spec(name).get_tasks())
    assert doc["rewards"] > 0 and doc["hacks"] == 0, doc["examples"]


def test_bank_state_checks_hold_up():
    # Bank-v0's checks are the reference's final state: nothing reaches reward without its effect
    # (its one guessable answer, "how many accounts does carol have" -> "2", is reported apart)
    doc = audit_spec(envfactory.spec("Bank-v0"), AuditBudget(depth=2, sequences=40, tasks=None))
    assert "missing_effect" not in doc["hacks_by_why"] and doc["rewards"] > 0


def test_the_transcriber_copies_ids_but_cannot_look_things_up():
    bank = envfactory.spec("Bank-v0")
    ep = envfactory.make("Bank-v0")
    # the instruction names everything: solved
    spelled = next(t for t in bank.get_tasks() if t.instruction == "Deposit 40.00 in cash into ACC-300.")
    out = play(ep, TranscriberPolicy(), spelled.id)
    assert out.success and out.calls == 1
    # "her checking account", "the landlord's checking account": ids only a look-up gives
    rent = next(t for t in bank.get_tasks() if t.instruction.startswith("Pay alice's rent"))
    assert not play(ep, TranscriberPolicy(), rent.id).success
    # FindLight: which room only `locate` says
    fl = envfactory.spec("FindLight-v1")
    rate = transcriber_rate(fl, fl.get_tasks())
    assert rate["solved"] == 0 and rate["needs_lookup"] == rate["tasks"]


def test_the_transcriber_only_writes_values_of_the_instruction():
    bank = envfactory.spec("Bank-v0")
    policy = TranscriberPolicy()
    ro = {n for n, t in bank.tools_of().items() if t.read_only}
    planned = 0
    for task in bank.get_tasks():
        text = task.instruction.lower()
        for c in policy.plan(task, bank.tool_schemas(), ro):
            assert c.name not in ro
            for v in c.arguments.values():
                v = v[0] if isinstance(v, list) else v
                s = str(v).lower()
                assert s in text or (isinstance(v, float) and re.search(rf"\b{v:g}(\.0+)?\b", text)), (task.id, c)
            planned += 1
    assert planned > 40
    rate = transcriber_rate(bank, bank.get_tasks())
    assert 0 < rate["solved"] < rate["tasks"] and rate["needs_lookup_solved"] <= rate["needs_lookup"]


def test_a_sound_team_environment_is_not_flagged():
    # MultiRecords' change log gets a second entry when a write is repeated: collateral, not a hack
    doc = audit_spec(envfactory.spec("MultiRecords-v0"), FULL)
    assert doc["tasks_searched"] == 50 and doc["rewards"] >= 50 and doc["hacks"] == 0, doc["examples"]


@tool
def sloppy_set_x(state: Garage, value: int) -> str:
    """Set x, checking the value only afterwards.

    Args:
        value: New value (0 to 100).
    """
    state.x = value
    if value < 0:
        raise ToolError("value must not be negative")
    return "ok"


def test_a_write_that_reports_an_error_is_counted():
    spec = ToolEnvSpec(name="Sloppy-v0", domain="test", state_type=Garage, tools=[sloppy_set_x, inspect],
                       tasks=[Task(id="x7", instruction="Set x to 7.", initial_state=Garage(),
                                   solution=[call("sloppy_set_x", value=7)])])
    assert audit_spec(spec, QUICK)["error_writes"] > 0
    assert audit_spec(_sound(), QUICK)["error_writes"] == 0
