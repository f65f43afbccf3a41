"""The episode engine: one referee for one agent or a team, over any world.

An :class:`Episode` is a live episode of a :class:`~envfactory.definition.ToolEnvSpec`
with N >= 1 roles. It is the referee and it always runs on the host: it parses
each action, checks permissions, keeps every agent's transcript and private
view, delivers messages, counts turns and rounds, decides the end of the
episode and computes the reward from the true final state. The state itself
lives in a :class:`~envfactory.world.World` (in-process, or in a container),
which only runs the calls the referee allowed.

Turn protocol. Agents act in role order; when every agent has taken one turn,
a round ends. One typed API for any number of roles:

- ``reset(task, seed=...) -> list[Message]`` starts an episode and returns the
  opening messages (system, instruction) of the agent who moves first: the sole
  agent of a one-role episode; for a team, ``agents[0]`` (each agent's own with
  :meth:`Episode.transcript`, what is new to it with :meth:`Episode.observation`).
- ``step(action) -> StepResult`` plays the sole agent's turn (one role, Gymnasium).
  On a team it raises :class:`EpisodeError` naming the two members below.
- ``act(agent, action) -> StepResult`` plays one agent's turn; it must be
  ``status.next_agent`` (turn order, PettingZoo AEC).
- ``step_round({agent: action}) -> dict[str, StepResult]`` plays a whole round of
  simultaneous moves (PettingZoo Parallel): every action of a round was chosen on
  the same information, so messages sent during it reach their recipients only
  from the next round on; calls run in role order, so when two agents grab the
  same resource the first gets it and the second a ``conflict`` error.
- ``aio``: the same calls, awaited (``await episode.aio.step(action)``), for asyncio
  code keeping many episodes in flight (:class:`AsyncEpisode`).
- Members taking ``agent=None`` (``transcript``, ``observation``, ``tool_schemas``,
  ``status.turns_taken``) mean the sole agent and raise on a team, asking which agent.

A turn is an assistant message (model text, an OpenAI-style message, or tool
calls). Calls to another role's tools are refused (``permission denied``). A
turn without a tool call *passes*. The episode terminates when anyone calls
``finish`` (its answer is the final answer), when the world says so
(``spec.terminal``), or when every agent passes in the same round (for one
agent: it answers without a tool call); it is truncated after ``max_turns``
rounds. Rewards are sparse: 0 until the end, then the task success (or, for
mixed-motive games, each agent's payoff), judged from the true final state,
never from what an agent claims.

The one-role case pays nothing for mail: it has no mailbox and no letters.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Literal, cast, overload

from pydantic import ValidationError

from . import quotas
from .definition import DEFAULT_SPLIT, PERMISSION_PREFIX, DrawSplit, ToolEnvSpec, split_members, task_for_seed
from .env import Environment, EpisodeError, Message, SnapshotError, StepResult, _offload
from .mail import CONFLICT_PREFIX, Mailbox, MultiState
from .parsing import ParsedAction, one_call, parse_action, parse_text
from .snapshots import WORLD_GONE, check_referee, check_seal, sign_snapshot
from .state import State, copy_state
from .task import Task, ToolCall
from .tooling import ToolOutcome
from .conversation import TURN_COMPONENTS, communicated, user_reply
from .users import USER_TOOL, UserResponder, host_reply, user_profile
from .world import LocalWorld, RunBatch, World, WorldGone, WorldLost

__all__ = ["Episode", "EpisodeStatus", "AsyncEpisode", "SNAPSHOT_FORMAT", "task_for_seed", "step_many"]

SNAPSHOT_FORMAT = 2
NOTHING_NEW = "(nothing new)"
_IGNORED = "Error: ignored; the episode was already finished by an earlier call."
_CONFLICT = "Error: " + CONFLICT_PREFIX
_N_CALL_IDS = 1024
# a call's id when the agent gave none (``call_<round>_0`` for a turn's one call), for the usual rounds
_CALL_IDS = tuple(f"call_{r}_0" for r in range(_N_CALL_IDS))
# step_many's first half of a turn: (action, its one call as (name, arguments), the world's
# pending batch or None, how the world went at the send or None)
_Begun = tuple[str, tuple[str, dict[str, Any]], Any, WorldGone | None]


class Episode(Environment):
    """A live episode of ``spec``: the referee of one agent or a team, over any world.

    The episode encapsulates a task's conversation and world behind :meth:`reset` and the
    turn methods; a one-role environment is played like a Gymnasium ``Env``, a team like
    PettingZoo's AEC (:meth:`act`) or Parallel (:meth:`step_round`) API (see the module
    docstring for the turn protocol).

    The main API methods that users of this class need to know are:

    - :meth:`reset` - Starts an episode of a task (named, or drawn from the episode's split)
      and returns the opening messages of the agent who moves first.
    - :meth:`step` - Plays the sole agent's turn (an assistant message: text or tool calls)
      and returns a :class:`StepResult`: the tool responses, the reward, whether the episode
      terminated or was truncated, and ``info``. Never raises on model output.
    - :meth:`act` - Plays one agent's turn of a team, in turn order (``status.next_agent``).
    - :meth:`step_round` - Plays a round of simultaneous moves, ``{agent: action}``.
    - :meth:`fork`, :meth:`snapshot`, :meth:`restore` - An independent live copy, and the
      whole episode as sealed JSON data to continue from later.
    - :meth:`close` - Releases the world (a container, a session). Idempotent.
    - :attr:`aio` - The same calls, awaited, for asyncio code (:class:`AsyncEpisode`).

    What the agents see:

    - :meth:`transcript` - An agent's whole conversation so far (OpenAI-style messages):
      what an LLM playing it is prompted with.
    - :meth:`observation` - What is new for an agent since its last turn, as text.
    - :meth:`tool_schemas` - The function-calling schemas of the tools an agent may call.

    What the episode is and how it stands:

    - :attr:`spec` - The environment definition; :attr:`agents` - its roles, in turn order.
    - :attr:`task` - The running task (``None`` before :meth:`reset`).
    - :attr:`state` - The true world state, the one the reward is computed from.
    - :attr:`done` - Whether the episode has ended (terminated or truncated).
    - :attr:`success`, :attr:`rewards` - The verdict, judged on the host from the true final
      state once the episode has ended (rewards are 0 until then).
    - :attr:`status` - Everything else about the episode so far, read live
      (:class:`EpisodeStatus`: round, whose turn, how it ended, the final answer, the turn
      limit, every tool call, each agent's turns, and the verdict if it were cut now).

    Args:
        spec: The environment definition.
        world: Where the state lives (default: in this process).
        max_turns: Overrides ``spec.max_turns`` (rounds, for a team).
        user: A host-side responder for ``ask_user`` (see :mod:`envfactory.users`).
        split: Which tasks ``reset()`` draws from when it is not given one: ``train`` (the
            ``sft`` and ``rl`` splits; the default), ``sft``, ``rl``, ``eval`` or ``all``.
            Evaluation tasks are drawn only when asked for (``eval`` or ``all``); a task named
            explicitly in ``reset(task)`` is always played.
    """

    def __init__(self, spec: ToolEnvSpec, world: World | None = None, *, max_turns: int | None = None,
                 user: UserResponder | None = None, split: DrawSplit = DEFAULT_SPLIT) -> None:
        split_members(split)  # a clear error for an unknown split
        self._split = split
        self._split_tasks: list[Task] | None = None
        self.spec = spec
        self._world = world if world is not None else LocalWorld(spec)
        self.agents: list[str] = list(spec.agent_ids)
        self._max_turns = spec.max_turns if max_turns is None else int(max_turns)
        if self._max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self._team = len(self.agents) > 1
        self._tools_of = {a: spec.tools_of(a) for a in self.agents}
        # per agent, the tools that run in the world (everything but finish): a call
        # batch made only of these goes to the world in one piece
        # (with a host-side user, ask_user is answered here too: an LLM user needs the host)
        self._user = user
        self._world_tools = {a: {n: t for n, t in tools.items() if not t.finish and not (user and n == USER_TOOL)}
                             for a, tools in self._tools_of.items()}
        self._solo_agent = self.agents[0]
        self._solo_tools = self._world_tools[self._solo_agent]
        self._terminal = spec.terminal
        # a one-role episode over a plain in-process world calls its tools itself (the same
        # Tool objects LocalWorld.run would call): no world round trip on the hot path
        self._in_process = (not self._team and type(self._world) is LocalWorld
                            and all(self._world._tools.get(n) is t for n, t in self._solo_tools.items()))
        self._timed_out: str | None = None
        self._success: bool | None = None  # the verdict, once judged
        self._answer: str | None = None
        self._ended_by: str | None = None
        self._gone = "timeout"  # or "world_lost": why the world is gone, once it is
        self._task: Task | None = None
        self._terminated = self._truncated = False
        self._tx: dict[str, list[Message]] = {}
        self._pending: list[tuple[Any, ...]] = []
        self._eager = False  # see _write_transcripts_eagerly
        # what reset() sets, computed once: each agent's system prompt, and a sole agent's mail
        # count and rewards (never changed in place, only replaced, so every episode shares them)
        self._system = {a: spec.render_system_prompt(a) for a in self.agents}
        self._solo_seen = {self._solo_agent: 0}
        self._solo_rewards = {self._solo_agent: 0.0}
        self._tasks_built = False
        self._conv: dict[str, Any] | None = None  # a conversation's progress (see _open_conversation)
        self._hidden: frozenset[str] = frozenset()  # tools of user turns not yet opened

    # -- the transcripts, written lazily ----------------------------------------
    # A sole agent's usual turn (world tools, no error; or an answer) is kept in _pending as
    # (content, tool_calls or None (one call) or False (an answer), call id, name, arguments, tool
    # messages) and written into the transcript as OpenAI-style messages when anything reads it:
    # the step path builds no assistant message that nobody reads.
    @property
    def _transcripts(self) -> dict[str, list[Message]]:
        if self._pending:
            self._flush()
        return self._tx

    @_transcripts.setter
    def _transcripts(self, value: dict[str, list[Message]]) -> None:
        self._tx, self._pending = value, []

    def _write_transcripts_eagerly(self) -> None:
        """Write every turn into the transcript as it is played (for a caller that reads each turn's
        messages, as the Gymnasium face does: deferring them would only add work)."""
        self._transcripts  # noqa: B018 - the property writes what is pending
        self._eager = True

    def _flush(self) -> None:
        transcript = self._tx[self._solo_agent]
        for content, openai_calls, cid, name, args, new in self._pending:
            if openai_calls is False:  # an answer without a tool call
                transcript.append({"role": "assistant", "content": content})
                continue
            if openai_calls is None:
                openai_calls = [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}]
            transcript.append({"role": "assistant", "content": content, "tool_calls": openai_calls})
            transcript += new
        self._pending = []  # a new list: a fork made before this flush keeps its own

    # -- protocol -------------------------------------------------------------
    @property
    def _tasks(self) -> list[Task]:
        """The tasks ``reset()`` draws from: those of the episode's split, in task order."""
        if self._split_tasks is None:
            self._split_tasks = self.spec.tasks_in(self._split)
        return self._split_tasks

    def reset(self, task: str | int | Task | None = None, *, seed: int | None = None) -> list[Message]:
        """Start an episode.

        Args:
            task: A task id, index or :class:`Task`. ``None`` draws one of the episode's
                split (the ``split`` it was made with) from ``seed`` (:func:`task_for_seed`),
                or at random when ``seed`` is ``None``.
            seed: Seeds the task draw when ``task`` is ``None``.

        Returns:
            The opening messages (system, user instruction) of the agent who moves first:
            the sole agent, or a team's ``agents[0]``. Every agent's own, private notes
            included: :meth:`transcript` (or :meth:`observation`) of that agent.
        """
        if task is None:
            task = self.spec.draw_task(self._split, seed, pool=self._tasks)
        if task.__class__ is Task and self._tasks_built:
            t = task  # what spec.task() returns for a Task once the tasks are built
        else:
            t = self.spec.task(task)
            self._tasks_built = True
        if not self._team:  # the sole agent: the same fields, written out
            if self._in_process:  # LocalWorld.start, inlined (a sole agent's state needs no team)
                init, w = t.initial_state, cast(LocalWorld, self._world)
                if w._box is not None:  # (it held a state shared with forks: it lets it go)
                    w._leave()
                state = w._state = copy_state(init)
                quotas.fresh_copy(state, init)
            else:
                self._world.start(t)
            self._task = t
            a = self._solo_agent
            opening = t.instruction
            if t.private:
                note = t.private.get(a)
                if note:
                    opening += "\n\nPrivate notes (only you know this): " + note
            opened: list[Message] = [{"role": "system", "content": self._system[a]},
                                     {"role": "user", "content": opening}]
            self._tx, self._pending = {a: opened}, []  # (the _transcripts setter, written out)
            self._last_tool: dict[str, list[Message]] = {a: []}
            self._acted = {a: 0}
            self._counts = {a: {"tool_calls": 0, "tool_errors": 0, "parse_errors": 0}}
            self._passed: list[str] = []
            self._last_words: dict[str, str] = {}
            self._log: list[tuple[Any, ...]] = []
            self._round, self._pos = 1, 0  # (attribute writes: twice as fast as a dict update of them)
            self._terminated = self._truncated = False
            self._success = self._answer = self._ended_by = self._timed_out = None
            self._seen_mail, self._rewards = self._solo_seen, self._solo_rewards
            self._open_conversation(t)
            return opened.copy()
        self._world.start(t)
        self._task = t
        self._transcripts: dict[str, list[Message]] = {}
        for a in self.agents:
            opening = t.instruction
            if t.private.get(a):
                opening += "\n\nPrivate notes (only you know this): " + t.private[a]
            self._transcripts[a] = [{"role": "system", "content": self._system[a]},
                                    {"role": "user", "content": opening}]
        self._seen_mail = dict.fromkeys(self.agents, 0)
        self._last_tool = {a: [] for a in self.agents}
        self._acted = dict.fromkeys(self.agents, 0)
        self._counts = {a: {"tool_calls": 0, "tool_errors": 0, "parse_errors": 0} for a in self.agents}
        self._round, self._pos = 1, 0
        self._passed = []
        self._last_words = {}
        self._log = []  # (round, agent, name, arguments, kind, read_only)
        self._terminated = self._truncated = False
        self._success = None
        self._rewards = dict.fromkeys(self.agents, 0.0)
        self._answer = None
        self._ended_by = None
        self._timed_out = None
        return list(self._transcripts[self.agents[0]])

    def act(self, agent: str, action: Any) -> StepResult:
        """Play ``agent``'s turn; it must be ``status.next_agent``. Never raises on model output.

        Raises:
            EpisodeError: no episode is running, it has ended, or it is not ``agent``'s turn.
            envfactory.parsing.ActionTypeError: ``action`` is of no accepted type.
        """
        self._check_turn(agent)
        return self._turn(agent, action, self._mail_count())

    def step(self, action: Any) -> StepResult:
        """Play the sole agent's turn. Never raises on model output.

        Raises:
            EpisodeError: no episode is running, it has ended, or this is a team (use
                :meth:`step_round` or :meth:`act`).
            envfactory.parsing.ActionTypeError: ``action`` is of no accepted type.
        """
        if self._team:
            raise EpisodeError(f"{self.spec.name} is a team environment ({', '.join(self.agents)}): step() "
                               "plays a sole agent's turn; use step_round({agent: action}) for a round of "
                               "simultaneous moves or act(agent, action) for one agent's turn")
        new, reward, terminated, truncated, info = self._solo_turn(action)
        agent = self._solo_agent
        return StepResult(new, reward, terminated, truncated, info, agent, {agent: reward})

    def _solo_begin(self, action: Any, batch: RunBatch | None = None) -> _Begun | None:
        """:func:`step_many`'s first half of the sole agent's turn: for the usual turn (a text of one
        call of a world tool) on a world that splits a batch, the call sent; ``None`` for any other
        turn (:meth:`step` plays it whole). Call :meth:`_solo_finish` with what it returns."""
        if (self._in_process or self._team or action.__class__ is not str or self._task is None
                or self._terminated or self._truncated or self._timed_out is not None):
            return None
        one = one_call(action)
        if one is None or one[0] not in self._solo_tools:
            return None
        try:
            pending = self._world.run_begin(self._solo_agent, self._round, [ToolCall(one[0], one[1])], batch)
        except WorldGone as exc:
            return action, one, None, exc
        return None if pending is None else (action, one, pending, None)

    def _solo_finish(self, begun: _Begun, ready: bool = False) -> StepResult:
        """:func:`step_many`'s second half: the turn :meth:`_solo_begin` began, played with the
        world's answer (read now; ``ready``: it is in) as :meth:`step` plays it."""
        action, one, pending, gone = begun
        pre: ToolOutcome | WorldGone
        if gone is not None:
            pre = gone
        else:
            try:
                outs = self._world.run_end(pending, ready)
            except WorldGone as exc:
                pre = exc
            else:
                if len(outs) != 1:
                    raise RuntimeError(f"{self.spec.name}: the world answered {len(outs)} outcomes for 1 call")
                pre = outs[0]
        new, reward, terminated, truncated, info = self._solo_turn(action, pre, one)
        agent = self._solo_agent
        return StepResult(new, reward, terminated, truncated, info, agent, {agent: reward})

    def step_round(self, actions: Mapping[str, Any]) -> dict[str, StepResult]:
        """Play one round of simultaneous moves from ``{agent: action}`` (an agent missing
        from it passes) and return ``{agent: StepResult}`` for the agents that acted, in role
        order. The episode may end mid-round (e.g. on ``finish``); later agents' actions are
        then ignored and they are absent from the result. With one role it plays that
        agent's turn (the same as :meth:`step`, through the general path).

        Raises:
            EpisodeError: no episode is running, it has ended, ``actions`` is not a mapping
                or names an unknown agent, or a turn-order round is half played (finish it
                with :meth:`act`).
            envfactory.parsing.ActionTypeError: an action is of no accepted type.
        """
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() before step_round()")
        if not isinstance(actions, Mapping):
            raise EpisodeError(f"{self.spec.name}: step_round() takes {{agent: action}} for {self.agents}, "
                               f"not {type(actions).__name__}; act(agent, action) plays one turn")
        if self._pos != 0 and not self.done:
            raise EpisodeError(f"{self.spec.name}: a simultaneous round must start at the beginning of "
                               f"a round, but it is {self.agents[self._pos]}'s turn; finish the round with act()")
        unknown = set(actions) - set(self.agents)
        if unknown:
            raise EpisodeError(f"{self.spec.name}: actions for unknown agents {sorted(unknown)}; "
                               f"the agents are {self.agents}")
        limit = self._mail_count()
        out: dict[str, StepResult] = {}
        for a in self.agents:
            if self.done and out:
                break
            self._check_turn(a)
            out[a] = self._turn(a, actions.get(a, ""), limit)
        return out

    def _slow(self, agent: str, parsed: ParsedAction) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        r = self._turn(agent, parsed, 0, preparsed=True)
        return r.messages, r.reward, r.terminated, r.truncated, r.info

    def _solo_turn(self, action: Any, pre: ToolOutcome | WorldGone | None = None,
                   one: tuple[str, dict[str, Any]] | None = None
                   ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """The sole agent's turn as ``(messages, reward, terminated, truncated, info)``. The
        usual turn (well-formed calls of world tools) takes this short path; anything else
        (a pass, parse errors, ``finish``, an unknown tool, a world that timed out) goes
        through :meth:`_turn` like a team's. ``pre``: the world's answer to the turn's one call,
        already in (:func:`step_many`), or how the world went while it ran."""
        agent = self._solo_agent
        task = self._task
        if task is None or self._terminated or self._truncated:
            task = self._check_turn(agent)  # raises
        world_tools = self._solo_tools
        rnd = self._round
        if one is None:  # (step_many's second half passes the call its first half read)
            one = one_call(action) if action.__class__ is str else None
        t = world_tools.get(one[0]) if one is not None and self._timed_out is None else None
        cid = _CALL_IDS[rnd] if rnd < _N_CALL_IDS else f"call_{rnd}_0"  # the id of a call that has none
        if t is not None:  # the usual turn's text, read without building the parse's objects
            assert one is not None  # (for mypy: t is found only for one call)
            parsed = None
            name, args = one
            content: str = action
            calls: list[ToolCall] | None = None
        else:
            if pre is not None:
                raise RuntimeError(f"{self.spec.name}: a turn of step_many changed between its halves")
            parsed = parse_text(action) if action.__class__ is str else parse_action(action)
            calls = parsed.calls
            if parsed.errors or not calls or self._timed_out is not None:
                if not (calls or parsed.errors or parsed.attempted) and self._timed_out is None:
                    return self._solo_answer(agent, task, parsed)
                return self._slow(agent, parsed)
            content = parsed.content
            if len(calls) == 1:
                c = calls[0]
                t = world_tools.get(c.name)
                if t is None:
                    return self._slow(agent, parsed)
                name, args = c.name, c.arguments
                cid = c.id or cid
        counts = self._counts[agent]
        if calls is None or len(calls) == 1:  # the usual turn, written out: one call, one tool message
            if pre is not None:  # step_many's second half
                o = pre if pre.__class__ is ToolOutcome else self._world_gone(cast(WorldGone, pre), 1)[0]
            elif self._in_process:  # what LocalWorld.run does for one call
                w: Any = self._world  # a LocalWorld (_in_process: checked in __init__)
                if w._box is not None and not t.read_only:  # type: ignore[union-attr]  # shared with a fork
                    w._own()  # (its own copy first)
                o, w._state = quotas.invoke_within_quota(t, w._state, args)
            else:
                try:  # _run_batch, inlined
                    outs = self._world.run(agent, rnd, calls or [ToolCall(name, args)])
                except WorldGone as exc:
                    outs = self._world_gone(exc, 1)
                if len(outs) != 1:
                    raise RuntimeError(f"{self.spec.name}: the world answered {len(outs)} outcomes for 1 call")
                o = outs[0]
            if len(o.content) > quotas.MAX_OBSERVATION_CHARS:
                o = quotas.cut_outcomes([o], quotas.MAX_OBSERVATION_CHARS)[0][0]
            kind = o.kind
            timed_out = False
            if not o.ok:
                counts["tool_errors"] += 1
                if o.content.startswith(_CONFLICT):
                    kind = "conflict"
                timed_out = kind == "timeout"
            # (t is the one call's tool on both paths into this branch; mypy cannot follow that)
            self._log.append((rnd, agent, name, args, kind, t.read_only))  # type: ignore[union-attr]
            new: list[Message] = [{"role": "tool", "tool_call_id": cid, "name": name, "content": o.content}]
            counts["tool_calls"] += 1
            if self._eager:
                openai_calls = [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}]
            else:  # the assistant message is written when the transcript is read (see _transcripts)
                self._pending.append((content, None, cid, name, args, new))
        else:
            assert parsed is not None and calls is not None  # (for mypy: the parse made them)
            found = []
            for c in calls:
                t = world_tools.get(c.name)
                if t is None:
                    return self._slow(agent, parsed)
                found.append(t)
            new = []
            openai_calls, timed_out = self._record(agent, rnd, str(rnd), calls, found,
                                                   self._run_batch(agent, rnd, calls), counts, new)
            if not self._eager:
                self._pending.append((parsed.content, openai_calls, None, None, None, new))
        if self._eager:  # a reader of every turn (the Gymnasium face): written now
            transcript = self._tx[agent]
            transcript.append({"role": "assistant", "content": content, "tool_calls": openai_calls})
            transcript += new
        self._last_tool[agent] = new
        acted = self._acted[agent] = self._acted[agent] + 1
        info: dict[str, Any] = {"turn": acted, "round": rnd, "task_id": task.id,
                                "tool_calls": counts["tool_calls"], "tool_errors": counts["tool_errors"],
                                "parse_errors": counts["parse_errors"]}
        terminal = self._terminal
        try:
            if timed_out:
                self._end(self._gone, terminated=False, success=False)
                info[self._gone] = True
            elif terminal is not None and terminal(self._world.view()):
                self._end("terminal", terminated=True)
            elif rnd >= self._max_turns:
                self._end("max_turns", terminated=False)
            else:
                self._round = rnd + 1
                return new, 0.0, False, False, info
        except WorldGone as exc:
            self._lost_while_ending(exc, info)
        self._pos = 1  # as _turn leaves it: the round was not started again
        info.update(success=self._success, answer=self._answer, ended_by=self._ended_by)
        return new, self._rewards[agent], self._terminated, self._truncated, info

    def _solo_answer(self, agent: str, task: Task, parsed: ParsedAction
                     ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """The sole agent answers without a tool call: what :meth:`_turn` does for it (the episode
        ends and is judged), with the assistant message written when the transcript is read."""
        if self._eager:
            self._tx[agent].append({"role": "assistant", "content": parsed.content})
        else:
            self._pending.append((parsed.content, False, None, None, None, ()))
        acted = self._acted[agent] = self._acted[agent] + 1
        new: list[Message] = []
        self._last_tool[agent] = new
        self._passed.append(agent)
        self._last_words[agent] = parsed.answer
        counts = self._counts[agent]
        info: dict[str, Any] = {"turn": acted, "round": self._round, "task_id": task.id,
                                "tool_calls": counts["tool_calls"], "tool_errors": counts["tool_errors"],
                                "parse_errors": counts["parse_errors"]}
        self._pos += 1
        terminal = self._terminal
        try:
            if terminal is not None and terminal(self._world.view()):
                self._end("terminal", terminated=True)
            elif self._conv is not None and self._converse(agent, parsed.answer, new):
                self._last_tool[agent] = new
                if self._round >= self._max_turns:
                    self._end("max_turns", terminated=False)
                else:
                    self._round, self._pos, self._passed = self._round + 1, 0, []
                    info["user_turn"] = self._conv["turn"]
                    return new, 0.0, False, False, info
            else:
                self._end("answer", terminated=True)
        except WorldGone as exc:
            self._lost_while_ending(exc, info)
        info.update(success=self._success, answer=self._answer, ended_by=self._ended_by)
        return new, self._rewards[agent], self._terminated, self._truncated, info

    def _check_turn(self, agent: str) -> Task:
        """The running task, if it is ``agent``'s turn in it; else an :class:`EpisodeError`."""
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() before step()")
        if self._terminated or self._truncated:
            raise EpisodeError(f"{self.spec.name}: the episode has ended; call reset() to start another")
        if agent != self.agents[self._pos]:
            raise EpisodeError(f"{self.spec.name}: it is {self.agents[self._pos]}'s turn, not {agent!r}")
        return self._task

    def _mail_count(self) -> int:
        return len(self._mail().letters) if self._team and self._task is not None else 0

    def _mail(self) -> Mailbox:
        """The team's mailbox (a team's state is a :class:`MultiState`)."""
        return cast(MultiState, self._world.view()).mail

    def _turn(self, agent: str, action: Any, mail_limit: int, *, preparsed: bool = False) -> StepResult:
        """``preparsed``: ``action`` is this episode's own parse of the action (from :meth:`_solo_turn`);
        anything a caller passes is parsed (and checked) here, a ``ParsedAction`` included."""
        # ActionTypeError before anything changes
        parsed: ParsedAction = action if preparsed else parse_action(action)
        transcript, counts = self._transcripts[agent], self._counts[agent]
        if self._team:
            letters = self._mail().inbox(agent, self._seen_mail[agent], mail_limit)
            if letters:
                transcript.append({"role": "user", "content": "\n".join(m.render() for m in letters)})
            self._seen_mail[agent] = max(self._seen_mail[agent], mail_limit)
        self._acted[agent] += 1
        rnd = self._round
        tag = f"{agent}_{rnd}" if self._team else str(rnd)
        assistant: Message = {"role": "assistant", "content": parsed.content}
        transcript.append(assistant)
        new: list[Message] = []
        log = self._log
        for j, err in enumerate(parsed.errors):
            counts["parse_errors"] += 1
            new.append({"role": "tool", "tool_call_id": f"call_{tag}_invalid{j}",
                        "name": "invalid_tool_call", "content": "Error: " + err})
            log.append((rnd, agent, None, None, "parse_error", False))
        finished, answer, timed_out = False, None, False
        if parsed.calls:
            finished, answer, timed_out = self._run_calls(agent, rnd, tag, parsed, assistant, new, counts)
        transcript.extend(new)
        self._last_tool[agent] = new
        if not parsed.attempted:
            self._passed.append(agent)
            self._last_words[agent] = parsed.answer
        info: dict[str, Any] = {"turn": self._acted[agent], "round": rnd, "task_id": self._require_task().id,
                                "tool_calls": counts["tool_calls"], "tool_errors": counts["tool_errors"],
                                "parse_errors": counts["parse_errors"]}
        self._pos += 1
        try:
            if timed_out:
                self._end(self._gone, terminated=False, success=False)
                info[self._gone] = True
            elif finished:
                self._end("finish", terminated=True, answer=answer)
            elif self.spec.terminal is not None and self.spec.terminal(self._world.view()):
                self._end("terminal", terminated=True)
            elif self._pos == len(self.agents):
                if (len(self._passed) == len(self.agents) and self._conv is not None
                        and self._converse(agent, parsed.answer, new)):
                    if rnd >= self._max_turns:
                        self._end("max_turns", terminated=False)
                    else:
                        self._round, self._pos, self._passed = rnd + 1, 0, []
                elif len(self._passed) == len(self.agents):
                    self._end("quiescence" if self._team else "answer", terminated=True)
                elif rnd >= self._max_turns:
                    self._end("max_turns", terminated=False)
                else:
                    self._round, self._pos, self._passed = rnd + 1, 0, []
        except WorldGone as exc:
            self._lost_while_ending(exc, info)
        if self._terminated or self._truncated:
            info.update(success=self._success, answer=self._answer, ended_by=self._ended_by)
        rewards = self._rewards
        return StepResult(new, rewards[agent], self._terminated, self._truncated, info, agent, dict(rewards))

    def _run_calls(self, agent: str, rnd: int, tag: str, parsed: ParsedAction, assistant: Message,
                   new: list[Message], counts: dict[str, int]) -> tuple[bool, str | None, bool]:
        """Check each call against ``agent``'s permissions, run the allowed ones in the
        world (one batch per step in the common case; ``finish`` runs here, on the
        host, and ends the turn), and write the tool messages and log entries.
        Returns (finished, answer, timed out)."""
        calls = parsed.calls
        world_tools = self._solo_tools if not self._team else self._world_tools[agent]
        found = [world_tools.get(c.name) for c in calls]
        finished, answer = False, None
        if None not in found:  # the common case: one batch
            outcomes = self._run_batch(agent, rnd, calls)
        else:
            tools = self._tools_of[agent]
            if self._hidden:  # a conversation's tools of turns not yet opened
                tools = {n: t for n, t in tools.items() if n not in self._hidden}
            found = [tools.get(c.name) for c in calls]
            outcomes = []
            for c, t in zip(calls, found):
                if finished:
                    outcomes.append(ToolOutcome(_IGNORED, False, "ignored"))
                elif t is None:
                    outcomes.append(self._refused(agent, c.name, tools))
                elif self._user is not None and c.name == USER_TOOL:
                    outcomes.append(self._ask_user(self._user, agent, rnd, c.arguments))
                elif t.finish:
                    out = t.invoke(None, c.arguments)  # finish touches no state
                    outcomes.append(out)
                    if out.ok:
                        finished, answer = True, str(c.arguments.get("answer", ""))
                else:
                    outcomes.extend(self._run_batch(agent, rnd, [c]))
        assistant["tool_calls"], timed_out = self._record(agent, rnd, tag, calls, found, outcomes, counts, new)
        return finished, answer, timed_out

    def _record(self, agent: str, rnd: int, tag: str, calls: list[ToolCall], found: list[Any],
                outcomes: list[ToolOutcome], counts: dict[str, int], new: list[Message]) -> tuple[list[Any], bool]:
        """Write each call's tool message (into ``new``), log entry and counts; return the
        assistant's ``tool_calls`` and whether the world timed out. ``found``: each call's
        tool, or ``None`` when refused."""
        timed_out = False
        # the turn's observations together, cut at the cap (the world cut each batch at it already:
        # cutting again at the same cap over the whole turn gives the same on every runtime)
        outcomes = quotas.cut_outcomes(outcomes, quotas.MAX_OBSERVATION_CHARS)[0]
        # Arguments stay a dict (the HF chat-template convention).
        openai_calls = []
        log = self._log
        for i, c in enumerate(calls):
            t, o = found[i], outcomes[i]
            cid = c.id or f"call_{tag}_{i}"
            openai_calls.append({"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
            kind = o.kind
            if not o.ok:
                counts["tool_errors"] += 1
                if o.content.startswith(_CONFLICT):
                    kind = "conflict"
                timed_out = timed_out or kind == "timeout"
            log.append((rnd, agent, c.name, c.arguments, kind, t is not None and t.read_only))
            new.append({"role": "tool", "tool_call_id": cid, "name": c.name, "content": o.content})
        counts["tool_calls"] += len(calls)
        return openai_calls, timed_out

    def _run_batch(self, agent: str, rnd: int, calls: list[ToolCall]) -> list[ToolOutcome]:
        if self._timed_out is not None:  # the world is gone: answer the rest of the turn
            return [ToolOutcome(self._timed_out, False, "timeout") for _ in calls]
        try:
            outs = self._world.run(agent, rnd, calls)
        except WorldGone as exc:
            return self._world_gone(exc, len(calls))
        if len(outs) != len(calls):
            raise RuntimeError(f"{self.spec.name}: the world answered {len(outs)} outcomes for {len(calls)} calls")
        return outs

    def _world_gone(self, exc: WorldGone, n: int) -> list[ToolOutcome]:
        """The world overran or was lost: these calls and the rest of the turn answer
        the error, and the turn ends the episode as truncated (``ended_by``: why)."""
        self._timed_out = f"Error: {exc}"
        self._gone = "world_lost" if isinstance(exc, WorldLost) else "timeout"
        return [ToolOutcome(self._timed_out, False, "timeout") for _ in range(n)]

    def _lost_while_ending(self, exc: WorldGone, info: dict[str, Any]) -> None:
        """The world was lost while the turn's end was decided (a terminal check, or judging, fetch
        the state): the same ending as a world lost during a batch, never an exception from step()."""
        self._world_gone(exc, 0)
        self._end(self._gone, terminated=False, success=False)
        info[self._gone] = True

    def _ask_user(self, user: UserResponder, agent: str, rnd: int, arguments: dict[str, Any]) -> ToolOutcome:
        """``ask_user`` answered by the episode's host-side user (an LLM user): the same
        argument validation as the tool, the task's user (persona, goal, facts), the questions
        asked so far. A user with a script (a confirmation to give) hears the question in the
        world too, so what it has confirmed is in the state; the agent sees the LLM's words."""
        checked = self._tools_of[agent][USER_TOOL].invoke(None, arguments)  # the tool's own validation
        if not checked.ok:
            return checked
        question = str(arguments["question"])
        history = []
        asked = {}
        for m in self._transcripts[agent]:
            for c in m.get("tool_calls") or ():
                if c["function"]["name"] == USER_TOOL:
                    asked[c["id"]] = str(c["function"]["arguments"].get("question", ""))
            if m["role"] == "tool" and m.get("name") == USER_TOOL and m["tool_call_id"] in asked:
                history.append((asked[m["tool_call_id"]], m["content"]))
        initial = self._require_task().initial_state
        reply = host_reply(user, question, user_profile(initial), history)
        ok = not reply.startswith("Error")
        if ok and any(k.startswith("_") for k in getattr(initial, "user", None) or {}):
            self._run_batch(agent, rnd, [ToolCall(USER_TOOL, dict(arguments))])
        return ToolOutcome(reply, ok, "ok" if ok else "tool_error")

    def _refused(self, agent: str, name: str, tools: dict[str, Any]) -> ToolOutcome:
        owners = self.spec.owners(name)
        if owners:
            return ToolOutcome(PERMISSION_PREFIX + f"'{name}' is a tool of {', '.join(owners)}, not of {agent}; "
                               f"ask them to do it. Your tools: {', '.join(tools)}.", False, "permission")
        what = "Your tools" if self._team else "Available tools"
        return ToolOutcome(f"Error: unknown tool '{name}'. {what}: {', '.join(tools)}.", False, "unknown_tool")

    def _judge(self, answer: str | None = None) -> tuple[str, bool, dict[str, float]]:
        if answer is None:
            answer = "\n".join(self._last_words[a] for a in self.agents if self._last_words.get(a))
        state = self._world.view()
        task = self._require_task()
        success = task.success(state, answer)
        if success and task.answer_facts and "answer" in task.components() and not self._facts_shown(task):
            success = False
        if success and (self._conv is not None or "actions" in task.components()):
            success = self._conversation_ok(task)
        return answer, success, self.spec.rewards(task, state, success)

    def _facts_shown(self, task: Task) -> bool:
        """:meth:`Task.facts_shown` over what this episode showed its agents: tool results
        (with their calls' arguments), letters and private notes."""
        notes = list(task.private.values())
        results: list[tuple[str, Any]] = []
        for a in self.agents:
            args: dict[str, Any] = {}
            for m in self._transcripts[a][2:]:
                role = m["role"]
                if role == "assistant":
                    for c in m.get("tool_calls") or ():
                        args[c["id"]] = c["function"]["arguments"]
                elif role == "tool":
                    results.append((m["content"] or "", args.get(m.get("tool_call_id", ""), "")))
                elif role == "user":
                    notes.append(m["content"] or "")
        return task.facts_shown(notes, results)

    def _end(self, how: str, *, terminated: bool, answer: str | None = None, success: bool | None = None) -> None:
        self._terminated, self._truncated, self._ended_by = terminated, not terminated, how
        if how in ("timeout", "world_lost"):  # the world is gone: nothing to judge
            self._answer, self._success, self._rewards = None, False, dict.fromkeys(self.agents, 0.0)
            return
        conv = self._conv
        if conv is not None and how in ("finish", "terminal") and len(conv["verdicts"]) == conv["turn"]:
            # the agent (or the world) ended the conversation: the turn under way is judged as it stands
            self._close_turn()
        self._answer, self._success, self._rewards = self._judge(answer)

    # -- conversations (envfactory.conversation) ------------------------------
    def _open_conversation(self, task: Task) -> None:
        """Start ``task``'s conversation at its first turn (or none, for a one-instruction task)."""
        conv = task.conversation
        if conv is None:
            self._conv = None
        else:
            # turn: the open turn; start: the log length when it opened; verdicts: each closed turn's
            # checks; told: facts the user has told; said: (agent's words, user's reply) exchanges
            self._conv = {"turn": 0, "start": 0, "verdicts": [], "told": [], "said": []}
        self._reopen_tools()

    def _reopen_tools(self) -> None:
        """The sole agent's tools as the conversation stands: those of turns not yet opened hidden."""
        task, conv = self._task, self._conv
        hidden = (frozenset(task.conversation.hidden_tools(conv["turn"]))
                  if conv is not None and task is not None and task.conversation is not None else frozenset())
        if hidden != self._hidden or (not hidden and self._solo_tools is not self._world_tools[self._solo_agent]):
            self._hidden = hidden
            tools = self._world_tools[self._solo_agent]
            self._solo_tools = {n: t for n, t in tools.items() if n not in hidden} if hidden else tools

    def _converse(self, agent: str, words: str, new: list[Message]) -> bool:
        """The agent answered ``words`` without a tool call: the user's next message, appended to
        ``new`` and the transcript, when the conversation goes on (``True``); ``False`` when this
        answer ends it (the last turn is answered)."""
        conv, task = self._conv, self._require_task()
        assert conv is not None and task.conversation is not None
        k = conv["turn"]
        called = any(e[2] is not None for e in self._log[conv["start"]:])
        reply, asked = user_reply(task.conversation, k, words, called)
        if reply is not None and asked and self._user is not None:
            profile = {"persona": task.conversation.persona, "goal": task.conversation.turns[k].message,
                       **task.conversation.facts}
            reply = host_reply(self._user, words, profile, [tuple(x) for x in conv["said"]])
        if reply is None:
            self._close_turn()
            if k + 1 >= len(task.conversation.turns):
                return False
            conv["turn"], conv["start"] = k + 1, len(self._log)
            self._reopen_tools()
            reply = task.conversation.turns[k + 1].message
            opened = task.conversation.turns[k + 1].tools
            if opened:  # a chat template shows the tools of the opening only: the message says what appeared
                schemas = [s for s in self.spec.tool_schemas() if s["function"]["name"] in opened]
                reply += ("\n\nNew tools you can call from now on:\n"
                          + "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas))
        conv["told"] += [a for a in asked if a not in conv["told"]]
        conv["said"].append([words, reply])
        message: Message = {"role": "user", "content": reply}
        new.append(message)
        self._transcripts[agent].append(message)  # (after the answer, written out if it was pending)
        return True

    def _close_turn(self) -> None:
        """Judge the open turn's checks now (the state after it, its results, whether it called)."""
        conv, task = self._conv, self._require_task()
        assert conv is not None and task.conversation is not None
        k = conv["turn"]
        turn = task.conversation.turns[k]
        refs = task._turn_refs
        if refs is None:
            raise RuntimeError(f"task {task.id!r}: the conversation's reference was not replayed "
                               "(register the task through a ToolEnvSpec)")
        verdict: dict[str, bool] = {}
        checks = turn.checks or ()
        if "no_call" in checks or "call" in checks:
            called = any(e[2] is not None for e in self._log[conv["start"]:])
            if "no_call" in checks:
                verdict["no_call"] = not called
            if "call" in checks:
                verdict["call"] = called
        if "state" in checks:
            view = task.conversation.state_view
            if view is None:
                from .state import state_hash
                verdict["state"] = state_hash(self._world.view()) == refs[k][0]
            else:  # (the reference's view, kept by ToolEnvSpec.replay_turns)
                verdict["state"] = bool(view(self._world.view()) == refs[k][0])
        if "results" in checks:  # each reference result, as often as the reference got it
            from collections import Counter
            got = Counter(m["content"] for m in self._transcripts[self._solo_agent] if m["role"] == "tool")
            verdict["results"] = all(got[r] >= n for r, n in Counter(refs[k][1]).items())
        conv["verdicts"].append(verdict)

    def _conversation_ok(self, task: Task) -> bool:
        """The conversation's components (every turn closed and its checks held; facts communicated)
        and the action sequence, when the task's components name them."""
        parts = task.components()
        conv = self._conv
        if conv is not None and task.conversation is not None:
            verdicts = conv["verdicts"]
            if len(verdicts) < len(task.conversation.turns):
                return False  # the conversation was not played to its end
            for check, part in TURN_COMPONENTS.items():
                if part in parts and not all(v.get(check, True) for v in verdicts):
                    return False
            if "communicate" in parts:
                said = [m["content"] or "" for m in self._transcripts[self._solo_agent]  # what the user heard:
                        if m["role"] == "assistant" and not m.get("tool_calls")]  # the answers, not the calls
                if not all(communicated(f, said) for f in task.conversation.communicate):
                    return False
        if "actions" in parts:
            tools = self.spec.all_tools
            wanted = [c for c in task.solution if not (c.name in tools and tools[c.name].read_only)]
            made = iter([(e[2], e[3]) for e in self._log if e[2] is not None and e[4] == "ok"])
            if not all(any(n == c.name and a == c.arguments for n, a in made) for c in wanted):
                return False
        return True

    # -- what each agent sees -------------------------------------------------
    def _agent(self, agent: str | None) -> str:
        if agent is None:
            if self._team:
                raise EpisodeError(f"{self.spec.name} is a team environment; say which agent (one of {self.agents})")
            return self.agents[0]
        if agent not in self._acted:
            raise KeyError(f"{self.spec.name} has no agent {agent!r}; its agents are {self.agents}")
        return agent

    def _require_task(self) -> Task:
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() first")
        return self._task

    def transcript(self, agent: str | None = None) -> list[Message]:
        """``agent``'s conversation so far as OpenAI-style messages (its private view), with
        undelivered letters as a final user message: what an LLM playing ``agent`` is prompted
        with. ``None``: the sole agent's, the live list (copy it before changing it).

        Raises:
            EpisodeError: this is a team and ``agent`` is ``None``, or no episode is running.
            KeyError: ``agent`` is none of the episode's agents.
        """
        if agent is None and self._team:  # (before reset too: a team always has to say whose)
            raise EpisodeError(f"{self.spec.name} is a team environment; say which agent: transcript(agent) "
                               f"for one of {self.agents}")
        self._require_task()
        agent = self._agent(agent)
        out = self._transcripts[agent]
        if not self._team:
            return out
        out = list(out)
        letters = self._mail().inbox(agent, self._seen_mail[agent])
        if letters:
            out.append({"role": "user", "content": "\n".join(m.render() for m in letters)})
        return out

    def observation(self, agent: str | None = None) -> str:
        """What is new for ``agent`` since its last turn: its tool responses, then the
        letters that reached it (before its first turn: the opening instruction)."""
        self._require_task()
        agent = self._agent(agent)
        parts = []
        if not self._acted[agent]:
            parts.append(self._transcripts[agent][1]["content"])
        elif self._last_tool[agent]:
            parts.append("\n".join(m["content"] if m["role"] == "user" else
                                   f"<tool_response>\n{m['content']}\n</tool_response>"
                                   for m in self._last_tool[agent]))
        if self._team:
            letters = self._mail().inbox(agent, self._seen_mail[agent])
            if letters:
                parts.append("\n".join(m.render() for m in letters))
        return "\n".join(parts) or NOTHING_NEW

    def tool_schemas(self, agent: str | None = None) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of the tools ``agent`` may call (``None``: the sole
        agent; a team must say which agent)."""
        if agent is None and self._team:
            raise EpisodeError(f"{self.spec.name} is a team environment; say whose tools: tool_schemas(agent) "
                               f"for one of {self.agents}")
        schemas = self.spec.tool_schemas(agent)
        if self._hidden:  # a conversation's tools of turns not yet opened
            return [s for s in schemas if s["function"]["name"] not in self._hidden]
        return schemas

    # -- fork / snapshot / restore ----------------------------------------------
    def fork(self) -> "Episode":
        """An independent copy of this live episode: same transcripts, same state, same
        turn; later actions on either copy do not affect the other."""
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: nothing to fork; call reset() first")
        new = Episode.__new__(Episode)
        new.__dict__.update(self.__dict__)
        new._world = self._world.fork()
        new._transcripts = {a: list(m) for a, m in self._transcripts.items()}  # messages are never mutated
        new._seen_mail, new._acted = dict(self._seen_mail), dict(self._acted)
        new._last_tool = dict(self._last_tool)
        new._counts = {a: dict(c) for a, c in self._counts.items()}
        new._passed, new._last_words = list(self._passed), dict(self._last_words)
        new._log, new._rewards = list(self._log), dict(self._rewards)
        if self._conv is not None:
            new._conv = json.loads(json.dumps(self._conv))
        return new

    _FIELDS = ("transcripts", "seen_mail", "last_tool", "acted", "counts", "round", "pos", "passed",
               "last_words", "log", "terminated", "truncated", "success", "rewards", "answer", "ended_by", "conv")

    def snapshot(self) -> dict[str, Any]:
        """The whole episode (referee and world) as JSON data, for :meth:`restore`; sealed
        (``"mac"``) under the snapshot key (:mod:`envfactory.snapshots`), so an edited copy is
        refused."""
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: nothing to snapshot; call reset() first")
        state = self._world.dump()
        if not (type(self._world) is LocalWorld and type(self._world.view()).__json_dump_is_fresh__):
            state = json.loads(json.dumps(state))  # a state that dumps fresh JSON data is not copied again
        referee = json.loads(json.dumps({k: getattr(self, "_" + k) for k in self._FIELDS}))  # lists, not tuples
        snap = {"format": SNAPSHOT_FORMAT, "env": self.spec.name, "task_id": self._task.id,
                "max_turns": self._max_turns, "state": state, **referee}
        return sign_snapshot(snap)

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue exactly from ``snapshot`` (taken from an episode of the same environment, in
        this process or one sharing its ``ENVFACTORY_SNAPSHOT_KEY``). The success of an ended
        episode is judged again here, from the snapshot's state.

        Raises:
            SnapshotError: not a snapshot of this environment, edited (its seal does not match),
                a referee field of the wrong type, a verdict contradicting the ending, or a
                state the world refuses. Every check but the world's runs before anything changes.
        """
        if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotError(f"not an envfactory snapshot of format {SNAPSHOT_FORMAT} "
                                "(take one with Episode.snapshot())")
        if snapshot.get("env") != self.spec.name:
            raise SnapshotError(f"snapshot is of {snapshot.get('env')!r}; this environment is {self.spec.name!r}")
        check_seal(snapshot)
        state = snapshot.get("state")
        direct = type(self._world) is LocalWorld and self.spec.state_type.__json_load_copies__(state)
        try:  # a private copy, but of the state only where loading it would not make one anyway
            snap = json.loads(json.dumps({k: v for k, v in snapshot.items() if k != "state"} if direct else snapshot))
        except RecursionError:
            raise SnapshotError("not a snapshot: nested too deep") from None
        if direct:
            snap["state"] = state
        check_referee(snap, tuple(self.agents))
        try:
            task = self.spec.task(snap["task_id"])
        except (KeyError, IndexError, ValueError) as exc:
            raise SnapshotError(f"snapshot field 'task_id': {exc}") from None
        _check_conv(snap.get("conv"), task, len(snap["log"]))
        try:
            self._world.load(task, snap["state"])
        except ValueError as exc:  # pydantic's ValidationError, PyStateError: a state the world refuses
            raise SnapshotError(f"snapshot field 'state': {_refusal(exc)}") from None
        self._task = task
        self._max_turns = snap["max_turns"]
        for k in self._FIELDS:
            setattr(self, "_" + k, snap.get(k))
        self._reopen_tools()
        if self.done and self._ended_by not in WORLD_GONE:
            self._answer, self._success, self._rewards = self._judge(self._answer)

    # -- views ----------------------------------------------------------------
    @property
    def state(self) -> State:
        """The current world state (from a container: a validated copy).

        Raises:
            EpisodeError: no episode is running.
        """
        self._require_task()
        return self._world.state()

    @property
    def task(self) -> Task | None:
        """The running task (also once it has ended); ``None`` before :meth:`reset`."""
        return self._task

    @property
    def done(self) -> bool:
        """Whether the episode has ended, terminated or truncated (``status`` says which, and why)."""
        return self._terminated or self._truncated

    @property
    def success(self) -> bool | None:
        """Task success once the episode has ended (judged on the host from the true final state),
        else ``None``."""
        return self._success if self._task is not None else None

    @property
    def rewards(self) -> dict[str, float]:
        """Every agent's reward (a copy): 0.0 until the end, then the task success (1.0 or 0.0) or,
        for a mixed-motive game, each agent's payoff."""
        return dict(self._rewards) if self._task is not None else dict.fromkeys(self.agents, 0.0)

    @property
    def status(self) -> EpisodeStatus:
        """Where the episode stands, read live: round, whose turn, how it ended, the final answer,
        the turn limit, the tool-call log, each agent's turns (:class:`EpisodeStatus`)."""
        return EpisodeStatus(self)

    @property
    def aio(self) -> AsyncEpisode:
        """This episode's blocking calls, awaited (:class:`AsyncEpisode`):
        ``await episode.aio.step(action)``."""
        return AsyncEpisode(self)

    def close(self) -> None:
        """Release the world (a container, a session). Idempotent."""
        self._world.close()

    def __repr__(self) -> str:
        tid = self._task.id if self._task else None
        rnd = self._round if self._task is not None else 0
        return f"<Episode {self.spec.name} task={tid} round={rnd} done={self.done} world={type(self._world).__name__}>"


def _refusal(exc: ValueError) -> str:
    """Why a world refused a snapshot's state: the state's own check's message when that was the
    one error (a from_class state's attribute of the wrong type, its document refused), not
    pydantic's wrapping of it, which repeats the whole input."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        inner = (errors[0].get("ctx") or {}).get("error") if len(errors) == 1 else None
        if isinstance(inner, ValueError):
            return f"{type(inner).__name__}: {str(inner)[:2000]}"
    return f"{type(exc).__name__}: {str(exc)[:2000]}"


def _check_conv(conv: Any, task: Task, log_len: int) -> None:
    """Raise :class:`SnapshotError` unless ``conv`` (a snapshot's conversation field) is one that an
    episode of ``task`` can hold."""
    if task.conversation is None:
        if conv is not None:
            raise SnapshotError("snapshot field 'conv': the task is not a conversation")
        return
    n = len(task.conversation.turns)
    ok = (isinstance(conv, dict) and set(conv) == {"turn", "start", "verdicts", "told", "said"}
          and conv["turn"].__class__ is int and 0 <= conv["turn"] < n
          and conv["start"].__class__ is int and 0 <= conv["start"] <= log_len
          and isinstance(conv["verdicts"], list) and len(conv["verdicts"]) in (conv["turn"], conv["turn"] + 1)
          and all(isinstance(v, dict) and all(x.__class__ is bool for x in v.values()) for v in conv["verdicts"])
          and isinstance(conv["told"], list) and all(isinstance(x, str) for x in conv["told"])
          and isinstance(conv["said"], list)
          and all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x) for x in conv["said"]))
    if not ok:
        raise SnapshotError(f"snapshot field 'conv': the progress of a conversation of {n} turns "
                            f"({{turn, start, verdicts, told, said}}), got {str(conv)[:80]!r}")


class EpisodeStatus:
    """Where a live :class:`Episode` stands (``episode.status``): a read-only view, read live
    (each attribute reads the episode as it is when read; keep the values, not the view, to
    compare two moments). Before ``reset`` the episode has no status: ``round`` is 0, the
    ending fields are ``None``, ``log`` is empty.

    - :attr:`round` - The round under way (a sole agent's turn number), from 1.
    - :attr:`next_agent` - Whose turn it is in turn order (``None`` before reset and after the end).
    - :attr:`terminated`, :attr:`truncated` - How the episode ended (finished, or cut at the
      turn limit or by a world that overran or was lost); :attr:`ended_by` says by what.
    - :attr:`answer` - The final answer, once ended.
    - :attr:`max_turns` - The turn limit (rounds, for a team).
    - :attr:`log` - Every tool call so far.
    - :meth:`turns_taken` - How many turns an agent has played.
    - :meth:`judge` - The verdict if the episode were truncated now.
    - :attr:`conversation` - Where a conversation stands (``None`` for a one-instruction task).
    """

    __slots__ = ("_episode",)

    def __init__(self, episode: Episode) -> None:
        self._episode = episode

    @property
    def round(self) -> int:
        """The round under way (for one agent, its turn number), from 1; 0 before ``reset``.
        After the end, the round the episode ended in."""
        ep = self._episode
        return ep._round if ep._task is not None else 0

    @property
    def next_agent(self) -> str | None:
        """Whose turn it is (turn order: :meth:`Episode.act` takes only this agent's turn), or
        ``None`` before ``reset`` and after the end."""
        ep = self._episode
        return None if ep._task is None or ep.done else ep.agents[ep._pos]

    @property
    def terminated(self) -> bool:
        """The episode finished: ``finish`` was called, the world says so (``spec.terminal``), or
        every agent answered without a tool call in the same round."""
        return self._episode._terminated

    @property
    def truncated(self) -> bool:
        """The episode was cut: the turn limit (``max_turns``) was reached first, or the world
        overran its timeout or was lost (``ended_by``: ``timeout``, ``world_lost``)."""
        return self._episode._truncated

    @property
    def ended_by(self) -> str | None:
        """``finish``, ``terminal``, ``answer`` (one agent), ``quiescence`` (a team),
        ``max_turns``, ``timeout`` or ``world_lost``, once ended; else ``None``."""
        ep = self._episode
        return ep._ended_by if ep._task is not None else None

    @property
    def answer(self) -> str | None:
        """The final answer once ended: ``finish``'s ``answer``, or the agents' last words
        without a tool call; ``None`` before the end, or when the world was gone."""
        ep = self._episode
        return ep._answer if ep._task is not None else None

    @property
    def max_turns(self) -> int:
        """The turn limit: rounds (for one agent, turns) after which the episode is truncated."""
        return self._episode._max_turns

    @property
    def conversation(self) -> dict[str, Any] | None:
        """A conversation's progress (a copy): ``turn`` (the user turn under way, from 0),
        ``turn_start`` (the index in :attr:`log` of its first call), ``told`` (the facts the user
        has told), ``verdicts`` (each ended turn's checks: ``{"state": True, ...}``); ``None`` for
        a one-instruction task or before reset."""
        conv = self._episode._conv if self._episode._task is not None else None
        if conv is None:
            return None
        return {"turn": conv["turn"], "turn_start": conv["start"], "told": list(conv["told"]),
                "verdicts": [dict(v) for v in conv["verdicts"]]}

    @property
    def log(self) -> list[dict[str, Any]]:
        """Every tool call so far, in order: ``round, agent, name, arguments, ok, kind, read_only``
        (a new list each read; kept as tuples on the step path, made into dicts here)."""
        ep = self._episode
        if ep._task is None:
            return []
        return [{"round": r, "agent": a, "name": n, "arguments": args, "ok": k == "ok", "kind": k, "read_only": ro}
                for r, a, n, args, k, ro in ep._log]

    def turns_taken(self, agent: str | None = None) -> int:
        """How many turns ``agent`` (``None``: the sole agent) has played in this episode.

        Raises:
            EpisodeError: no episode is running, or this is a team and ``agent`` is ``None``.
            KeyError: ``agent`` is none of the episode's agents.
        """
        ep = self._episode
        ep._require_task()
        return ep._acted[ep._agent(agent)]

    def judge(self) -> tuple[bool, dict[str, float]]:
        """``(success, rewards)`` the episode would get if it were truncated now: judged on the
        true state, each agent's last answer without a tool call making the final answer, as
        at the turn limit. Changes nothing (for a caller that stops playing first, e.g. a
        trainer out of context).

        Raises:
            EpisodeError: no episode is running.
        """
        ep = self._episode
        ep._require_task()
        _, success, rewards = ep._judge()
        return success, rewards

    def __repr__(self) -> str:
        return (f"<EpisodeStatus round={self.round} next_agent={self.next_agent} terminated={self.terminated} "
                f"truncated={self.truncated} ended_by={self.ended_by}>")


class AsyncEpisode:
    """An :class:`Episode`'s blocking calls, awaited (``episode.aio``), for asyncio code that keeps
    many episodes in flight on one event loop: ``await episode.aio.step(action)``.

    - :meth:`reset`, :meth:`step`, :meth:`act`, :meth:`step_round` - The turn methods of
      :class:`Episode`, awaited: other episodes go on while this one's tools run.
    - :meth:`fork`, :meth:`close` - The same, for a world that forks or closes with a request.

    Each method runs its blocking twin on a bounded thread pool shared by the process
    (:func:`envfactory.env.async_executor`), so a slow tool holds only its own episode, and
    returns or raises exactly what that twin does (a world that fails or overruns is an error
    observation, never an exception). One episode takes one call at a time: a second async call
    on it while one is running raises :class:`EpisodeError`. Cancelling the awaiting task does not
    undo a call already running: the episode ends up as that call leaves it.
    """

    __slots__ = ("_episode",)

    def __init__(self, episode: Episode) -> None:
        self._episode = episode

    async def reset(self, task: str | int | Task | None = None, *, seed: int | None = None) -> list[Message]:
        """:meth:`Episode.reset`, awaited."""
        ep = self._episode
        return await _offload(ep, ep.reset, task, seed=seed)

    async def step(self, action: Any) -> StepResult:
        """:meth:`Episode.step`, awaited: other episodes go on while this one's tools run."""
        ep = self._episode
        return await _offload(ep, ep.step, action)

    async def act(self, agent: str, action: Any) -> StepResult:
        """:meth:`Episode.act`, awaited."""
        ep = self._episode
        return await _offload(ep, ep.act, agent, action)

    async def step_round(self, actions: Mapping[str, Any]) -> dict[str, StepResult]:
        """:meth:`Episode.step_round`, awaited."""
        ep = self._episode
        return await _offload(ep, ep.step_round, actions)

    async def fork(self) -> Episode:
        """:meth:`Episode.fork`, awaited (a container world forks with a request)."""
        ep = self._episode
        return await _offload(ep, ep.fork)

    async def close(self) -> None:
        """:meth:`Episode.close`, awaited."""
        ep = self._episode
        await _offload(ep, ep.close)


@overload
def step_many(steps: Iterable[tuple[Environment, Any]], *, return_exceptions: Literal[False] = False
              ) -> list[StepResult]: ...


@overload
def step_many(steps: Iterable[tuple[Environment, Any]], *, return_exceptions: Literal[True]
              ) -> list[StepResult | Exception]: ...


def step_many(steps: Iterable[tuple[Environment, Any]], *, return_exceptions: bool = False) -> list[Any]:
    """Play one sole-agent turn in each ``(episode, action)``: what ``[e.step(a) for e, a in
    steps]`` returns, in that order, from one thread, with the world round trips in flight
    together. The usual turn of an episode over a container world (a text of one call of a
    world tool) goes out first: the turns bound for one shared container in one frame on its
    batch channel (:mod:`envfactory.runtime.batch`), others on their sessions' channels; every
    other turn is then played with :meth:`Episode.step` while those are under way; then each
    reply is read as it comes in (a ``selectors`` loop, each within its own step timeout).
    Threads stepping sessions each wait on their own reply and hand the GIL over at every one;
    here one thread pays only the steps' own work. No garbage collection runs during the call
    (the round's requests, replies and results are freed by reference counting once it returns):
    it is paused process-wide, and turned back on at the end if it was on at the start.

    ``return_exceptions``: what a turn raises (an episode that cannot take a step, an action of no
    accepted type, ...) takes that turn's place in the list, and every other turn is played and
    returned (as ``asyncio.gather`` does): one failing episode fails only itself.

    Raises:
        EpisodeError: an episode appears twice; without ``return_exceptions``, also one that could
            not take a step (a team, not reset, ended), before anything is sent. Without it, an
            error raised by one turn is raised once every turn already sent has been read and
            played (their results are then lost to the caller, as a loop of ``step`` calls would
            lose the rest).
    """
    pairs = list(steps)
    results: list[Any] = [None] * len(pairs)
    play: list[int] = []
    seen: set[int] = set()
    for i, (env, _) in enumerate(pairs):
        if id(env) in seen:
            raise EpisodeError(f"step_many: {env!r} appears twice; each episode takes one turn")
        seen.add(id(env))
        try:
            if isinstance(env, Episode):
                if env._team:
                    raise EpisodeError(f"step_many: {env.spec.name} is a team environment; it plays a sole "
                                       "agent's turns (use step_round or act)")
                env._check_turn(env._solo_agent)
        except EpisodeError as exc:
            if not return_exceptions:
                raise
            results[i] = exc
            continue
        play.append(i)
    # No collection while the round's turns are in flight: every turn's request, reply and
    # result is alive until the round ends, and a collection then would move them all to older
    # generations (and make the full collections, which walk every live episode, come often).
    # Freed by reference counting once the round ends, they are never seen by the collector.
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        _step_many(pairs, play, results, return_exceptions)
    finally:
        if paused:
            gc.enable()
    return results


def _step_many(pairs: list[tuple[Environment, Any]], play: list[int], results: list[Any], keep: bool) -> None:
    """Play the turns ``play`` (indices into ``pairs``) into ``results``; ``keep``: a turn's error
    is its result (else the first one is raised once every turn sent is finished)."""
    flight: list[tuple[int, Episode, _Begun]] = []
    batch = RunBatch()

    def played(i: int, turn: Callable[..., Any], *args: Any) -> None:
        try:
            results[i] = turn(*args)
        except Exception as exc:
            if not keep:
                raise
            results[i] = exc

    try:
        rest = []
        try:
            for i in play:
                env, action = pairs[i]
                try:
                    begun = env._solo_begin(action, batch) if isinstance(env, Episode) else None
                except Exception as exc:
                    if not keep:
                        raise
                    results[i] = exc
                    continue
                if begun is None:
                    rest.append(i)
                elif begun[2] is None:  # the world went at the send
                    played(i, cast(Episode, env)._solo_finish, begun)
                else:
                    flight.append((i, cast(Episode, env), begun))
        finally:
            batch.send()  # what was staged on shared channels goes out
        for i in rest:  # played while the others' calls run
            env, action = pairs[i]
            played(i, env.step, action)
    finally:
        try:
            failure = _read_replies(flight, results, keep)
        finally:
            batch.release()
    if failure is not None:
        raise failure


def _read_replies(flight: list[tuple[int, Episode, _Begun]], results: list[Any],
                  keep: bool = False) -> BaseException | None:
    """Finish every turn of ``flight`` as its reply comes in, or at its deadline (its read then
    raises the timeout that ends it as :meth:`Episode.step` would); the first error raised by one
    (the others are finished all the same; ``keep``: an ``Exception`` is its turn's result instead). A turn waits on its own descriptor, or on a channel
    it shares with others (:meth:`World.run_wait`), whose ``pump`` says which turns are in."""
    if not flight:
        return None
    import heapq
    import selectors
    import time

    failure: BaseException | None = None
    open_: dict[int, tuple[Episode, _Begun]] = {}  # the turns not finished, by flight index
    fd_of: dict[int, int] = {}  # flight index -> the descriptor it waits on
    by_fd: dict[int, Any] = {}  # a descriptor: the index of its one turn, or the channel its turns share
    left: dict[int, int] = {}  # turns still waiting on each registered descriptor
    where: dict[int, int] = {}  # id(pending) -> flight index, for the shared channels' turns
    deadlines: list[tuple[float, int]] = []  # a heap; entries of finished turns are dropped as they surface

    def finish(k: int, ready: bool) -> None:
        nonlocal failure
        env, begun = open_.pop(k)
        fd = fd_of[k]
        if fd in left:
            left[fd] -= 1
        try:
            results[flight[k][0]] = env._solo_finish(begun, ready)
        except Exception as exc:  # noqa: BLE001 - raised once every turn is finished (or kept as its result)
            if keep:
                results[flight[k][0]] = exc
            else:
                failure = failure or exc
        except BaseException as exc:  # noqa: BLE001 - raised once every turn is finished
            failure = failure or exc

    def pump(channel: Any) -> None:
        for p in channel.pump():
            k = where.pop(id(p), None)
            if k is not None and k in open_:
                finish(k, True)

    with selectors.DefaultSelector() as sel:
        channels: dict[int, Any] = {}
        for k, (_, env, begun) in enumerate(flight):
            w, deadline = env._world.run_wait(begun[2])
            open_[k] = (env, begun)
            deadlines.append((deadline, k))
            shared = w.__class__ is not int
            fd = w.fileno() if shared else w
            fd_of[k] = fd
            if shared:
                where[id(begun[2])] = k
                channels[id(w)] = w
            if fd >= 0 and fd not in by_fd:
                by_fd[fd] = w if shared else k
                left[fd] = 0
                sel.register(fd, selectors.EVENT_READ)
            if fd in left:
                left[fd] += 1
        heapq.heapify(deadlines)
        for channel in channels.values():  # what is in already, or a channel that failed at the send
            pump(channel)
        while open_:
            while deadlines[0][1] not in open_:
                heapq.heappop(deadlines)  # that turn is finished already
            for fd in [fd for fd, n in left.items() if n <= 0]:
                sel.unregister(fd)
                del left[fd]
            ready = [key.fd for key, _ in sel.select(max(0.0, deadlines[0][0] - time.monotonic()))]
            for fd in ready:
                w = by_fd[fd]
                if w.__class__ is int:
                    if w in open_:
                        finish(w, True)
                else:
                    pump(w)
            if not ready:  # deadlines passed: each of their reads raises the timeout
                now = time.monotonic()
                while deadlines and deadlines[0][0] <= now:
                    k = heapq.heappop(deadlines)[1]
                    if k in open_:
                        finish(k, False)
    return failure
