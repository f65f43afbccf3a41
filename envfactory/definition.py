"""ToolEnvSpec: everything that defines an environment, for one agent or a team.

One definition covers N >= 1 roles. A single-agent environment is the one-role
case: it names no roles, and its one agent (``agent_0``) may call every tool.
A team environment names its :class:`Role` objects; each role adds the tools
only it may call (its permissions) to the ``tools`` every role shares (usually
the messaging tools), and its state subclasses
:class:`~envfactory.mail.MultiState` (the mailbox, who is acting, the round).
Private views, payoffs and the world's own end (``terminal``) are further
properties of the definition, never of a second code path.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Sequence, cast

from .state import State, copy_state, state_hash
from .task import Task, ToolCall, normalize_answer, number_rivals
from .tooling import Tool, finish_tool

if TYPE_CHECKING:
    from .mail import MultiState

__all__ = ["ToolEnvSpec", "Role", "SpecError", "SOLE_AGENT", "PERMISSION_PREFIX", "lookup_task", "SPLITS", "Split",
           "DRAW_SPLITS", "DrawSplit", "DEFAULT_SPLIT", "split_members", "HELDOUT_FAMILIES", "HELDOUT_KINDS",
           "HELDOUT_PHRASING",
           "GENERALIZATION_SPLITS", "generalization_group",
           "served_tasks", "task_for_seed"]

_NAME_RE = re.compile(r"^[A-Z][A-Za-z0-9]*-v\d+$")
_AGENT_RE = re.compile(r"^[a-z][a-z0-9]*_[0-9]+$")
SOLE_AGENT = "agent_0"
PERMISSION_PREFIX = "Error: permission denied: "
SPLITS = ("sft", "rl", "eval")
Split = Literal["sft", "rl", "eval"]
# what an episode (and every face over it) may draw tasks from: one split, ``train`` (sft and rl:
# everything but evaluation; the default everywhere) or ``all``. Evaluation tasks are drawn only
# where ``eval`` (or ``all``) is asked for explicitly.
DRAW_SPLITS = ("train", "sft", "rl", "eval", "all", "seen", "heldout-family", "heldout-kind", "heldout-phrasing")
DrawSplit = Literal["train", "sft", "rl", "eval", "all", "seen", "heldout-family", "heldout-kind", "heldout-phrasing"]
DEFAULT_SPLIT: DrawSplit = "train"

# -- splits that test generalization (docs/training.md, "Held-out families and kinds") --------------
# Besides the per-task hash split (sft/rl/eval), whole families and whole task kinds are held out, so a
# trainer can evaluate on tasks whose family (vocabulary, tools, world) or whose kind (task frame) it
# never trained on. Both sets are frozen here, not drawn at run time, so adding a family never moves one.
HELDOUT_FAMILIES: tuple[str, ...] = (
    "CRM-v1", "FleetMaintenance-v0", "GymClub-v1", "ITAssets-v0", "Marina-v0", "Parking-v0",
    "PeopleOps-v0", "Pharmacy-v1", "SalesDesk-v0", "ShopBackOffice-v0", "StudentHousing-v0", "Subscriptions-v0")
"""The families never trained on: ``random.Random(0).sample`` of 12 of the 77 table-backed families
with a task supply (as of 2026-11-25; ``benchmarks/smol_agent.py`` evaluates on them), frozen."""
HELDOUT_KINDS: tuple[str, ...] = ("conditional",)
"""The task kinds never trained on, in any family: ``conditional`` composes what the training kinds
teach one at a time (find rows by description as ``lookup`` does, read a value as ``answer`` does,
then act on a threshold), so an agent that learned tool use rather than frames should transfer."""
HELDOUT_PHRASING = 4
"""The frame never trained on, in any kind and family: a goal-level task worded in the fifth frame of
its kind (``task.metadata["phrasing"] == 4``; the frames are ``envfactory.factory.tasks.realize.FRAMES``,
5-6 per kind), so an agent can be evaluated on wordings it never saw."""
GENERALIZATION_SPLITS = ("seen", "heldout-family", "heldout-kind", "heldout-phrasing")
"""The draw splits over whole families, kinds and frames: ``seen`` (train-split tasks of the
families, kinds and frames not held out: what a trainer testing generalization trains on),
``heldout-family`` (eval-split tasks of :data:`HELDOUT_FAMILIES`, every kind), ``heldout-kind``
(eval-split tasks of :data:`HELDOUT_KINDS` in the other families) and ``heldout-phrasing``
(eval-split tasks of the other families and kinds worded in the :data:`HELDOUT_PHRASING` frame).
The four are disjoint, and the held-out ones lie within ``eval``, so they are kept out of tokenizer
and pretraining corpora as every eval task is."""


def generalization_group(env: str, kind: str | None, phrasing: int | None = None) -> str:
    """Which of :data:`GENERALIZATION_SPLITS` a task of environment ``env``, ``kind`` and frame
    ``phrasing`` counts for (ignoring its sft/rl/eval split): ``heldout-family`` first, then
    ``heldout-kind``, then ``heldout-phrasing``, else ``seen``."""
    if env in HELDOUT_FAMILIES:
        return "heldout-family"
    if kind in HELDOUT_KINDS:
        return "heldout-kind"
    if phrasing == HELDOUT_PHRASING:
        return "heldout-phrasing"
    return "seen"

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that completes the user's task in a {domain} environment by calling tools. "
    "Call tools with <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>. "
    "When the task is done, reply with your final answer without calling a tool."
)
DEFAULT_TEAM_PROMPT = (
    "You are {agent}, {role}. You work in a team of agents ({team}) in a {domain} environment. "
    "Only you see your own tool results and private notes; your teammates learn what you tell them "
    "with send_message (to an agent id, or to \"all\"), and their messages to you appear in your "
    "observations. Call tools with <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>. "
    "Each round every agent takes one turn. Reply without a tool call to pass your turn; the episode "
    "ends when every agent passes in the same round, or when anyone calls finish."
)


class SpecError(ValueError):
    """An environment definition is invalid; the message says what to fix."""


@dataclass(frozen=True)
class Role:
    """One agent of a team.

    Attributes:
        id: The agent id, ``<descriptor>_<number>`` (PettingZoo's convention), e.g. ``reader_0``.
        description: Who this agent is, completing "You are reader_0, ..." in its system prompt.
        tools: The tools only this role may call (its permissions).
    """

    id: str
    description: str
    tools: Sequence[Tool] = ()


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'X'?"`` naming the choices closest to a mistyped ``word`` (case aside),
    or ``""`` when none is close: what an error about an unknown name says instead of every name."""
    import difflib  # only an error needs it; `import envfactory` stays cheap

    by_lower = {c.lower(): c for c in choices}
    if word.lower() in by_lower:  # only the case is wrong
        close = [word.lower()]
    else:
        close = difflib.get_close_matches(word.lower(), list(by_lower), n=3, cutoff=0.6)
    if not close:
        return ""
    named = [repr(by_lower[c]) for c in close]
    return "; did you mean " + (f"{', '.join(named[:-1])} or {named[-1]}" if len(named) > 1 else named[0]) + "?"


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
        hint = did_you_mean(key, index) or f" (ids look like {tasks[0].id!r})"
        raise KeyError(f"{env} has no task {key!r}{hint}") from None


Payoff = Callable[[Task, Any, bool], dict[str, float]]


def task_for_seed(n_tasks: int, seed: int | None) -> int:
    """The index, among a split's tasks, that ``reset(seed=seed)`` picks, for every face (make,
    Gymnasium, PettingZoo, MCP, OpenEnv): the one seeding rule."""
    return random.Random(seed).randrange(n_tasks)


def split_members(split: str) -> tuple[str, ...]:
    """The splits (of :data:`SPLITS`) that a draw split stands for; a clear error for any other name."""
    if split == "train":
        return ("sft", "rl")
    if split == "all":
        return SPLITS
    if split in SPLITS:
        return (split,)
    if split == "seen":
        return ("sft", "rl")
    if split in ("heldout-family", "heldout-kind", "heldout-phrasing"):
        return ("eval",)
    raise ValueError(f"split must be one of {', '.join(DRAW_SPLITS)}, got {split!r}")


def within_split(served: str, split: str | None = None) -> DrawSplit:
    """The split a served face's request asks for (``split``; ``None``: all of ``served``), which
    must lie within the split the server serves (``ValueError`` otherwise, or for an unknown name)."""
    want = served if split is None else split
    narrower = served in GENERALIZATION_SPLITS and want != served  # a family/kind split holds only itself
    if narrower or not set(split_members(want)) <= set(split_members(served)):
        raise ValueError(f"this server serves the {served!r} split; {want!r} tasks are not served "
                         "(start it with --split all, or with that split)")
    return cast(DrawSplit, want)  # a DrawSplit: split_members checked it


def served_tasks(spec: "ToolEnvSpec", served: str, split: str | None = None) -> list[dict[str, Any]]:
    """The tasks a server of ``served`` lists (every served face: MCP, OpenEnv): those of ``split``
    when given, which must lie within ``served`` (``ValueError`` otherwise)."""
    return [{"task_id": t.id, "split": spec.split(t), "kind": t.kind, "instruction": t.instruction}
            for t in spec.tasks_in(within_split(served, split))]


@dataclass(eq=False)
class ToolEnvSpec:
    """The definition of an environment.

    Attributes:
        name: Registry name and Gymnasium id suffix, ``<Name>-v<N>``.
        domain: Short domain label (``filesystem``, ``banking``...).
        state_type: The pydantic :class:`State` subclass of the world
            (a :class:`~envfactory.mail.MultiState` subclass for teams).
        tools: The tools every role may call (for one agent: all its tools).
        tasks: The tasks, or a zero-argument function that builds them (called
            once, lazily: registration stays cheap).
        roles: The team, in turn order; empty for a single-agent environment.
        description: One sentence for listings.
        system_prompt: The system message; ``{domain}`` is filled in (and, for
            teams, ``{agent} {role} {team}``).
        max_turns: Rounds (every role takes one turn) before the episode is truncated.
        finish_tool: Add the built-in ``finish(answer)`` tool.
        terminal: ``terminal(state) -> bool``: the world itself ended the
            episode (a deal was closed); checked after every turn.
        payoff: ``payoff(task, final_state, success) -> {agent: reward}`` for
            mixed-motive games; by default every role gets the joint reward.
        legal_actions: ``legal_actions(state, agent) -> [ToolCall]``: the moves ``agent``
            may legally make now (asked on the state as its tools would see it this turn:
            for a team, ``acting`` and ``round`` set) (a game's move list: its board, its budget, the cells
            not fired at yet); empty when it has none. Optional: without it, the tools'
            schemas (enums, bounds) are all that says what may be called. The random
            policy draws from it (:class:`~envfactory.checks.scripted.RandomPolicy`).
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
    roles: Sequence[Role] = ()
    description: str = ""
    system_prompt: str | None = None
    max_turns: int = 20
    finish_tool: bool = True
    terminal: Callable[[Any], bool] | None = None
    payoff: Payoff | None = None
    legal_actions: Callable[[Any, str], Sequence[ToolCall]] | None = None
    isolation: Literal["session", "container"] = "session"
    module: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    _tasks: list[Task] | None = field(default=None, init=False, repr=False)
    _task_index: dict[str, Task] = field(default_factory=dict, init=False, repr=False)
    _enums: list[list[str]] | None = field(default=None, init=False, repr=False)
    _tool_map: dict[str, Tool] = field(default_factory=dict, init=False, repr=False)
    _role_tools: dict[str, dict[str, Tool]] = field(default_factory=dict, init=False, repr=False)
    _owners: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)
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
        common = list(self.tools) + ([finish_tool] if self.finish_tool else [])
        for t in common:
            if not isinstance(t, Tool):
                raise SpecError(f"{self.name}: {t!r} is not a Tool (decorate it with @envfactory.tool)")
            if t.name in self._tool_map:
                raise SpecError(f"{self.name}: two tools are named {t.name!r}")
            self._tool_map[t.name] = t
        self.roles = tuple(self.roles)
        if len(self.roles) == 1:
            raise SpecError(f"{self.name}: a team needs at least two roles; a single agent names none")
        if self.roles:
            from .mail import MultiState

            if not issubclass(self.state_type, MultiState):
                raise SpecError(f"{self.name}: the state of a team must subclass envfactory.MultiState "
                                "(it carries the mailbox and who is acting)")
        for role in self.roles:
            if not _AGENT_RE.match(role.id):
                raise SpecError(f"{self.name}: agent id {role.id!r} must look like 'reader_0' "
                                "(lower-case descriptor, underscore, number)")
            if role.id in self._role_tools:
                raise SpecError(f"{self.name}: two roles are called {role.id!r}")
            own = dict(self._tool_map)
            for t in role.tools:
                if not isinstance(t, Tool):
                    raise SpecError(f"{self.name}: {t!r} of role {role.id} is not a Tool")
                if t.name in own:
                    raise SpecError(f"{self.name}: role {role.id} has two tools named {t.name!r}")
                own[t.name] = t
                self._owners.setdefault(t.name, []).append(role.id)
            self._role_tools[role.id] = own
        if not self.roles:
            self._role_tools[SOLE_AGENT] = self._tool_map
        self._agents = list(self._role_tools)

    # -- roles and tools ---------------------------------------------------
    @property
    def multi_agent(self) -> bool:
        """Whether this is a team environment (two or more roles)."""
        return bool(self.roles)

    @property
    def agent_ids(self) -> list[str]:
        """The agents in turn order (``["agent_0"]`` for a single agent)."""
        return self._agents

    def role(self, agent: str) -> Role:
        for r in self.roles:
            if r.id == agent:
                return r
        if not self.roles and agent == SOLE_AGENT:
            return Role(SOLE_AGENT, "the agent")
        raise KeyError(f"{self.name} has no agent {agent!r}; its agents are {self.agent_ids}")

    @property
    def all_tools(self) -> dict[str, Tool]:
        """Every tool by name: the shared ones, ``finish``, and every role's own."""
        if not self.roles:
            return self._tool_map
        out = dict(self._tool_map)
        for tools in self._role_tools.values():
            out.update(tools)
        return out

    def tools_of(self, agent: str | None = None) -> dict[str, Tool]:
        """The tools ``agent`` may call, by name (the sole agent's when ``None``)."""
        if agent is None:
            agent = self._agents[0]
        try:
            return self._role_tools[agent]
        except KeyError:
            raise KeyError(f"{self.name} has no agent {agent!r}; its agents are {self.agent_ids}") from None

    def owners(self, tool_name: str) -> list[str]:
        """The roles that own a role-specific tool (empty for shared or unknown tools)."""
        return self._owners.get(tool_name, [])

    def tool_schemas(self, agent: str | None = None) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of the tools ``agent`` may call."""
        return [t.schema() for t in self.tools_of(agent).values()]

    def render_system_prompt(self, agent: str | None = None) -> str:
        if not self.roles:
            return (self.system_prompt or DEFAULT_SYSTEM_PROMPT).format(domain=self.domain)
        agent = agent or self._agents[0]
        return (self.system_prompt or DEFAULT_TEAM_PROMPT).format(
            agent=agent, role=self.role(agent).description, team=", ".join(self._agents), domain=self.domain)

    # -- tasks -------------------------------------------------------------
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
            agents = set(self._agents)
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
                unknown = ({c.agent for c in t.solution if c.agent is not None} | set(t.private)) - agents
                if unknown:
                    raise SpecError(f"{self.name}: task {t.id!r} names unknown agents {sorted(unknown)}")
                index[t.id] = t
                s = self.start_state(t)
                if t.conversation is not None:
                    if self.roles:
                        raise SpecError(f"{self.name}: task {t.id!r} is a conversation; conversations are "
                                        "played by one agent (a team's tasks are one instruction)")
                    errs = self.replay_turns(t, s)
                else:
                    errs = self.replay(s, t.solution)
                if errs:
                    self.replay_errors[t.id] = errs
                if t.check is None and t.expected_state_hash is None:
                    if type(s).__hash_on_demand__:  # (hashed by the first judgment that needs it)
                        t.keep_expected_final(s, on_demand=True)
                    else:
                        t.expected_state_hash = state_hash(s)
                        t.keep_expected_final(s)  # judged by comparing with it, the hash where unsure
                if t.answer_facts and t.answer_rivals is None:
                    t.answer_rivals = self.answer_rivals(t.answer_facts)
            self._task_index = index
            self._tasks = tasks
        return self._tasks

    def answer_rivals(self, facts: list[str]) -> list[str]:
        """The values that contradict ``facts``: the other members of every enum (in the tool
        schemas) that a fact belongs to, and for a small whole number (up to 50) the other numbers
        from 0 to 12 (or to the fact plus 2), normalized, facts excluded (see ``Task.answer_rivals``)."""
        if self._enums is None:
            enums: list[list[str]] = []

            def walk(node: Any) -> None:
                if isinstance(node, dict):
                    if isinstance(node.get("enum"), list):
                        enums.append([normalize_answer(str(v)) for v in node["enum"]])
                    for v in node.values():
                        walk(v)
                elif isinstance(node, list):
                    for v in node:
                        walk(v)

            for t in self.all_tools.values():
                walk(t.parameters)
            self._enums = enums
        wanted = {normalize_answer(f) for f in facts}
        rivals = {v for e in self._enums if wanted & set(e) for v in e} - wanted
        for f in wanted:  # a small count or amount: listing the numbers around it is no answer
            rivals.update(number_rivals(f))
        return sorted(r for r in rivals - wanted if r)

    def task(self, key: str | int | Task) -> Task:
        """A task by id, by index, or the task itself."""
        tasks = self.get_tasks()
        return key if isinstance(key, Task) else lookup_task(self.name, tasks, self._task_index, key)

    def split(self, task: str | int | Task) -> Split:
        """Which of the three disjoint splits ``task`` belongs to: ``sft`` (warm-start
        demonstrations), ``rl`` (reinforcement learning) or ``eval`` (evaluation only:
        never trained on, and kept out of tokenizer and pretraining corpora).

        ``task.metadata["split"]`` decides when set; otherwise a stable hash of the
        environment name and task id does (half ``sft``, a quarter each ``rl`` and
        ``eval``), the same in every process and on every machine."""
        t = self.task(task)
        chosen = t.metadata.get("split")
        if chosen is not None:
            if chosen not in SPLITS:
                raise SpecError(f"{self.name}: task {t.id!r} has split {chosen!r}; splits are {SPLITS}")
            return chosen
        bucket = hashlib.sha256(f"{self.name}/{t.id}".encode()).digest()[0] % 4
        return "eval" if bucket == 0 else "rl" if bucket == 1 else "sft"

    def tasks_in(self, split: DrawSplit) -> list[Task]:
        """The tasks of one split (see :meth:`split`), in task order: ``sft``, ``rl``, ``eval``,
        ``train`` (sft and rl) or ``all``."""
        if split == "all":
            return list(self.get_tasks())
        return [t for t in self.get_tasks() if self.in_split(t, split)]

    def in_split(self, task: Task, split: DrawSplit) -> bool:
        """Whether ``task`` belongs to the draw split ``split``: its own split (:meth:`split`) is one
        of the split's members, and for :data:`GENERALIZATION_SPLITS` its family and kind fit."""
        if self.split(task) not in split_members(split):
            return False
        return split not in GENERALIZATION_SPLITS or \
            generalization_group(self.name, task.kind, task.metadata.get("phrasing")) == split

    def draw_task(self, split: DrawSplit, seed: int | None = None, *, pool: list[Task] | None = None) -> Task:
        """The task of ``split`` that ``reset(seed=seed)`` plays (:func:`task_for_seed`; at random
        when ``seed`` is ``None``); ``pool``: ``tasks_in(split)`` when the caller keeps it."""
        pool = self.tasks_in(split) if pool is None else pool
        if not pool:
            have = sorted({self.split(t) for t in self.get_tasks()})
            raise SpecError(f"{self.name} has no task in the {split!r} split; name a task, or choose another "
                            f"split ({', '.join(have)} have tasks; 'all' draws from every task)")
        return pool[task_for_seed(len(pool), seed)]

    def task_in_split(self, key: str | int | Task, split: DrawSplit) -> Task:
        """The task ``key``, refused (``KeyError``, naming both splits) unless it belongs to ``split``:
        what a served face does with a task a remote client names."""
        t = self.task(key)
        own = self.split(t)
        if own not in split_members(split):
            raise KeyError(f"task {t.id!r} of {self.name} is in the {own!r} split; this server serves the "
                           f"{split!r} split (start it with --split {own} or --split all to play it)")
        if not self.in_split(t, split):
            group = generalization_group(self.name, t.kind, t.metadata.get("phrasing"))
            raise KeyError(f"task {t.id!r} of {self.name} counts for {group!r}; this server serves the "
                           f"{split!r} split (start it with --split {own} or --split all to play it)")
        return t

    def start_state(self, task: Task) -> State:
        """A fresh copy of the task's world (with the team filled in, for teams)."""
        state = copy_state(task.initial_state)
        if self.roles:  # a team's state is a MultiState
            cast("MultiState", state).agents = list(self._agents)
        return state

    def replay(self, state: State, calls: Sequence[ToolCall]) -> list[str]:
        """Run ``calls`` on ``state`` in place, with permissions; return the error observations.

        A call without ``agent`` is made by the first role (the sole agent). A team's calls get the
        rounds of turn-order play, one call per turn: a call by a role later in the turn order than the
        previous call's is made in the same round, any other in the next."""
        errors = []
        team = bool(self.roles)
        rnd, last = 1, -1
        for i, c in enumerate(calls):
            agent = c.agent or self._agents[0]
            if team:
                pos = self._agents.index(agent) if agent in self._agents else len(self._agents)
                rnd, last = (rnd if pos > last else rnd + 1), pos
                cast("MultiState", state).acting, cast("MultiState", state).round = agent, rnd
            t = self._role_tools.get(agent, {}).get(c.name)
            if t is None:
                errors.append(f"call {i} ({agent}: {c.name}): not a tool of {agent}")
                continue
            out = t.invoke(state, c.arguments)
            if not out.ok:
                errors.append(f"call {i} ({agent}: {c.name}): {out.content}")
        if team:
            cast("MultiState", state).acting = ""
        return errors

    def replay_turns(self, task: Task, state: State) -> list[str]:
        """Replay a conversation's reference turn by turn on ``state`` (in place), keeping for each
        turn the state's hash after it (or a copy of ``Conversation.state_view`` of it) and its
        calls' results (``task._turn_refs``), for the per-turn checks; return the error
        observations, as :meth:`replay`."""
        import copy

        conv = task.conversation
        assert conv is not None
        errors, refs, i = [], [], 0
        for k, turn in enumerate(conv.turns):
            results = []
            for c in turn.solution:
                t = self._role_tools.get(self._agents[0], {}).get(c.name)
                if t is None:
                    errors.append(f"call {i} (turn {k}: {c.name}): not a tool")
                    results.append("")
                else:
                    out = t.invoke(state, c.arguments)
                    results.append(out.content)
                    if not out.ok:
                        errors.append(f"call {i} (turn {k}: {c.name}): {out.content}")
                i += 1
            if "state" not in (turn.checks or ()):
                hashed: Any = ""
            elif conv.state_view is None:
                hashed = state_hash(state)
            else:  # what the turn's state check compares (Conversation.state_view), kept as it is now
                hashed = copy.deepcopy(conv.state_view(state))
            refs.append((hashed, results))
        task._turn_refs = refs
        return errors

    def rewards(self, task: Task, state: Any, success: bool) -> dict[str, float]:
        """Per-agent rewards at the end: the payoff for mixed-motive games, else the joint reward."""
        if self.payoff is not None:
            out = self.payoff(task, state, success)
            return {a: float(out.get(a, 0.0)) for a in self._agents}
        return dict.fromkeys(self._agents, 1.0 if success else 0.0)

    def describe(self) -> dict[str, Any]:
        """The listing entry: name, domain, multi_agent, tasks, tools."""
        d = {
            "name": self.name,
            "domain": self.domain,
            "multi_agent": self.multi_agent,
            "tasks": len(self.get_tasks()),
            "tools": len(self.all_tools),
            "description": self.description,
        }
        if self.roles:
            d.update(agents=list(self._agents), mixed_motive=self.payoff is not None)
        return d
