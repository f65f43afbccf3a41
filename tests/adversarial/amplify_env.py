"""A test-only environment whose tools amplify the state, or exit (issue 63).

``multiply`` makes the rows list ``times`` times as long (``rows * times``: the same strings, so
memory barely grows while a dump writes each of them ``times`` times); ``nest`` wraps the rows in
a pair of themselves ``levels`` times (``rows = [rows, rows]``: one list per level, 2**levels
paths); ``leave`` raises ``SystemExit``, ``interrupt`` ``KeyboardInterrupt``, ``generator_exit``
``GeneratorExit``. No built-in tool does this, but any imported class can. ``add`` is the
bystanders' ordinary work. ``isolation="session"``: sessions share a container. The Docker
runtime copies this module into the image (``/opt/envf-extra``).
"""

from __future__ import annotations

from typing import Any

from envfactory import State, Task, ToolEnvSpec, call, register, tool


class RowsState(State):
    rows: list[Any] = []


@tool
def add(state: RowsState, text: str) -> str:
    """Add a row.

    Args:
        text: The row.
    """
    state.rows.append(text)
    return f"{len(state.rows)} rows"


@tool
def fill(state: RowsState, n: int, width: int) -> str:
    """Add ``n`` distinct rows of ``width`` characters.

    Args:
        n: How many.
        width: Characters each.
    """
    state.rows.extend(f"{i:08d}".ljust(width, "r") for i in range(n))
    return f"{len(state.rows)} rows"


@tool
def multiply(state: RowsState, times: int) -> str:
    """Repeat the rows.

    Args:
        times: How many times.
    """
    state.rows = state.rows * times
    return f"{len(state.rows)} rows"


@tool
def nest(state: RowsState, levels: int) -> str:
    """Nest the rows in pairs of themselves.

    Args:
        levels: How many times.
    """
    rows = state.rows
    for _ in range(levels):
        rows = [rows, rows]
    state.rows = rows
    return "nested"


@tool
def leave(state: RowsState, code: int) -> str:
    """Exit.

    Args:
        code: The exit status.
    """
    state.rows.append("left")
    raise SystemExit(code)


@tool
def interrupt(state: RowsState) -> str:
    """Raise KeyboardInterrupt."""
    state.rows.append("interrupted")
    raise KeyboardInterrupt


@tool
def generator_exit(state: RowsState) -> str:
    """Raise GeneratorExit."""
    raise GeneratorExit("closed")


@tool(read_only=True)
def count(state: RowsState) -> str:
    """How many rows."""
    return str(len(state.rows))


def tasks() -> list[Task]:
    return [Task(id="one-row", instruction="Add the row 'x'.", initial_state=RowsState(),
                 solution=[call("add", text="x")], check=lambda s: "x" in s.rows),
            Task(id="exits", instruction="Add the row 'x'.", initial_state=RowsState(),
                 solution=[call("leave", code=3), call("add", text="x")], check=lambda s: "x" in s.rows)]


SPEC = register(ToolEnvSpec(name="Amplify-v0", domain="test", state_type=RowsState,
                            tools=[add, fill, multiply, nest, leave, interrupt, generator_exit, count],
                            tasks=tasks, isolation="session", max_turns=64, module=__name__), replace=True)
