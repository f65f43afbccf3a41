"""Multi-turn, token-in/token-out rollouts of policies in envfactory episodes, for one agent or a team.

A :class:`Rollout` is one live episode (:class:`envfactory.Episode`, any number of
roles) and a :class:`Trajectory` per role: the sequence that role's model really
saw and wrote. A single agent is the one-role case. A role's ``prompt_ids`` are its
opening (system prompt with its tool schemas, the instruction with its private
notes, letters that reached it before its first turn, the assistant header); its
``response_ids`` interleave

* the ids its actor sampled on each of its turns (``loss_mask`` 1), and
* what it observes between its turns (the closing markup of its turn, its tool
  responses, teammates' letters, the next assistant header), rendered by the chat
  template as the *difference* of two renderings
  (:class:`~agents.policies.chat_render.ChatRenderer`) and inserted with ``loss_mask`` 0 as
  soon as it is the role's turn again (or at the end of the episode).

The model's text is decoded from its ids and handed to the episode, never
re-encoded, so decoding ``prompt_ids + response_ids`` gives exactly the chat
template's rendering of ``Trajectory.messages`` (what
:func:`agents.rollout_check.invariant_problems` checks).

A *team* is one :class:`~agents.policies.policy.Policy` for every role (self-play, or a
single agent) or ``{agent id: actor}``. An actor is a ``Policy`` (sampled, batched
across all live episodes) or a :class:`~envfactory.checks.scripted.RolePolicy`
(``act(episode, agent, seed)``; its text is encoded and recorded as a turn with logprob 0: that is how
SFT data on reference solutions is made). Turn order (``aec``) and simultaneous
moves (``parallel``) both work. At the end every role trajectory gets its agent's
reward (the sparse success, or the agent's payoff in a mixed-motive game).

Failures stay inside their episode: a malformed model output is the episode's
error observation; an environment or backend that raises ends only that
episode, with :attr:`Rollout.error` (and each ``Trajectory.error``) saying why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from envfactory import Episode, step_many

from agents.policies.chat_render import ChatRenderer, renderer_for
from agents.policies.policy import Generation, default_stop_ids

__all__ = ["Trajectory", "Rollout", "Team", "resolve_team", "start", "advance", "rollout", "renderer_for"]

Team = Any  # Policy | Mapping[str, Policy | envfactory.checks.scripted.RolePolicy]


class Trajectory(BaseModel):
    """One role's side of an episode as a training sample (see the module docstring).

    The one record of a trajectory: rollouts build it, the trainer learns from it, and
    :mod:`agents.trajectories` writes and reads it (JSONL or Parquet).
    """

    model_config = ConfigDict(use_attribute_docstrings=True, extra="ignore")

    env_name: str
    task_id: str
    agent: str = "agent_0"
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    entropies: list[float] = Field(default_factory=list)
    turn_spans: list[tuple[int, int]] = Field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    parse_errors: int = 0
    reward: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """The tool schemas rendered into the prompt (``render(messages, tools)`` reproduces the sample)."""
    turns: int = 0
    token_exact: bool = True
    """False when the backend returned text only (no sampled ids): evaluation only, not training."""
    env_version: str = ""
    """A fingerprint of the environment's definition (tool schemas, task ids): :func:`env_version`."""
    seed: int | None = None
    """The episode's seed (``start(..., seed=)``), when it had one."""
    rubric: dict[str, float] | None = None
    """The rubric's grade of the episode (``start(..., rubric=)``): each criterion and ``score``."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict of every field (``turn_spans`` as lists)."""
        d = self.model_dump()
        d["turn_spans"] = [list(s) for s in self.turn_spans]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Trajectory":
        """The trajectory of a :meth:`to_json` dict (keys it does not know are ignored)."""
        return cls.model_validate(d)

    def copy(self) -> "Trajectory":  # type: ignore[override]
        """An independent copy (its lists are new; a fork extends it without touching this one)."""
        # no validation: every field is already valid, and branching copies long id lists
        return Trajectory.model_construct(**{k: list(v) if isinstance(v, list) else v
                                             for k, v in self.__dict__.items()})

    def _insert(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.entropies += [0.0] * len(ids)


_VERSIONS: dict[int, tuple[Any, str]] = {}


def env_version(spec: Any) -> str:
    """A short fingerprint of an environment's definition: its tool schemas (every role's) and
    task ids, so trajectories say which version of ``FindLight-v0`` they were played on."""
    hit = _VERSIONS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    import hashlib

    try:
        doc = {"tools": spec.tool_schemas(None) if not getattr(spec, "multi_agent", False) else
               {a: spec.tool_schemas(a) for a in spec.agent_ids},
               "tasks": [t.id for t in spec.get_tasks()]}
        version = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]
    except Exception:  # a spec that cannot describe itself still plays
        version = ""
    _VERSIONS[id(spec)] = (spec, version)
    return version


