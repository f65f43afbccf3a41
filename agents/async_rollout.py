"""Rollouts without a lock-step barrier: the policy plays whichever episodes are ready.

:func:`agents.rollout.rollout` plays in ticks: the policy generates for every live episode,
then every episode steps, and the next tick waits for the slowest tool of the batch.
:func:`arollout` keeps every episode in flight on one event loop instead. Each episode steps
through its async twin (``await episode.aio.step(text)``, see :mod:`envfactory.env`); as soon as
a step returns, its episode is *ready*, and the policy is called with the batch of episodes
that are ready at that moment, while slow tools of the others are still running. One
``generate`` runs at a time (a model is one device); while it runs, steps go on finishing.

The records are the same as the synchronous loop's: one :class:`~agents.rollout.Rollout` per
``(episode, task)`` with a :class:`~agents.rollout.Trajectory` per role, built by the same
code (rendering, masks, closing markup, rewards), so the trainer takes them unchanged. A
deterministic policy (a scripted one, greedy decoding) gives exactly the trajectories of
:func:`~agents.rollout.rollout`: each episode's seed on its k-th turn is the one the
synchronous loop gives its k-th tick. A sampled policy draws differently, because which
episodes share a batch depends on which tools finished first.

Failures stay per episode, as in the synchronous loop: a failing reset, backend or step
ends that rollout with :attr:`~agents.rollout.Rollout.error`; a world that overruns its
deadline or is lost ends its episode as truncated (the episode's own rule).
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from agents.rollout import Rollout, Team, _generate, _new, _render_next

__all__ = ["arollout", "rollout_async"]


async def _astart(ro: Rollout, task: Any, seed: int | None, max_new_tokens: int, max_context: int | None) -> Rollout:
    try:
        await ro.env.aio.reset(task, seed=seed)
        ro._opened(max_new_tokens, max_context)
    except Exception as exc:  # a crashed container must not kill the batch
        ro.fail(f"reset failed: {type(exc).__name__}: {exc}")
    return ro


async def _aplay(s: Rollout, turns: dict[str, Any], stops: dict[str, set[int]], max_new_tokens: int,
                 max_context: int | None) -> Rollout:
    """:func:`agents.rollout._play` with the episode's step awaited."""
    try:
        split, texts, acting = s._texts(turns, stops)
        s._record(turns, split, await s._astep(acting, texts))
    except Exception as exc:
        s.fail(f"environment step failed: {type(exc).__name__}: {exc}")
        return s
    _render_next(s, max_new_tokens, max_context)
    return s


async def arollout(team: Team, envs_and_tasks: Iterable[tuple[Any, Any]], *, max_new_tokens: int = 256,
                   temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None, mode: str = "aec",
                   tokenizer: Any = None, stop_token_ids: list[int] | None = None, max_context: int | None = None,
                   max_batch: int | None = None, rubric: Any = None,
                   rubric_as_reward: bool = False) -> list[Rollout]:
    """Play every ``(episode, task)`` to its end with ``team``, every episode in flight at once
    (see the module docstring); the arguments are :func:`agents.rollout.rollout`'s.

    Args:
        max_batch: The most episodes one ``generate`` call takes (default: every ready one).

    Returns:
        The rollouts, in the order of ``envs_and_tasks``.
    """
    pairs = list(envs_and_tasks)
    if len({id(e) for e, _ in pairs}) != len(pairs):
        raise ValueError("arollout: each episode needs its own environment instance (make one per pair)")
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    states = [_new(team, env, task, seed=None if seed is None else seed + i, mode=mode, tokenizer=tokenizer,
                   rubric=rubric, rubric_as_reward=rubric_as_reward) for i, (env, task) in enumerate(pairs)]
    await asyncio.gather(*(_astart(s, task, s_seed, max_new_tokens, max_context)
                           for s, (_, task), s_seed in zip(states, pairs,
                                                           (None if seed is None else seed + i
                                                            for i in range(len(pairs))))))
    ticks = dict.fromkeys(map(id, states), 0)  # each rollout's ticks so far: its seed, as the sync loop's tick

    def tick_seed(s: Rollout) -> int | None:
        return None if seed is None else seed * 7919 + ticks[id(s)]

    ready = [s for s in states if not s.done]
    stepping: set[asyncio.Task[Rollout]] = set()
    while ready or stepping:
        if ready:
            batch, ready = (ready, []) if max_batch is None else (ready[:max_batch], ready[max_batch:])
            # generate on a thread: meanwhile the loop keeps collecting finished steps
            turns = await asyncio.to_thread(_generate, batch, [tick_seed(s) for s in batch],
                                            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                            stop_token_ids=stop_token_ids)
            for s in batch:
                ticks[id(s)] += 1
            for s, t, st in turns:
                stepping.add(asyncio.create_task(_aplay(s, t, st, max_new_tokens, max_context)))
        if stepping:  # the steps that are done; wait for one only when no episode is ready
            done, stepping = await asyncio.wait(stepping, timeout=0 if ready else None,
                                                return_when=asyncio.FIRST_COMPLETED)
            ready += [s for s in (t.result() for t in done) if not s.done]
    return states


def rollout_async(team: Team, envs_and_tasks: Iterable[tuple[Any, Any]], **kwargs: Any) -> list[Rollout]:
    """:func:`arollout` on an event loop of its own, for synchronous callers (the trainer's
    drop-in for :func:`agents.rollout.rollout`). Raises ``RuntimeError`` inside a running loop:
    ``await arollout(...)`` there."""
    return asyncio.run(arollout(team, envs_and_tasks, **kwargs))
