"""What the LLM is told: the module contract, an example, and how failures come back."""

from __future__ import annotations

from typing import Any

__all__ = ["SYSTEM_PROMPT", "repair_message", "extract_code"]

EXAMPLE = '''
"""Notes-v0: keep short notes by title."""
from envfactory import ToolEnvSpec, State, Task, ToolError, call, tool


class NotesState(State):
    notes: dict[str, str] = {}


@tool
def write_note(state: NotesState, title: str, text: str) -> str:
    """Create or replace a note.

    Args:
        title: The note's title.
        text: The note's text.
    """
    if not title.strip():
        raise ToolError("title must not be empty")
    state.notes[title] = text
    return f"Saved note {title!r}."


@tool(read_only=True)
def read_note(state: NotesState, title: str) -> str:
    """Return the text of a note.

    Args:
        title: The note's title.
    """
    if title not in state.notes:
        raise ToolError(f"no note {title!r}; existing: {sorted(state.notes)}")
    return state.notes[title]


def world() -> NotesState:
    return NotesState(notes={"groceries": "milk, eggs", "ideas": "a garden robot"})


def tasks() -> list[Task]:
    return [
        Task(id="notes-0", instruction="Write a note titled 'plan' saying 'ship friday'.",
             initial_state=world(), solution=[call("write_note", title="plan", text="ship friday")]),
        Task(id="notes-1", instruction="What is on my groceries note?", initial_state=world(),
             solution=[call("read_note", title="groceries")], answer_facts=["milk", "eggs"]),
    ]


SPEC = ToolEnvSpec(name="Notes-v0", domain="notes", description="Keep short notes.",
               state_type=NotesState, tools=[write_note, read_note], tasks=tasks)
'''

SYSTEM_PROMPT = f"""You write tool-use environments for agent training as one Python module
against the `envfactory` API. Rules:
- Define a State subclass (pydantic; plain data fields only), tools decorated with @tool
  (first parameter is the state; every other parameter has a type hint and is described in a
  Google-style docstring `Args:` section; raise ToolError for expected failures), and tasks.
- Each Task has a unique id, an instruction, an initial_state, a reference `solution` (a list of
  `call(tool_name, **arguments)`) that completes it, and optionally `answer_facts` (strings the
  final answer must contain) or `check` (a function of the final state). Without `check`,
  success means the final state equals the state the solution produces.
- Tools must be deterministic: no randomness, clocks, network, files or global variables.
- No task may be satisfied by doing nothing, and answer facts must not appear in the instruction.
- Define `SPEC = ToolEnvSpec(name="Name-v0", domain=..., description=..., state_type=...,
  tools=[...], tasks=tasks)` at module level; do not call register().
- Import only from `envfactory`, `pydantic`, `typing` and the standard library.
Answer with the complete module in one ```python code block and nothing else.

Example of a valid module:
```python{EXAMPLE}```
"""


def repair_message(report: dict[str, Any], limit: int = 12) -> str:
    """The user turn that sends a failed verification back for repair."""
    lines = ["The module failed verification in the sandbox."]
    if report.get("error"):
        lines.append(report["error"])
    failures = report.get("failures", [])
    for f in failures[:limit]:
        where = f" (task {f['task']})" if f.get("task") else ""
        lines.append(f"- check '{f['check']}'{where}: {f['detail']}")
    if len(failures) > limit:
        lines.append(f"- ... and {len(failures) - limit} more failures")
    lines.append("Fix every problem and answer with the complete corrected module in one "
                 "```python code block.")
    return "\n".join(lines)


def extract_code(answer: str) -> str | None:
    """The Python module in an answer: the first ```python block (or the whole
    answer if it parses as Python); ``None`` if there is none."""
    import ast
    import re

    m = re.search(r"```(?:python|py)?\s*\n(.*?)```", answer, re.DOTALL)
    code = m.group(1) if m else answer
    try:
        ast.parse(code)
    except SyntaxError:
        return None if not m else code  # a fenced block with a syntax error still goes to the sandbox
    return code
