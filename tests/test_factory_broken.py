"""Deliberately broken environments are rejected, with the failing check named."""

from __future__ import annotations

import itertools

from envfactory import ToolEnvSpec, State, Task, call, tool
from envfactory import Episode
from envfactory.checks.verify import verify_spec


class Box(State):
    items: dict[str, int] = {}
    stamp: int = 0


@tool
def put(state: Box, name: str, count: int) -> str:
    """Put items in the box.

    Args:
        name: Item name.
        count: How many.
    """
    state.items[name] = state.items.get(name, 0) + count
    return f"{name}: {state.items[name]}"


_clock = itertools.count()


@tool
def put_stamped(state: Box, name: str) -> str:
    """Put one item in the box and stamp the box with a serial number.

    Args:
        name: Item name.
    """
    state.items[name] = state.items.get(name, 0) + 1
    state.stamp = next(_clock)  # hidden global: not a function of state and arguments
    return "stamped"


def _verify(tasks, tools=(put,)):
    spec = ToolEnvSpec(name="Broken-v0", domain="test", state_type=Box, tools=list(tools), tasks=tasks)
    report = verify_spec(spec, make_env=lambda: Episode(spec))
    return report, {(f.check, f.task) for f in report.failures}


def _good(i=0):
    return Task(id=f"good{i}", instruction=f"Put {i + 2} pears in the box.", initial_state=Box(),
                solution=[call("put", name="pear", count=i + 2)])


def test_good_box_passes():
    report, _ = _verify([_good(0), _good(1)])
    assert report.verified, report.failures


def test_unsolvable_task_is_rejected():
    bad = Task(id="unsolvable", instruction="Put 3 figs in the box.", initial_state=Box(),
               solution=[call("put", name="fig", count=3)], check=lambda s: s.items.get("fig") == 4)
    report, failed = _verify([_good(), bad])
    assert not report.verified and ("reference", "unsolvable") in failed
    assert all(task == "unsolvable" for check, task in failed if check == "reference")


def test_reward_reachable_by_a_noop_is_rejected():
    free = Task(id="free", instruction="Make sure the box holds no figs.", initial_state=Box(),
                solution=[call("put", name="pear", count=1)], check=lambda s: "fig" not in s.items)
    report, failed = _verify([_good(), free])
    assert ("noop", "free") in failed and ("claim", "free") in failed


def test_non_deterministic_tool_is_rejected():
    t = Task(id="stamped", instruction="Put a plum in the box with the stamping tool.",
             initial_state=Box(), solution=[call("put_stamped", name="plum")],
             check=lambda s: s.items.get("plum") == 1)
    report, failed = _verify([_good(), t], tools=(put, put_stamped))
    assert ("tool_determinism", "stamped") in failed
    detail = next(f.detail for f in report.failures if f.check == "tool_determinism")
    assert "put_stamped" in detail
