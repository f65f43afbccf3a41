"""The verifier rejects broken environments and names the failing check."""

import random

from envfactory import Episode, ToolEnvSpec, State, Task, call, tool
from envfactory.checks.verify import verify_spec


class S(State):
    x: int = 0
    y: int = 0


@tool
def set_x(state: S, value: int) -> str:
    """Set x.

    Args:
        value: New value.
    """
    state.x = value
    return "ok"


@tool
def set_y_random(state: S) -> str:
    """Set y to something."""
    state.y = random.randint(0, 10**9)
    return "ok"


def _spec(name, tasks, tools=(set_x,)):
    return ToolEnvSpec(name=name, domain="test", state_type=S, tools=list(tools), tasks=tasks)


def _checks(report):
    return {(f.check, f.task) for f in report.failures}


def _local(spec):
    return lambda: Episode(spec)


def test_good_environment_passes():
    spec = _spec("Good-v0", [Task(id="t1", instruction="set x to 7", initial_state=S(),
                                  solution=[call("set_x", value=7)])])
    report = verify_spec(spec, make_env=_local(spec))
    assert report.verified, report.failures


def test_noop_reachable_reward_is_rejected():
    spec = _spec("Trivial-v0", [Task(id="free", instruction="x must be 0", initial_state=S(),
                                     solution=[call("set_x", value=0)])])
    report = verify_spec(spec, make_env=_local(spec))
    assert ("noop", "free") in _checks(report) and ("claim", "free") in _checks(report)


def test_unsolvable_task_is_rejected():
    spec = _spec("Unsolvable-v0", [Task(id="never", instruction="make x 5", initial_state=S(),
                                        solution=[call("set_x", value="five")],
                                        check=lambda s: s.x == 5)])
    report = verify_spec(spec, make_env=_local(spec))
    checks = _checks(report)
    assert ("reference", "never") in checks and ("tasks", "never") in checks


def test_nondeterministic_tool_is_rejected():
    spec = _spec("Flaky-v0", [Task(id="t", instruction="set x to 3 and touch y", initial_state=S(),
                                   solution=[call("set_x", value=3), call("set_y_random")],
                                   check=lambda s: s.x == 3)], tools=(set_x, set_y_random))
    report = verify_spec(spec, make_env=_local(spec))
    assert ("determinism", "t") in _checks(report)
