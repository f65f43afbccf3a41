"""FindLight: success depends on reading locate's answer; and the three disjoint task splits."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

import envfactory
from envfactory import SpecError, Task
from envfactory.checks.scripted import OraclePolicy, play


def _blind_success(name: str, seed: int = 0) -> float:
    """A policy that ignores every tool result: it knows the task's rooms (more than the
    agent is told) and switches one on at random. The best such a policy can do is chance."""
    rng = random.Random(seed)
    ep = envfactory.make(name)
    wins = 0
    tasks = ep.spec.get_tasks()
    for t in tasks:
        ep.reset(t)
        ep.step(envfactory.call("locate", thing=t.metadata["item"]))
        room = rng.choice(sorted(t.initial_state.lights))
        wins += ep.step(envfactory.call("turn_on", room=room)).info.get("success") or ep.step("done").info["success"]
    return wins / len(tasks)


@pytest.mark.parametrize("name,rooms", [("FindLight-v0", 4), ("FindLight-v1", 6), ("FindLight-v2", 8)])
def test_ignoring_tool_results_stays_near_chance(name: str, rooms: int) -> None:
    blind = _blind_success(name)
    assert abs(blind - 1 / rooms) < 0.1, blind
    ep = envfactory.make(name)
    oracle = [play(ep, OraclePolicy(), t).success for t in ep.spec.get_tasks()]
    assert all(oracle)


def test_switching_every_light_on_is_not_success() -> None:
    ep = envfactory.make("FindLight-v1")
    for t in ep.spec.get_tasks()[:40]:
        ep.reset(t)
        ep.step([envfactory.call("turn_on", room=r) for r in t.initial_state.lights])
        assert ep.step("done").info["success"] is False


def test_two_hop_tasks_need_the_second_locate() -> None:
    spec = envfactory.spec("FindLight-v2")
    t = spec.get_tasks()[0]
    assert t.metadata["hops"] == 2
    item_place = t.initial_state.where[t.metadata["item"]]
    assert item_place not in t.initial_state.lights  # the first answer is a container, not a room
    with pytest.raises(ValueError):
        from environments.find_light import find_light_spec

        find_light_spec("FindLight-v9", difficulty=3)


@pytest.mark.parametrize("name", ["FindLight-v0", "FindLight-v2", "Lights-v0", "Counter-v0", "MultiDeal-v0"])
def test_the_three_splits_are_disjoint_and_cover_every_task(name: str) -> None:
    spec = envfactory.spec(name)
    parts = {k: [t.id for t in spec.tasks_in(k)] for k in ("sft", "rl", "eval")}
    ids = [t.id for t in spec.get_tasks()]
    assert sorted(sum(parts.values(), [])) == sorted(ids)
    assert all(spec.split(i) == k for k, v in parts.items() for i in v)
    if len(ids) >= 200:
        assert all(0.15 < len(v) / len(ids) < 0.65 for v in parts.values())


def test_splits_are_the_same_in_every_process() -> None:
    code = "import envfactory; s = envfactory.spec('FindLight-v0'); print([t.id for t in s.tasks_in('eval')])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    here = str([t.id for t in envfactory.spec("FindLight-v0").tasks_in("eval")])
    assert other == here


def test_a_task_can_name_its_split_and_a_wrong_name_is_an_error() -> None:
    from environments.counter import CounterState

    spec = envfactory.ToolEnvSpec(
        name="SplitCheck-v0", domain="test", description="d", state_type=CounterState, tools=[],
        tasks=[Task(id="a", instruction="i", initial_state=CounterState(), solution=[], metadata={"split": "eval"}),
               Task(id="b", instruction="i", initial_state=CounterState(), solution=[], metadata={"split": "test"})])
    assert spec.split("a") == "eval"
    with pytest.raises(SpecError, match="splits are"):
        spec.split("b")
    with pytest.raises(ValueError):
        spec.tasks_in("train")
