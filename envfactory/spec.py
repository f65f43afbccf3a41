"""EnvSpec: everything that defines an environment, independent of where it runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from .state import State, copy_state, state_hash
from .task import Task, ToolCall
from .tool import Tool, finish_tool

__all__ = ["EnvSpec", "SpecError", "replay"]

_NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]*-v\d+$")

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that completes the user's task in a {domain} environment by calling tools. "
    "Call tools with <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>. "
    "When the task is done, reply with your final answer without calling a tool."
)


class SpecError(ValueError):
    """An environment definition is invalid; the message says what to fix."""


def replay(tools: dict[str, Tool], state: State, calls: Sequence[ToolCall]) -> list[str]:
    """Run ``calls`` on ``state`` in place; return the error observations, if any."""
    errors = []
    for i, call in enumerate(calls):
        t = tools.get(call.name)
        if t is None:
            errors.append(f"call {i} ({call.name}): unknown tool")
            continue
        out = t.invoke(state, call.arguments)
        if not out.ok:
            errors.append(f"call {i} ({call.name}): {out.content}")
    return errors


def lookup_task(env: str, tasks: list[Any], index: dict[str, Any], key: str | int) -> Any:
    """``tasks[key]`` for an index, ``index[key]`` for an id; a ``KeyError`` naming ``env`` otherwise."""
    if isinstance(key, bool):
        raise TypeError("a task is chosen by id (str) or index (int), not bool")
    if isinstance(key, int):
        if not -len(tasks) <= key < len(tasks):
            raise KeyError(f"{env} has {len(tasks)} tasks; index {key} is out of range")
        return tasks[key]
    try:
        return index[key]
    except KeyError:
        raise KeyError(f"{env} has no task {key!r} (ids look like {tasks[0].id!r})") from None


@dataclass(eq=False)
class EnvSpec:
    """The definition of an environment.

    Attributes:
        name: Registry name and Gymnasium id suffix, ``<Name>-v<N>``.
        domain: Short domain label (``filesystem``, ``banking``...).
        state_type: The pydantic :class:`State` subclass of the world.
        tools: The tools agents may call.
        tasks: The tasks, or a zero-argument function that builds them (called
            once, lazily: registration stays cheap).
        description: One sentence for listings.
        system_prompt: The system message; ``{domain}`` is filled in.
        max_turns: Assistant turns before the episode is truncated.
        finish_tool: Add the built-in ``finish(answer)`` tool.
        isolation: For the Docker runtime: ``session`` (many sessions share a
            container; pure-state worlds) or ``container`` (one container per
            session; worlds that execute agent code).
        module: The module that registers this spec (imported again inside
            containers); filled in by :func:`envfactory.register`.
    """

    name: str
    domain: str
    state_type: type[State]
    tools: Sequence[Tool]
    tasks: Sequence[Task] | Callable[[], Sequence[Task]]
    description: str = ""
    system_prompt: str | None = None
    max_turns: int = 20
    finish_tool: bool = True
    isolation: Literal["session", "container"] = "session"
    module: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    _tasks: list[Task] | None = field(default=None, init=False, repr=False)
    _task_index: dict[str, Task] = field(default_factory=dict, init=False, repr=False)
    _tool_map: dict[str, Tool] = field(default_factory=dict, init=False, repr=False)
    replay_errors: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise SpecError(
                f"environment name {self.name!r} must look like 'Name-v0' "
                "(capitalised, alphanumeric, version suffix)"
            )
        if not (isinstance(self.state_type, type) and issubclass(self.state_type, State)):
            raise SpecError(f"{self.name}: state_type must be a subclass of envfactory.State")
        if self.max_turns < 1:
            raise SpecError(f"{self.name}: max_turns must be at least 1")
        tools = list(self.tools) + ([finish_tool] if self.finish_tool else [])
        for t in tools:
            if not isinstance(t, Tool):
                raise SpecError(f"{self.name}: {t!r} is not a Tool (decorate it with @envfactory.tool)")
            if t.name in self._tool_map:
                raise SpecError(f"{self.name}: two tools are named {t.name!r}")
            self._tool_map[t.name] = t

    @property
    def all_tools(self) -> dict[str, Tool]:
        """Tools by name, including the finishing tool when enabled."""
        return self._tool_map

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of every tool."""
        return [t.schema() for t in self._tool_map.values()]

    def render_system_prompt(self) -> str:
        return (self.system_prompt or DEFAULT_SYSTEM_PROMPT).format(domain=self.domain)

    def get_tasks(self) -> list[Task]:
        """The tasks, built on first use. Each reference solution is replayed once
        here: tool errors are kept in :attr:`replay_errors`, and tasks without a
        ``check`` get the expected final state it produces."""
        if self._tasks is None:
            raw = self.tasks() if callable(self.tasks) else self.tasks
            tasks = list(raw)
            if not tasks:
                raise SpecError(f"{self.name}: an environment needs at least one task")
            index: dict[str, Task] = {}
            for t in tasks:
                if not isinstance(t, Task):
                    raise SpecError(f"{self.name}: {t!r} is not a Task")
                if t.id in index:
                    raise SpecError(f"{self.name}: two tasks have id {t.id!r}")
                if not isinstance(t.initial_state, self.state_type):
                    raise SpecError(
                        f"{self.name}: task {t.id!r} has an initial state of type "
                        f"{type(t.initial_state).__name__}, expected {self.state_type.__name__}"
                    )
                index[t.id] = t
                s = copy_state(t.initial_state)
                errs = replay(self._tool_map, s, t.solution)
                if errs:
                    self.replay_errors[t.id] = errs
                if t.check is None and t.expected_state_hash is None:
                    t.expected_state_hash = state_hash(s)
            self._task_index = index
            self._tasks = tasks
        return self._tasks

    def task(self, key: str | int | Task) -> Task:
        """A task by id, by index, or the task itself."""
        tasks = self.get_tasks()
        return key if isinstance(key, Task) else lookup_task(self.name, tasks, self._task_index, key)

    def describe(self) -> dict[str, Any]:
        """The listing entry: name, domain, multi_agent, tasks, tools."""
        return {
            "name": self.name,
            "domain": self.domain,
            "multi_agent": False,
            "tasks": len(self.get_tasks()),
            "tools": len(self._tool_map),
            "description": self.description,
        }
