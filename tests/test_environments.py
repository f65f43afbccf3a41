"""Every registered single-agent environment: solvable, not trivially rewarded, Gymnasium-valid."""

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import envfactory
from envfactory.checks.scripted import ClaimPolicy, NoopPolicy, OraclePolicy, play

SINGLE = [s for s in envfactory.specs() if not getattr(s, "multi_agent", False)]
NAMES = [s.name for s in SINGLE]


@pytest.mark.parametrize("name", NAMES)
def test_every_reference_solution_earns_1_and_noop_earns_0(name):
    spec = envfactory.spec(name)
    env = envfactory.make(name)
    assert not spec.replay_errors, spec.replay_errors
    for task in spec.get_tasks():
        # the same scripted policies that play teams play the one-role case
        assert play(env, OraclePolicy(), task.id).reward == 1.0, task.id
        assert play(env, NoopPolicy(), task.id).reward == 0.0, task.id
        assert play(env, ClaimPolicy(), task.id).reward == 0.0, task.id


@pytest.mark.parametrize("name", NAMES)
def test_gymnasium_check_env(name):
    env = gymnasium.make(f"envfactory/{name}", split="all")  # API conformance: any task will do
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # check_env warnings are failures here
        check_env(env.unwrapped)


@pytest.mark.parametrize("name", ["FileSystem-v0", "Helpdesk-v0", "Bank-v0"])
def test_real_environments_have_rich_tasks(name):
    tasks = envfactory.spec(name).get_tasks()
    lengths = [len(t.solution) for t in tasks]
    assert len(tasks) >= 20
    assert min(lengths) == 1 and max(lengths) >= 5
    # some tasks need the output of an earlier call: their reference solution
    # starts with a read-only call whose result determines a later write
    spec = envfactory.spec(name)
    tools = spec.all_tools
    dependent = [t for t in tasks if len(t.solution) >= 2 and tools[t.solution[0].name].read_only
                 and any(not tools[c.name].read_only for c in t.solution[1:])]
    assert len(dependent) >= 3
