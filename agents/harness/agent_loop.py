"""Training any agent loop: GRPO steps on episodes an unchanged loop plays through a :class:`ChatEndpoint`.

The loop is a plain function ``fn(base_url, env)``: it makes an ``openai.OpenAI(base_url=...)``
client (any ``api_key``), calls ``chat.completions.create`` with ``env``'s messages and tool
schemas, runs the returned ``tool_calls`` on ``env`` (``env.step(message)``, or any other way),
and returns when it is done. Each call is served by the policy being trained and recorded
(:mod:`agents.harness.endpoint`); one step:

    for each chosen task:  G = algorithm.M runs of fn, each on its own fork of the task's episode,
                           each with its own session URL (all runs of the step at once, so their
                           requests are sampled in batches)
    reward of a run     =  what fn returned, if a number; else the episode's reward (judged on its
                           final state when fn stopped before its end); the trainer's reward_fn wins
    Â                   =  algorithm.advantages(rewards of the task's G runs)
    samples             =  every chain of calls of a run (its trajectory) with its run's Â on each token
    update              =  the trainer's clipped-loss update (Trainer._update), weights pushed as usual

ARPO's branching needs to fork a rollout mid-turn, which an opaque loop does not allow: an ARPO
algorithm trains here as GRPO (its advantages, clip, KL and updates; no branches).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from agents.harness.endpoint import ChatEndpoint
from agents.rollout import Trajectory, env_version

__all__ = ["AgentLoop", "Run", "run_agent_loop", "advantaged"]

AgentLoop = Callable[[str, Any], Any]  # fn(base_url, env) -> None | reward


@dataclass
class Run:
    """One run of the loop on one task: its episode, reward and recorded trajectories."""

    group: int
    env_name: str
    task_id: str
    session: str
    reward: float = 0.0
    success: bool = False
    error: str | None = None
    seconds: float = 0.0
    trajectories: list[Trajectory] = field(default_factory=list)


def _play(fn: AgentLoop, endpoint: ChatEndpoint, run: Run, env: Any) -> Run:
    t0 = time.perf_counter()
    try:
        returned = fn(endpoint.session_url(run.session), env)
        if isinstance(returned, (int, float)) and not isinstance(returned, bool):
            run.reward, run.success = float(returned), float(returned) > 0
        elif env.done:
            run.reward, run.success = float(env.rewards.get(env.agents[0], 0.0)), bool(env.success)
        else:  # the loop stopped before the episode ended: judged as at the turn limit
            success, rewards = env.status.judge()
            run.reward, run.success = float(rewards.get(env.agents[0], 0.0)), bool(success)
    except Exception as exc:  # a failing loop fails its run only
        while getattr(exc, "exceptions", None):  # an async loop's task group: say what failed inside
            exc = exc.exceptions[0]  # type: ignore[attr-defined]
        run.error = f"{type(exc).__name__}: {exc}"
    finally:
        env.close()
    run.seconds = time.perf_counter() - t0
    session = endpoint.pop(run.session)
    run.trajectories = session.trajectories(env_name=run.env_name, task_id=run.task_id, reward=run.reward,
                                            success=run.success)
    version = env_version(env.spec)
    for t in run.trajectories:
        t.agent, t.error, t.env_version = env.agents[0], run.error, version
    return run


def run_agent_loop(fn: AgentLoop, endpoint: ChatEndpoint, pairs: list[tuple[Any, str]], runs_per_task: int,
                   *, prefix: str = "run", threads: int = 32) -> list[Run]:
    """Play ``fn`` ``runs_per_task`` times on each ``(episode, task id)``, each run on its own fork
    of the episode reset on the task and with its own session of ``endpoint``; all runs at once
    (``threads`` at most). Returns the runs, task by task."""
    jobs: list[tuple[Run, Any]] = []
    for gi, (env, task_id) in enumerate(pairs):
        env.reset(task_id)
        for j in range(runs_per_task):
            run = Run(gi, env.spec.name, env.task.id, f"{prefix}-{gi}-{j}")
            jobs.append((run, env.fork()))
    with ThreadPoolExecutor(max(1, min(threads, len(jobs)))) as pool:
        return list(pool.map(lambda job: _play(fn, endpoint, *job), jobs))


def advantaged(runs: list[Run], algo: Any, reward: Callable[[Run], float]) -> list[tuple[Trajectory, float, bool]]:
    """``(trajectory, advantage, signal)`` for every trajectory worth training on: each task's runs
    (``Run.group``) are a group, ``algo.advantages`` of their ``reward(run)`` each run's advantage.
    A group whose advantages are all zero is left out unless ``algo.kl_coef`` keeps it for the KL
    term (``signal`` false); failed runs and chains with no sampled token never count."""
    out = []
    for gi in sorted({r.group for r in runs}):
        group = [r for r in runs if r.group == gi]
        adv = algo.advantages([reward(r) for r in group])
        if not any(adv) and not algo.kl_coef:
            continue  # equal rewards: no signal
        out += [(t, a, any(adv)) for r, a in zip(group, adv) if r.error is None
                for t in r.trajectories if sum(t.loss_mask)]
    return out
