"""The ``agents`` package's ``envfactory`` subcommands: ``eval``, ``quickstart``, ``train``, ``pretrain``.

They reach the core CLI through the entry-point group ``envfactory.commands``
(see ``pyproject.toml``), so ``envfactory`` itself never imports ``agents``.
This module is loaded for ``envfactory --help``, so it must stay cheap: every
heavy import (torch, transformers, the rest of ``agents``) happens inside a
runner, when its command actually runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from envfactory.cli import Command

__all__ = ["EVAL", "QUICKSTART", "TRAIN", "PRETRAIN"]

Result = tuple[int, Any, str]


# -- eval ---------------------------------------------------------------------
def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", required=True,
                   help="environment name(s), comma-separated (e.g. FileSystem-v0,Bank-v0); team environments "
                        "(or 'multi': all of them) get the team evaluation")
    p.add_argument("--policy", required=True,
                   help="tiny | hf:PATH | vllm:PATH | openai:URL#MODEL | oracle | random | noop | claim "
                        "(teams: comma-separated, see 'envfactory eval-team --help')")
    p.add_argument("--episodes", type=int, default=10,
                   help="episodes per environment (tasks in order, cycling); teams: per task, stochastic policies")
    p.add_argument("--runtime", default="local", help="local or docker")
    p.add_argument("--split", default="eval", choices=["eval", "rl", "sft", "all", "heldout-family", "heldout-kind",
                                                            "heldout-phrasing"],
                   help="which tasks to play (single-agent environments): the eval split training never sees "
                        "(default), a training split, all, or the eval tasks of the held-out families, kinds or "
                        "phrasings")
    p.add_argument("--max-turns", type=int, default=None, help="assistant turns per episode (default: the env's)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="sampled tokens per assistant turn")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, metavar="DIR",
                   help="write report.md, results.json and PNG plots here (teams: team_eval.md/json, SVG plots)")
    p.add_argument("--trajectories", default=None, metavar="FILE",
                   help="write model trajectories to this .jsonl or .parquet file (the dataset format of "
                        "--save-trajectories)")
    p.add_argument("--save-trajectories", default=None, metavar="DIR",
                   help="write model trajectories as a dataset here (trajectories.jsonl, or .parquet with "
                        "--trajectory-format parquet; datasets.load_dataset reads it, Trainer.sft trains on it)")
    p.add_argument("--trajectory-format", default="jsonl", choices=["jsonl", "parquet"])


def _eval_run(args: argparse.Namespace) -> Result:
    from envfactory.evaluation.eval import run_and_report, team_names

    team = team_names(args.env)  # team environments (or "multi"): the team evaluation
    if team is not None:
        return run_and_report(team, [p for p in args.policy.split(",") if p], out=args.report or "team_eval",
                              episodes=args.episodes, max_new_tokens=args.max_new_tokens, runtime=args.runtime,
                              max_turns=args.max_turns)
    from agents.eval import evaluate
    from agents.policies.policy_spec import PolicySpecError

    names = [n.strip() for n in args.env.split(",") if n.strip()]
    if args.trajectories and not args.trajectories.endswith((".jsonl", ".parquet")):
        msg = f"--trajectories {args.trajectories}: name a .jsonl or .parquet file (or use --save-trajectories DIR)"
        return 2, {"error": msg}, "error: " + msg
    trajs: list[Any] = []
    try:
        doc = evaluate(names, args.policy, episodes=args.episodes, runtime=args.runtime, max_turns=args.max_turns,
                       max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                       trajectories_out=trajs, split=None if args.split == "all" else args.split)
    except (KeyError, ValueError, PolicySpecError, ImportError) as exc:
        msg = str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)
        return 2, {"error": msg}, "error: " + msg
    if args.trajectories:
        from agents.trajectories import save_trajectories

        doc["trajectories_file"] = str(save_trajectories(trajs, args.trajectories))
    if args.save_trajectories:
        from agents.trajectories import save_trajectories

        doc["trajectories_dataset"] = str(save_trajectories(trajs, args.save_trajectories,
                                                            format=args.trajectory_format))
    lines = [f"{'environment':<22}{'episodes':>9}{'success':>9}  {'95% CI':<13}{'turns':>7}{'calls':>7}{'parse err':>10}"]
    for e in doc["environments"] + [{"name": "all", **doc["totals"]}]:
        lines.append(f"{e['name']:<22}{e['episodes']:>9}{e['success_rate']:>9.1%}  "
                     f"{e['ci95'][0]:.2f}-{e['ci95'][1]:.2f}    {e['mean_turns']:>7}{e['mean_tool_calls']:>7}"
                     f"{e['mean_parse_errors']:>10}")
    for e in doc["environments"]:  # a benchmark's own verdict (spec.metadata["suite_judge"])
        if "suite" in e:
            u = e["suite"]
            lines.append(f"{e['name']}: {u['name']} calls {u['valid']}/{u['episodes']} episodes valid "
                         f"({u['rate']:.1%}, 95% CI {u['ci95'][0]:.2f}-{u['ci95'][1]:.2f}); "
                         f"it agrees with envfactory's success on {u['agree']}")
    if args.report:
        from envfactory.evaluation.report import write_report

        doc["report"] = write_report(doc, args.report)["markdown"]
        lines.append(f"report: {doc['report']}")
    lines.append(f"policy {doc['policy']}, {doc['seconds']}s")
    failed = doc["totals"]["failed_episodes"]
    return (1 if failed else 0), doc, "\n".join(lines)


# -- quickstart: tiny model -> reader SFT -> RL vs a compute-matched control ------
def _quickstart_args(p: argparse.ArgumentParser) -> None:
    from agents.quickstart.experiment import ARMS, MODELS, QuickstartConfig

    q = QuickstartConfig()
    p.add_argument("--model", default=q.model, choices=sorted(MODELS),
                   help="tiny: the embedded tiny model; smol: SmolLM2-135M-Instruct from its PyPI package")
    p.add_argument("--env", default=q.env, help="environment (its sft / rl / eval splits are used)")
    p.add_argument("--seeds", type=int, nargs="+", default=q.seeds, help="seeds (one run each)")
    p.add_argument("--arms", nargs="+", default=q.arms, choices=ARMS,
                   help="arms, each from the same SFT checkpoint (rft: the compute-matched continued-SFT control)")
    p.add_argument("--steps", type=int, default=q.rl_steps, help="RL steps per seed and arm")
    p.add_argument("--eval-tasks", type=int, default=q.eval_tasks,
                   help="evaluation tasks per half of the eval split (default 60 of 200; 0: all)")
    p.add_argument("--eval-samples", type=int, default=q.eval_samples, help="sampled episodes per evaluation task")
    p.add_argument("--no-probe", action="store_true", help="skip the greedy swap probe")
    p.add_argument("--workers", type=int, default=q.workers, help="worker processes (0: one per core)")
    p.add_argument("--device", default=q.device, help="torch device (cpu, cuda, ...)")
    p.add_argument("--out", default=q.output_dir, help="report folder")
    p.add_argument("--fresh", action="store_true",
                   help="run every seed again (default: keep seeds already finished in --out with this recipe)")


def _quickstart_run(args: argparse.Namespace) -> Result:
    """Tiny model -> reader SFT -> RL arms and controls; success on the eval split, paired CIs."""
    from agents.quickstart.experiment import QuickstartConfig, run_quickstart

    try:
        cfg = QuickstartConfig(model=args.model, env=args.env, seeds=list(args.seeds), arms=list(args.arms), rl_steps=args.steps,
                               eval_tasks=args.eval_tasks or None, eval_samples=args.eval_samples, probe=not args.no_probe,
                               workers=args.workers, device=args.device, output_dir=args.out,
                               resume=not args.fresh)
    except ValueError as exc:
        return 2, {"error": str(exc)}, f"error: {exc}"
    doc = run_quickstart(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
    lines = [f"success on evaluation tasks nothing trained on, seeds {doc['seeds']}:"]
    for half, succ in doc["success"].items():
        b = doc["blind"][half]
        lines.append(f"  {half} (blind: random {b['random']:.3f}, most frequent {b['most_frequent']:.3f})")
        lines += [f"    {k:<14}{v['mean']:.3f}  95% CI [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]" for k, v in succ.items()]
    if doc["primary"]:
        c = doc["primary"]
        lines.append(f"  primary {doc['primary_comparison'].replace('_minus_', ' - ')}: {c['mean']:+.3f}  "
                     f"95% CI [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]" + ("" if c["excludes_zero"] else
                                                                        "  (no difference shown)"))
    lines.append(f"report {args.out}/report.md; {doc['seconds']}s")
    return 0, doc, "\n".join(lines)


# -- train --config FILE ------------------------------------------------------
def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a JSON or YAML TrainerConfig (agents/train_config.py documents every key)")
    p.add_argument("--print-config", action="store_true",
                   help="print the config (--config's, else every default) as YAML and exit: a file to start from")
    p.add_argument("--steps", type=int, default=None, help="override the config's steps")
    p.add_argument("--output-dir", default=None, help="override the config's output.dir (default runs/train)")
    p.add_argument("--device", default=None, help="override the config's device (cpu, cuda, cuda:1, ...)")


def _train_run(args: argparse.Namespace) -> Result:
    import dataclasses

    from agents.train_config import TrainerConfig
    from agents.trainer import train_from_config

    try:
        if args.config is None and not args.print_config:
            raise ValueError("name a config file: envfactory train --config FILE (--print-config writes one)")
        cfg = TrainerConfig.from_file(args.config) if args.config else TrainerConfig(envs=["Counter-v0"])
        if args.steps is not None:
            cfg = dataclasses.replace(cfg, steps=args.steps)
        if args.output_dir is not None:
            cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, dir=args.output_dir))
        if args.device is not None:
            cfg = dataclasses.replace(cfg, device=args.device)
    except (OSError, ValueError) as exc:
        return 2, {"error": str(exc)}, f"error: {exc}"
    if args.print_config:
        import yaml

        return 0, cfg.to_dict(), yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip()
    try:
        doc = train_from_config(cfg)
    except (KeyError, ValueError) as exc:  # e.g. an unknown environment or task id, an eval-split task
        return 2, {"error": str(exc)}, f"error: {exc}"
    return 0, doc, json.dumps(doc, indent=2, default=str)


# -- pretrain: language-model pretraining of the tiny model ------------------------
def _pretrain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="the tiny model's seed (weights and data order)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: agents.models.pretrain.PRETRAIN_CONFIG)")
    p.add_argument("--envs", default=None,
                   help="only these environments, comma-separated (default: every single-agent one)")
    p.add_argument("--cache-dir", default=None, help="model cache folder (default: $ENVFACTORY_CACHE/models)")
    p.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda, ...)")


def _pretrain_run(args: argparse.Namespace) -> Result:
    """Pretrain (or reuse) the tiny model on plays synthesised from the environments' tool graphs."""
    from agents.models.pretrain import pretrain

    config = {"envs": sorted({n.strip() for n in args.envs.split(",") if n.strip()})} if args.envs else None
    try:
        doc = pretrain(seed=args.seed, steps=args.steps, cache_dir=args.cache_dir, config=config,
                       log=lambda m: print(m, file=sys.stderr, flush=True), device=args.device)
    except (KeyError, ValueError) as exc:
        return 2, {"error": str(exc)}, f"error: {exc}"
    text = (f"{doc['path']}{' (cached)' if doc['cached'] else ''}\n"
            f"corpus {doc['corpus_hash']}: {doc['plays']} plays ({doc['train_plays']} trained on, "
            f"{doc['heldout_plays']} held out), {doc['train_tokens']} training tokens\n"
            f"held-out loss {doc['loss_before']:.3f} -> {doc['loss_after']:.3f}; pretraining took {doc['seconds']}s"
            + (f" (this call {doc['elapsed']}s)" if doc["cached"] else ""))
    return 0, doc, text


