"""Multi-agent episodes served from a hardened container.

``envfactory.make_multi(name, runtime="docker")`` returns a
:class:`DockerMultiEpisode`: the interface and the observable behaviour of
:class:`~envfactory.multi.episode.MultiEpisode` (AEC turns with :meth:`act`,
Parallel rounds with :meth:`step`, fork, snapshot, restore, rewards). The
container runs exactly that class (:mod:`envfactory.serve`); a parity test
holds the two runtimes to identical observations, rewards and final states.

What the host does not delegate, as in the single-agent runtime
(:mod:`envfactory.runtime.docker`): the task choice, the turn protocol (whose
turn it is, the round, who passed), which turn ends the episode, how and with
what team answer (derived from the agents' own actions; ``spec.terminal`` is
run here on the state fetched after every turn), and the rewards: the joint
success and each agent's payoff are computed here from the final state
fetched from the container and validated into the spec's state type. A
container whose account of a turn disagrees is removed as untrustworthy.

Faults: a container that dies raises :class:`ContainerError` naming the
environment, the session and the container (the pool replaces it); a turn
that overruns ``step_timeout`` ends the episode (truncated, rewards 0) with
an error observation, and the container is recycled.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass
from typing import Any

from ..env import EpisodeError, Message
from ..multi.episode import SNAPSHOT_FORMAT, EpisodeViews, TurnResult
from ..multi.spec import MultiAgentSpec, MultiTask
from ..multi.state import MultiState
from ..parsing import ParsedAction, parse_action
from .container import ContainerError
from .docker_session import SessionLink
from .pool import Pool, get_pool
from .wire import action_to_json

__all__ = ["DockerMultiEpisode"]


@dataclass(frozen=True, eq=False)
class _Served:
    """What the pool and the container need to know of a multi-agent spec.
    Multi-agent worlds are pure state: their sessions share containers."""

    name: str
    module: str | None
    isolation: str = "session"


_served: dict[int, tuple[MultiAgentSpec, _Served]] = {}


def _served_as(spec: MultiAgentSpec) -> _Served:
    """One stable stand-in per spec (the pool registry is keyed by identity)."""
    hit = _served.get(id(spec))
    if hit is None or hit[0] is not spec:
        hit = _served[id(spec)] = (spec, _Served(spec.name, spec.module, getattr(spec, "isolation", "session")))
    return hit[1]


class DockerMultiEpisode(EpisodeViews):
    """A multi-agent episode of ``spec`` in a container (see the module docstring).

    Args:
        spec: The environment definition.
        max_rounds: Overrides ``spec.max_rounds``.
        step_timeout: Seconds one turn (or round) may take before the container is recycled.
        pool: The container pool (default: the process-wide pool of ``spec``).
        image: Image tag to use instead of the content-hashed build.
        **pool_options: ``warm``, ``sessions_per_container``, ``limits``, used
            when the process-wide pool is created.
    """

    _MIRROR = ("round", "pos", "passed", "last_words", "acted", "terminated", "truncated", "answer",
               "ended_by", "log", "success", "rewards", "views", "obs")

    def __init__(self, spec: MultiAgentSpec, *, max_rounds: int | None = None, step_timeout: float = 30.0,
                 pool: Pool | None = None, image: str | None = None, **pool_options: Any) -> None:
        self.spec = spec
        self.agents = spec.agent_ids
        self.max_rounds = spec.max_rounds if max_rounds is None else int(max_rounds)
        if self.max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        self.step_timeout = step_timeout
        self.pool = pool or get_pool(_served_as(spec), image, **pool_options)
        self._link = SessionLink(self.pool, spec.name, {"max_rounds": self.max_rounds}, step_timeout)
        self._task: MultiTask | None = None
        self._terminated = self._truncated = False

    # -- protocol -------------------------------------------------------
    def reset(self, task: Any = None, *, seed: int | None = None) -> dict[str, str]:
        """Start an episode; return each agent's opening observation (see ``MultiEpisode.reset``)."""
        if task is None:
            task = random.Random(seed).randrange(len(self.spec.get_tasks()))
        t = self.spec.task(task)
        try:
            registered = self.spec.task(t.id)
        except KeyError:
            registered = None
        if registered is not t:
            raise ValueError(f"{self.spec.name}: the docker runtime runs registered tasks only; "
                             f"task {t.id!r} is not one of them (register it in the spec)")
        reply = self._link.request_with_retry({"op": "reset", "task": t.id})
        self._task = t
        self._round, self._pos, self._passed, self._last_words = 1, 0, [], {}
        self._acted = dict.fromkeys(self.agents, 0)
        self._terminated = self._truncated = False
        self._answer: str | None = None
        self._ended_by: str | None = None
        self._success: bool | None = None
        self._rewards = dict.fromkeys(self.agents, 0.0)
        self._log: list[dict[str, Any]] = []
        self._views: dict[str, list[Message]] = {a: [] for a in self.agents}
        self._obs: dict[str, str] = {}
        self._take_views(reply)
        return dict(self._obs)

    @property
    def next_agent(self) -> str | None:
        """Whose turn it is (turn order), or ``None`` once the episode has ended."""
        return None if self.done or self._task is None else self.agents[self._pos]

    def act(self, agent: str, action: Any) -> TurnResult:
        """Play ``agent``'s turn; it must be :attr:`next_agent`. Never raises on model output
        (a container fault raises :class:`ContainerError`)."""
        self._check_turn(agent)
        parsed = parse_action(action)
        return self._play("act", {"agent": agent, "action": action_to_json(action)}, {agent: parsed})[agent]

    def step(self, actions: dict[str, Any]) -> dict[str, TurnResult]:
        """Play one round of simultaneous moves (see ``MultiEpisode.step``)."""
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() before step()")
        if self._pos != 0 and not self.done:
            raise EpisodeError(f"{self.spec.name}: a simultaneous round must start at the beginning of "
                               f"a round, but it is {self.next_agent}'s turn; finish the round with act()")
        unknown = set(actions) - set(self.agents)
        if unknown:
            raise EpisodeError(f"{self.spec.name}: actions for unknown agents {sorted(unknown)}; "
                               f"the agents are {self.agents}")
        self._check_turn(self.agents[0])
        full = {a: actions.get(a, "") for a in self.agents}
        parsed = {a: parse_action(x) for a, x in full.items()}
        return self._play("step", {"actions": {a: action_to_json(x) for a, x in full.items()}}, parsed)

    def _check_turn(self, agent: str) -> None:
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() before acting")
        if self.done:
            raise EpisodeError(f"{self.spec.name}: the episode has ended; call reset() to start another")
        if agent != self.agents[self._pos]:
            raise EpisodeError(f"{self.spec.name}: it is {self.agents[self._pos]}'s turn, not {agent!r}")

    def _play(self, op: str, req: dict[str, Any], parsed: dict[str, ParsedAction]) -> dict[str, TurnResult]:
        """Send one turn or round, then replay the protocol here and judge the container's account."""
        req.update(op=op, have={a: len(v) for a, v in self._views.items()}, state=self.spec.terminal is not None)
        try:
            reply = self._link.request(req, raise_timeout=True)
        except socket.timeout:
            return self._timed_out(parsed)
        except ContainerError:
            self._terminated, self._truncated = False, True
            raise
        got = reply["results"]
        state = self.spec.state_type.model_validate(reply["state"]) if "state" in reply else None
        out: dict[str, TurnResult] = {}
        last = [a for a in parsed if a in got][-1:]
        for agent, p in parsed.items():
            if self.done:
                break
            if agent not in got:
                self._distrust(f"no result for {agent}'s turn")
            out[agent] = self._judge(agent, p, got[agent], state, [agent] == last)
        if set(got) != set(out):
            self._distrust(f"results for {sorted(got)}, expected {sorted(out)}")
        self._log.extend(reply["log"])
        self._take_views(reply)
        return out

    def _judge(self, agent: str, parsed: ParsedAction, res: dict[str, Any], state: MultiState | None,
               last: bool) -> TurnResult:
        """One turn's outcome, from the agent's action and (for ``terminal``) the state fetched
        after the request. Only the request's ``last`` turn can end the episode: the state
        is the one after it, and a turn that ends the episode is the last one played."""
        new, info = res["messages"], dict(res["info"])
        turn_round = self._round
        finished, answer = self._finish_call(agent, parsed, new)
        self._acted[agent] += 1
        if not parsed.attempted:
            self._passed.append(agent)
            self._last_words[agent] = parsed.answer or parsed.content
        self._pos += 1
        if finished:
            self._end("finish", True, answer, state)
        elif last and self.spec.terminal is not None and self._terminal(state):
            self._end("terminal", True, None, state)
        elif self._pos == len(self.agents):
            if len(self._passed) == len(self.agents):
                self._end("quiescence", True, None, state)
            elif self._round >= self.max_rounds:
                self._end("max_rounds", False, None, state)
            else:
                self._round, self._pos, self._passed = self._round + 1, 0, []
        claimed = (res["terminated"], res["truncated"], info.get("ended_by"), info.get("round"))
        if claimed != (self._terminated, self._truncated, self._ended_by, turn_round) or res["agent"] != agent:
            self._distrust(f"its account of {agent}'s turn in round {turn_round} (ended {claimed}) disagrees "
                           f"with the actions (ended {(self._terminated, self._truncated, self._ended_by)})")
        for k in ("success", "answer", "ended_by"):
            info.pop(k, None)
        if self.done:
            info.update(success=self._success, answer=self._answer, ended_by=self._ended_by)
        return TurnResult(agent, new, self._terminated, self._truncated, dict(self._rewards), info)

    def _finish_call(self, agent: str, parsed: ParsedAction, new: list[Message]) -> tuple[bool, str | None]:
        """Whether ``agent`` finished the episode, and its answer: the first ``finish`` call
        whose response is not an error (the container only says which call succeeded)."""
        offset = len(parsed.errors)
        if len(new) != offset + len(parsed.calls):
            self._distrust(f"{len(new)} tool messages for {len(parsed.calls)} calls and {offset} parse errors")
        tools = self.spec.tools_of(agent)
        for i, c in enumerate(parsed.calls):
            t = tools.get(c.name)
            if t is not None and t.finish and not str(new[offset + i]["content"]).startswith("Error"):
                return True, str(c.arguments.get("answer", ""))
        return False, None

    def _terminal(self, state: MultiState | None) -> bool:
        if state is None:
            self._distrust("no state came with the turn of an environment that can end itself")
        return bool(self.spec.terminal(state))

    def _end(self, how: str, terminated: bool, answer: str | None, state: MultiState | None) -> None:
        """End the episode and judge it here, on the validated final state."""
        if answer is None:
            answer = "\n".join(self._last_words[a] for a in self.agents if self._last_words.get(a))
        if state is None:
            self._distrust(f"the episode ended ({how}) but no final state came back")
        self._terminated, self._truncated = terminated, not terminated
        self._answer, self._ended_by = answer, how
        self._success = self._task.success(state, answer)
        self._rewards = self.spec.rewards(self._task, state, self._success)

    def _distrust(self, what: str) -> None:
        where = self._link.where()
        self._link.drop(remove=True)
        self._terminated, self._truncated = False, True
        raise ContainerError(f"{where}: {what}; the container was removed as untrustworthy. "
                             "Call reset() to start a new episode.")

    def _timed_out(self, parsed: dict[str, ParsedAction]) -> dict[str, TurnResult]:
        """The turn or round overran: recycle the container, end the episode with an error observation."""
        where = self._link.where()
        self._link.drop(remove=True)
        msg = (f"Error: the turn did not finish within {self.step_timeout}s; the environment's container "
               f"was stopped and the episode ended ({where}).")
        self._terminated, self._truncated, self._success, self._answer = False, True, False, None
        self._ended_by = "timeout"
        self._rewards = dict.fromkeys(self.agents, 0.0)
        out = {}
        for agent, p in parsed.items():
            tag = f"{agent}_{self._round}"
            calls = [{"id": c.id or f"call_{tag}_{i}", "type": "function",
                      "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(p.calls)]
            new: list[Message] = [{"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                                   "content": msg} for c in calls]
            if not new:
                new = [{"role": "tool", "tool_call_id": f"call_{tag}_timeout", "name": "timeout", "content": msg}]
            assistant: Message = {"role": "assistant", "content": p.content, **({"tool_calls": calls} if calls else {})}
            self._views[agent] = self._views[agent] + [assistant, *new]
            self._obs[agent] = "\n".join(f"<tool_response>\n{m['content']}\n</tool_response>" for m in new)
            self._acted[agent] += 1
            info = {"round": self._round, "task_id": self._task.id, "timeout": True, "success": False,
                    "answer": None, "ended_by": "timeout"}
            out[agent] = TurnResult(agent, new, False, True, dict(self._rewards), info)
        return out

    def _take_views(self, reply: dict[str, Any]) -> None:
        for a in self.agents:
            keep = max(0, len(self._views[a]) - 1)
            self._views[a] = self._views[a][:keep] + list(reply["tails"][a])
        self._obs = dict(reply["observations"])

    # -- what each agent sees ---------------------------------------------
    def observation(self, agent: str) -> str:
        """What is new for ``agent`` since its last turn (see ``MultiEpisode.observation``)."""
        self._require_task()
        if agent not in self._obs:
            raise KeyError(f"{self.spec.name} has no agent {agent!r}; its agents are {self.agents}")
        return self._obs[agent]

    def messages(self, agent: str) -> list[Message]:
        """``agent``'s conversation so far, undelivered letters last (see ``MultiEpisode.messages``)."""
        self._require_task()
        return list(self._views[agent])

    def tool_schemas(self, agent: str) -> list[dict[str, Any]]:
        return self.spec.tool_schemas(agent)

    def turns_taken(self, agent: str) -> int:
        self._require_task()
        return self._acted[agent]

    # -- fork / snapshot / restore -------------------------------------------
    def fork(self) -> "DockerMultiEpisode":
        """An independent copy of this live episode (a forked session, or a new container)."""
        self._require_task()
        child = DockerMultiEpisode(self.spec, max_rounds=self.max_rounds, step_timeout=self.step_timeout,
                                   pool=self.pool)
        if not self._link.fork_into(child._link):
            child.restore(self.snapshot())
            return child
        child._task, child._terminated, child._truncated = self._task, self._terminated, self._truncated
        for k in self._MIRROR:
            v = getattr(self, "_" + k)
            setattr(child, "_" + k, {a: list(x) if isinstance(x, list) else x for a, x in v.items()}
                    if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
        return child

    def snapshot(self) -> dict[str, Any]:
        """The whole episode as JSON (``MultiEpisode``'s format; success and rewards as judged here)."""
        self._require_task()
        snap = self._link.call("GET", "snapshot")
        snap["success"], snap["rewards"] = self._success, dict(self._rewards)
        return snap

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue exactly from ``snapshot`` (from either runtime); the outcome is judged again here."""
        if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"not a multi-agent envfactory snapshot of format {SNAPSHOT_FORMAT} "
                             "(take one with snapshot())")
        if snapshot.get("env") != self.spec.name:
            raise ValueError(f"snapshot is of {snapshot.get('env')!r}; this environment is {self.spec.name!r}")
        task = self.spec.task(snapshot["task_id"])
        state = self.spec.state_type.model_validate(snapshot["state"])
        self._link.call("POST", "restore", snapshot, open_session=True)
        reply = self._link.request({"op": "views", "have": {}})
        self._task, self.max_rounds = task, int(snapshot["max_rounds"])
        self._round, self._pos = int(snapshot["round"]), int(snapshot["pos"])
        self._passed, self._last_words = list(snapshot["passed"]), dict(snapshot["last_words"])
        self._acted = {a: int(snapshot["acted"][a]) for a in self.agents}
        self._terminated, self._truncated = bool(snapshot["terminated"]), bool(snapshot["truncated"])
        self._answer, self._ended_by, self._log = snapshot["answer"], snapshot["ended_by"], list(snapshot["log"])
        self._success, self._rewards = None, dict.fromkeys(self.agents, 0.0)
        if self.done:  # judged here, from the snapshot's state, not from its "success"/"rewards"
            self._success = task.success(state, self._answer)
            self._rewards = self.spec.rewards(task, state, self._success)
        self._views = {a: [] for a in self.agents}
        self._take_views(reply)

    # -- views ----------------------------------------------------------
    @property
    def state(self) -> MultiState:
        """The shared world, fetched from the container and validated."""
        self._require_task()
        return self.spec.state_type.model_validate(self._link.request({"op": "state"})["state"])

    @property
    def container(self) -> Any:
        """The container serving the current session (``None`` before ``reset``)."""
        return self._link.container

    def close(self) -> None:
        """End the session (its shared container goes back to the pool). Idempotent."""
        self._link.drop()

    def __repr__(self) -> str:
        tid = self._task.id if self._task else None
        return (f"<DockerMultiEpisode {self.spec.name} task={tid} round={getattr(self, '_round', 0)} "
                f"done={self.done} {self._link.container!r}>")
