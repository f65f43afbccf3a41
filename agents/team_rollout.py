"""Token-in/token-out rollouts of a team of policies in multi-agent environments.

Every role of a joint episode gets its own :class:`~agents.rollout.Trajectory`:
the sequence that role's model actually saw and wrote. Its ``prompt_ids`` are
the role's opening (system prompt with the role's tool schemas, the
instruction with its private notes, and any letters that reached it before its
first turn, then the assistant header); its ``response_ids`` interleave

* the ids the role's policy sampled on each of its turns (``loss_mask`` 1), and
* everything it observes from the environment and the other agents (its own
  tool responses, letters from teammates, the template's markup), rendered by
  the chat template as the *difference* of two renderings
  (:class:`~agents.chat_render.ChatRenderer`) and inserted with ``loss_mask`` 0
  just before its next turn (or at the end of the episode).

The model's text is decoded from its sampled ids and handed to the episode,
never re-encoded, so decoding ``prompt_ids + response_ids`` gives exactly the
chat template's rendering of ``Trajectory.messages`` (what
:func:`agents.rollout_check.invariant_problems` checks).

A *team* is one :class:`~agents.policy.Policy` for every role (self-play) or a
mapping ``agent id -> actor``. An actor is a ``Policy`` (sampled, batched across
all live episodes) or a scripted role policy with ``act(episode, agent, seed)``
(:mod:`envfactory.multi.team`, e.g. the oracle: its text is encoded and recorded
as a turn with logprob 0, which is how SFT data on reference joint solutions is
made). Turn order (``aec``) and simultaneous moves (``parallel``) both work.
At the end every role trajectory gets its agent's reward (the joint sparse
reward, or the agent's payoff in a mixed-motive game) and the joint success.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .policy import Generation, Policy, default_stop_ids
from .rollout import Trajectory, append_turn, renderer_for

__all__ = ["Team", "TeamEpisode", "resolve_team", "team_rollout"]

Team = Any  # Policy | Mapping[str, Policy | RolePolicy]


@dataclass
class TeamEpisode:
    """One joint episode: a trajectory per role and the team's outcome.

    ``trajectories`` holds every agent of the environment; a role that never got
    a turn (the episode ended first) has an empty trajectory (no sampled ids).
    """

    env_name: str
    task_id: str
    mode: str
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    success: bool = False
    rewards: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    ended_by: str = ""
    error: str | None = None


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


class _Live:
    """One running joint episode and its per-role token records."""

    def __init__(self, episode: Any, task: Any, actors: dict[str, Any], mode: str) -> None:
        self.episode, self.actors = episode, actors
        self.out = TeamEpisode(episode.spec.name, str(getattr(task, "id", task)), mode)
        self.cursor: dict[str, int] = {}      # index in messages(agent) after the role's last assistant turn
        self.closing: dict[str, str] = {}     # markup still owed after the role's last sampled turn
        self.counts: dict[str, dict[str, int]] = {}
        self.full: set[str] = set()           # roles out of context: they pass, nothing more is recorded
        self.done = False
        try:
            episode.reset(task)
            self.out.task_id = episode.task.id
        except Exception as exc:
            self.fail(f"reset failed: {type(exc).__name__}: {exc}")
        for a in episode.agents:
            self.out.trajectories[a] = Trajectory(env_name=self.out.env_name, task_id=self.out.task_id)

    def fail(self, why: str) -> None:
        self.out.error, self.done = why, True


def _observe(live: _Live, agent: str, policy_like: Any, *, max_new_tokens: int) -> list[int] | None:
    """Bring ``agent``'s trajectory up to its turn now; return the ids it continues (None: no room)."""
    r = renderer_for(policy_like)
    t = live.out.trajectories[agent]
    msgs = [dict(m) for m in live.episode.messages(agent)]
    if agent not in live.cursor:
        t.tools = live.episode.tool_schemas(agent)
        t.messages = msgs
        t.prompt_ids = r.opening(msgs, t.tools)
    else:
        new = msgs[live.cursor[agent]:]
        _insert(t, r.encode(live.closing.pop(agent) + r.continuation(new, add_generation_prompt=True)))
        t.messages += new
    limit = getattr(policy_like.tokenizer, "model_max_length", None) or 0
    if 0 < limit < 10**8 and len(t.prompt_ids) + len(t.response_ids) + max_new_tokens > limit:
        t.truncated = True
        live.full.add(agent)
        return None
    return t.prompt_ids + t.response_ids