def resolve_team(team: Team, agents: Sequence[str]) -> dict[str, Any]:
    """``agent id -> actor`` for ``agents``; a single policy plays every role.

    Raises:
        KeyError: a mapping lacks some agent (names what is missing and what was given).
    """
    if isinstance(team, Mapping):
        missing = [a for a in agents if a not in team]
        if missing:
            raise KeyError(f"the team has no policy for {missing}; give one per agent id "
                           f"(it has {sorted(team)}), or pass a single Policy for self-play")
        return {a: team[a] for a in agents}
    return dict.fromkeys(agents, team)


class Rollout:
    """One episode being played (or finished): the episode, its actors and a trajectory per role.

    Attributes:
        trajectories: ``agent id -> Trajectory`` for every agent of the episode; a role that
            never got a turn has an empty one.
        done, error: Whether it has ended; why it failed (``None`` unless it did).
        success, rewards, rounds, ended_by: The outcome, set when it ends.
    """

    def __init__(self, env: Any, actors: dict[str, Any], tokenizers: dict[str, Any], mode: str) -> None:
        self.env, self.actors, self.tokenizers, self.mode = env, actors, tokenizers, mode
        spec = getattr(env, "spec", None)
        name = getattr(spec, "name", type(env).__name__)
        version = env_version(spec) if spec is not None else ""
        self.trajectories = {a: Trajectory(env_name=name, task_id="", agent=a, env_version=version) for a in actors}
        self.cursor: dict[str, int] = {}   # index in transcript(agent) after the role's last assistant turn
        self.closing: dict[str, str] = {}  # markup still owed after the role's last sampled turn
        self.full: set[str] = set()        # roles out of context: they pass, nothing more is recorded
        self.done, self.error = False, None
        self.success, self.rewards, self.rounds, self.ended_by = False, dict.fromkeys(actors, 0.0), 0, ""
        self.owns_env = False  # the caller's episode; a fork owns the fork of it (see close)
        self.rubric: Any = None  # set by start(): grades the finished episode
        self.rubric_as_reward = False

    @property
    def env_name(self) -> str:
        return next(iter(self.trajectories.values())).env_name

    @property
    def task_id(self) -> str:
        return next(iter(self.trajectories.values())).task_id

    @property
    def trajectory(self) -> Trajectory:
        """The sole agent's trajectory (single-agent environments)."""
        if len(self.trajectories) != 1:
            raise ValueError(f"{self.env_name} has agents {list(self.trajectories)}; use trajectories[agent]")
        return next(iter(self.trajectories.values()))

    @property
    def ids(self) -> list[int]:
        """The sole agent's whole sequence so far (what its policy continues)."""
        t = self.trajectory
        return t.prompt_ids + t.response_ids

    def acting(self) -> list[str]:
        """The agents who play the next tick: the next agent (turn order) or all (a parallel round)."""
        if self.done:
            return []
        return list(self.env.agents) if self.mode == "parallel" else [self.env.status.next_agent]

    def fork(self) -> "Rollout":
        """An independent copy: the token records are copied and the episode forked (a finished
        one too, so that closing either copy never closes the other's episode).

        Never raises for a failing environment. A rollout that failed (``error`` set, e.g. its
        reset) is not forked again: the copy refers to the same episode without owning it, so
        :meth:`close` on the copy leaves it alone. A live episode whose fork fails gives a copy
        that is done, with ``error`` set, in the same way.
        """
        new = Rollout.__new__(Rollout)
        new.__dict__.update(self.__dict__)
        new.trajectories = {a: t.copy() for a, t in self.trajectories.items()}
        new.cursor, new.closing, new.full = dict(self.cursor), dict(self.closing), set(self.full)
        new.rewards = dict(self.rewards)
        new.owns_env = False
        if self.error is None:
            try:
                new.env, new.owns_env = self.env.fork(), True
            except Exception as exc:  # a dead container, or an episode that cannot be forked
                if not self.done:
                    new.fail(f"fork failed: {type(exc).__name__}: {exc}")
        return new

    def close(self) -> None:
        """Close this rollout's episode if it owns it (a fork's own copy); never the episode
        the caller passed to :func:`start`, nor one shared with the rollout it was copied from.
        Never raises."""
        if self.owns_env:
            self.owns_env = False
            try:
                self.env.close()
            except Exception:  # a dead container must not kill the caller
                pass

    def fail(self, why: str) -> None:
        self.error = why
        self._finish()

    # -- observing and recording ------------------------------------------------
    def _observe(self, agent: str, max_new_tokens: int, max_context: int | None) -> None:
        """Bring ``agent``'s trajectory up to its turn now (or mark it out of context)."""
        r, t = renderer_for(self.tokenizers[agent]), self.trajectories[agent]
        msgs = [dict(m) for m in self.env.transcript(agent)]
        if agent not in self.cursor:
            t.tools = self.env.tool_schemas(agent)
            t.messages = msgs
            t.prompt_ids = r.opening(msgs, t.tools)
            self.cursor[agent] = len(msgs)
        else:
            new = msgs[self.cursor[agent]:]
            t._insert(r.encode(self.closing.pop(agent) + r.continuation(new, add_generation_prompt=True)))
            t.messages += new
        limit = max_context or getattr(self.tokenizers[agent], "model_max_length", None) or 0
        if 0 < limit < 10**8 and len(t.prompt_ids) + len(t.response_ids) + max_new_tokens > limit:
            t.truncated = True
            self.full.add(agent)

    def _opened(self, max_new_tokens: int, max_context: int | None) -> None:
        """After the episode's reset: its task, and the opening of the agents who act first."""
        for t in self.trajectories.values():
            t.task_id = self.env.task.id
        self._next(max_new_tokens, max_context)

    def _next(self, max_new_tokens: int, max_context: int | None) -> None:
        """After a tick: end the rollout, or let the next agents observe what is new to them."""
        if self.env.done:
            return self._finish()
        for a in self.acting():
            if a not in self.full:
                self._observe(a, max_new_tokens, max_context)
        if len(self.full) == len(self.trajectories):
            self._finish()  # nobody fits another turn

    def _play(self, turns: dict[str, Generation], stops: dict[str, set[int]]) -> None:
        """Hand the sampled turns' text to the episode; record the turns it took."""
        split, texts, acting = self._texts(turns, stops)
        self._record(turns, split, self._step(acting, texts))

    def _texts(self, turns: dict[str, Generation], stops: dict[str, set[int]]
               ) -> tuple[dict[str, tuple[list[int], str, str]], dict[str, str], list[str]]:
        """``(split, texts, acting)``: each sampled turn's ids, text and owed closing, the texts the
        episode gets, and who acts (what :meth:`_step` and :meth:`_record` take)."""
        split = {a: _split(g, renderer_for(self.tokenizers[a]), stops[a]) for a, g in turns.items()}
        return split, {a: s[1] for a, s in split.items()}, self.acting()

    def _step(self, acting: list[str], texts: dict[str, str]) -> dict[str, Any]:
        """The episode's tick: ``{agent: StepResult}`` of the agents that acted."""
        if len(self.trajectories) == 1:
            return {acting[0]: self.env.step(texts.get(acting[0], ""))}
        if self.mode == "parallel":
            return self.env.step_round({a: texts.get(a, "") for a in acting})
        return {acting[0]: self.env.act(acting[0], texts.get(acting[0], ""))}

    async def _astep(self, acting: list[str], texts: dict[str, str]) -> dict[str, Any]:
        """:meth:`_step`, awaited (the episode's async twins)."""
        if len(self.trajectories) == 1:
            return {acting[0]: await self.env.aio.step(texts.get(acting[0], ""))}
        if self.mode == "parallel":
            return dict(await self.env.aio.step_round({a: texts.get(a, "") for a in acting}))
        return {acting[0]: await self.env.aio.act(acting[0], texts.get(acting[0], ""))}

    def _record(self, turns: dict[str, Generation], split: dict[str, tuple[list[int], str, str]],
                results: dict[str, Any]) -> None:
        """Record the turns the episode took (``results``: :meth:`_step`'s)."""
        for a, (ids, text, closing) in split.items():
            t = self.trajectories[a]
            if a not in results:  # a parallel round cut short (finish) ignored this turn
                t.truncated = True
                self.full.add(a)
                continue
            g = turns[a]
            begin = len(t.response_ids)
            t.response_ids += ids
            t.loss_mask += [1] * len(ids)
            t.logprobs += list(g.logprobs) if len(g.logprobs) == len(ids) else [0.0] * len(ids)
            t.entropies += list(g.entropies) if len(g.entropies) == len(ids) else [0.0] * len(ids)
            t.turn_spans.append((begin, len(t.response_ids)))
            t.turns += 1
            t.token_exact = t.token_exact and bool(g.token_ids)
            t.messages.append({"role": "assistant", "content": text})
            self.closing[a] = closing
            msgs = self.env.transcript(a)
            self.cursor[a] = max(i for i, m in enumerate(msgs) if m["role"] == "assistant") + 1
        for a, res in results.items():
            for k in ("tool_calls", "tool_errors", "parse_errors"):
                setattr(self.trajectories[a], k, int(res.info.get(k, 0)))

    def _finish(self) -> None:
        """Close every role's trajectory: owed markup and last observations, rewards, outcome."""
        ep = self.env
        self.done = True
        ok = self.error is None
        if ok and ep.done:
            self.success, self.rewards = bool(ep.success), dict(ep.rewards)
            self.rounds, self.ended_by = ep.status.round, ep.status.ended_by or ""
        elif ok:  # cut by the rollout (no role fits max_context): judged like the episode's own end
            self._grade_cut(ep)
        for a, t in self.trajectories.items():
            if ok and a in self.closing and a not in self.full:
                r = renderer_for(self.tokenizers[a])
                new = [dict(m) for m in ep.transcript(a)[self.cursor[a]:]]
                t._insert(r.encode(self.closing.pop(a) + r.continuation(new, add_generation_prompt=False)))
                t.messages += new
            t.reward, t.success, t.error = float(self.rewards.get(a, 0.0)), self.success, self.error
            t.terminated = ok and bool(ep.status.terminated)
            t.truncated = t.truncated or (ok and bool(ep.status.truncated))
        if self.rubric is not None and ok and ep.done:
            self._grade(ep)

    def _grade(self, ep: Any) -> None:
        """The rubric's grade of the finished episode on every trajectory (and as its reward when asked)."""
        try:
            grade = self.rubric.grade(ep)
        except Exception as exc:  # a world lost before grading: no grade, and say why
            self.ended_by += f" (not graded: {type(exc).__name__}: {exc})"
            return
        for t in self.trajectories.values():
            t.rubric = {**grade.parts, "score": grade.score}
            if self.rubric_as_reward:
                t.reward = grade.score

    def _grade_cut(self, ep: Any) -> None:
        """Judge an episode the rollout ended before the episode did (out of context) the way
        the episode judges its own turn limit (:meth:`envfactory.episode.EpisodeStatus.judge`)."""
        try:
            success, rewards = ep.status.judge()
        except Exception as exc:  # nothing to judge (a dead container): reward 0, and say why
            self.ended_by = f"max_context (not judged: {type(exc).__name__}: {exc})"
            return
        self.success, self.rewards = bool(success), {a: float(rewards.get(a, 0.0)) for a in self.trajectories}
        status = ep.status
        started = status.next_agent != ep.agents[0]  # the round under way has had some turns already
        self.rounds, self.ended_by = status.round - (0 if started else 1), "max_context"


