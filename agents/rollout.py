"""Multi-turn, token-in/token-out rollouts of a policy in envfactory environments.

An episode's sample is ``prompt_ids + response_ids``. ``response_ids`` interleaves
the ids the policy sampled (``loss_mask`` 1) with ids inserted from the chat
template (``loss_mask`` 0): the closing markup of each assistant turn, the
environment's tool responses and the next assistant header
(:class:`~agents.chat_render.ChatRenderer`). The model's text is decoded from
its ids and handed to the environment, never re-encoded, so decoding the whole
sample gives exactly the template's rendering of ``Trajectory.messages``.

Failures stay inside their episode: a malformed model output is the
environment's error observation; an environment or backend that raises ends
only that episode, with :attr:`Trajectory.error` saying why.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from envfactory.env import Environment

from .chat_render import ChatRenderer
from .policy import Generation, Policy, default_stop_ids

__all__ = ["Trajectory", "RolloutState", "start", "advance", "rollout", "write_jsonl", "read_jsonl",
           "renderer_for"]


@dataclass
class Trajectory:
    """One episode as a training sample (see the module docstring)."""

    env_name: str
    task_id: str
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    parse_errors: int = 0
    reward: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The tool schemas rendered into the prompt (``render(messages, tools)`` reproduces the sample)."""
    turns: int = 0
    token_exact: bool = True
    """False when the backend returned text only (no sampled ids): evaluation only, not training."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict of every field (``turn_spans`` as lists)."""
        d = asdict(self)
        d["turn_spans"] = [list(s) for s in self.turn_spans]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["turn_spans"] = [tuple(s) for s in d.get("turn_spans", [])]
        return cls(**d)


@dataclass
class RolloutState:
    """One live episode: its environment, the tokens so far and their records."""

    env: Environment
    traj: Trajectory
    done: bool = False
    max_turns: int | None = None

    @property
    def ids(self) -> list[int]:
        """The whole sequence so far (what the policy continues)."""
        return self.traj.prompt_ids + self.traj.response_ids

    def fork(self) -> "RolloutState":
        """An independent copy: the token records are copied and the environment forked."""
        t = self.traj
        traj = Trajectory(**{**t.__dict__, "prompt_ids": list(t.prompt_ids), "response_ids": list(t.response_ids),
                             "loss_mask": list(t.loss_mask), "logprobs": list(t.logprobs),
                             "entropies": list(t.entropies), "turn_spans": list(t.turn_spans),
                             "messages": list(t.messages)})
        return RolloutState(self.env.fork() if not self.done else self.env, traj, self.done, self.max_turns)


_RENDERERS: dict[int, ChatRenderer] = {}


def renderer_for(policy: Policy) -> ChatRenderer:
    """The (cached) :class:`ChatRenderer` of a policy's tokenizer."""
    key = id(policy.tokenizer)
    r = _RENDERERS.get(key)
    if r is None or r.tokenizer is not policy.tokenizer:
        r = _RENDERERS[key] = ChatRenderer(policy.tokenizer)
    return r


def _fail(state: RolloutState, why: str) -> None:
    state.traj.error = why
    state.done = True


def start(policy: Policy, env: Environment, task: Any = None, *, seed: int | None = None,
          max_turns: int | None = None) -> RolloutState:
    """Reset ``env`` on ``task`` and render the opening prompt.

    Never raises for a failing environment: the state comes back done, with
    ``traj.error`` set.
    """
    name = getattr(getattr(env, "spec", None), "name", type(env).__name__)
    traj = Trajectory(env_name=name, task_id=str(getattr(task, "id", task)))
    state = RolloutState(env, traj, max_turns=max_turns)
    try:
        messages = env.reset(task, seed=seed)
        traj.task_id = env.task.id if env.task is not None else traj.task_id
        traj.tools = env.tool_schemas()
        traj.messages = [dict(m) for m in messages]
        traj.prompt_ids = renderer_for(policy).opening(traj.messages, traj.tools)
    except Exception as exc:  # a crashed container must not kill the batch
        _fail(state, f"reset failed: {type(exc).__name__}: {exc}")
    return state


def _generate_each(policy: Policy, prompts: list[list[int]], kw: dict[str, Any]) -> list[Generation | Exception]:
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


def append_turn(t: Trajectory, ids: list[int], gen: Generation, r: Any, stops: set[int]) -> tuple[str, str]:
    """Append one sampled turn's ids (loss mask 1, their logprobs and entropies) to ``t``.

    Returns ``(text, closing)``: the turn's text as the environment gets it (without the
    sampled stop token when that token is the template's turn end) and what of the
    template's turn closing is still to be inserted (mask 0) before the next message.
    """
    begin = len(t.response_ids)
    t.response_ids += ids
    t.loss_mask += [1] * len(ids)
    t.logprobs += list(gen.logprobs) if len(gen.logprobs) == len(ids) else [0.0] * len(ids)
    t.entropies += list(gen.entropies) if len(gen.entropies) == len(ids) else [0.0] * len(ids)
    t.turn_spans.append((begin, len(t.response_ids)))
    t.turns += 1
    closing, content_ids = r.close, ids
    if gen.finish_reason == "stop" and ids and ids[-1] in stops:
        stop_text = r.decode(ids[-1:])
        if closing.startswith(stop_text):  # the sampled stop token is the template's turn end
            content_ids, closing = ids[:-1], closing[len(stop_text):]
    text = r.decode(content_ids)
    t.messages.append({"role": "assistant", "content": text})
    return text, closing


