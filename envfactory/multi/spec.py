"""MultiAgentSpec: the definition of a multi-agent tool environment.

Roles are agents with their own tools (permissions); every role also gets the
spec's ``common_tools`` (usually the messaging tools) and ``finish``. Tasks give
the team one instruction, each agent its private knowledge, a shared initial
world, a success check and a *joint* reference solution: tool calls, each made
by a named agent, in the order that solves the task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..spec import SpecError, lookup_task
from ..state import copy_state
from ..task import ToolCall, normalize_answer
from ..tool import Tool, finish_tool
from .state import MultiState

__all__ = ["Role", "JointCall", "by", "MultiTask", "MultiAgentSpec", "PERMISSION_PREFIX"]

_NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]*-v\d+$")
_AGENT_RE = re.compile(r"^[a-z][a-z0-9]*_[0-9]+$")
PERMISSION_PREFIX = "Error: permission denied: "

DEFAULT_SYSTEM_PROMPT = (
    "You are {agent}, {role}. You work in a team of agents ({team}) in a {domain} environment. "
    "Only you see your own tool results and private notes; your teammates learn what you tell them "
    "with send_message (to an agent id, or to \"all\"), and their messages to you appear in your "
    "observations. Call tools with <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>. "
    "Each round every agent takes one turn. Reply without a tool call to pass your turn; the episode "
    "ends when every agent passes in the same round, or when anyone calls finish."
)


@dataclass(frozen=True)
class Role:
    """One agent of the team.

    Attributes:
        id: The agent id, ``<descriptor>_<number>`` (PettingZoo's convention), e.g. ``reader_0``.
        description: Who this agent is, completing "You are reader_0, ..." in its system prompt.
        tools: The tools only this role may call (its permissions).
    """

    id: str
    description: str
    tools: Sequence[Tool] = ()


@dataclass(slots=True)
class JointCall:
    """One step of a joint solution: ``agent`` makes ``call``."""

    agent: str
    call: ToolCall

    def to_json(self) -> dict[str, Any]:
        return {"agent": self.agent, **self.call.to_json()}


def by(agent: str, name: str, /, **arguments: Any) -> JointCall:
    """Shorthand for joint solutions: ``by("writer_0", "update_record", id="E-1", ...)``."""
    return JointCall(agent, ToolCall(name=name, arguments=arguments))


class MultiTask(BaseModel):
    """A task of a multi-agent environment.

    Attributes:
        id: Unique within the environment.
        instruction: The team's goal, shown to every agent.
        initial_state: The shared world at ``reset``.
        solution: The joint reference solution; replaying it earns success.
        private: Private knowledge per agent id, shown only to that agent.
        answer_facts: Strings the team's final answer (``finish``) must contain.
        check: ``check(final_state) -> bool``: the sparse joint success.
        metadata: Environment-specific data (e.g. private valuations for a payoff).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    id: str
    instruction: str
    initial_state: MultiState
    solution: list[JointCall]
    check: Callable[[Any], bool] = Field(exclude=True)
    private: dict[str, str] = Field(default_factory=dict)
    answer_facts: list[str] = Field(default_factory=list)
    difficulty: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def model_post_init(self, _ctx: Any) -> None:
        if self.difficulty is None:
            self.difficulty = len(self.solution)

    def fresh_state(self) -> MultiState:
        return copy_state(self.initial_state)

    def success(self, final_state: MultiState, answer: str | None) -> bool:
        """Joint success: the state check holds and the answer has every fact."""
        if not self.check(final_state):
            return False
        if not self.answer_facts:
            return True
        norm = normalize_answer(answer or "")
        return all(normalize_answer(f) in norm for f in self.answer_facts)

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "instruction": self.instruction, "private": dict(self.private),
                "difficulty": self.difficulty, "solution": [s.to_json() for s in self.solution],
                "answer_facts": list(self.answer_facts)}


Payoff = Callable[[MultiTask, Any, bool], dict[str, float]]