def _split(gen: Generation, r: ChatRenderer, stops: set[int]) -> tuple[list[int], str, str]:
    """``(ids, text, closing)`` of a sampled turn: the ids recorded, the text the episode gets
    (without a sampled stop token that is the template's turn end) and the template's turn
    closing still to be inserted (mask 0) before the role's next observation."""
    ids = list(gen.token_ids) or r.encode(gen.text or "")  # a text-only backend: evaluation only
    closing, content = r.close, ids
    if gen.finish_reason == "stop" and ids and ids[-1] in stops:
        stop_text = r.decode(ids[-1:])
        if closing.startswith(stop_text):
            content, closing = ids[:-1], closing[len(stop_text):]
    return ids, r.decode(content), closing


def start(team: Team, env: Any, task: Any = None, *, seed: int | None = None, mode: str = "aec",
          tokenizer: Any = None, max_new_tokens: int = 256, max_context: int | None = None,
          rubric: Any = None, rubric_as_reward: bool = False) -> Rollout:
    """Reset ``env`` on ``task`` and render the opening of the agents who act first.

    Args:
        team: A ``Policy`` for every role, or ``{agent id: Policy | scripted role policy}``.
        tokenizer: The tokenizer of scripted actors' turns (default: that of a ``Policy`` in the team).
        rubric: An :class:`envfactory.evaluation.rubric.Rubric` that grades the finished episode
            (each trajectory's ``rubric``); the reward stays the sparse task reward unless
            ``rubric_as_reward`` makes it the rubric's score.

    Never raises for a failing environment: the rollout comes back done, with ``error`` set.
    """
    ro = _new(team, env, task, seed=seed, mode=mode, tokenizer=tokenizer, rubric=rubric,
              rubric_as_reward=rubric_as_reward)
    try:
        env.reset(task, seed=seed)
        ro._opened(max_new_tokens, max_context)
    except Exception as exc:  # a crashed container must not kill the batch
        ro.fail(f"reset failed: {type(exc).__name__}: {exc}")
    return ro


