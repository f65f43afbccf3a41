"""Verification claims for every multi-agent environment: reference joint solutions succeed,
a no-op team fails, each role acting alone fails; and the verifier catches violations."""

import json
import subprocess
import sys

import pytest

import envfactory
from envfactory import MultiState, Role, State, Task, ToolEnvSpec, by, tool
from envfactory.checks.scripted import MODES, ClaimPolicy, NoopPolicy, OraclePolicy, RandomPolicy, ScriptPolicy, play
from envfactory.checks.verify import verify_spec

MULTI = sorted(s.name for s in envfactory.specs() if getattr(s, "multi_agent", False))


@pytest.mark.parametrize("name", MULTI)
def test_reference_succeeds_noop_fails_and_every_role_alone_fails(name):
    spec = envfactory.spec(name)
    ep = envfactory.make_multi(name)
    assert not spec.replay_errors
    for task in spec.get_tasks():
        for mode in task.metadata.get("modes", MODES):
            assert play(ep, dict.fromkeys(spec.agent_ids, OraclePolicy()), task.id, mode=mode).success, (task.id, mode)
        noop = play(ep, dict.fromkeys(spec.agent_ids, NoopPolicy()), task.id)
        assert not noop.success and not any(noop.rewards.values())
        rand = play(ep, dict.fromkeys(spec.agent_ids, RandomPolicy()), task.id, seed=3)
        if spec.legal_actions is not None:  # a game's random players draw legal moves only
            assert rand.errors == {}, (task.id, rand.errors)
        if not spec.metadata.get("competitive"):  # (and two of them may play a match out)
            assert not rand.success
        assert not play(ep, ClaimPolicy(), task.id).success
        for agent in spec.agent_ids:
            team = {a: ScriptPolicy(list(task.solution), finish=True) if a == agent else NoopPolicy()
                    for a in spec.agent_ids}
            out = play(ep, team, task.id)
            assert not out.success, f"{agent} alone solved {task.id}"


@pytest.mark.parametrize("name", MULTI)
def test_full_verification_suite_passes(name):
    report = verify_spec(envfactory.spec(name), api_checks=False)
    assert report.verified, [f.to_json() for f in report.failures]
    assert {"reference", "noop", "claim", "alone", "fork", "snapshot", "malformed"} <= set(report.checks)


class Tally(MultiState):
    a: int = 0
    b: int = 0


@tool
def bump_a(state: Tally) -> str:
    """Increase a."""
    state.a += 1
    return "ok"


@tool
def bump_b(state: Tally) -> str:
    """Increase b."""
    state.b += 1
    return "ok"


def _spec(name, roles, check):
    task = Task(id="t", instruction="make a and b positive", initial_state=Tally(),
                solution=[by("left_0", "bump_a"), by("right_0", "bump_b")], check=check)
    return ToolEnvSpec(name=name, domain="test", state_type=Tally, tools=[], roles=roles, tasks=[task])


def test_verifier_catches_a_role_that_can_do_everything_alone():
    spec = _spec("TestSolo-v0", [Role("left_0", "left", [bump_a, bump_b]), Role("right_0", "right", [bump_b])],
                 lambda s: s.a > 0 and s.b > 0)
    report = verify_spec(spec, make_env=lambda: envfactory.Episode(spec))
    assert "pettingzoo" in report.checks and not [f for f in report.failures if f.check == "pettingzoo"]
    alone = [f.detail for f in report.failures if f.check == "alone"]
    assert len(alone) == 1 and alone[0].startswith("left_0 alone succeeded")


def test_verifier_catches_a_task_a_noop_team_solves():
    spec = _spec("TestTrivial-v0", [Role("left_0", "left", [bump_a]), Role("right_0", "right", [bump_b])],
                 lambda s: True)
    report = verify_spec(spec, make_env=lambda: envfactory.Episode(spec), api_checks=False)
    assert {"noop", "claim", "random", "alone"} <= {f.check for f in report.failures}


def test_verifier_catches_two_roles_with_different_tools_of_one_name():
    @tool(name="bump_a")
    def other_bump(state: Tally) -> str:
        """Increase b, under a's name."""
        state.b += 1
        return "ok"

    spec = _spec("TestClash-v0", [Role("left_0", "left", [bump_a]), Role("right_0", "right", [other_bump, bump_b])],
                 lambda s: s.a > 0 and s.b > 0)
    report = verify_spec(spec, make_env=lambda: envfactory.Episode(spec), api_checks=False)
    assert any(f.check == "schema" and "'bump_a'" in f.detail for f in report.failures)


def test_spec_validation_names_what_to_fix():
    with pytest.raises(envfactory.SpecError, match="reader_0"):
        _spec("TestBad-v0", [Role("Left", "x", [bump_a]), Role("right_0", "y", [bump_b])], lambda s: True)
    with pytest.raises(envfactory.SpecError, match="at least two roles"):
        _spec("TestBad-v0", [Role("left_0", "x", [bump_a])], lambda s: True)

    class NotMulti(State):
        x: int = 0

    with pytest.raises(envfactory.SpecError, match="MultiState"):
        ToolEnvSpec(name="TestBad-v0", domain="t", state_type=NotMulti, tools=[],
                    roles=[Role("a_0", "a"), Role("b_0", "b")], tasks=[])


def test_cli_list_and_verify_show_multi_agent_environments():
    out = subprocess.run([sys.executable, "-m", "envfactory.cli", "list", "--json"], capture_output=True,
                         text=True, check=True)
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    for name in MULTI:
        assert rows[name]["multi_agent"] is True and rows[name]["tasks"] >= 4 and rows[name]["tools"] >= 3
    out = subprocess.run([sys.executable, "-m", "envfactory.cli", "verify", "MultiDeal-v0", "--json"],
                         capture_output=True, text=True)
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["environments"][0]["verified"]
    assert "pettingzoo" in doc["environments"][0]["checks"] and "alone" in doc["environments"][0]["checks"]
