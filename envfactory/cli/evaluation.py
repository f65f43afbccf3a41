"""``envfactory eval-team``: teams of policies on the multi-agent environments (JSON + markdown report)."""

from __future__ import annotations

import argparse

from . import Command, Result



def _eval_team_args(p: argparse.ArgumentParser) -> None:
    from ..evaluation.eval import POLICY_GROUP

    p.add_argument("names", nargs="*", help="multi-agent environments (default: all)")
    p.add_argument("--policies", default="oracle,expert,random,noop,tiny",
                   help="comma-separated: oracle, expert (each environment's strong scripted policy; rated "
                        "in competitive games), env:<key> (an environment's own policy, e.g. env:naive), random, "
                        "noop, claim, and the model policies installed "
                        f"packages announce in the '{POLICY_GROUP}' entry-point group (agents: tiny, "
                        "hf:<model path or id>)")
    p.add_argument("--episodes", type=int, default=2, help="episodes per task for stochastic policies")
    p.add_argument("--modes", default="aec,parallel", help="aec, parallel or both")
    p.add_argument("--model-tasks", type=int, default=2, help="tasks per environment for model policies")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per turn for model policies")
    p.add_argument("--out", default="team_eval", help="folder for team_eval.json, team_eval.md and plots/")


def _eval_team_run(args: argparse.Namespace) -> Result:
    from ..evaluation.eval import run_and_report

    return run_and_report(args.names or None, [p for p in args.policies.split(",") if p], out=args.out,
                          episodes=args.episodes, modes=[m for m in args.modes.split(",") if m],
                          model_tasks=args.model_tasks, max_new_tokens=args.max_new_tokens)


EVAL_TEAM = Command("evaluate teams of policies on the multi-agent environments (JSON + markdown report)",
                    _eval_team_args, _eval_team_run,
                    "envfactory eval-team MultiSupport-v0 --policies oracle,random,noop --episodes 1\n"
                    "envfactory eval-team --policies oracle,expert --out team_eval --json")
