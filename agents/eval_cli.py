"""``envfactory eval``: the command's arguments and runner (imported lazily by envfactory.cli)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["eval_args", "eval_run"]


def eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", required=True, help="environment name(s), comma-separated (e.g. FileSystem-v0,Bank-v0)")
    p.add_argument("--policy", required=True,
                   help="tiny | hf:PATH | vllm:PATH | openai:URL#MODEL | oracle | random | noop")
    p.add_argument("--episodes", type=int, default=10, help="episodes per environment (tasks in order, cycling)")
    p.add_argument("--runtime", default="local", help="local or docker")
    p.add_argument("--max-turns", type=int, default=None, help="assistant turns per episode (default: the env's)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="sampled tokens per assistant turn")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, metavar="DIR", help="write report.md, results.json and PNG plots here")
    p.add_argument("--trajectories", default=None, metavar="FILE", help="write model trajectories as JSONL here")


def eval_run(args: argparse.Namespace) -> tuple[int, Any, str]:
    from .eval import evaluate
    from .policy_spec import PolicySpecError

    names = [n.strip() for n in args.env.split(",") if n.strip()]
    trajs: list[Any] = []
    try:
        doc = evaluate(names, args.policy, episodes=args.episodes, runtime=args.runtime, max_turns=args.max_turns,
                       max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                       trajectories_out=trajs)
    except (KeyError, ValueError, PolicySpecError, ImportError) as exc:
        msg = str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)
        return 2, {"error": msg}, "error: " + msg
    if args.trajectories:
        from .rollout import write_jsonl

        doc["trajectories_file"] = args.trajectories
        write_jsonl(trajs, args.trajectories)
    lines = [f"{'environment':<22}{'episodes':>9}{'success':>9}  {'95% CI':<13}{'turns':>7}{'calls':>7}{'parse err':>10}"]
    for e in doc["environments"] + [{"name": "all", **doc["totals"]}]:
        lines.append(f"{e['name']:<22}{e['episodes']:>9}{e['success_rate']:>9.1%}  "
                     f"{e['ci95'][0]:.2f}-{e['ci95'][1]:.2f}    {e['mean_turns']:>7}{e['mean_tool_calls']:>7}"
                     f"{e['mean_parse_errors']:>10}")
    if args.report:
        from .eval_report import write_report

        doc["report"] = str(write_report(doc, args.report))
        lines.append(f"report: {doc['report']}")
    lines.append(f"policy {doc['policy']}, {doc['seconds']}s")
    failed = doc["totals"]["failed_episodes"]
    return (1 if failed else 0), doc, "\n".join(lines)
