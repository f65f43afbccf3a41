"""``envfactory train --config FILE``: a Trainer run described by a JSON or YAML file.

Example (YAML)::

    model: tiny                 # or a model folder / HF id
    envs: [Counter-v0]
    tasks: null                 # null = every task; or a list of ids
    algorithm: {name: arpo, M: 8, N: 4, k: 8}     # name: arpo | grpo, other keys: ARPO fields
    sft: {epochs: 30, lr: 0.003}                  # optional warm start on reference solutions
    sft_tasks: null             # tasks whose reference solutions SFT uses (default: tasks)
    steps: 10
    trainer: {lr: 1.0e-4, tasks_per_step: 4, max_new_tokens: 32, max_turns: 6, seed: 0}
    output_dir: runs/train
    resume: false
    eval: {samples: 4}          # optional: success before and after
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["load_config", "train_from_config"]

_KEYS = {"model", "envs", "tasks", "algorithm", "sft", "sft_tasks", "steps", "trainer", "output_dir", "resume",
         "eval", "device"}


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a JSON (``.json``) or YAML (anything else) config; check its keys."""
    text = Path(path).read_text()
    if str(path).endswith(".json"):
        cfg = json.loads(text)
    else:
        import yaml

        cfg = yaml.safe_load(text)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a config is a mapping of keys {sorted(_KEYS)}")
    unknown = set(cfg) - _KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    if not cfg.get("envs"):
        raise ValueError(f"{path}: 'envs' (a list of environment names) is required")
    return cfg


def train_from_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Build the policy, environments and Trainer of ``cfg``; run it; return a summary."""
    from .algorithms.arpo import ARPO, GRPO
    from .hf_policy import HFPolicy
    from .tiny import build_tiny_model
    from .trainer import Trainer

    model = cfg.get("model", "tiny")
    policy = HFPolicy(build_tiny_model() if model in (None, "tiny") else model, device=cfg.get("device"))
    algo_cfg = dict(cfg.get("algorithm") or {})
    name = str(algo_cfg.pop("name", "arpo")).lower()
    if name not in ("arpo", "grpo"):
        raise ValueError(f"algorithm.name must be 'arpo' or 'grpo', not {name!r}")
    algo = ARPO(**algo_cfg) if name == "arpo" else GRPO(**{k: v for k, v in algo_cfg.items() if k != "N"})
    trainer = Trainer(policy, list(cfg["envs"]), algo, tasks=cfg.get("tasks"),
                      output_dir=cfg.get("output_dir", "runs/train"), **(cfg.get("trainer") or {}))
    summary: dict[str, Any] = {"algorithm": algo.name, "tasks": len(trainer.pool)}
    ev = cfg.get("eval")
    if ev:
        summary["success_before"] = trainer.evaluate(**ev)["success"]
    if cfg.get("sft") and not cfg.get("resume"):
        summary["sft"] = trainer.sft(cfg.get("sft_tasks") or cfg.get("tasks"), **cfg["sft"])
    rows = trainer.train(int(cfg.get("steps", 10)), resume=cfg.get("resume", False))
    if ev:
        summary["success_after"] = trainer.evaluate(**ev)["success"]
    summary.update(steps=trainer.step, last=rows[-1] if rows else None,
                   output_dir=str(trainer.output_dir), checkpoint=str(trainer.output_dir / "checkpoints"))
    policy.close()
    return summary
