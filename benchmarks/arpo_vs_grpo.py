"""GRPO, ARPO and ARPO with β = 0 (random branching), paired by seed and task.

Runs the quickstart's pipeline (:func:`agents.quickstart.run_quickstart`) with
all three RL arms: for each seed, one SFT checkpoint that every arm starts
from, the same RL tasks (rl split) and rollout budget (M per task), and the same
evaluation on evaluation-split tasks RL never saw. Prints one JSON object: per
arm, final evaluation success with its bootstrap CI, tokens actually sampled
during training, tool calls per solved task and wall-clock; and every pairwise
difference with its paired two-way (seed x task) bootstrap 95% CI. Not in CI.

    python benchmarks/arpo_vs_grpo.py [--seeds 0 1 2 3 4 5 6 7 8 9] [--steps 12] [--env FindLight-v1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def main() -> int:
    from agents.quickstart import ARMS, QuickstartConfig, run_quickstart
    from agents.stats import paired_bootstrap

    q = QuickstartConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default=q.env)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--steps", type=int, default=q.rl_steps)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--eval-tasks", type=int, default=q.eval_tasks)
    p.add_argument("--eval-samples", type=int, default=q.eval_samples)
    p.add_argument("--out", default="runs/arpo_vs_grpo")
    args = p.parse_args()
    cfg = QuickstartConfig(env=args.env, seeds=args.seeds, arms=args.arms, rl_steps=args.steps,
                           eval_tasks=args.eval_tasks, eval_samples=args.eval_samples, output_dir=args.out)
    s = run_quickstart(cfg, log=lambda m: print(m, file=sys.stderr))
    per_arm = {}
    for arm in cfg.arms:
        rows = s["per_seed"]
        solved = [r[f"{arm}_tool_calls_per_solved"] for r in rows if r[f"{arm}_tool_calls_per_solved"] is not None]
        per_arm[arm] = {
            "success": s["success_ci"][arm],
            "tokens_sampled_mean": statistics.mean(r[f"{arm}_tokens_sampled"] for r in rows),
            "tool_calls_per_solved_mean": statistics.mean(solved) if solved else None,
            "train_seconds_mean": statistics.mean(r[f"{arm}_seconds"] for r in rows),
            "auc": s["auc"][arm],
        }
    # the other measures, paired by seed (one value per seed and arm)
    per_seed_diff = {}
    for i, a in enumerate(cfg.arms):
        for b in cfg.arms[i + 1:]:
            for key in ("tokens_sampled", "seconds", "tool_calls_per_solved"):
                pairs = [(r[f"{b}_{key}"], r[f"{a}_{key}"]) for r in s["per_seed"]
                         if r[f"{a}_{key}"] is not None and r[f"{b}_{key}"] is not None]
                if pairs:
                    per_seed_diff[f"{a}_minus_{b}_{key}"] = paired_bootstrap([[x] for x, _ in pairs],
                                                                             [[y] for _, y in pairs])
    print(json.dumps({"env": cfg.env, "seeds": cfg.seeds, "per_arm": per_arm, "compare": s["compare"],
                      "compare_per_seed": per_seed_diff,
                      "seconds": s["seconds"], "report": f"{args.out}/report.md"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