@dataclass(eq=False)
class MultiAgentSpec:
    """The definition of a multi-agent environment.

    Attributes:
        name: Registry name, ``<Name>-v<N>``.
        domain: Short domain label.
        state_type: The :class:`MultiState` subclass of the shared world.
        roles: The agents, in turn order.
        tasks: The tasks, or a function that builds them (called lazily, once).
        common_tools: Tools every role may call (messaging).
        description: One sentence for listings.
        max_rounds: Rounds (every agent takes one turn) before truncation.
        terminal: ``terminal(state) -> bool``: the world itself ended the game
            (a deal was closed); checked after every turn.
        payoff: ``payoff(task, final_state, success) -> {agent: reward}`` for
            mixed-motive games; by default every agent gets the joint reward.
        system_prompt: Template with ``{agent} {role} {team} {domain}``.
    """

    name: str
    domain: str
    state_type: type[MultiState]
    roles: Sequence[Role]
    tasks: Sequence[MultiTask] | Callable[[], Sequence[MultiTask]]
    common_tools: Sequence[Tool] = ()
    description: str = ""
    max_rounds: int = 12
    terminal: Callable[[Any], bool] | None = None
    payoff: Payoff | None = None
    system_prompt: str | None = None
    module: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    multi_agent: bool = field(default=True, init=False)
    _tasks: list[MultiTask] | None = field(default=None, init=False, repr=False)
    _index: dict[str, MultiTask] = field(default_factory=dict, init=False, repr=False)
    _role_tools: dict[str, dict[str, Tool]] = field(default_factory=dict, init=False, repr=False)
    _owners: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)
    replay_errors: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise SpecError(f"environment name {self.name!r} must look like 'Name-v0'")
        if not (isinstance(self.state_type, type) and issubclass(self.state_type, MultiState)):
            raise SpecError(f"{self.name}: state_type must subclass envfactory.multi.MultiState")
        if len(self.roles) < 2:
            raise SpecError(f"{self.name}: a multi-agent environment needs at least two roles")
        if self.max_rounds < 1:
            raise SpecError(f"{self.name}: max_rounds must be at least 1")
        common = {t.name: t for t in list(self.common_tools) + [finish_tool]}
        for role in self.roles:
            if not _AGENT_RE.match(role.id):
                raise SpecError(f"{self.name}: agent id {role.id!r} must look like 'reader_0' "
                                "(lower-case descriptor, underscore, number)")
            if role.id in self._role_tools:
                raise SpecError(f"{self.name}: two roles are called {role.id!r}")
            tools = dict(common)
            for t in role.tools:
                if not isinstance(t, Tool):
                    raise SpecError(f"{self.name}: {t!r} of role {role.id} is not a Tool")
                if t.name in tools:
                    raise SpecError(f"{self.name}: role {role.id} has two tools named {t.name!r}")
                tools[t.name] = t
                self._owners.setdefault(t.name, []).append(role.id)
            self._role_tools[role.id] = tools

    # -- roles and tools -------------------------------------------------
    @property
    def agent_ids(self) -> list[str]:
        return [r.id for r in self.roles]

    def role(self, agent: str) -> Role:
        for r in self.roles:
            if r.id == agent:
                return r
        raise KeyError(f"{self.name} has no agent {agent!r}; its agents are {self.agent_ids}")

    def tools_of(self, agent: str) -> dict[str, Tool]:
        """The tools ``agent`` may call, by name (its own, the common ones, ``finish``)."""
        try:
            return self._role_tools[agent]
        except KeyError:
            raise KeyError(f"{self.name} has no agent {agent!r}; its agents are {self.agent_ids}") from None

    def owners(self, tool_name: str) -> list[str]:
        """The roles that own a role-specific tool (empty for common or unknown tools)."""
        return self._owners.get(tool_name, [])

    def tool_schemas(self, agent: str) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools_of(agent).values()]

    def render_system_prompt(self, agent: str) -> str:
        return (self.system_prompt or DEFAULT_SYSTEM_PROMPT).format(
            agent=agent, role=self.role(agent).description, team=", ".join(self.agent_ids),
            domain=self.domain)

    # -- tasks -------------------------------------------------------------
    def get_tasks(self) -> list[MultiTask]:
        """The tasks, built on first use; each joint solution is replayed once
        (tool errors land in :attr:`replay_errors`)."""
        if self._tasks is None:
            tasks = list(self.tasks() if callable(self.tasks) else self.tasks)
            if not tasks:
                raise SpecError(f"{self.name}: an environment needs at least one task")
            index: dict[str, MultiTask] = {}
            for t in tasks:
                if not isinstance(t, MultiTask):
                    raise SpecError(f"{self.name}: {t!r} is not a MultiTask")
                if t.id in index:
                    raise SpecError(f"{self.name}: two tasks have id {t.id!r}")
                if not isinstance(t.initial_state, self.state_type):
                    raise SpecError(f"{self.name}: task {t.id!r} has an initial state of type "
                                    f"{type(t.initial_state).__name__}, expected {self.state_type.__name__}")
                unknown = ({s.agent for s in t.solution} | set(t.private)) - set(self.agent_ids)
                if unknown:
                    raise SpecError(f"{self.name}: task {t.id!r} names unknown agents {sorted(unknown)}")
                index[t.id] = t
                errors = self.replay(self.start_state(t), t.solution)
                if errors:
                    self.replay_errors[t.id] = errors
            self._index, self._tasks = index, tasks
        return self._tasks

    def task(self, key: str | int | MultiTask) -> MultiTask:
        """A task by id, by index, or the task itself."""
        tasks = self.get_tasks()
        return key if isinstance(key, MultiTask) else lookup_task(self.name, tasks, self._index, key)

    def start_state(self, task: MultiTask) -> MultiState:
        """A fresh copy of the task's world with the team filled in."""
        state = task.fresh_state()
        state.agents = self.agent_ids
        return state

    def replay(self, state: MultiState, steps: Sequence[JointCall]) -> list[str]:
        """Run ``steps`` on ``state`` in place, with permissions; return the errors."""
        errors = []
        for i, step in enumerate(steps):
            state.acting, state.round = step.agent, i + 1
            t = self.tools_of(step.agent).get(step.call.name)
            if t is None:
                errors.append(f"step {i} ({step.agent}: {step.call.name}): not a tool of {step.agent}")
                continue
            out = t.invoke(state, step.call.arguments)
            if not out.ok:
                errors.append(f"step {i} ({step.agent}: {step.call.name}): {out.content}")
        state.acting = ""
        return errors

    def rewards(self, task: MultiTask, state: MultiState, success: bool) -> dict[str, float]:
        """Per-agent rewards at the end: the payoff for mixed-motive games, else the joint reward."""
        if self.payoff is not None:
            out = self.payoff(task, state, success)
            return {a: float(out.get(a, 0.0)) for a in self.agent_ids}
        return dict.fromkeys(self.agent_ids, 1.0 if success else 0.0)

    def describe(self) -> dict[str, Any]:
        """The listing entry (``envfactory list``)."""
        names = {n for tools in self._role_tools.values() for n in tools}
        return {"name": self.name, "domain": self.domain, "multi_agent": True,
                "tasks": len(self.get_tasks()), "tools": len(names), "agents": self.agent_ids,
                "mixed_motive": self.payoff is not None, "description": self.description}