def _new(team: Team, env: Any, task: Any, *, seed: int | None, mode: str, tokenizer: Any, rubric: Any,
         rubric_as_reward: bool) -> Rollout:
    """The rollout :func:`start` begins, before its episode is reset."""
    if mode not in ("aec", "parallel"):
        raise ValueError(f"mode must be 'aec' or 'parallel', got {mode!r}")
    actors = resolve_team(team, list(env.agents))
    fallback = tokenizer or next((a.tokenizer for a in actors.values() if hasattr(a, "generate")), None)
    toks = {a: getattr(x, "tokenizer", None) or fallback for a, x in actors.items()}
    if any(t is None for t in toks.values()):
        raise ValueError("a team of scripted actors needs tokenizer= to record their turns")
    ro = Rollout(env, actors, toks, mode if len(actors) > 1 else "aec")
    ro.rubric, ro.rubric_as_reward = rubric, rubric_as_reward
    for t in ro.trajectories.values():
        t.task_id, t.seed = str(getattr(task, "id", task)), seed
    return ro


def _generate_each(policy: Any, prompts: list[list[int]], kw: dict[str, Any]) -> list[Generation | Exception]:
    """Generate as one batch; if the batch fails, retry prompt by prompt so one
    bad request only fails its own episode."""
    try:
        return list(policy.generate(prompts, **kw))
    except Exception:
        out: list[Generation | Exception] = []
        for p in prompts:
            try:
                out.append(policy.generate([p], **kw)[0])
            except Exception as exc:
                out.append(exc)
        return out


