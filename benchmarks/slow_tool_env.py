"""``SlowTools-v0``: a tool environment whose tools take time, for the async rollout benchmark.

``wait_for(job, ms)`` stands for a slow tool (a query, a build, an API call): it sleeps ``ms``
milliseconds where the world runs (in this process, or in the container), then records the job
as done. A task asks for some jobs to be waited for, then an answer; its reference solution
waits for each in turn. Imported as a top-level module (``slow_tool_env``, with this folder on
``sys.path``) so that the Docker runtime copies it into the image, as it does any user's
environment module (:func:`envfactory.runtime.images.extra_modules`).
"""

from __future__ import annotations

import time

from envfactory import State, Task, ToolEnvSpec, ToolError, call, register, tool

NAME = "SlowTools-v0"
MAX_MS = 5000


class JobsState(State):
    done: list[str] = []
    waited_ms: int = 0


@tool
def wait_for(state: JobsState, job: str, ms: int) -> str:
    """Wait until a job has finished.

    Args:
        job: The job's name.
        ms: How long it takes, in milliseconds.
    """
    if not 0 <= ms <= MAX_MS:
        raise ToolError(f"ms must be between 0 and {MAX_MS}")
    time.sleep(ms / 1000)
    state.done.append(job)
    state.waited_ms += ms
    return f"{job} finished after {ms} ms"


def tasks() -> list[Task]:
    out = []
    for n in range(1, 4):
        jobs = [f"job-{k}" for k in range(n)]
        out.append(Task(id=f"jobs-{n}", instruction=f"Wait for {', '.join(jobs)}, then say done.",
                        initial_state=JobsState(), solution=[call("wait_for", job=j, ms=10) for j in jobs],
                        check=lambda s, jobs=jobs: all(j in s.done for j in jobs)))
    return out


# Registered on import: by the benchmark that imports this module, and by the container's
# server, which imports the spec's module.
SPEC = register(ToolEnvSpec(name=NAME, domain="testing", state_type=JobsState, tools=[wait_for], tasks=tasks,
                            max_turns=8, module=__name__), replace=True)
