"""A test-only environment whose tool runs agent-written Python in the container.

Registered by tests/test_docker_faults.py (``isolation="container"``: one
container per session). The Docker runtime copies this module into the image
(``/opt/envf-extra``), because it lives outside the project's packages.

``run_python`` runs the code in a child process of the server, as any
environment that executes agent code must: code inside the server process
itself could forge every reply. The child's process group is killed after
``CODE_TIMEOUT_S`` seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from envfactory import ToolEnvSpec, State, Task, ToolError, call, register, tool

CODE_TIMEOUT_S = 3.0


class SandboxState(State):
    files: dict[str, str] = {}
    runs: int = 0


@tool
def write_file(state: SandboxState, path: str, content: str) -> str:
    """Write a file of the task's world.

    Args:
        path: Absolute path.
        content: The new content.
    """
    if not path.startswith("/"):
        raise ToolError("paths are absolute")
    state.files[path] = content
    return "OK"


@tool
def run_python(state: SandboxState, code: str) -> str:
    """Run Python code and return what it prints.

    Args:
        code: The program.
    """
    state.runs += 1
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env={"PATH": os.environ.get("PATH", "")}, cwd="/tmp")
    try:
        out, _ = proc.communicate(timeout=CODE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=1)
        except subprocess.TimeoutExpired:  # a process outside the group still holds the pipe
            pass
        raise ToolError(f"the program ran longer than {CODE_TIMEOUT_S}s and was killed") from None
    text = out.decode(errors="replace")[-4000:]
    if proc.returncode != 0:
        raise ToolError(f"exit status {proc.returncode}: {text}")
    return text or "(no output)"


def tasks() -> list[Task]:
    return [Task(id="answer-42", instruction="Write 42 to /answer.txt.",
                 initial_state=SandboxState(), solution=[call("write_file", path="/answer.txt", content="42")],
                 check=lambda s: s.files.get("/answer.txt") == "42")]


# Registered on import: by the test that imports this module, and by the
# container's server, which imports the spec's module.
SPEC = register(ToolEnvSpec(name="CodeSandbox-v0", domain="code", state_type=SandboxState,
                        tools=[write_file, run_python], tasks=tasks, isolation="container", max_turns=8,
                    module=__name__), replace=True)
