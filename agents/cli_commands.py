"""The ``agents`` package's ``envfactory`` subcommands: ``eval``, ``quickstart``, ``train``.

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

__all__ = ["EVAL", "QUICKSTART", "TRAIN"]

Result = tuple[int, Any, str]


# -- eval ---------------------------------------------------------------------
def _eval_args(p: argparse.ArgumentParser) -> None:
    from agents.eval_cli import eval_args

    eval_args(p)


def _eval_run(args: argparse.Namespace) -> Result:
    team = _team_names(args.env)  # multi-agent environments (or "multi"): the team evaluation
    if team is not None:
        from envfactory.multi.eval import eval_team_from_eval_args

        return eval_team_from_eval_args(args, team)
    from agents.eval_cli import eval_run

    return eval_run(args)


def _team_names(env_arg: str) -> list[str] | None:
    """The multi-agent names ``--env`` asks for (``multi``: all of them), or ``None``."""
    try:
        from envfactory.multi.eval import team_names
    except ImportError:
        team_names = None
    if team_names is not None:
        return team_names(env_arg)
    import envfactory

    names = [n.strip() for n in env_arg.split(",") if n.strip()]
    if names == ["multi"]:
        return [s.name for s in envfactory.specs() if getattr(s, "multi_agent", False)]
    try:
        return names if names and all(envfactory.spec(n).multi_agent for n in names) else None
    except KeyError:
        return None


# -- quickstart: tiny model -> SFT -> ARPO on held-out tasks --------------------
def _quickstart_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (one run each)")
    p.add_argument("--steps", type=int, default=None, help="ARPO steps per seed")
    p.add_argument("--out", default="runs/quickstart", help="report folder")


def _quickstart_run(args: argparse.Namespace) -> Result:
    """Tiny model -> SFT on reference solutions -> ARPO on held-out tasks; success before/after per seed."""
    from agents.quickstart import QuickstartConfig, run_quickstart

    cfg = QuickstartConfig(seeds=list(args.seeds), output_dir=args.out)
    if args.steps is not None:
        cfg.rl_steps = args.steps
    doc = run_quickstart(cfg, log=lambda m: print(m, file=sys.stderr))
    text = (f"success on held-out tasks per seed {doc['seeds']}:\n"
            + "\n".join(f"  {k:<7}{[round(x, 3) for x in v]}" for k, v in doc["success"].items())
            + f"\nARPO - SFT mean {doc['arpo_minus_sft_mean']:+.3f}, seed spread {doc['seed_spread']:.3f}; "
            f"report {args.out}/report.md; {doc['seconds']}s")
    return 0, doc, text


# -- train --config FILE ------------------------------------------------------
def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a JSON or YAML training config (see agents/train_config.py)")


def _train_run(args: argparse.Namespace) -> Result:
    from agents.train_config import load_config, train_from_config

    try:
        cfg = load_config(args.config)
    except (OSError, ValueError) as exc:
        return 2, {"error": str(exc)}, f"error: {exc}"
    doc = train_from_config(cfg)
    return 0, doc, json.dumps(doc, indent=2, default=str)


EVAL = Command("evaluate a model or a scripted baseline on environments (success with 95%% CIs; --report DIR)",
               _eval_args, _eval_run)
QUICKSTART = Command("the main job: tiny model, SFT, ARPO on held-out tasks, success before/after (report)",
                     _quickstart_args, _quickstart_run)
TRAIN = Command("train a policy with GRPO/ARPO: 'train --config FILE' (JSON or YAML)", _train_args, _train_run)