def _insert(t: Trajectory, ids: list[int]) -> None:
    t.response_ids += ids
    t.loss_mask += [0] * len(ids)
    t.logprobs += [0.0] * len(ids)
    t.entropies += [0.0] * len(ids)


def _record(live: _Live, agent: str, policy_like: Any, gen: Generation, stops: set[int]) -> str:
    """Append one sampled turn to ``agent``'s trajectory; return the text the episode gets."""
    r = renderer_for(policy_like)
    t = live.out.trajectories[agent]
    text, live.closing[agent] = append_turn(t, list(gen.token_ids), gen, r, stops)
    return text


class _Scripted:
    """A scripted role policy (``act(episode, agent, seed)``) as a source of "sampled" turns."""

    def __init__(self, role_policy: Any, tokenizer: Any) -> None:
        self.role_policy, self.tokenizer = role_policy, tokenizer
        self.stop = default_stop_ids(tokenizer)[-1]

    def turn(self, live: _Live, agent: str, seed: int) -> Generation:
        text = str(self.role_policy.act(live.episode, agent, seed))
        ids = renderer_for(self).encode(text) + [self.stop]
        return Generation(ids, [0.0] * len(ids), [0.0] * len(ids), "stop")


def _generate(jobs: list[tuple[_Live, str, list[int]]], *, tokenizer: Any, max_new_tokens: int,
              temperature: float, top_p: float, seed: int | None) -> list[Generation | Exception]:
    """One generation per job, batched per distinct sampling policy (scripted actors play directly)."""
    out: list[Generation | Exception | None] = [None] * len(jobs)
    by_policy: dict[int, list[int]] = {}
    for j, (live, agent, _) in enumerate(jobs):
        actor = live.actors[agent]
        if isinstance(actor, Policy) or hasattr(actor, "generate"):
            by_policy.setdefault(id(actor), []).append(j)
        else:
            try:
                out[j] = _Scripted(actor, tokenizer).turn(live, agent, seed or 0)
            except Exception as exc:
                out[j] = exc
    for idx in by_policy.values():
        policy = jobs[idx[0]][0].actors[jobs[idx[0]][1]]
        kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                  stop_token_ids=sorted(set(default_stop_ids(policy.tokenizer))), seed=seed)
        try:
            gens: list[Any] = list(policy.generate([jobs[j][2] for j in idx], **kw))
        except Exception as exc:
            gens = [exc] * len(idx)
        for j, g in zip(idx, gens):
            out[j] = g
    return out  # type: ignore[return-value]


def _tokenizer_of(actor: Any, fallback: Any) -> Any:
    return getattr(actor, "tokenizer", None) or fallback


def _after_turn(live: _Live, agent: str, res: Any) -> None:
    msgs = live.episode.messages(agent)
    live.cursor[agent] = max(i for i, m in enumerate(msgs) if m["role"] == "assistant") + 1
    live.counts[agent] = {k: int(res.info.get(k, 0)) for k in ("tool_calls", "tool_errors", "parse_errors")}


def _finish(live: _Live, tokenizers: dict[str, Any]) -> None:
    """Close every role's trajectory: owed markup and last observations, rewards, outcome."""
    ep, out = live.episode, live.out
    live.done = True
    if out.error is None:
        out.success, out.rewards = bool(ep.success), dict(ep.rewards)
        out.rounds, out.ended_by = ep.round, ep.ended_by or ""
    for a, t in out.trajectories.items():
        tok_holder = _Holder(tokenizers[a])
        if a in live.closing and a not in live.full and out.error is None:
            r = renderer_for(tok_holder)
            new = [dict(m) for m in ep.messages(a)[live.cursor[a]:]]
            _insert(t, r.encode(live.closing.pop(a) + r.continuation(new, add_generation_prompt=False)))
            t.messages += new
        for k, v in live.counts.get(a, {}).items():
            setattr(t, k, v)
        t.reward = float(out.rewards.get(a, 0.0))
        t.success = out.success
        t.terminated = bool(ep.terminated) if out.error is None else False
        t.truncated = t.truncated or (bool(ep.truncated) if out.error is None else False)
        t.error = out.error


