"""A live multi-agent episode: the reference implementation, in-process.

Turn protocol. Agents act in the spec's role order; when every agent has taken
one turn, a round ends. :meth:`MultiEpisode.act` plays one agent's turn (turn
order, PettingZoo AEC). :meth:`MultiEpisode.step` plays a whole round of
simultaneous moves (PettingZoo Parallel): every action was chosen on the same
information, so letters sent during the round reach their recipients' turns
only from the next round on; the calls themselves run in role order, so when
two agents grab the same resource, the first in order gets it and the second a
``conflict`` error.

A turn is an assistant message (text, parsed tool calls). Calls to tools of
another role are refused (``permission denied``). A turn without a tool call
*passes*. The episode terminates when anyone calls ``finish`` (its answer is the
team's answer), when the world says the game is over (``spec.terminal``), or
when every agent passes in the same round; it is truncated after
``max_rounds``. Rewards are sparse: 0 until the end, then the joint success
(or, for mixed-motive games, each agent's payoff), computed from the true
final state on the host side.

Everything that crosses the episode's boundary (observations, results,
snapshots) is plain JSON, so a server can host it exactly like ``LocalEnv``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from ..env import EpisodeError, Message
from ..parsing import parse_action
from .spec import PERMISSION_PREFIX, MultiAgentSpec, MultiTask
from .state import CONFLICT_PREFIX, MultiState

__all__ = ["EpisodeViews", "MultiEpisode", "TurnResult", "SNAPSHOT_FORMAT"]

SNAPSHOT_FORMAT = 1
NOTHING_NEW = "(nothing new)"


@dataclass(slots=True)
class TurnResult:
    """What one agent's turn produced.

    Attributes:
        agent: Who acted.
        messages: The tool responses of this turn (``role: tool``), errors included.
        terminated / truncated: The episode ended with this turn (for everyone).
        rewards: Per agent; all 0.0 until the end.
        info: ``round``, ``task_id``, this agent's ``tool_calls``/``tool_errors``/
            ``parse_errors``; at the end also ``success``, ``answer``, ``ended_by``.
    """

    agent: str
    messages: list[Message]
    terminated: bool
    truncated: bool
    rewards: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class EpisodeViews:
    """The read-only views every multi-agent episode has, in-process or in a container.

    Subclasses keep ``spec``, ``_task``, ``_round``, ``_terminated``, ``_truncated``, ``_success``,
    ``_rewards``, ``_answer``, ``_ended_by`` and ``_log`` up to date.
    """

    spec: MultiAgentSpec

    def _require_task(self) -> None:
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() first")

    @property
    def task(self) -> MultiTask | None:
        return self._task

    @property
    def round(self) -> int:
        return self._round

    @property
    def done(self) -> bool:
        return self._terminated or self._truncated

    @property
    def terminated(self) -> bool:
        return self._terminated

    @property
    def truncated(self) -> bool:
        return self._truncated

    @property
    def success(self) -> bool | None:
        """Joint success once the episode has ended (judged on the host), else ``None``."""
        return self._success

    @property
    def rewards(self) -> dict[str, float]:
        return dict(self._rewards)

    @property
    def answer(self) -> str | None:
        return self._answer

    @property
    def ended_by(self) -> str | None:
        """``finish``, ``terminal``, ``quiescence``, ``max_rounds`` (or ``timeout`` in a container), once ended."""
        return self._ended_by

    @property
    def log(self) -> list[dict[str, Any]]:
        """Every tool call so far: ``round, agent, name, arguments, ok, kind, read_only``."""
        return self._log


class MultiEpisode(EpisodeViews):
    """An episode of a multi-agent environment, executed in this process.

    Args:
        spec: The environment definition.
        max_rounds: Overrides ``spec.max_rounds``.
    """

    def __init__(self, spec: MultiAgentSpec, *, max_rounds: int | None = None) -> None:
        self.spec = spec
        self.agents = spec.agent_ids
        self.max_rounds = spec.max_rounds if max_rounds is None else int(max_rounds)
        if self.max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        self._task: MultiTask | None = None
        self._state: MultiState | None = None
        self._terminated = self._truncated = False

    # -- protocol -------------------------------------------------------
    def reset(self, task: Any = None, *, seed: int | None = None) -> dict[str, str]:
        """Start an episode; return each agent's opening observation (instruction and private notes).

        ``task`` is an id, index or :class:`MultiTask`; ``None`` picks one from ``seed``.
        """
        if task is None:
            task = random.Random(seed).randrange(len(self.spec.get_tasks()))
        t = self.spec.task(task)
        self._task = t
        self._state = self.spec.start_state(t)
        self._transcripts: dict[str, list[Message]] = {}
        for a in self.agents:
            opening = t.instruction
            if t.private.get(a):
                opening += "\n\nPrivate notes (only you know this): " + t.private[a]
            self._transcripts[a] = [{"role": "system", "content": self.spec.render_system_prompt(a)},
                                    {"role": "user", "content": opening}]
        self._seen_mail = dict.fromkeys(self.agents, 0)
        self._last_tool: dict[str, list[Message]] = {a: [] for a in self.agents}
        self._acted: dict[str, int] = dict.fromkeys(self.agents, 0)
        self._counts = {a: {"tool_calls": 0, "tool_errors": 0, "parse_errors": 0} for a in self.agents}
        self._round, self._pos = 1, 0
        self._passed: list[str] = []
        self._last_words: dict[str, str] = {}
        self._log: list[dict[str, Any]] = []
        self._terminated = self._truncated = False
        self._success: bool | None = None
        self._rewards = dict.fromkeys(self.agents, 0.0)
        self._answer: str | None = None
        self._ended_by: str | None = None
        return {a: self.observation(a) for a in self.agents}

    @property
    def next_agent(self) -> str | None:
        """Whose turn it is (turn order), or ``None`` once the episode has ended."""
        return None if self.done or self._task is None else self.agents[self._pos]

    def act(self, agent: str, action: Any) -> TurnResult:
        """Play ``agent``'s turn; it must be :attr:`next_agent`. Never raises on model output.

        Raises:
            EpisodeError: no episode is running, it has ended, or it is not ``agent``'s turn.
        """
        self._check_turn(agent)
        return self._turn(agent, action, len(self._state.mail.letters))

    def step(self, actions: dict[str, Any]) -> dict[str, TurnResult]:
        """Play one round of simultaneous moves; an agent missing from ``actions`` passes.

        Returns the results of the agents that acted (the episode may end mid-round,
        e.g. on ``finish``; later agents' actions are then ignored).
        """
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() before step()")
        if self._pos != 0 and not self.done:
            raise EpisodeError(f"{self.spec.name}: a simultaneous round must start at the beginning of "
                               f"a round, but it is {self.next_agent}'s turn; finish the round with act()")
        unknown = set(actions) - set(self.agents)
        if unknown:
            raise EpisodeError(f"{self.spec.name}: actions for unknown agents {sorted(unknown)}; "
                               f"the agents are {self.agents}")
        limit = len(self._state.mail.letters) if self._state is not None else 0
        out: dict[str, TurnResult] = {}
        for a in self.agents:
            if self.done and out:
                break
            self._check_turn(a)
            out[a] = self._turn(a, actions.get(a, ""), limit)
        return out

    def _check_turn(self, agent: str) -> None:
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() before acting")
        if self.done:
            raise EpisodeError(f"{self.spec.name}: the episode has ended; call reset() to start another")
        if agent != self.agents[self._pos]:
            raise EpisodeError(f"{self.spec.name}: it is {self.agents[self._pos]}'s turn, not {agent!r}")

    def _turn(self, agent: str, action: Any, mail_limit: int) -> TurnResult:
        state, transcript, counts = self._state, self._transcripts[agent], self._counts[agent]
        letters = state.mail.inbox(agent, self._seen_mail[agent], mail_limit)
        if letters:
            transcript.append({"role": "user", "content": "\n".join(m.render() for m in letters)})
        self._seen_mail[agent] = max(self._seen_mail[agent], mail_limit)
        parsed = parse_action(action)
        self._acted[agent] += 1
        tag = f"{agent}_{self._round}"
        assistant: Message = {"role": "assistant", "content": parsed.content}
        transcript.append(assistant)
        new: list[Message] = []
        for j, err in enumerate(parsed.errors):
            counts["parse_errors"] += 1
            new.append({"role": "tool", "tool_call_id": f"call_{tag}_invalid{j}",
                        "name": "invalid_tool_call", "content": "Error: " + err})
            self._log.append({"round": self._round, "agent": agent, "name": None, "arguments": None,
                              "ok": False, "kind": "parse_error"})
        finished, answer = False, None
        tools = self.spec.tools_of(agent)
        calls = []
        for i, call in enumerate(parsed.calls):
            cid = call.id or f"call_{tag}_{i}"
            calls.append({"id": cid, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
            counts["tool_calls"] += 1
            t, kind = tools.get(call.name), "ok"
            if finished:
                content, kind = "Error: ignored; the episode was already finished by an earlier call.", "ignored"
            elif t is None:
                owners = self.spec.owners(call.name)
                if owners:
                    content, kind = (PERMISSION_PREFIX + f"'{call.name}' is a tool of {', '.join(owners)}, "
                                     f"not of {agent}; ask them to do it. Your tools: {', '.join(tools)}."), "permission"
                else:
                    content, kind = f"Error: unknown tool '{call.name}'. Your tools: {', '.join(tools)}.", "unknown_tool"
            else:
                state.acting, state.round = agent, self._round
                out = t.invoke(state, call.arguments)
                state.acting = ""
                content = out.content
                if not out.ok:
                    kind = "conflict" if content.startswith("Error: " + CONFLICT_PREFIX) else out.kind
                elif t.finish:
                    finished, answer = True, str(call.arguments.get("answer", ""))
            if kind != "ok":
                counts["tool_errors"] += 1
            self._log.append({"round": self._round, "agent": agent, "name": call.name,
                              "arguments": call.arguments, "ok": kind == "ok", "kind": kind,
                              "read_only": bool(t is not None and t.read_only)})
            new.append({"role": "tool", "tool_call_id": cid, "name": call.name, "content": content})
        if calls:
            assistant["tool_calls"] = calls
        transcript.extend(new)
        self._last_tool[agent] = new
        if not parsed.attempted:
            self._passed.append(agent)
            self._last_words[agent] = parsed.answer or parsed.content
        info: dict[str, Any] = {"round": self._round, "task_id": self._task.id, **counts}
        self._pos += 1
        if finished:
            self._end("finish", terminated=True, answer=answer)
        elif self.spec.terminal is not None and self.spec.terminal(state):
            self._end("terminal", terminated=True)
        elif self._pos == len(self.agents):
            if len(self._passed) == len(self.agents):
                self._end("quiescence", terminated=True)
            elif self._round >= self.max_rounds:
                self._end("max_rounds", terminated=False)
            else:
                self._round, self._pos, self._passed = self._round + 1, 0, []
        if self.done:
            info.update(success=self._success, answer=self._answer, ended_by=self._ended_by)
        return TurnResult(agent, new, self._terminated, self._truncated, dict(self._rewards), info)

    def _end(self, how: str, *, terminated: bool, answer: str | None = None) -> None:
        if answer is None:
            answer = "\n".join(self._last_words[a] for a in self.agents if self._last_words.get(a))
        self._terminated, self._truncated = terminated, not terminated
        self._answer, self._ended_by = answer, how
        self._success = self._task.success(self._state, answer)
        self._rewards = self.spec.rewards(self._task, self._state, self._success)

    # -- what each agent sees ---------------------------------------------
    def observation(self, agent: str) -> str:
        """What is new for ``agent`` since its last turn: its tool responses, then the
        letters that reached it (before its first turn: the opening instruction)."""
        self._require_task()
        if agent not in self._transcripts:
            raise KeyError(f"{self.spec.name} has no agent {agent!r}; its agents are {self.agents}")
        parts = []
        if not self._acted[agent]:
            parts.append(self._transcripts[agent][1]["content"])
        elif self._last_tool[agent]:
            parts.append("\n".join(f"<tool_response>\n{m['content']}\n</tool_response>"
                                   for m in self._last_tool[agent]))
        letters = self._state.mail.inbox(agent, self._seen_mail[agent])
        if letters:
            parts.append("\n".join(m.render() for m in letters))
        return "\n".join(parts) or NOTHING_NEW

    def messages(self, agent: str) -> list[Message]:
        """``agent``'s conversation so far (its private view), with undelivered letters
        as a final user message: what an LLM playing ``agent`` is prompted with."""
        self._require_task()
        out = list(self._transcripts[agent])
        letters = self._state.mail.inbox(agent, self._seen_mail[agent])
        if letters:
            out.append({"role": "user", "content": "\n".join(m.render() for m in letters)})
        return out

    def tool_schemas(self, agent: str) -> list[dict[str, Any]]:
        return self.spec.tool_schemas(agent)

    def turns_taken(self, agent: str) -> int:
        """How many turns ``agent`` has played in this episode."""
        self._require_task()
        return self._acted[agent]

    # -- fork / snapshot / restore -------------------------------------------
    def fork(self) -> "MultiEpisode":
        """An independent copy of this live episode (same state, transcripts and turn)."""
        self._require_task()
        new = MultiEpisode.__new__(MultiEpisode)
        new.__dict__.update(self.__dict__)
        new._state = self._state.copy_state()
        new._transcripts = {a: list(m) for a, m in self._transcripts.items()}
        new._seen_mail, new._acted = dict(self._seen_mail), dict(self._acted)
        new._last_tool = dict(self._last_tool)
        new._counts = {a: dict(c) for a, c in self._counts.items()}
        new._passed, new._last_words = list(self._passed), dict(self._last_words)
        new._log, new._rewards = list(self._log), dict(self._rewards)
        return new

    _FIELDS = ("transcripts", "seen_mail", "last_tool", "acted", "counts", "round", "pos", "passed",
               "last_words", "log", "terminated", "truncated", "success", "rewards", "answer", "ended_by")

    def snapshot(self) -> dict[str, Any]:
        """The whole episode as JSON data, for :meth:`restore`."""
        self._require_task()
        snap = {"format": SNAPSHOT_FORMAT, "env": self.spec.name, "task_id": self._task.id,
                "max_rounds": self.max_rounds, "state": self._state.model_dump(mode="json")}
        snap.update({k: getattr(self, "_" + k) for k in self._FIELDS})
        return json.loads(json.dumps(snap))

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue exactly from ``snapshot`` (taken from an episode of the same spec)."""
        if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"not a multi-agent envfactory snapshot of format {SNAPSHOT_FORMAT} "
                             "(take one with MultiEpisode.snapshot())")
        if snapshot.get("env") != self.spec.name:
            raise ValueError(f"snapshot is of {snapshot.get('env')!r}; this environment is {self.spec.name!r}")
        snap = json.loads(json.dumps(snapshot))
        self._task = self.spec.task(snap["task_id"])
        self._state = self.spec.state_type.model_validate(snap["state"])
        self.max_rounds = int(snap["max_rounds"])
        for k in self._FIELDS:
            setattr(self, "_" + k, snap[k])

    # -- views ----------------------------------------------------------
    @property
    def state(self) -> MultiState:
        self._require_task()
        return self._state

    def close(self) -> None:
        """Release resources (nothing in-process). Idempotent."""

    def __repr__(self) -> str:
        tid = self._task.id if self._task else None
        return f"<MultiEpisode {self.spec.name} task={tid} round={getattr(self, '_round', 0)} done={self.done}>"
