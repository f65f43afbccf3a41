"""All five arms (GRPO, ARPO, ARPO β = 0, and the controls RFT and shuffled-reward GRPO),
paired by seed and task, on FindLight-v3 where the tiny model reads.

Runs the quickstart's pipeline (:func:`agents.quickstart.experiment.run_quickstart`) with every arm:
per seed, one reader-SFT checkpoint that every arm starts from, the same RL tasks and
rollout budget (M per task, the same steps), and the same evaluation on both halves of
the evaluation split. Prints one JSON object: per arm, success with its CI, sampled and
trained tokens and training wall-clock; every pairwise difference in success (paired
two-way bootstrap, Holm-corrected over the family), and in sampled tokens and wall-clock
(paired by seed). Not in CI. Measured 2026-12-02 with the KL term on, a fresh 2-core machine: 7,821 s
(130 min) cold, pretraining and all ten readers built in the run (about 12.5 min of one core each,
two at once); the arms took 5,592 s of one core (about 50 min with every reader cached). KL off,
2026-11-29: 48 min with five readers built (figures: benchmarks/results/RESULTS.md).

``--eval-split dev`` evaluates on ``--eval-tasks`` fresh tasks of the training distribution instead
(:func:`agents.quickstart.experiment.eval_tasks`): choose variants there (the diagnostic arms), and
measure only the chosen one on the evaluation split.

    python benchmarks/arpo_vs_grpo.py [--seeds 0 1 2 3 4 5 6 7 8 9] [--steps 12] [--eval-split dev]
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    from agents.quickstart.experiment import ARMS, DIAGNOSTICS, SPLITS, QuickstartConfig, run_quickstart
    from agents.stats import holm, paired_bootstrap

    q = QuickstartConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default=q.env)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--steps", type=int, default=q.rl_steps)
    p.add_argument("--arms", nargs="+", default=[a for a in ARMS if a not in DIAGNOSTICS], choices=ARMS)
    p.add_argument("--eval-tasks", type=int, default=q.eval_tasks)
    p.add_argument("--eval-samples", type=int, default=q.eval_samples)
    p.add_argument("--eval-split", default=q.eval_split, choices=SPLITS,
                   help="dev: fresh training-distribution tasks, to choose variants on (not the eval split)")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--device", default=q.device)
    p.add_argument("--out", default="runs/arpo_vs_grpo")
    args = p.parse_args()
    cfg = QuickstartConfig(env=args.env, seeds=args.seeds, arms=args.arms, rl_steps=args.steps,
                           eval_tasks=args.eval_tasks, eval_samples=args.eval_samples, workers=args.workers,
                           eval_split=args.eval_split,
                           device=args.device, output_dir=args.out)
    s = run_quickstart(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
    rows = s["per_seed"]
    per_arm = {a: {"success": {h: s["success"][h][a] for h in s["success"]}, **s["arms_training"][a]}
               for a in cfg.arms}
    cost = {}
    for i, a in enumerate(cfg.arms):
        for b in cfg.arms[i + 1:]:
            for key in ("tokens_sampled", "train_seconds"):
                cost[f"{a}_minus_{b}/{key}"] = paired_bootstrap([[r["arms"][b][key]] for r in rows],
                                                                [[r["arms"][a][key]] for r in rows])
    success = {k: v for k, v in s["compare"].items() if "before" not in k}
    print(json.dumps({"env": cfg.env, "seeds": s["seeds"], "seconds": s["seconds"], "commit": s["commit"],
                      "blind": s["blind"], "per_arm": per_arm, "success_diff": success,
                      "success_holm": holm({k: v["p"] for k, v in success.items()}),
                      "cost_diff": cost, "cost_holm": holm({k: v["p"] for k, v in cost.items()}),
                      "reading": s["reading"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