def _scripted(ro: Rollout, agent: str, seed: int) -> Generation:
    """A scripted actor's turn as a "sampled" one (logprob 0), ending in the turn's stop token."""
    tok = ro.tokenizers[agent]
    ids = renderer_for(tok).encode(str(ro.actors[agent].act(ro.env, agent, seed))) + [default_stop_ids(tok)[-1]]
    return Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "stop")


def advance(states: Sequence[Rollout], *, max_new_tokens: int, temperature: float = 1.0, seed: int | None = None,
            top_p: float = 1.0, stop_token_ids: list[int] | None = None, max_context: int | None = None,
            env_threads: int | None = None) -> None:
    """Play one batched tick of every rollout that is not done: its next agent's turn (turn
    order) or a whole round (parallel).

    Generates for all of them, one call per distinct policy, steps each episode with
    the sampled text, and inserts what each next agent observes (loss mask 0). A role
    whose sequence cannot fit another ``max_new_tokens`` within ``max_context``
    (default: the tokenizer's ``model_max_length``) passes from then on, its trajectory
    truncated; a rollout none of whose roles fits ends. Episodes are stepped in
    ``env_threads`` threads (default: 1 for in-process worlds, 16 when any is remote); with more
    than one, one agent's episodes take the tick as one :func:`envfactory.step_many` round from
    this thread instead (a shared container's turns in one batch frame), and teams use the threads.
    """
    live = [s for s in states if not s.done]
    ticks = _generate(live, [seed] * len(live), max_new_tokens=max_new_tokens, temperature=temperature,
                      top_p=top_p, stop_token_ids=stop_token_ids)

    def play(tick: tuple[Rollout, dict[str, Generation], dict[str, set[int]]]) -> None:
        _play(*tick, max_new_tokens=max_new_tokens, max_context=max_context)

    if env_threads is None:
        from envfactory.world import LocalWorld

        env_threads = 1 if all(isinstance(getattr(s.env, "_world", None), LocalWorld) for s, _, _ in ticks) else 16
    if env_threads > 1 and len(ticks) > 1:
        # one agent's episodes over remote worlds: one step_many round from this thread (a shared
        # container's turns in one batch frame); the others (teams) in threads
        solo = [t for t in ticks if len(t[0].trajectories) == 1 and isinstance(t[0].env, Episode)]
        if len(solo) > 1:
            _play_solo(solo, max_new_tokens=max_new_tokens, max_context=max_context)
            ticks = [t for t in ticks if not (len(t[0].trajectories) == 1 and isinstance(t[0].env, Episode))]
    if env_threads > 1 and len(ticks) > 1:
        with ThreadPoolExecutor(min(env_threads, len(ticks))) as pool:
            list(pool.map(play, ticks))
    else:
        for tick in ticks:
            play(tick)


