"""``envfactory quickstart``: the tiny model, SFT, then RL, measured on tasks RL never saw.

The environment (default ``FindLight-v0``) has three disjoint task splits
(:meth:`envfactory.ToolEnvSpec.split`): SFT sees the reference solutions of
``sft``-split tasks, RL trains from the sparse success reward on ``rl``-split
tasks, and every figure is measured on ``eval``-split tasks, which nothing
before evaluation has seen (the tokenizer and pretraining corpora leave them
out too). On FindLight success needs the room that ``locate`` returns, so a
policy that ignores tool results stays at chance.

For each seed: the embedded tiny model (``pretrained``: after its cached
language-model pretraining, :mod:`agents.pretrain`), evaluated ("before"),
SFT ("sft"), evaluated; then every RL arm (``arpo``, ``grpo``, ``arpo_beta0``:
random branching) starts from that same post-SFT checkpoint, trains
``rl_steps`` steps and is evaluated. Every evaluation plays ``eval_samples``
sampled episodes of each of ``eval_tasks`` evaluation tasks with the same
sampling seed, so arms are paired by seed and by task.

The primary metric, fixed in advance, is final evaluation success; the claim
"RL beats SFT alone" is made only when the paired two-way (seed x task)
bootstrap 95% interval of RL − SFT excludes 0 (:func:`agents.stats.paired_bootstrap`).
Also reported: the area under the learning curve (mean training success over the
RL steps), tokens actually sampled, tool calls per solved task and wall-clock.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["QuickstartConfig", "run_quickstart", "ARMS", "check_splits"]

ARMS = ("arpo", "grpo", "arpo_beta0", "rft", "grpo_shuffled")


@dataclass
class QuickstartConfig:
    env: str = "FindLight-v0"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    arms: list[str] = field(default_factory=lambda: ["arpo"])
    pretrained: bool = True         # start from the cached language-model pretraining
    sft_tasks: int | None = 48      # how many sft-split tasks SFT uses (None: all)
    sft_epochs: int = 4
    sft_lr: float = 2e-3
    sft_batch_size: int = 8
    rl_steps: int = 12
    rl_lr: float = 5e-4
    M: int = 8
    N: int = 4
    k: int = 8
    alpha: float = 0.5
    beta: float = 0.2
    updates: int = 1                # policy updates per rollout batch (μ)
    kl_coef: float = 0.1            # k3 KL penalty to the post-SFT policy
    tasks_per_step: int = 4
    max_new_tokens: int = 32
    max_turns: int | None = None    # default: the environment's
    temperature: float = 1.0        # sampling temperature of RL's rollouts
    eval_tasks: int = 12            # evaluation-split tasks evaluated (the first ones, by task order)
    eval_samples: int = 32          # sampled episodes per evaluation task
    eval_temperature: float = 1.0
    output_dir: str = "runs/quickstart"

    def __post_init__(self) -> None:
        unknown = set(self.arms) - set(ARMS)
        if unknown or not self.arms:
            raise ValueError(f"arms must be some of {ARMS}, got {self.arms}")
        if not self.seeds:
            raise ValueError("seeds must not be empty")


def check_splits(sft: list[str], rl: list[str], evaluation: list[str]) -> None:
    """Raise if the SFT, RL and evaluation task lists overlap (they never may)."""
    for a, b, what in ((sft, rl, "SFT and RL"), (sft, evaluation, "SFT and evaluation"),
                       (rl, evaluation, "RL and evaluation")):
        both = set(a) & set(b)
        if both:
            raise ValueError(f"{what} tasks overlap: {sorted(both)[:5]}")


def _algorithm(arm: str, cfg: QuickstartConfig) -> Any:
    from .algorithms.arpo import ARPO, GRPO, RFT

    common = dict(M=cfg.M, updates=cfg.updates, kl_coef=cfg.kl_coef)
    if arm in ("grpo", "grpo_shuffled"):  # grpo_shuffled: rewards permuted across the batch (a control)
        return GRPO(shuffle_rewards=arm == "grpo_shuffled", **common)
    if arm == "rft":  # rejection-sampling fine-tuning on the M rollouts' successes (a control)
        return RFT(**common)
    return ARPO(N=cfg.N, k=cfg.k, alpha=cfg.alpha, beta=0.0 if arm == "arpo_beta0" else cfg.beta, **common)


def run_quickstart(cfg: QuickstartConfig | None = None, *, log: Any = None) -> dict[str, Any]:
    """Run every seed and arm; write ``summary.json``, ``report.md`` and the learning curve;
    return the summary (see the module docstring)."""
    import torch

    import envfactory

    from .algorithms.metrics import plot_learning_curve
    from .hf_policy import HFPolicy
    from .pretrain import pretrained_tiny_model
    from .stats import bootstrap_mean, paired_bootstrap
    from .tiny import build_tiny_model
    from .train_config import EvalConfig, OptimConfig, OutputConfig, SamplingConfig, SFTConfig, TrainerConfig
    from .trainer import Trainer

    cfg = cfg or QuickstartConfig()
    say = log or (lambda msg: None)
    started = time.perf_counter()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = envfactory.spec(cfg.env)
    sft_ids = [t.id for t in spec.tasks_in("sft")][:cfg.sft_tasks]
    rl_ids = [t.id for t in spec.tasks_in("rl")]
    eval_ids = [t.id for t in spec.tasks_in("eval")][:cfg.eval_tasks]
    check_splits(sft_ids, rl_ids, eval_ids)
    if len(eval_ids) < cfg.eval_tasks:
        raise ValueError(f"{cfg.env} has {len(eval_ids)} evaluation tasks; eval_tasks={cfg.eval_tasks}")
    stages = ["before", "sft", *cfg.arms]
    grids: dict[str, list[list[float]]] = {s: [] for s in stages}  # stage -> [seed][task] success
    curves: dict[str, list[tuple[float, float]]] = {}
    per_seed = []
    for seed in cfg.seeds:
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        path = pretrained_tiny_model(seed=seed) if cfg.pretrained else build_tiny_model(seed=seed)
        policy = HFPolicy(path, device="cpu")
        row: dict[str, Any] = {"seed": seed}

        def trainer(arm: str) -> Trainer:
            return Trainer(policy, [cfg.env], TrainerConfig(
                tasks=rl_ids, seed=seed, steps=cfg.rl_steps, algorithm=_algorithm(arm, cfg),
                sampling=SamplingConfig(max_new_tokens=cfg.max_new_tokens, max_turns=cfg.max_turns,
                                        temperature=cfg.temperature),
                optim=OptimConfig(lr=cfg.rl_lr, tasks_per_step=cfg.tasks_per_step),
                sft=SFTConfig(epochs=cfg.sft_epochs, lr=cfg.sft_lr, batch_size=cfg.sft_batch_size, tasks=sft_ids),
                eval=EvalConfig(samples=cfg.eval_samples, seed=10_000 + seed, temperature=cfg.eval_temperature,
                                tasks=eval_ids),
                output=OutputConfig(dir=str(out / f"seed-{seed}" / arm), show_progress=False)))

        def evaluate(tr: Trainer, stage: str) -> dict[str, Any]:
            r = tr.evaluate()
            grids[stage].append([r["per_task"][f"{cfg.env}/{t}"] for t in eval_ids])
            row[stage] = r["success"]
            return r

        tr = trainer(cfg.arms[0])
        evaluate(tr, "before")
        row["sft_final_nll"] = tr.sft()["final_nll"]
        evaluate(tr, "sft")
        after_sft = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
        for arm in cfg.arms:
            policy.model.load_state_dict(after_sft)  # every arm starts from the same checkpoint
            tr = trainer(arm)
            a0 = time.perf_counter()
            rows = tr.train()
            r = evaluate(tr, arm)
            curves[f"{arm} seed {seed}"] = [(0, row["sft"])] + [(x["step"], x["success"]) for x in rows]
            row[f"{arm}_auc"] = statistics.mean(x["success"] for x in rows) if rows else 0.0
            row[f"{arm}_tokens_sampled"] = sum(x["tokens_generated"] for x in rows)
            row[f"{arm}_tool_calls_per_solved"] = r["tool_calls_per_solved"]
            row[f"{arm}_branches"] = sum(x["branches"] for x in rows)
            row[f"{arm}_seconds"] = round(time.perf_counter() - a0, 1)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        per_seed.append(row)
        say(f"seed {seed}: " + "  ".join(f"{s} {row[s]:.3f}" for s in stages) + f"  ({row['seconds']} s)")
        policy.close()
    compare = {f"{arm}_minus_sft": paired_bootstrap(grids["sft"], grids[arm]) for arm in cfg.arms}
    compare["sft_minus_before"] = paired_bootstrap(grids["before"], grids["sft"])
    for i, a in enumerate(cfg.arms):
        for b in cfg.arms[i + 1:]:
            compare[f"{a}_minus_{b}"] = paired_bootstrap(grids[b], grids[a])
    summary = {
        "env": cfg.env, "seeds": list(cfg.seeds), "arms": list(cfg.arms),
        "primary_metric": "final success on evaluation-split tasks (paired by seed and task)",
        "success": {s: [r[s] for r in per_seed] for s in stages},
        "success_ci": {s: bootstrap_mean(grids[s]) for s in stages},
        "compare": compare,
        "rl_beats_sft": {arm: compare[f"{arm}_minus_sft"]["excludes_zero"] and compare[f"{arm}_minus_sft"]["mean"] > 0
                         for arm in cfg.arms},
        "auc": {arm: statistics.mean(r[f"{arm}_auc"] for r in per_seed) for arm in cfg.arms},
        "tasks": {"sft": len(sft_ids), "rl": len(rl_ids), "eval": eval_ids},
        "seconds": round(time.perf_counter() - started, 1),
        "per_seed": per_seed, "grids": grids, "config": asdict(cfg),
    }
    png = plot_learning_curve(curves, out / "learning_curve.png", xlabel="RL step",
                              title="RL tasks: success of the sampled training episodes (step 0 = after SFT)")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "report.md").write_text(_report(summary, Path(png).name))
    return summary


def _ci(c: dict[str, Any]) -> str:
    return f"{c['mean']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]"


def _report(s: dict[str, Any], png: str) -> str:
    c = s["config"]
    stages = ["before", "sft", *s["arms"]]
    lines = [
        "# envfactory quickstart report", "",
        f"Environment `{s['env']}`; tiny model{' (pretrained)' if c['pretrained'] else ''}; "
        f"{len(s['seeds'])} seeds; {s['seconds']} s in all. SFT on {s['tasks']['sft']} sft-split tasks; RL "
        f"({', '.join(s['arms'])}; M={c['M']}, {c['rl_steps']} steps, lr {c['rl_lr']}, KL {c['kl_coef']}) on "
        f"{s['tasks']['rl']} rl-split tasks; success on {len(s['tasks']['eval'])} evaluation-split tasks RL "
        f"never saw x {c['eval_samples']} sampled episodes (temperature {c['eval_temperature']}).", "",
        "| seed | " + " | ".join(stages) + " |", "|---" * (len(stages) + 1) + "|",
    ]
    for r in s["per_seed"]:
        lines.append(f"| {r['seed']} | " + " | ".join(f"{r[x]:.3f}" for x in stages) + " |")
    lines += ["| mean [95% CI] | " + " | ".join(
        f"{s['success_ci'][x]['mean']:.3f} [{s['success_ci'][x]['ci'][0]:.3f}, {s['success_ci'][x]['ci'][1]:.3f}]"
        for x in stages) + " |", "",
        "Paired differences (mean, two-way bootstrap 95% CI over seeds and tasks):", ""]
    lines += [f"- {k.replace('_minus_', ' − ')}: {_ci(v)}" + (" (excludes 0)" if v["excludes_zero"] else
                                                             " (includes 0: no difference shown)")
              for k, v in s["compare"].items()]
    lines += ["", f"Area under the learning curve (mean training success over the RL steps): "
              + ", ".join(f"{a} {v:.3f}" for a, v in s["auc"].items()),
              "", f"![learning curve]({png})", "", f"Evaluation tasks: {', '.join(s['tasks']['eval'])}", ""]
    return "\n".join(lines)
