"""Evaluation: run a policy (or a scripted baseline) on environments' tasks and summarise.

``evaluate`` plays ``episodes`` episodes per environment (tasks in order,
cycling) and returns a JSON document: per environment the success rate with a
95% Wilson interval, mean turns, tool calls, tool errors and parse errors per
episode, and episodes that failed (with their error); every episode's row is
kept too. :mod:`agents.eval_report` turns it into a markdown report with plots.
"""

from __future__ import annotations

import math
import time
from typing import Any

import envfactory
from envfactory.agents_scripted import noop_actions, oracle_actions, random_actions

from .policy import Policy
from .policy_spec import load_policy
from .rollout import Trajectory, rollout

__all__ = ["evaluate", "wilson_interval", "summarise"]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for ``z = 1.96``)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _scripted_episode(agent: str, env: envfactory.Environment, task: Any, seed: int) -> dict[str, Any]:
    """Play a scripted baseline; the same row shape as a model episode."""
    row: dict[str, Any] = {"env": env.spec.name, "task": task.id, "success": False, "reward": 0.0, "turns": 0,
                           "tool_calls": 0, "tool_errors": 0, "parse_errors": 0, "truncated": False, "error": None}
    try:
        env.reset(task)
        actions = {"oracle": lambda: oracle_actions(task), "noop": lambda: noop_actions(task),
                   "random": lambda: random_actions(task, env.tool_schemas(), seed=seed)}[agent]()
        for action in list(actions) + [""]:
            res = env.step(action)
            row["turns"] += 1
            for k in ("tool_calls", "tool_errors", "parse_errors"):
                row[k] = int(res.info.get(k, 0))
            if res.done:
                row.update(success=bool(res.info.get("success")), reward=float(res.reward), truncated=res.truncated)
                break
    except Exception as exc:  # a crashed environment fails its episode only
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def _row(t: Trajectory) -> dict[str, Any]:
    return {"env": t.env_name, "task": t.task_id, "success": t.success, "reward": t.reward, "turns": t.turns,
            "tool_calls": t.tool_calls, "tool_errors": t.tool_errors, "parse_errors": t.parse_errors,
            "truncated": t.truncated, "error": t.error, "sampled_tokens": sum(t.loss_mask)}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Success rate, its Wilson interval and per-episode means of a set of episode rows."""
    n = len(rows)
    k = sum(1 for r in rows if r["success"])
    lo, hi = wilson_interval(k, n)
    mean = (lambda key: round(sum(r[key] for r in rows) / n, 3) if n else 0.0)
    return {"episodes": n, "successes": k, "success_rate": round(k / n, 4) if n else 0.0,
            "ci95": [round(lo, 4), round(hi, 4)], "mean_turns": mean("turns"), "mean_tool_calls": mean("tool_calls"),
            "mean_tool_errors": mean("tool_errors"), "mean_parse_errors": mean("parse_errors"),
            "failed_episodes": sum(1 for r in rows if r["error"])}


def evaluate(env_names: list[str], policy: str | Policy, *, episodes: int, runtime: str = "local",
             max_turns: int | None = None, max_new_tokens: int = 256, temperature: float = 0.7,
             top_p: float = 1.0, seed: int = 0, trajectories_out: list[Trajectory] | None = None) -> dict[str, Any]:
    """Evaluate ``policy`` (a spec string or a :class:`Policy`) on ``episodes`` episodes per environment.

    Args:
        max_turns: Assistant turns per episode (default: each environment's own limit).
        trajectories_out: When given, model trajectories are appended to it (for JSONL export).
    """
    if episodes < 1:
        raise ValueError("episodes must be at least 1")
    specs = [envfactory.spec(n) for n in env_names]  # KeyError names an unknown environment
    multi = [s.name for s in specs if getattr(s, "multi_agent", False)]
    if multi:
        raise ValueError(f"{', '.join(multi)}: multi-agent environments are not evaluated here; "
                         "pass single-agent environments (envfactory list shows which are which)")
    label = policy if isinstance(policy, str) else type(policy).__name__
    t0 = time.perf_counter()
    agent = load_policy(policy) if isinstance(policy, str) else policy
    load_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    try:
        for s in specs:
            tasks = s.get_tasks()
            chosen = [tasks[i % len(tasks)] for i in range(episodes)]
            if isinstance(agent, str):
                env = envfactory.make(s.name, runtime=runtime, max_turns=max_turns)
                try:
                    rows += [_scripted_episode(agent, env, t, seed + i) for i, t in enumerate(chosen)]
                finally:
                    env.close()
                continue
            envs = [envfactory.make(s.name, runtime=runtime, max_turns=max_turns) for _ in chosen]
            try:
                trajs = [r.trajectory for r in rollout(agent, list(zip(envs, chosen)), max_new_tokens=max_new_tokens,
                                                       temperature=temperature, top_p=top_p, seed=seed)]
            finally:
                for e in envs:
                    e.close()
            rows += [_row(t) for t in trajs]
            if trajectories_out is not None:
                trajectories_out.extend(trajs)
    finally:
        if not isinstance(agent, str) and isinstance(policy, str):
            agent.close()
    per_env = [{"name": s.name, "domain": s.domain, **summarise([r for r in rows if r["env"] == s.name])}
               for s in specs]
    return {"policy": label, "runtime": runtime, "episodes_per_env": episodes, "temperature": temperature,
            "environments": per_env, "totals": summarise(rows), "episodes": rows,
            "policy_load_s": round(load_s, 2), "seconds": round(time.perf_counter() - t0, 2)}