def _generate(live: Sequence[Rollout], seeds: Sequence[int | None], *, max_new_tokens: int, temperature: float,
              top_p: float, stop_token_ids: list[int] | None
              ) -> list[tuple[Rollout, dict[str, Generation], dict[str, set[int]]]]:
    """The next turns of the rollouts ``live`` (none done; ``seeds``: each one's tick seed), one
    ``generate`` call per distinct policy (seeded with its first rollout's seed). A rollout whose
    backend failed is failed here; for each other one ``(rollout, {agent: turn}, {agent: stop ids})``."""
    jobs = [(i, s, a) for i, s in enumerate(live) for a in s.acting() if a not in s.full]
    out: list[Generation | Exception | None] = [None] * len(jobs)
    by_policy: dict[int, list[int]] = {}
    for j, (i, s, a) in enumerate(jobs):
        if hasattr(s.actors[a], "generate"):
            by_policy.setdefault(id(s.actors[a]), []).append(j)
        else:
            try:
                out[j] = _scripted(s, a, seeds[i] or 0)
            except Exception as exc:
                out[j] = exc
    stops: dict[int, list[int]] = {}
    for idx in by_policy.values():
        i0, s0, a0 = jobs[idx[0]]
        policy = s0.actors[a0]
        stops[id(policy)] = stop_token_ids if stop_token_ids is not None else default_stop_ids(policy.tokenizer)
        kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                  stop_token_ids=sorted(set(stops[id(policy)])), seed=seeds[i0])
        seqs = [jobs[j][1].trajectories[jobs[j][2]] for j in idx]
        for j, g in zip(idx, _generate_each(policy, [t.prompt_ids + t.response_ids for t in seqs], kw)):
            out[j] = g
    turns: dict[int, dict[str, Generation]] = {id(s): {} for s in live}
    for (_, s, a), g in zip(jobs, out):
        if isinstance(g, Exception):
            if not s.done:
                s.fail(f"policy backend failed for {a}: {type(g).__name__}: {g}")
        else:
            turns[id(s)][a] = g
    return [(s, turns[id(s)], {a: set(stops.get(id(s.actors[a])) or default_stop_ids(s.tokenizers[a]))
                               for a in turns[id(s)]}) for s in live if not s.done]


