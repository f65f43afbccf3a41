"""``envfactory train --config FILE``: a Trainer run described by a JSON or YAML file.

:class:`TrainConfig` is both the file format (its fields are the file's keys) and
what a program builds a run from. Example (YAML)::

    model: tiny                 # or a model folder / HF id; or {agent id: model}, a learner per role
    envs: [Counter-v0]          # single-agent or team environments
    tasks: null                 # null = each env's rl split (spec.split); or a list of ids, never eval-split ones
    algorithm: {name: arpo, M: 8, N: 4, k: 8}     # name: arpo | grpo, other keys: that algorithm's fields
    sft: {epochs: 30, lr: 0.003}                  # optional warm start on reference solutions
    sft_tasks: null             # tasks whose reference solutions SFT uses (default: tasks, else the sft split)
    steps: 10
    trainer: {lr: 1.0e-4, tasks_per_step: 4, max_new_tokens: 32, max_turns: 6, seed: 0}  # respect_splits: false lifts the split rules
    output_dir: runs/train
    resume: false
    eval: {samples: 4}          # optional: success before and after, on the eval split (or tasks: [...])
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["TrainConfig", "load_config", "train_from_config"]


@dataclass
class TrainConfig:
    """One training run (see the module docstring for every key)."""

    envs: list[str]
    model: str | dict[str, str] | None = "tiny"
    tasks: list[str] | None = None
    algorithm: dict[str, Any] = field(default_factory=lambda: {"name": "arpo"})
    sft: dict[str, Any] | None = None
    sft_tasks: list[str] | None = None
    steps: int = 10
    trainer: dict[str, Any] = field(default_factory=dict)
    output_dir: str = "runs/train"
    resume: bool | str = False
    eval: dict[str, Any] | None = None
    device: str | None = None

    @classmethod
    def from_dict(cls, d: Any, source: str = "config") -> "TrainConfig":
        """Check the keys of a parsed file and build the config.

        Raises:
            ValueError: not a mapping, unknown keys, no ``envs``, or an algorithm that does not exist
                or does not take the given keys.
        """
        keys = sorted(f.name for f in fields(cls))
        if not isinstance(d, dict):
            raise ValueError(f"{source}: a config is a mapping of keys {keys}")
        unknown = set(d) - set(keys)
        if unknown:
            raise ValueError(f"{source}: unknown keys {sorted(unknown)}; allowed: {keys}")
        if not d.get("envs"):
            raise ValueError(f"{source}: 'envs' (a list of environment names) is required")
        cfg = cls(**{k: v for k, v in d.items() if v is not None})  # null: the default
        cfg.build_algorithm(source)
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        """Read a JSON (``.json``) or YAML (anything else) file."""
        text = Path(path).read_text()
        if str(path).endswith(".json"):
            return cls.from_dict(json.loads(text), str(path))
        import yaml

        return cls.from_dict(yaml.safe_load(text), str(path))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def build_algorithm(self, source: str = "config") -> Any:
        from .algorithms.arpo import ARPO, GRPO

        kw = dict(self.algorithm or {})
        name = str(kw.pop("name", "arpo")).lower()
        algos = {"arpo": ARPO, "grpo": GRPO}
        if name not in algos:
            raise ValueError(f"{source}: algorithm.name must be 'arpo' or 'grpo', not {name!r}")
        allowed = {f.name for f in fields(algos[name])}
        if set(kw) - allowed:
            raise ValueError(f"{source}: {name} does not take {sorted(set(kw) - allowed)}; it takes {sorted(allowed)}")
        return algos[name](**kw)

    def build(self) -> Any:
        """The :class:`~agents.trainer.Trainer` of this config (a learner per role when ``model`` is a mapping)."""
        from .hf_policy import HFPolicy
        from .tiny import build_tiny_model
        from .trainer import Trainer

        def policy(m: str | None) -> HFPolicy:
            return HFPolicy(build_tiny_model() if m in (None, "tiny") else m, device=self.device)

        team = ({a: policy(m) for a, m in self.model.items()} if isinstance(self.model, dict)
                else policy(self.model))
        return Trainer(team, list(self.envs), self.build_algorithm(), tasks=self.tasks, output_dir=self.output_dir,
                       **self.trainer)

    def run(self) -> dict[str, Any]:
        """Build the Trainer; warm-start, train and evaluate it as configured; return a summary."""
        trainer = self.build()
        summary: dict[str, Any] = {"algorithm": trainer.algorithm.name, "tasks": len(trainer.pool),
                                   "learners": [ln.label for ln in trainer.learners]}
        if self.eval:
            summary["success_before"] = trainer.evaluate(**self.eval)["success"]
        if self.sft and not self.resume:
            summary["sft"] = trainer.sft(self.sft_tasks or self.tasks, **self.sft)
        rows = trainer.train(int(self.steps), resume=self.resume)
        if self.eval:
            summary["success_after"] = trainer.evaluate(**self.eval)["success"]
        summary.update(steps=trainer.step, last=rows[-1] if rows else None,
                       output_dir=str(trainer.output_dir), checkpoint=str(trainer.output_dir / "checkpoints"))
        for ln in trainer.learners:
            ln.policy.close()
        return summary


def load_config(path: str | Path) -> TrainConfig:
    """Read and check a JSON or YAML config (the ``envfactory train`` hook)."""
    return TrainConfig.load(path)


def train_from_config(cfg: TrainConfig | dict[str, Any]) -> dict[str, Any]:
    """Run a config (a :class:`TrainConfig` or its dict form); return a summary."""
    return (cfg if isinstance(cfg, TrainConfig) else TrainConfig.from_dict(cfg)).run()