class _Holder:
    """Anything with a ``tokenizer`` (what :func:`agents.rollout.renderer_for` keys on)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer


def team_rollout(team: Team, episodes_and_tasks: Sequence[tuple[Any, Any]], *, mode: str = "aec",
                 max_new_tokens: int = 96, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int | None = None, tokenizer: Any = None) -> list[TeamEpisode]:
    """Play every ``(episode, task)`` to its end with ``team``, all turns batched together.

    Args:
        team: A ``Policy`` for every role, or ``{agent id: Policy | scripted role policy}``.
        episodes_and_tasks: A fresh :class:`~envfactory.multi.MultiEpisode` per joint episode
            (e.g. ``envfactory.make_multi(name)``) and the task (id, index or ``MultiTask``).
        mode: ``aec`` (turn order) or ``parallel`` (every agent of a round decides on the same information).
        tokenizer: The tokenizer of scripted actors' turns (default: that of any ``Policy`` in the team).

    Never raises for a failing episode: :attr:`TeamEpisode.error` says why.
    """
    if mode not in ("aec", "parallel"):
        raise ValueError(f"mode must be 'aec' or 'parallel', got {mode!r}")
    pairs = list(episodes_and_tasks)
    if len({id(e) for e, _ in pairs}) != len(pairs):
        raise ValueError("team_rollout: each joint episode needs its own MultiEpisode (make one per pair)")
    lives = []
    for ep, task in pairs:
        actors = resolve_team(team, ep.agents)
        lives.append(_Live(ep, task, actors, mode))
    if tokenizer is None:
        tokenizer = next((a.tokenizer for lv in lives for a in lv.actors.values() if hasattr(a, "generate")), None)
        if tokenizer is None:
            raise ValueError("team_rollout: a team of scripted actors needs tokenizer= to record their turns")
    tokenizers = {a: _tokenizer_of(x, tokenizer) for lv in lives for a, x in lv.actors.items()}
    for lv in lives:
        if lv.done:
            _finish(lv, tokenizers)
    tick = 0
    while any(not lv.done for lv in lives):
        jobs, actions = [], []
        for lv in lives:
            if lv.done:
                continue
            agents = [lv.episode.next_agent] if mode == "aec" else list(lv.episode.agents)
            acts: dict[str, Any] = {}
            for a in agents:
                if a in lv.full:
                    acts[a] = ""
                    continue
                ids = _observe(lv, a, _Holder(tokenizers[a]), max_new_tokens=max_new_tokens)
                if ids is None:
                    acts[a] = ""  # out of context: passes for the rest of the episode
                else:
                    jobs.append((lv, a, ids))
            actions.append((lv, acts))
        gens = _generate(jobs, tokenizer=tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
                         top_p=top_p, seed=None if seed is None else seed * 7919 + tick)
        tick += 1
        pending: dict[int, list[tuple[str, Generation]]] = {}
        for (lv, a, _), g in zip(jobs, gens):
            if isinstance(g, Exception):
                lv.fail(f"policy backend failed for {a}: {type(g).__name__}: {g}")
            else:
                pending.setdefault(id(lv), []).append((a, g))
        for lv, acts in actions:
            if lv.out.error is not None:
                _finish(lv, tokenizers)
                continue
            turns = dict(pending.get(id(lv), []))
            texts = {a: _record_text(lv, a, g, tokenizers[a]) for a, g in turns.items()}
            try:
                if mode == "aec":
                    a = lv.episode.next_agent
                    results = {a: lv.episode.act(a, texts.get(a, acts.get(a, "")))}
                else:
                    results = lv.episode.step({**acts, **texts})
            except Exception as exc:
                lv.fail(f"episode step failed: {type(exc).__name__}: {exc}")
                _finish(lv, tokenizers)
                continue
            for a, g in turns.items():
                if a in results:  # a parallel round cut short by `finish` ignores later agents' turns
                    _record(lv, a, _Holder(tokenizers[a]), g, set(default_stop_ids(tokenizers[a])))
                    _after_turn(lv, a, results[a])
                else:
                    _undo_observe(lv, a)
            if lv.episode.done:
                _finish(lv, tokenizers)
    return [lv.out for lv in lives]


def _record_text(live: _Live, agent: str, gen: Generation, tokenizer: Any) -> str:
    """The text of a sampled turn, as :func:`_record` will hand it to the episode."""
    r = renderer_for(_Holder(tokenizer))
    ids, stops = list(gen.token_ids), set(default_stop_ids(tokenizer))
    if gen.finish_reason == "stop" and ids and ids[-1] in stops and r.close.startswith(r.decode(ids[-1:])):
        ids = ids[:-1]
    return r.decode(ids)


def _undo_observe(live: _Live, agent: str) -> None:
    """Nothing to undo for the ids: the role's observation stays, and the episode ends right after.

    The role's trajectory then ends with an assistant header and no turn; it is
    marked truncated so the invariant check renders the open header.
    """
    live.out.trajectories[agent].truncated = True
    live.full.add(agent)
