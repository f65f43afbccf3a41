"""Counter-v0: the smallest stateful tool environment (benchmarks and runtime tests use it)."""

from __future__ import annotations

from envfactory import ToolEnvSpec, State, Task, ToolError, call, register, tool


class CounterState(State):
    value: int = 0


@tool
def increment(state: CounterState, by: int = 1) -> str:
    """Add to the counter.

    Args:
        by: How much to add (1 to 10).
    """
    if not 1 <= by <= 10:
        raise ToolError("by must be between 1 and 10")
    state.value += by
    return str(state.value)


@tool
def reset_counter(state: CounterState) -> str:
    """Set the counter back to zero."""
    state.value = 0
    return "0"


@tool(read_only=True)
def read_counter(state: CounterState) -> str:
    """Return the counter's value."""
    return str(state.value)


def tasks() -> list[Task]:
    out = []
    for start in (0, 3):
        for target in range(1, 13):
            if target == start:
                continue
            steps = []
            if target < start:
                steps.append(call("reset_counter"))
                base = 0
            else:
                base = start
            remaining = target - base
            while remaining > 0:
                by = min(remaining, 3)
                steps.append(call("increment", by=by))
                remaining -= by
            out.append(Task(
                id=f"counter-{start}-{target}",
                instruction=f"The counter shows {start}. Make it show exactly {target} using "
                            "increments of at most 3 at a time.",
                initial_state=CounterState(value=start),
                solution=steps,
                check=lambda s, target=target: s.value == target,
            ))
    return out


SPEC = register(
    ToolEnvSpec(
        name="Counter-v0",
        domain="toy",
        description="Bring a counter to a target value (benchmark and runtime smoke tests).",
        state_type=CounterState,
        tools=[increment, reset_counter, read_counter],
        tasks=tasks,
        max_turns=12,
    )
)