EVAL = Command("evaluate a model or a scripted baseline, one agent or a team (success with 95%% CIs; --report DIR)",
               _eval_args, _eval_run,
               "envfactory eval --env Counter-v0,FileSystem-v0 --policy tiny --episodes 4 --report eval_report\n"
               "envfactory eval --env Bank-v0 --policy hf:HuggingFaceTB/SmolLM2-135M-Instruct --json\n"
               "envfactory eval --env MultiDeal-v0 --policy oracle,noop --episodes 1")
QUICKSTART = Command("the main job: tiny model, reader SFT, RL against a compute-matched control; success on "
                     "evaluation tasks nothing trained on, what the model reads, paired CIs (report)",
                     _quickstart_args, _quickstart_run,
                     "envfactory quickstart\nenvfactory quickstart --seeds 0 1 2 --steps 20 --out quickstart_report")
TRAIN = Command("train a policy with GRPO/ARPO: 'train --config FILE' (a JSON or YAML TrainerConfig)",
                _train_args, _train_run,
                "envfactory train --print-config > train.yaml\nenvfactory train --config train.yaml\n"
                "envfactory train --config train.json --steps 2 --json > run.json")
PRETRAIN = Command("pretrain the tiny model on plays of the environments' non-evaluation tasks (cached; path, losses)",
                   _pretrain_args, _pretrain_run,
                   "envfactory pretrain\nenvfactory pretrain --seed 1 --steps 200 --envs Counter-v0,Bank-v0")
