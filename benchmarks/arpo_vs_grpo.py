"""ARPO against GRPO at the same rollout budget, on the same tasks and seeds.

For each seed: the tiny model, the same SFT warm start, then N_STEPS of ARPO or
of GRPO (M trajectories per task either way), then the same evaluation.
Prints one JSON object: per algorithm, success rate on the trained tasks after
training, tool calls per solved task, tokens generated during training, and
prefill tokens recomputed per branch (ARPO only; measured with
``policy.prefill_tokens_computed()`` around each branch's first turn), plus
ARPO/GRPO ratios measured in this run.

    python benchmarks/arpo_vs_grpo.py [--seeds 0 1 2] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def run(algo_name: str, seed: int, args: argparse.Namespace) -> dict:
    import torch

    from agents.algorithms.arpo import ARPO, GRPO
    from agents.hf_policy import HFPolicy
    from agents.quickstart import split_tasks
    from agents.tiny import build_tiny_model
    from agents.trainer import Trainer

    sft_tasks, held = split_tasks(args.env, args.heldout_every)
    torch.manual_seed(seed)
    policy = HFPolicy(build_tiny_model(seed=seed), device="cpu")
    common = dict(updates=args.updates, kl_coef=args.kl_coef)
    algo = ARPO(M=args.M, N=args.N, k=args.k, **common) if algo_name == "ARPO" else GRPO(M=args.M, **common)
    tr = Trainer(policy, [args.env], algo, tasks=held, lr=args.lr, tasks_per_step=args.tasks_per_step,
                 max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, temperature=args.temperature,
                 seed=seed, show_progress=False)
    ev_kw = dict(samples=args.eval_samples, seed=10_000 + seed, temperature=args.eval_temperature)
    before = tr.evaluate(held, **ev_kw)["success"]  # as the quickstart does: the same RNG path, the same figures
    tr.sft(sft_tasks, epochs=args.sft_epochs, lr=args.sft_lr, batch_size=args.sft_batch_size, seed=seed)
    sft_success = tr.evaluate(held, **ev_kw)["success"]
    t0 = time.perf_counter()
    rows = tr.train(args.steps)
    train_s = time.perf_counter() - t0
    ev = tr.evaluate(held, **ev_kw)
    per_branch = [r["prefill_tokens_per_branch"] for r in rows if r["prefill_tokens_per_branch"] is not None]
    return {
        "before_success": before,
        "sft_success": sft_success,
        "success": ev["success"],
        "tool_calls_per_solved": ev["tool_calls_per_solved"],
        "train_tokens_generated": sum(r["tokens_generated"] for r in rows),
        "train_episodes": sum(r["episodes"] for r in rows),
        "train_success": statistics.mean(r["success"] for r in rows) if rows else 0.0,
        "branches": sum(r["branches"] for r in rows),
        "prefill_tokens_per_branch": statistics.mean(per_branch) if per_branch else None,
        "train_s": round(train_s, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from agents.quickstart import QuickstartConfig

    q = QuickstartConfig()  # defaults: the quickstart's own settings
    p.add_argument("--env", default=q.env)
    p.add_argument("--seeds", type=int, nargs="+", default=q.seeds)
    p.add_argument("--steps", type=int, default=q.rl_steps)
    p.add_argument("--M", type=int, default=q.M)
    p.add_argument("--N", type=int, default=q.N)
    p.add_argument("--k", type=int, default=q.k)
    p.add_argument("--updates", type=int, default=q.updates)
    p.add_argument("--kl-coef", type=float, default=q.kl_coef)
    p.add_argument("--tasks-per-step", type=int, default=q.tasks_per_step)
    p.add_argument("--max-new-tokens", type=int, default=q.max_new_tokens)
    p.add_argument("--max-turns", type=int, default=q.max_turns)
    p.add_argument("--lr", type=float, default=q.rl_lr)
    p.add_argument("--sft-epochs", type=int, default=q.sft_epochs)
    p.add_argument("--sft-lr", type=float, default=q.sft_lr)
    p.add_argument("--sft-batch-size", type=int, default=q.sft_batch_size)
    p.add_argument("--eval-samples", type=int, default=q.eval_samples)
    p.add_argument("--eval-temperature", type=float, default=q.eval_temperature)
    p.add_argument("--temperature", type=float, default=q.temperature)
    p.add_argument("--heldout-every", type=int, default=q.heldout_every)
    args = p.parse_args()
    out: dict = {"config": vars(args), "per_seed": {}}
    for name in ("GRPO", "ARPO"):
        out["per_seed"][name] = [run(name, s, args) for s in args.seeds]
        print(f"{name}: {out['per_seed'][name]}", file=sys.stderr)
    for name, runs in out["per_seed"].items():
        agg = {}
        for key in ("before_success", "sft_success", "success", "tool_calls_per_solved", "train_tokens_generated",
                    "prefill_tokens_per_branch", "train_s", "branches"):
            vals = [r[key] for r in runs if r[key] is not None]
            agg[key] = statistics.mean(vals) if vals else None
        out[name] = agg
    a, g = out["ARPO"], out["GRPO"]
    out["success_ratio"] = a["success"] / g["success"] if g["success"] else None
    out["success_diff"] = a["success"] - g["success"]
    # read the difference against this: the largest spread of final success between seeds of one algorithm
    out["seed_spread"] = max(max(r["success"] for r in runs) - min(r["success"] for r in runs)
                             for runs in out["per_seed"].values())
    out["tokens_generated_ratio"] = a["train_tokens_generated"] / g["train_tokens_generated"]
    out["train_s_ratio"] = a["train_s"] / g["train_s"]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