def _play(s: Rollout, turns: dict[str, Generation], stops: dict[str, set[int]], *, max_new_tokens: int,
          max_context: int | None) -> None:
    """Step ``s``'s episode with its sampled ``turns`` and render what comes next; a failure fails ``s`` only."""
    try:
        s._play(turns, stops)
    except Exception as exc:
        return _step_failed(s, exc)
    _render_next(s, max_new_tokens, max_context)


def _step_failed(s: Rollout, exc: Exception) -> None:
    s.fail(f"environment step failed: {type(exc).__name__}: {exc}")


def _play_solo(ticks: list[tuple[Rollout, dict[str, Generation], dict[str, set[int]]]], *, max_new_tokens: int,
               max_context: int | None) -> None:
    """:func:`_play` for one agent's episodes, their steps in one :func:`envfactory.step_many` round
    (each episode's failure fails its rollout only, as in :func:`_play`)."""
    ready = []
    for s, turns, stops in ticks:
        try:
            split, texts, acting = s._texts(turns, stops)
        except Exception as exc:
            _step_failed(s, exc)
            continue
        ready.append((s, turns, split, acting, texts.get(acting[0], "")))  # what _step hands the episode
    results = step_many([(s.env, text) for s, _, _, _, text in ready], return_exceptions=True)
    for (s, turns, split, acting, _), r in zip(ready, results):
        if isinstance(r, Exception):
            _step_failed(s, r)
            continue
        try:
            s._record(turns, split, {acting[0]: r})
        except Exception as exc:
            _step_failed(s, exc)
            continue
        _render_next(s, max_new_tokens, max_context)


def _render_next(s: Rollout, max_new_tokens: int, max_context: int | None) -> None:
    try:
        s._next(max_new_tokens, max_context)
    except Exception as exc:
        s.fail(f"rendering the environment's reply failed: {type(exc).__name__}: {exc}")


def rollout(team: Team, envs_and_tasks: Iterable[tuple[Any, Any]], *, max_new_tokens: int = 256,
            temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None, mode: str = "aec",
            tokenizer: Any = None, stop_token_ids: list[int] | None = None, max_context: int | None = None,
            env_threads: int | None = None, rubric: Any = None, rubric_as_reward: bool = False) -> list[Rollout]:
    """Play every ``(episode, task)`` to its end with ``team``, all turns batched together
    (``rubric``: grade each finished episode, see :func:`start`).

    Each pair needs its own episode (``envfactory.make(name, max_turns=...)``: the
    episode's turn limit ends it). One failing episode is reported in its rollout's
    ``error``; the others go on.
    """
    pairs = list(envs_and_tasks)
    if len({id(e) for e, _ in pairs}) != len(pairs):
        raise ValueError("rollout: each episode needs its own environment instance (make one per pair)")
    states = [start(team, env, task, seed=None if seed is None else seed + i, mode=mode, tokenizer=tokenizer,
                    max_new_tokens=max_new_tokens, max_context=max_context, rubric=rubric,
                    rubric_as_reward=rubric_as_reward) for i, (env, task) in enumerate(pairs)]
    tick = 0
    while not all(s.done for s in states):
        advance(states, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                seed=None if seed is None else seed * 7919 + tick, stop_token_ids=stop_token_ids,
                max_context=max_context, env_threads=env_threads)
        tick += 1
    return states
