"""RL budget probe (issue 32): the quickstart's recipe with 36 RL steps (3x its default), arms ``grpo``
and its compute-matched control ``rft``, seeds 0-2, evaluated as the quickstart evaluates (paired by
seed and task, unseen and held-out halves, blind baselines, reading report).

    python -m benchmarks.rl_budget [--out DIR] [--steps N] [--seeds 0 1 2]

Recorded: ``benchmarks/results/rl-budget-2026-11-25.{json,md}`` (RESULTS.md, "GRPO at 3x the
quickstart's RL budget"). Seeds whose results are in ``--out`` already are kept (the quickstart's
``resume``)."""

from __future__ import annotations

import argparse
import json
import time


def main(argv: list[str] | None = None) -> dict:
    from agents.quickstart.experiment import QuickstartConfig, run_quickstart

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/rl-budget")
    ap.add_argument("--steps", type=int, default=36)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=["grpo", "rft"])
    args = ap.parse_args(argv)
    cfg = QuickstartConfig(seeds=args.seeds, arms=args.arms, rl_steps=args.steps, workers=1,
                           output_dir=args.out)
    t = time.time()
    s = run_quickstart(cfg, log=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True))
    print(json.dumps({"seconds": round(time.time() - t, 1), "primary_comparison": s["primary_comparison"],
                      "primary": s["primary"]}, default=str))
    return s


if __name__ == "__main__":
    main()
