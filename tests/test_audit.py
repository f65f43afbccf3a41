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


class Vault(State):
    x: int = 0
    inside: bool = False
    vault_open: bool = False


@tool(read_only=True)
def sign_in(state: Vault) -> str:
    """Sign in at the front desk and get today's badge."""
    return "Your badge today is B-12."


@tool
def enter(state: Vault, badge: str) -> str:
    """Enter the building with a badge.

    Args:
        badge: Today's badge.
    """
    if badge != "B-12":
        raise ToolError("that badge is not valid today")
    state.inside = True
    return "Welcome in. The vault code today is V-31."


@tool
def open_vault(state: Vault, code: str) -> str:
    """Open the vault (from inside).

    Args:
        code: Today's vault code.
    """
    if not state.inside or code != "V-31":
        raise ToolError("the vault stays shut")
    state.vault_open = True
    return "the vault is open"


@tool
def set_dial(state: Vault, value: int) -> str:
    """Set the dial x (from inside).

    Args:
        value: New value (0 to 100).
    """
    if not state.inside or not 0 <= value <= 100:
        raise ToolError("the dial cannot be set from here")
    state.x = value
    return f"the dial is at {value}"


def _deep_lenient():
    """A check that also accepts an open vault, three calls away (each needs what the last one
    said): a search to depth 2 cannot reach it, one as deep as the reference (3 calls) can."""
    return ToolEnvSpec(name="DeepLenient-v0", domain="test", state_type=Vault,
                       tools=[sign_in, enter, open_vault, set_dial], tasks=[Task(
                           id="dial7", instruction="Sign in, go inside and set the dial to 7.", initial_state=Vault(),
                           solution=[call("sign_in"), call("enter", badge="B-12"), call("set_dial", value=7)],
                           check=lambda s: s.x == 7 or s.vault_open)])


def test_the_guided_search_reaches_the_reference_depth_and_finds_what_depth_two_misses():
    from dataclasses import replace

    spec = _deep_lenient()
    task = spec.task("dial7")
    shallow = audit_task(spec, task, FULL)
    assert shallow["hacks"] == [] and "guided" not in shallow  # depth 2: the open vault is out of reach
    deep = audit_task(spec, task, replace(FULL, guided_depth=0))  # 0: as deep as the reference
    [hack] = deep["hacks"]
    assert hack.why == "missing_effect" and hack.confirmed and hack.kind == "guided"
    assert [c["name"] for c in hack.calls] == ["sign_in", "enter", "open_vault"]
    g = deep["guided"]
    assert g["depth"] == g["reached"] == 3 and g["sequences"] <= FULL.guided_sequences
    assert [lv["depth"] for lv in g["levels"]] == [1, 2, 3]
    assert 0 < g["coverage"] <= 1 and g["space"] >= g["sequences"] and g["states"] >= 3
    # the legitimate dial setting is reached too (no hack), and its rewards count in the total
    assert deep["rewards"] > shallow["rewards"] > 0
    doc = audit_spec(spec, replace(QUICK, guided_depth=0))
    assert doc["hacks"] == 1 and doc["guided"]["tasks"] == 1 and doc["guided"]["max_depth"] == 3
    assert audit_spec(spec, QUICK)["hacks"] == 0 and "guided" not in audit_spec(spec, QUICK)


def test_verify_audit_depth_is_opt_in_and_reports_the_guided_coverage(capsys):
    from envfactory.cli import main

    assert main(["verify", "RetailOrders-v1", "--json", "--workers", "1"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "guided" not in plain["audit"] and plain["environments"][0]["audit"]["budget"]["guided_depth"] is None
    assert main(["verify", "RetailOrders-v1", "--json", "--workers", "1", "--audit-depth", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    g, tasks = doc["audit"]["guided"], envfactory.spec("RetailOrders-v1").get_tasks()
    searched = doc["environments"][0]["audit"]["tasks_searched"]
    assert g["tasks"] == searched == 3 and g["reached_depth"] == 3  # every search went as deep as asked
    assert g["max_depth"] <= max(len(t.solution) for t in tasks) and g["mean_depth"] > 2
    assert 0 < g["coverage"] < 1 and g["states"] > 0 and doc["audit"]["hacks"] == 0
    assert doc["audit"]["sequences"] > plain["audit"]["sequences"] + g["sequences"] - 1
    assert main(["verify", "RetailOrders-v1", "--workers", "1", "--audit-depth", "4"]) == 0
    assert "guided search: 3 tasks to depth 4.0" in capsys.readouterr().out
