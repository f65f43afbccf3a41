"""Checking the token-in/token-out invariant of a trajectory.

Used by the tests of every backend, and handy before training on trajectories
from somewhere else (e.g. read back from JSONL).
"""

from __future__ import annotations

from typing import Any, Sequence

from agents.policies.chat_render import ChatRenderer
from agents.rollout import Trajectory

__all__ = ["invariant_problems"]


def invariant_problems(traj: Trajectory, tokenizer: Any,
                       sampled: Sequence[Sequence[int]] | None = None) -> list[str]:
    """What is wrong with ``traj`` as a token-in/token-out sample (empty when nothing is).

    Checks: record lengths agree; ``loss_mask`` is 1 exactly on the turn spans;
    logprobs/entropies are 0 off the spans; decoding ``prompt_ids + response_ids``
    equals the chat template's rendering of ``traj.messages`` with ``traj.tools``;
    and, when ``sampled`` (the ids the backend returned for each turn, in order)
    is given, each turn span holds exactly those ids.
    """
    problems = []
    n = len(traj.response_ids)
    for name in ("loss_mask", "logprobs", "entropies"):
        if len(getattr(traj, name)) != n:
            problems.append(f"{name} has {len(getattr(traj, name))} entries for {n} response ids")
    if problems:
        return problems
    in_span = [0] * n
    for a, b in traj.turn_spans:
        for i in range(a, b):
            in_span[i] = 1
    if list(traj.loss_mask) != in_span:
        problems.append("loss_mask is not 1 exactly on the sampled turn spans")
    if any(traj.logprobs[i] != 0.0 or traj.entropies[i] != 0.0 for i in range(n) if not in_span[i]):
        problems.append("inserted ids carry nonzero logprobs/entropies")
    if sampled is not None:
        spans = [list(traj.response_ids[a:b]) for a, b in traj.turn_spans]
        if [list(s) for s in sampled] != spans:
            problems.append(f"turn spans {spans!r} differ from the sampled ids {[list(s) for s in sampled]!r}")
    if traj.error is not None:  # a failed episode is reported, not a training sample
        return problems
    r = ChatRenderer(tokenizer)
    ended = traj.terminated or traj.truncated
    text = r.decode(list(traj.prompt_ids) + list(traj.response_ids))
    rendered = r.render(traj.messages, traj.tools, add_generation_prompt=not ended)
    if traj.truncated and text != rendered:  # cut for context after the next assistant header
        rendered = r.render(traj.messages, traj.tools, add_generation_prompt=True)
    if text != rendered:
        k = next((i for i, (x, y) in enumerate(zip(text, rendered)) if x != y), min(len(text), len(rendered)))
        problems.append(f"decoded sample differs from the rendered conversation at char {k}: "
                        f"{text[k:k + 60]!r} vs {rendered[k:k + 60]!r}")
    return problems