def _apply(policy: Policy, state: RolloutState, gen: Generation, stops: set[int]) -> None:
    """Record one sampled turn, step the environment with its text, insert the reply's ids."""
    r = renderer_for(policy)
    t = state.traj
    ids = list(gen.token_ids)
    if not ids and gen.text is not None:  # a text-only backend: evaluation only
        t.token_exact = False
        ids = r.encode(gen.text)
    text, closing = append_turn(t, ids, gen, r, stops)
    try:
        res = state.env.step(text)
    except Exception as exc:
        _fail(state, f"environment step failed: {type(exc).__name__}: {exc}")
        return
    info = res.info
    t.tool_calls = int(info.get("tool_calls", t.tool_calls))
    t.tool_errors = int(info.get("tool_errors", t.tool_errors))
    t.parse_errors = int(info.get("parse_errors", t.parse_errors))
    new = [dict(m) for m in res.messages]
    cut = not res.done and state.max_turns is not None and t.turns >= state.max_turns
    state.done = res.done or cut
    try:
        inserted = r.encode(closing + r.continuation(new, add_generation_prompt=not state.done))
    except Exception as exc:
        _fail(state, f"rendering the environment's reply failed: {type(exc).__name__}: {exc}")
        return
    t.messages += new
    t.response_ids += inserted
    t.loss_mask += [0] * len(inserted)
    t.logprobs += [0.0] * len(inserted)
    t.entropies += [0.0] * len(inserted)
    t.reward = float(res.reward)
    t.terminated = bool(res.terminated)
    t.truncated = bool(res.truncated or cut)
    t.success = bool(info.get("success", False)) if res.done else False


def advance(policy: Policy, states: Sequence[RolloutState], *, max_new_tokens: int, temperature: float = 1.0,
            seed: int | None = None, top_p: float = 1.0, stop_token_ids: list[int] | None = None,
            max_context: int | None = None, env_threads: int | None = None) -> None:
    """Play one batched assistant turn for every state that is not done.

    Generates for all of them in one call, steps each environment with its
    sampled text, and appends the environment's reply as inserted ids (loss
    mask 0). A state whose sequence cannot fit another ``max_new_tokens``
    within ``max_context`` (default: the tokenizer's ``model_max_length``) ends
    truncated. Environments are stepped in ``env_threads`` threads (default: 1
    for in-process environments, 16 when any is remote, e.g. Docker).
    """
    live = [s for s in states if not s.done]
    limit = max_context or getattr(policy.tokenizer, "model_max_length", None) or 0
    if 0 < limit < 10**8:
        for s in live:
            if len(s.traj.prompt_ids) + len(s.traj.response_ids) + max_new_tokens > limit:
                s.traj.truncated = True
                s.done = True
        live = [s for s in live if not s.done]
    if not live:
        return
    stops = set(stop_token_ids if stop_token_ids is not None else default_stop_ids(policy.tokenizer))
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
              stop_token_ids=sorted(stops), seed=seed)
    gens = _generate_each(policy, [s.ids for s in live], kw)
    jobs = []
    for s, g in zip(live, gens):
        if isinstance(g, Exception):
            _fail(s, f"policy backend failed: {type(g).__name__}: {g}")
        else:
            jobs.append((s, g))
    if env_threads is None:
        from envfactory.runtime.local import LocalEnv

        env_threads = 1 if all(isinstance(s.env, LocalEnv) for s, _ in jobs) else 16
    if env_threads > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(min(env_threads, len(jobs))) as pool:
            list(pool.map(lambda job: _apply(policy, job[0], job[1], stops), jobs))
    else:
        for s, g in jobs:
            _apply(policy, s, g, stops)


def rollout(policy: Policy, envs_and_tasks: Iterable[tuple[Environment, Any]], *, max_turns: int,
            max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
            stop_token_ids: list[int] | None = None, max_context: int | None = None,
            env_threads: int | None = None) -> list[Trajectory]:
    """Run every ``(env, task)`` episode to its end, all turns batched together.

    Each pair needs its own environment instance. An episode still running
    after ``max_turns`` assistant turns ends truncated. One failing episode is
    reported in its trajectory's ``error``; the others go on.
    """
    pairs = list(envs_and_tasks)
    if len({id(e) for e, _ in pairs}) != len(pairs):
        raise ValueError("rollout: each episode needs its own environment instance (make one per pair)")
    states = [start(policy, env, task, seed=None if seed is None else seed + i, max_turns=max_turns)
              for i, (env, task) in enumerate(pairs)]
    for turn in range(max_turns):
        if all(s.done for s in states):
            break
        advance(policy, states, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                seed=None if seed is None else seed * 7919 + turn, stop_token_ids=stop_token_ids,
                max_context=max_context, env_threads=env_threads)
    return [s.traj for s in states]


def write_jsonl(trajectories: Iterable[Trajectory], path: str | os.PathLike[str]) -> int:
    """Write one JSON object per trajectory; return how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Trajectories written by :func:`write_jsonl`."""
    with open(path, encoding="utf-8") as f:
        return [Trajectory.from_json(json.loads(line)) for line in f if line.strip()]
