"""Evaluation of one policy on single-agent environments (``envfactory eval``).

``evaluate`` plays ``episodes`` episodes per environment (the tasks of one split,
by default ``eval``, the tasks training never sees; in order, cycling) and returns a JSON document: per environment the success rate with a
95% Wilson interval, mean turns, tool calls, tool errors and parse errors per
episode, and episodes that failed (with their error); every episode's row is
kept too. Scripted baselines (and any policy object with ``act(episode, agent,
seed)``) play through :func:`envfactory.checks.scripted.play`, exactly as teams do;
models play through the batched token-in/token-out :func:`agents.rollout.rollout`.
The rows, their summary and the report (:func:`envfactory.evaluation.report.write_report`)
are the team evaluation's (:mod:`envfactory.evaluation.eval`).

An environment imported from a benchmark may bring the benchmark's own verdict on an episode
(``spec.metadata["suite_judge"] = (label, judge)``, ``judge(task_id, messages) -> bool`` over the
episode's transcript): each row then holds ``suite_valid`` and the environment's entry a
``suite`` summary (how many episodes the benchmark calls valid), besides envfactory's success. The
BFCL environments bring BFCL's ``multi_turn_checker`` (``environments/bfcl.py``).
"""

from __future__ import annotations

import time
from typing import Any

import envfactory
from envfactory.evaluation.eval import episode_row, summarize

from agents.policies.policy_spec import load_policy
from agents.rollout import Trajectory, rollout

__all__ = ["evaluate"]


def _row(t: Trajectory) -> dict[str, Any]:
    return {"env": t.env_name, "task": t.task_id, "success": t.success, "reward": t.reward, "turns": t.turns,
            "tool_calls": t.tool_calls, "tool_errors": t.tool_errors, "parse_errors": t.parse_errors,
            "truncated": t.truncated, "error": t.error, "sampled_tokens": sum(t.loss_mask)}


def _suite_judged(row: dict[str, Any], judge: Any, messages: list[dict[str, Any]] | None) -> dict[str, Any]:
    """``row`` with the benchmark's verdict on the episode (``suite_valid``; ``False`` for an
    episode that failed before it ended)."""
    if judge is not None:
        row["suite_valid"] = bool(not row.get("error") and messages is not None and judge[1](row["task"], messages))
    return row


def _suite_summary(judge: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from envfactory.evaluation.eval import wilson

    n, k = len(rows), sum(bool(r.get("suite_valid")) for r in rows)
    return {"suite": {"name": judge[0], "valid": k, "episodes": n, "rate": round(k / n, 4) if n else None,
                      "ci95": wilson(k, n),
                      "agree": sum(bool(r.get("suite_valid")) == bool(r["success"]) for r in rows)}}


def evaluate(env_names: list[str], policy: str | Any, *, episodes: int, runtime: str = "local",
             max_turns: int | None = None, max_new_tokens: int = 256, temperature: float = 0.7,
             top_p: float = 1.0, seed: int = 0, trajectories_out: list[Trajectory] | None = None,
             split: str | None = "eval") -> dict[str, Any]:
    """Evaluate ``policy`` (a spec string, a :class:`~agents.policies.policy.Policy` or a scripted policy) on
    ``episodes`` episodes per environment.

    Args:
        max_turns: Assistant turns per episode (default: each environment's own limit).
        trajectories_out: When given, model trajectories are appended to it (for JSONL export).
        split: The tasks played: ``"eval"`` (default: those no training split holds, see
            :meth:`envfactory.ToolEnvSpec.split`), ``"rl"``, ``"sft"``, or ``None`` for all.

    Raises:
        KeyError: an unknown environment.
        ValueError: ``episodes`` < 1, a team environment, an unknown split, or an
            environment with no task in ``split``.
    """
    if episodes < 1:
        raise ValueError("episodes must be at least 1")
    specs = [envfactory.spec(n) for n in env_names]  # KeyError names an unknown environment
    multi = [s.name for s in specs if getattr(s, "multi_agent", False)]
    if multi:
        raise ValueError(f"{', '.join(multi)}: evaluate team environments on their own (envfactory eval --env "
                         "with only team environments, or envfactory eval-team)")
    pools = {s.name: (s.get_tasks() if split is None else s.tasks_in(split)) for s in specs}  # ValueError: a bad split
    empty = [n for n, ts in pools.items() if not ts]
    if empty:
        raise ValueError(f"{', '.join(empty)}: no task in the {split!r} split (pass split=None / --split all)")
    label = policy if isinstance(policy, str) else type(policy).__name__
    t0 = time.perf_counter()
    agent = load_policy(policy) if isinstance(policy, str) else policy
    load_s = time.perf_counter() - t0
    scripted = not hasattr(agent, "generate")  # act(episode, agent, seed): the same play() as teams
    rows: list[dict[str, Any]] = []
    try:
        for s in specs:
            tasks = pools[s.name]
            chosen = [tasks[i % len(tasks)] for i in range(episodes)]
            judge = s.metadata.get("suite_judge")
            if scripted:
                ep = envfactory.make(s.name, runtime=runtime, max_turns=max_turns)
                try:
                    for i, t in enumerate(chosen):
                        row = episode_row(ep, agent, t, seed=seed + i)
                        rows.append(_suite_judged(row, judge, None if row["error"] else ep.transcript()))
                finally:
                    ep.close()
                continue
            envs = [envfactory.make(s.name, runtime=runtime, max_turns=max_turns) for _ in chosen]
            try:
                trajs = [r.trajectory for r in rollout(agent, list(zip(envs, chosen)), max_new_tokens=max_new_tokens,
                                                       temperature=temperature, top_p=top_p, seed=seed)]
            finally:
                for e in envs:
                    e.close()
            rows += [_suite_judged(_row(t), judge, t.messages) for t in trajs]
            if trajectories_out is not None:
                trajectories_out.extend(trajs)
    finally:
        if not scripted and isinstance(policy, str):
            agent.close()
    per_env = []
    for s in specs:
        mine = [r for r in rows if r["env"] == s.name]
        judge = s.metadata.get("suite_judge")
        per_env.append({"name": s.name, "domain": s.domain, **summarize(mine),
                        **(_suite_summary(judge, mine) if judge is not None else {})})
    return {"policy": label, "runtime": runtime, "split": split or "all", "episodes_per_env": episodes,
            "temperature": temperature,
            "environments": per_env, "totals": summarize(rows), "episodes": rows,
            "policy_load_s": round(load_s, 2), "seconds": round(time.perf_counter() - t0, 2)}
