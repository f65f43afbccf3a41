"""A test-only environment whose tools can take as long as the agent asks (issue 28).

``isolation="session"``: many sessions share one container, so an agent that makes a tool
overrun ``step_timeout`` is a tenant the others must not notice. ``nap`` sleeps (a thread
blocked in C, which nothing can interrupt), ``spin`` loops in Python (holding the GIL between
switches), ``note`` is the bystanders' ordinary work. The Docker runtime copies this module
into the image (``/opt/envf-extra``): it lives outside the project's packages.
"""

from __future__ import annotations

import time

from envfactory import State, Task, ToolEnvSpec, call, register, tool


class NotesState(State):
    notes: list[str] = []


@tool
def note(state: NotesState, text: str) -> str:
    """Add a note.

    Args:
        text: The note.
    """
    state.notes.append(text)
    return f"{len(state.notes)} notes"


@tool
def nap(state: NotesState, seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "awake"


@tool
def spin(state: NotesState, seconds: float) -> str:
    """Busy-loop in Python, then answer.

    Args:
        seconds: How long.
    """
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return f"spun {n}"


def tasks() -> list[Task]:
    return [Task(id="one-note", instruction="Add the note 'x'.", initial_state=NotesState(),
                 solution=[call("note", text="x")], check=lambda s: "x" in s.notes)]


SPEC = register(ToolEnvSpec(name="SlowTool-v0", domain="test", state_type=NotesState, tools=[note, nap, spin],
                            tasks=tasks, isolation="session", max_turns=64, module=__name__), replace=True)
