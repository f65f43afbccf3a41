"""A test-only environment whose server creeps up in memory outside any state (issue 63).

``hoard`` keeps ``mib`` MiB in a module-level list of the process that runs it: memory that no
state quota sees and no trim returns, as a long-lived server's fragmentation is. ``add`` is the
bystanders' ordinary work. ``isolation="session"``: sessions share a container. The Docker runtime
copies this module into the image (``/opt/envf-extra``).
"""

from __future__ import annotations

from envfactory import State, Task, ToolEnvSpec, call, register, tool

_HOARD: list[bytes] = []


class RowsState(State):
    rows: list[str] = []


@tool
def add(state: RowsState, text: str) -> str:
    """Add a row.

    Args:
        text: The row.
    """
    state.rows.append(text)
    return f"{len(state.rows)} rows"


@tool
def hoard(state: RowsState, mib: int) -> str:
    """Keep ``mib`` MiB in this process for good (written, so the pages are resident).

    Args:
        mib: How many MiB (at most 64 per call).
    """
    _HOARD.append(b"h" * (min(max(mib, 0), 64) << 20))
    return f"{sum(map(len, _HOARD)) >> 20} MiB hoarded"


def tasks() -> list[Task]:
    return [Task(id="one-row", instruction="Add the row 'x'.", initial_state=RowsState(),
                 solution=[call("add", text="x")], check=lambda s: "x" in s.rows)]


SPEC = register(ToolEnvSpec(name="Hoard-v0", domain="test", state_type=RowsState, tools=[add, hoard],
                            tasks=tasks, isolation="session", max_turns=64, module=__name__), replace=True)
