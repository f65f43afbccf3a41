"""``envfactory quickstart``: the tiny model learns to read tool results, then RL is tested
against a compute-matched control, on tasks nothing trained on.

The environment is ``FindLight-v3``: "turn on the light in the room where the X is", asked
in plain words; only two ``locate`` calls reveal the room (two hops), among 8 rooms. Its
splits are disjoint: reader SFT learns from ``sft``-split tasks (plus fresh generated
ones), RL trains on ``rl``-split tasks, and every figure is measured on the ``eval`` split,
which nothing before evaluation saw. The evaluation split has two halves, reported
separately:

* ``unseen``: unseen tasks of the training names and phrasings (the primary metric);
* ``heldout``: tasks whose target room, item, container and phrasing occur in no
  training task (generalization: a model can only solve them by copying what it read).

Per seed (``workers`` processes share the work in units: a seed's start, stages 1–2, then each
of its arms, so that two cores stay busy to the last unit):

1. ``before``: the pretrained tiny model (:mod:`agents.models.pretrain`): one checkpoint for every seed
   (``READER_CONFIG["base_seed"]``, see :func:`agents.quickstart.reader.base_model`);
2. ``sft``: after reader SFT (:mod:`agents.quickstart.reader`; cached like pretraining);
3. every arm from that same checkpoint, ``rl_steps`` steps of ``tasks_per_step`` rl-split
   tasks x ``M`` sampled episodes each, then evaluated. Arms: ``arpo``, ``grpo``,
   ``arpo_beta0`` (random branching), and the controls ``rft`` (continued SFT on the
   successes of the same samples: the same tasks, samples and gradient steps, no
   reward-weighted advantage) and ``grpo_shuffled`` (GRPO whose rewards are shuffled
   across the step's episodes).

Every evaluation plays ``eval_samples`` sampled episodes of each evaluation task with the
same sampling seed (arms are paired by seed and task) and reports what explains its
success (:func:`agents.quickstart.probe.reading_report`): the call chain, success given the room was
shown, and (on the ``unseen`` half) the greedy swap probe: does a success follow
``locate``'s answer when it is swapped for another room? The blind baselines (a random room, the most frequent
room) are computed on the same tasks.

The model (``model``, :data:`MODELS`): the embedded tiny model by default, or ``"smol"``,
SmolLM2-135M-Instruct from its PyPI package, whose reader SFT and RL arms train its top layers
only (:data:`agents.quickstart.reader.SMOL_READER_CONFIG`); the pipeline, splits and statistics are the same.

The primary comparison, fixed in advance: ``<first RL arm> − rft`` on the model's primary half
(``unseen`` for the tiny model, ``heldout`` for SmolLM2; paired two-way bootstrap over seeds and
tasks, 95%). Every other comparison is reported
with Holm-corrected p-values. Each seed's results are written to ``seed-<n>.json`` as
soon as they exist, and the summary and report are rewritten after every seed; a run
started again with the same recipe and folder keeps the seeds already finished (``resume``).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from agents.quickstart.reader import SMOL_READER_CONFIG

__all__ = ["QuickstartConfig", "MODELS", "run_quickstart", "run_seed", "seed_start", "seed_arm", "ARMS", "DIAGNOSTICS", "check_splits",
           "eval_tasks", "figures_block", "write_figures", "RUN_OPTIONS", "SPLITS", "FIGURES_SINCE"]

ARMS = ("arpo", "grpo", "arpo_beta0", "rft", "grpo_shuffled", "rft_mixed", "grpo_pos", "grpo_neg25", "grpo_neg50")
DIAGNOSTICS = ("rft_mixed", "grpo_pos", "grpo_neg25", "grpo_neg50")  # arms that change one part of an update (see _algorithm)
SPLITS = ("eval", "dev")
"""Where a run is evaluated: the environment's ``eval`` split, or ``dev``, fresh tasks of the
training distribution that no seed trains on (:func:`eval_tasks`), for choosing a variant
before the evaluation split measures it."""
CONTROL = "rft"
MODELS: dict[str, dict[str, Any]] = {
    "tiny": {"rl_lr": 2e-4, "primary_half": "unseen", "reader": None},
    "smol": {"rl_lr": 5e-5, "primary_half": "heldout", "reader": SMOL_READER_CONFIG},
}
"""The models a quickstart trains, and what each changes in the recipe: ``tiny``, the embedded
tiny model (pretrained here; its reader does not copy a name it never trained on: the
``heldout`` half stays at 0 and the primary comparison is on ``unseen``); ``smol``,
SmolLM2-135M-Instruct from its PyPI package (:mod:`agents.models.smol`), reader SFT of
:data:`agents.quickstart.reader.SMOL_READER_CONFIG`, a smaller RL learning rate, and the primary comparison
on the ``heldout`` half, where a pretrained LLM that copies what it read has room to improve
(fixed before its first run)."""


@dataclass
class QuickstartConfig:
    env: str = "FindLight-v3"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    arms: list[str] = field(default_factory=lambda: ["arpo", "rft"])
    reader: dict[str, Any] | None = None  # overrides of agents.quickstart.reader.READER_CONFIG
    rl_steps: int = 12
    rl_lr: float | None = None      # None: the model's (MODELS)
    M: int = 8
    N: int = 4
    k: int = 8
    alpha: float = 0.5
    beta: float = 0.2
    updates: int = 1                # policy updates per rollout batch (μ)
    kl_coef: float = 0.05           # k3 KL penalty to the post-SFT policy
    tasks_per_step: int = 4
    max_new_tokens: int = 40
    temperature: float = 1.0        # sampling temperature of RL's rollouts
    eval_tasks: int | None = 60     # per half of the evaluation split (None: all 200 of each)
    eval_samples: int = 2           # sampled episodes per evaluation task
    eval_temperature: float = 1.0
    probe: bool = True              # the greedy swap probe at every evaluation
    workers: int = 0                # worker processes (0: as many as cores, at most one per seed x arm)
    device: str = "cpu"
    output_dir: str = "runs/quickstart"
    cache_dir: str | None = None    # where reader checkpoints are kept (default: the model cache)
    resume: bool = True             # keep seeds whose results of this recipe are in output_dir already
    eval_split: str = "eval"        # "eval", or "dev": a development set (see SPLITS)
    model: str = "tiny"             # "tiny" or "smol" (MODELS)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {sorted(MODELS)}, got {self.model!r}")
        preset = MODELS[self.model]
        if self.rl_lr is None:
            self.rl_lr = preset["rl_lr"]
        if preset["reader"] is not None:  # the model's reader recipe, under the caller's overrides
            self.reader = {**preset["reader"], **(self.reader or {})}
        elif (self.reader or {}).get("base", "tiny") != "tiny":
            raise ValueError(f"model 'tiny' takes a tiny reader recipe; for another base use model= ({sorted(MODELS)})")
        if self.eval_split not in SPLITS:
            raise ValueError(f"eval_split must be one of {SPLITS}, got {self.eval_split!r}")
        unknown = set(self.arms) - set(ARMS)
        if unknown or not self.arms:
            raise ValueError(f"arms must be some of {ARMS}, got {self.arms}")
        if not self.seeds:
            raise ValueError("seeds must not be empty")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must differ, got {self.seeds}")


def check_splits(sft: list[str], rl: list[str], evaluation: list[str]) -> None:
    """Raise if the SFT, RL and evaluation task lists overlap (they never may)."""
    for a, b, what in ((sft, rl, "SFT and RL"), (sft, evaluation, "SFT and evaluation"),
                       (rl, evaluation, "RL and evaluation")):
        both = set(a) & set(b)
        if both:
            raise ValueError(f"{what} tasks overlap: {sorted(both)[:5]}")


DEV_TASKS = 200


def eval_tasks(env: str, n: int | None = None, split: str = "eval") -> dict[str, list[Any]]:
    """The evaluation split's halves, ``{"unseen": [...], "heldout": [...]}`` (the first ``n`` of each).

    ``split="dev"``: ``{"unseen": [...]}``, ``n`` (default 200) fresh FindLight-v3 tasks of the
    training names and phrasings from a supply stream of their own (seed ``"dev"``; readers
    learn from the streams of integer seeds, RL from the ``rl`` split): a development set to
    choose among variants on, so that the evaluation split measures only what was chosen."""
    import envfactory

    if split == "dev":
        from environments.find_light import v3_supply

        if env != "FindLight-v3":
            raise ValueError(f"a dev split exists for FindLight-v3 only, not {env!r}")
        return {"unseen": v3_supply(DEV_TASKS if n is None else n, seed="dev", made_up=0.0)}
    if split != "eval":
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    ev = envfactory.spec(env).tasks_in("eval")
    halves = {"unseen": [t for t in ev if t.metadata.get("names", "train") == "train"],
              "heldout": [t for t in ev if t.metadata.get("names") == "heldout"]}
    return {k: v[:n] for k, v in halves.items() if v}


def _algorithm(arm: str, cfg: QuickstartConfig) -> Any:
    from agents.algorithms import objectives as alg

    common = dict(M=cfg.M, updates=cfg.updates, kl_coef=cfg.kl_coef)
    if arm == "grpo":
        return alg.GRPO(**common)
    if arm == "grpo_shuffled":
        return alg.GRPO(shuffle_rewards=True, **common)
    if arm == "rft":
        return alg.RFT(**common)
    if arm == "rft_mixed":  # diagnostics: RFT without the all-success groups, GRPO without its negatives
        return alg.RFT(mixed_only=True, **common)
    if arm == "grpo_pos":
        return alg.GRPO(negatives=0.0, **common)
    if arm.startswith("grpo_neg"):  # negative advantages scaled down: grpo_neg25 = a quarter of GRPO's
        return alg.GRPO(negatives=int(arm.removeprefix("grpo_neg")) / 100, **common)
    return alg.ARPO(N=cfg.N, k=cfg.k, alpha=cfg.alpha, beta=0.0 if arm == "arpo_beta0" else cfg.beta, **common)


def _evaluate(policy: Any, cfg: QuickstartConfig, halves: dict[str, list[Any]], seed: int,
              probe: bool) -> dict[str, Any]:
    from agents.quickstart.probe import reading_report

    return {half: reading_report(policy, cfg.env, tasks, samples=cfg.eval_samples, seed=10_000 + seed,
                                 temperature=cfg.eval_temperature, swap=probe and half == "unseen",
                                 max_new_tokens=cfg.max_new_tokens)
            for half, tasks in halves.items()}


def run_seed(cfg: QuickstartConfig, seed: int, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One seed of the quickstart (see the module docstring): every stage's evaluation reports,
    the arms' training figures and times. Also written to ``<output_dir>/seed-<seed>.json``."""
    row = seed_start(cfg, seed, log)
    for arm in cfg.arms:
        row["stages"][arm], row["arms"][arm] = seed_arm(cfg, seed, arm, log)
    return _seed_done(cfg, row)


def seed_start(cfg: QuickstartConfig, seed: int, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A seed's first unit of work: the ``before`` and ``sft`` evaluations (building the seed's
    reader checkpoint when it is not cached). Returns the seed's row so far."""
    import torch

    import envfactory

    from agents.policies.hf_policy import HFPolicy
    from agents.quickstart.reader import base_model, reader_model

    say = log or (lambda m: None)
    t0 = time.perf_counter()
    spec = envfactory.spec(cfg.env)
    halves = eval_tasks(cfg.env, cfg.eval_tasks, cfg.eval_split)
    check_splits([t.id for t in spec.tasks_in("sft")], [t.id for t in spec.tasks_in("rl")],
                 [t.id for ts in halves.values() for t in ts])
    row: dict[str, Any] = {"seed": seed, "recipe": _recipe(cfg), "stages": {}, "arms": {}}
    torch.manual_seed(seed)
    say(f"seed {seed}: {_MODEL_NAMES[cfg.model]} before any SFT")
    before = HFPolicy(base_model(seed, cfg.reader, log=say, device=cfg.device), device=cfg.device)
    row["stages"]["before"] = _evaluate(before, cfg, {"unseen": halves["unseen"]}, seed, probe=False)
    before.close()
    say(f"seed {seed}: before {row['stages']['before']['unseen']['success']:.3f} on unseen tasks "
        f"({time.perf_counter() - t0:.0f}s)")
    path = reader_model(seed, cfg.reader, log=say, device=cfg.device, cache_dir=cfg.cache_dir)
    policy = HFPolicy(path, device=cfg.device)
    row["stages"]["sft"] = _evaluate(policy, cfg, halves, seed, cfg.probe)
    policy.close()
    row["seconds"] = round(time.perf_counter() - t0, 1)
    say(f"seed {seed}: sft {_line(row['stages']['sft'])} ({row['seconds']:.0f}s)")
    from agents.quickstart.probe import blind_baselines

    if _not_taken(row, blind_baselines(halves["unseen"])) is not None:
        say(f"seed {seed}: its reader SFT did not take (unseen {row['stages']['sft']['unseen']['success']:.3f}, "
            f"no better than a random room): its arms measure little, and the means include them")
    return row


def _not_taken(row: dict[str, Any], blind: dict[str, Any]) -> float | None:
    """A seed's unseen success after reader SFT when it is no better than a random room (the
    reader did not learn to read: every arm from it starts where a blind policy stands), else None."""
    got = row["stages"]["sft"]["unseen"]["success"]
    return got if got <= blind["random"] else None


def _readers_not_taken(s: dict[str, Any]) -> dict[int, float]:
    """The seeds of a summary whose reader SFT did not take (:func:`_not_taken`), with their success."""
    found = {r["seed"]: _not_taken(r, s["blind"]["unseen"]) for r in s["per_seed"]}
    return {seed: got for seed, got in found.items() if got is not None}


def _not_taken_line(s: dict[str, Any]) -> str | None:
    bad = _readers_not_taken(s)
    if not bad:
        return None
    seeds = ", ".join(f"seed {k} ({v:.3f})" for k, v in bad.items())
    return (f"Reader SFT did not take on {seeds}: unseen success after SFT no better than a random room "
            f"({s['blind']['unseen']['random']:.3f}); the means and CIs above include "
            f"{'it' if len(bad) == 1 else 'them'}.")


def seed_arm(cfg: QuickstartConfig, seed: int, arm: str, log: Callable[[str], None] | None = None
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One arm of one seed, from the seed's post-SFT checkpoint (built by :func:`seed_start`):
    ``rl_steps`` training steps, then the evaluation. Returns (its evaluation report, its
    training figures). An arm's results depend on its seed and recipe only, never on which arms
    ran before it or in which process (each starts from the checkpoint on disk, torch seeded)."""
    import torch

    import envfactory

    from agents.policies.hf_policy import HFPolicy
    from agents.quickstart.reader import reader_model, train_top
    from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig
    from agents.trainer import Trainer

    say = log or (lambda m: None)
    a0 = time.perf_counter()
    halves = eval_tasks(cfg.env, cfg.eval_tasks, cfg.eval_split)
    rl_ids = [t.id for t in envfactory.spec(cfg.env).tasks_in("rl")]
    torch.manual_seed(seed)
    policy = HFPolicy(reader_model(seed, cfg.reader, log=say, device=cfg.device, cache_dir=cfg.cache_dir),
                      device=cfg.device)
    train_top(policy.model, cfg.reader)  # RL trains what reader SFT trained
    tr = Trainer(policy, [cfg.env], TrainerConfig(
        tasks=rl_ids, seed=seed, steps=cfg.rl_steps, algorithm=_algorithm(arm, cfg),
        sampling=SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature),
        optim=OptimConfig(lr=cfg.rl_lr, tasks_per_step=cfg.tasks_per_step),
        output=OutputConfig(dir=str(Path(cfg.output_dir) / f"seed-{seed}" / arm), show_progress=False)))
    rows = []
    try:
        for _ in range(cfg.rl_steps):
            rows.append(tr.train_step())
    finally:
        tr.close()
    trained = round(time.perf_counter() - a0, 1)
    report = _evaluate(policy, cfg, halves, seed, cfg.probe)
    policy.close()
    figures = {
        "train_success": [x["success"] for x in rows],
        "tokens_sampled": sum(x["tokens_generated"] for x in rows),
        "tokens_trained": sum(x["trained_tokens"] for x in rows),
        "branches": sum(x.get("branches", 0) for x in rows),
        "train_seconds": trained, "seconds": round(time.perf_counter() - a0, 1),
    }
    say(f"seed {seed}: {arm} {_line(report)}; trained {trained}s ({figures['seconds']:.0f}s)")
    return report, figures


def _seed_done(cfg: QuickstartConfig, row: dict[str, Any]) -> dict[str, Any]:
    """A seed's row once every arm is in: stages and arms in the recipe's order, ``seconds`` the
    sum of its units' times; written to ``<output_dir>/seed-<seed>.json``."""
    order = ["before", "sft", *cfg.arms]
    row["stages"] = {k: row["stages"][k] for k in order}
    row["arms"] = {k: row["arms"][k] for k in cfg.arms}
    row["seconds"] = round(row["seconds"] + sum(a["seconds"] for a in row["arms"].values()), 1)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"seed-{row['seed']}.json").write_text(json.dumps(row, indent=1))
    return row


def _recipe(cfg: QuickstartConfig) -> dict[str, Any]:
    """What a seed's results depend on: the config without the seeds, workers and folders, with
    the reader recipe in full (a changed default is a changed recipe)."""
    from agents.quickstart.reader import _FORMAT, READER_CONFIG

    skip = {"seeds", "workers", "output_dir", "cache_dir"}
    recipe = {k: v for k, v in asdict(cfg).items() if k not in skip}
    recipe["reader"] = {**READER_CONFIG, **(cfg.reader or {}), "format": _FORMAT}
    for k, v in _LATER_FIELDS.items():  # fields that came after recorded results: their defaults leave those recipes
        if recipe[k] == v:
            del recipe[k]
    return recipe


_LATER_FIELDS = {"eval_split": "eval", "model": "tiny"}
FIGURES_SINCE = "dae3cbe717f884eb7ff3784a2ba69964b197b4c9"
"""The last commit that changed what a quickstart of an unchanged recipe measures (there: the KL
term, which RL arms had never applied, see :meth:`agents.trainer.Trainer._update`). Results of an
older commit are stale though their recipe matches; ``tests/test_quickstart.py`` fails when the
quickstart figures of ``benchmarks/results/RESULTS.md`` come from one. A change of behaviour moves this
to its own commit."""


def _finished(cfg: QuickstartConfig, seed: int) -> dict[str, Any] | None:
    """The saved results of ``seed`` in the output folder, when they are of this recipe."""
    f = Path(cfg.output_dir) / f"seed-{seed}.json"
    try:
        row = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    def what(recipe: Any) -> Any:  # resume says how a run goes, never what a seed gives
        return {k: v for k, v in recipe.items() if k != "resume"} if isinstance(recipe, dict) else recipe

    return row if what(row.get("recipe")) == what(json.loads(json.dumps(_recipe(cfg)))) else None


def _line(report: dict[str, Any]) -> str:
    parts = []
    for half, r in report.items():
        s = f"{half} {r['success']:.3f}"
        if "swap" in r and r["swap"]["moved"] is not None:
            s += f" (moved {r['swap']['moved']:.2f})"
        parts.append(s)
    return ", ".join(parts)


def _unit_worker(cfg_dict: dict[str, Any], seed: int, arm: str | None) -> Any:
    """One unit of work in a worker process: a seed's start (``arm`` None) or one arm."""
    import torch

    torch.set_num_threads(1)
    cfg, say = QuickstartConfig(**cfg_dict), (lambda m: print(m, file=sys.stderr, flush=True))
    return seed_start(cfg, seed, say) if arm is None else seed_arm(cfg, seed, arm, say)


RECORDED_HOST: dict[str, Any] = {"cpu": "AMD EPYC", "cores": 2, "kernels": "AVX512", "torch": "2.13.0"}
"""The host of the run RESULTS.md shows (2026-12-03: a Zen 4 VM, where torch's CPU kernels run their AVX-512
code), for a results file written before summaries named their host (later ones carry ``host``)."""


def host() -> dict[str, Any]:
    """What this machine is for the quickstart's figures: the CPU, its cores, torch, and the vector
    code torch's CPU kernels dispatch to (``torch.backends.cpu.get_cpu_capability()``: AVX512, AVX2,
    ...). The kernels round floats differently per code path, so the weights a seed's training gives,
    and with them the figures, depend on it."""
    import torch

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        kernels = str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        kernels = "unknown"
    return {"cpu": cpu or platform.processor() or platform.machine(), "cores": os.cpu_count() or 1,
            "kernels": kernels, "torch": torch.__version__.split("+")[0]}


def recorded_host(page: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The host of the run ``page`` (RESULTS.md) shows: its results file's ``host``, else
    :data:`RECORDED_HOST`."""
    root = Path(__file__).resolve().parents[2]
    try:
        results, _ = page_figures(page or root / FIGURES_PAGE)
        return dict(json.loads((root / results).read_text()).get("host") or RECORDED_HOST)
    except (OSError, ValueError):
        return dict(RECORDED_HOST)


def host_line(here: dict[str, Any], recorded: dict[str, Any]) -> str:
    """Whether this run can be compared figure for figure with the recorded one, and why not."""
    what = f"{here['cpu']}, {here['cores']} cores, torch {here['torch']}, kernels {here['kernels']}"
    if here["kernels"] == recorded["kernels"] and here["torch"] == recorded["torch"]:
        return f"Host: {what}: as the recorded run's (RESULTS.md), so its figures are those to compare with."
    return (f"Host: {what}; the recorded run (RESULTS.md) ran torch {recorded['torch']} with kernels "
            f"{recorded['kernels']}. This run departs from it: torch's kernels round floats differently per code "
            "path, so a seed's weights differ, a reader may need more rounds of SFT before it copies names "
            "(on a fresh AVX2 host, seeds 0 and 1 took a second round), and the figures can differ from "
            "RESULTS.md's beyond their intervals.")


def run_quickstart(cfg: QuickstartConfig | None = None, *, log: Any = None) -> dict[str, Any]:
    """Run every seed and arm; write ``seed-<n>.json``, ``summary.json``, ``report.md`` and the
    learning curves; return the summary (see the module docstring)."""
    cfg = cfg or QuickstartConfig()
    say = log or (lambda msg: None)
    started = time.perf_counter()
    say(host_line(host(), recorded_host()))
    commit = _commit()  # the code that runs: a commit made while the run goes on is not what it measured
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    todo = []
    for seed in cfg.seeds:  # a seed already finished with this recipe (a stopped run) is kept
        done = _finished(cfg, seed) if cfg.resume else None
        if done is not None:
            say(f"seed {seed}: kept from {out / f'seed-{seed}.json'}")
            rows.append(done)
        else:
            todo.append(seed)
    workers = cfg.workers or min(max(1, len(todo) * len(cfg.arms)), os.cpu_count() or 1)
    summary = _summarize(cfg, rows, time.perf_counter() - started, commit) if rows else {}
    if workers <= 1:
        for seed in todo:
            rows.append(run_seed(cfg, seed, log=say))
            rows.sort(key=lambda r: cfg.seeds.index(r["seed"]))
            summary = _summarize(cfg, rows, time.perf_counter() - started, commit)
    elif todo:
        partial: dict[int, dict[str, Any]] = {}

        def on_done(seed: int, arm: str | None, result: Any) -> None:
            nonlocal summary
            if arm is None:
                partial[seed] = result
                return
            row = partial[seed]
            row["stages"][arm], row["arms"][arm] = result
            if len(row["arms"]) == len(cfg.arms):  # the seed's last arm is in
                rows.append(_seed_done(cfg, partial.pop(seed)))
                rows.sort(key=lambda r: cfg.seeds.index(r["seed"]))
                summary = _summarize(cfg, rows, time.perf_counter() - started, commit)

        _run_units(cfg, todo, workers, _unit_worker, on_done, say)
    return summary


def _run_units(cfg: QuickstartConfig, todo: list[int], workers: int, work: Callable[..., Any],
               on_done: Callable[[int, str | None, Any], None], say: Callable[[str], None]) -> None:
    """Run the seeds ``todo`` in ``workers`` processes, in units: ``work(asdict(cfg), seed, None)``
    (a seed's start), then ``work(asdict(cfg), seed, arm)`` for each arm; ``on_done(seed, arm,
    result)`` as each unit ends.

    The next unit is an arm of the earliest started seed, else the next seed's start: seeds finish
    (and are saved) in order, and no core idles while another runs a lone last seed. A worker that
    dies (the kernel's OOM killer, a segfault) breaks its pool: the units then in flight run again
    in a new pool of one worker fewer, so finished units are kept and a run that ran out of memory
    goes on with less of it in use. A worker dying with one worker left is an error that names the
    units."""
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    from envfactory.processes import worker_pool

    waiting, arms_left, started = list(todo), {}, []  # started: seeds whose start is done, in order
    lost: list[tuple[int, str | None]] = []  # units of a broken pool, run first in the next
    while waiting or lost or any(arms_left.values()):
        with worker_pool(workers, "spawn") as pool:  # a killed run takes its workers with it
            flight: dict[Any, tuple[int, str | None]] = {}

            def refill() -> None:
                while len(flight) < workers:
                    if lost:
                        unit = lost.pop(0)
                    elif (seed := next((s for s in started if arms_left[s]), None)) is not None:
                        unit = (seed, arms_left[seed].pop(0))
                    elif waiting:
                        unit = (waiting.pop(0), None)
                    else:
                        return
                    flight[pool.submit(work, asdict(cfg), *unit)] = unit

            refill()
            broken = False
            while flight and not broken:
                done, _ = wait(flight, return_when=FIRST_COMPLETED)
                for f in sorted(done, key=lambda f: isinstance(f.exception(), BrokenProcessPool)):
                    if isinstance(f.exception(), BrokenProcessPool):
                        broken = True  # every unit still in flight is lost with the pool
                        break
                    seed, arm = flight.pop(f)
                    result = f.result()  # a unit's own error ends the run, as it would in one process
                    if arm is None:
                        started.append(seed)
                        arms_left[seed] = list(cfg.arms)
                    on_done(seed, arm, result)
                if not broken:
                    refill()
            if broken:
                units = sorted(flight.values(), key=lambda u: (cfg.seeds.index(u[0]), u[1] is not None))
                named = ", ".join(f"seed {s} {a or 'start'}" for s, a in units)
                if workers == 1:
                    raise RuntimeError(f"a quickstart worker died running {named} with one worker left (killed "
                                       "by the kernel? out of memory: see dmesg); the seeds finished so far are "
                                       "saved, and a run started again keeps them")
                workers -= 1
                say(f"a worker died (killed by the kernel? out of memory): {named} run again, "
                    f"in {workers} worker{'s' if workers > 1 else ''}")
                lost = units


def _grid(rows: list[dict[str, Any]], stage: str, half: str) -> list[list[float]]:
    return [r["stages"][stage][half]["per_task"] for r in rows]


def _summarize(cfg: QuickstartConfig, rows: list[dict[str, Any]], seconds: float, commit: str | None) -> dict[str, Any]:
    from agents.metrics import plot_learning_curve
    from agents.quickstart.probe import blind_baselines
    from agents.stats import bootstrap_mean, holm, paired_bootstrap

    out = Path(cfg.output_dir)
    halves = eval_tasks(cfg.env, cfg.eval_tasks, cfg.eval_split)
    stages = ["before", "sft", *cfg.arms]
    success: dict[str, dict[str, Any]] = {}
    for half in halves:
        success[half] = {s: bootstrap_mean(_grid(rows, s, half)) for s in stages if half in rows[0]["stages"][s]}
    compare: dict[str, dict[str, Any]] = {}
    rl = [a for a in cfg.arms if a != CONTROL]
    primary = f"{rl[0]}_minus_{CONTROL}" if rl and CONTROL in cfg.arms else None
    for half in halves:
        if half == "unseen":
            compare[f"sft_minus_before/{half}"] = paired_bootstrap(_grid(rows, "before", half), _grid(rows, "sft", half))
        for arm in cfg.arms:
            compare[f"{arm}_minus_sft/{half}"] = paired_bootstrap(_grid(rows, "sft", half), _grid(rows, arm, half))
        for i, a in enumerate(cfg.arms):
            for b in cfg.arms[i + 1:]:
                x, y = (b, a) if a == CONTROL else (a, b)  # "<arm> − rft": the control on the right
                compare[f"{x}_minus_{y}/{half}"] = paired_bootstrap(_grid(rows, y, half), _grid(rows, x, half))
    primary_half = MODELS[cfg.model]["primary_half"]
    primary_key = f"{primary}/{primary_half}" if primary and primary_half in halves else None
    secondary = holm({k: v["p"] for k, v in compare.items() if k != primary_key})
    reading = {half: {s: _mean_reading([r["stages"][s][half] for r in rows])
                      for s in stages if half in rows[0]["stages"][s]} for half in halves}
    summary = {
        "env": cfg.env, "seeds": [r["seed"] for r in rows], "arms": list(cfg.arms),
        "model": cfg.model,
        "primary_metric": f"success on the {primary_half} half of the evaluation split, paired by seed and task",
        "primary_comparison": primary_key,
        "primary": compare.get(primary_key) if primary_key else None,
        "success": success, "compare": compare, "holm": secondary, "reading": reading,
        "blind": {half: blind_baselines(ts) for half, ts in halves.items()},
        "arms_training": {a: {k: statistics.mean(r["arms"][a][k] for r in rows)
                              for k in ("tokens_sampled", "tokens_trained", "branches", "train_seconds")}
                          for a in cfg.arms},
        "tasks": {h: [t.id for t in ts] for h, ts in halves.items()},
        "seconds": round(seconds, 1), "seed_seconds": {r["seed"]: r["seconds"] for r in rows},
        "per_seed": rows, "config": asdict(cfg), "recipe": _recipe(cfg),
        "commit": commit, "host": host(),
    }
    summary["readers_not_taken"] = _readers_not_taken(summary)
    # one line an arm, the mean over seeds (a line per seed and arm made 50 lines and a legend that
    # covered the plot at 10 seeds); each seed's curve stays in summary.json
    steps = min((len(r["arms"][a]["train_success"]) for r in rows for a in cfg.arms), default=0)
    curves = {a: [(i + 1, statistics.mean(r["arms"][a]["train_success"][i] for r in rows)) for i in range(steps)]
              for a in cfg.arms}
    png = plot_learning_curve(curves, out / "learning_curve.png", xlabel="RL step",
                              title=f"Training success on rl-split tasks (sampled; mean of {len(rows)} "
                                    f"seed{'s' if len(rows) != 1 else ''})")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "report.md").write_text(_report(summary, Path(png).name))
    return summary


def _mean_reading(reports: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("success", "item_first", "container_second", "shown", "success_given_shown", "success_given_not_shown")
    out = {k: _avg([r.get(k) for r in reports]) for k in keys}
    swaps = [r["swap"] for r in reports if "swap" in r]
    if swaps:
        out["swap"] = {k: _avg([s.get(k) for s in swaps]) for k in ("greedy_success", "twin_success", "moved", "stayed")}
        out["swap"]["solved"] = sum(s["solved"] for s in swaps)
    return out


def _avg(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.mean(xs), 4) if xs else None


def _commit() -> str | None:
    """The checkout's commit, with ``+changes`` when tracked files differ from it (the figures are
    then of code no commit holds), or None outside a git checkout."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        return (head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")) or None
    except Exception:
        return None


def _short(commit: str | None) -> str:
    """A commit as reports show it: 10 hex digits, and ``+changes`` when the tree differed."""
    return "unknown" if not commit else commit[:10] + ("+changes" if commit.endswith("+changes") else "")


def _ci(c: dict[str, Any]) -> str:
    return f"{c['mean']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]"


def _report(s: dict[str, Any], png: str) -> str:
    c = s["config"]
    lines = [
        "# envfactory quickstart report", "",
        f"Environment `{s['env']}`; {_MODEL_NAMES[s.get('model', 'tiny')]}; seeds {s['seeds']}; {s['seconds']} s in all; commit "
        f"`{_short(s['commit'])}`. Arms from the same post-SFT checkpoint: {', '.join(s['arms'])} "
        f"(M={c['M']}, {c['rl_steps']} steps x {c['tasks_per_step']} tasks, lr {c['rl_lr']}, KL {c['kl_coef']}). "
        f"Evaluation: {c['eval_samples']} sampled episodes (temperature {c['eval_temperature']}) of each "
        "evaluation-split task, paired by seed and task.", "",
        host_line(s["host"], recorded_host()) if s.get("host") else "Host: not recorded.", "",
    ]
    for half, succ in s["success"].items():
        b = s["blind"][half]
        lines += [f"## {half} ({len(s['tasks'][half])} tasks; blind: random room {b['random']:.3f}, "
                  f"most frequent room {b['most_frequent']:.3f})", "",
                  "| stage | success [95% CI] | first call right | shown | success if shown | if not shown "
                  "| swap: greedy | moved | stayed |", "|---|---|---|---|---|---|---|---|---|"]
        for stage, m in succ.items():
            r = s["reading"][half][stage]
            sw = r.get("swap") or {}
            lines.append(f"| {stage} | {m['mean']:.3f} [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}] | {_f(r['item_first'])} | "
                         f"{_f(r['shown'])} | {_f(r['success_given_shown'])} | {_f(r['success_given_not_shown'])} | "
                         f"{_f(sw.get('greedy_success'))} | {_f(sw.get('moved'))} | {_f(sw.get('stayed'))} |")
        lines.append("")
    if _not_taken_line(s):
        lines += [f"**{_not_taken_line(s)}**", ""]
    if s["primary"]:
        p = s["primary"]
        lines += [f"**Primary (fixed in advance): {s['primary_comparison'].replace('_minus_', ' − ')} = {_ci(p)}**"
                  + (" (excludes 0)" if p["excludes_zero"] else " (includes 0: no difference shown)"), ""]
    lines += ["Other paired differences (two-way bootstrap 95% CI; Holm-corrected p):", ""]
    lines += [f"- {k.replace('_minus_', ' − ')}: {_ci(v)}, p_holm {s['holm'][k]['p_holm']:.3f}"
              + (" (significant)" if s["holm"][k]["significant"] else "")
              for k, v in s["compare"].items() if k in s["holm"]]
    lines += ["", "Training cost per seed (mean): " + "; ".join(
        f"{a}: {v['tokens_sampled']:.0f} tokens sampled, {v['tokens_trained']:.0f} trained, {v['train_seconds']:.0f}s"
        for a, v in s["arms_training"].items()), "", f"![learning curves]({png})", ""]
    return "\n".join(lines)


_MODEL_NAMES = {"tiny": "the tiny model", "smol": "SmolLM2-135M-Instruct"}

RUN_OPTIONS = ("env", "seeds", "arms", "rl_steps", "eval_tasks", "eval_samples", "probe", "workers", "device",
               "output_dir", "cache_dir", "resume", "model")
"""The config keys a run sets from the command line; every other key is the code's default."""

_BEGIN, _END = "<!-- quickstart-figures", "<!-- /quickstart-figures -->"
FIGURES_PAGE = "benchmarks/results/RESULTS.md"
"""Where the quickstart's figures are shown (relative to the repository root), generated by
:func:`write_figures` between the two markers."""


def figures_block(s: dict[str, Any]) -> str:
    """The quickstart figures RESULTS.md shows, rendered from a quickstart summary (``summary.json``):
    per evaluation half and stage, success with its CI and what explains it, the blind
    baselines, the primary comparison and the controls. RESULTS.md's copy is generated by
    :func:`write_figures` and checked against its results file by ``tests/test_quickstart.py``."""
    lines = [f"Commit `{_short(s.get('commit'))}`, seeds {s['seeds']}, "
             f"{', '.join(f'{len(v)} {h}' for h, v in s['tasks'].items())} evaluation tasks x "
             f"{s['config']['eval_samples']} samples, {_minutes(s['seed_seconds'].values())} min per seed.", "",
             "| half | stage | success [95% CI] | first call right | success if shown | swap: moved |",
             "|---|---|---|---|---|---|"]
    for half, succ in s["success"].items():
        b = s["blind"][half]
        for stage, m in succ.items():
            r = s["reading"][half][stage]
            lines.append(f"| {half} | {stage} | {m['mean']:.3f} [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}] | "
                         f"{_f(r['item_first'])} | {_f(r['success_given_shown'])} | {_f((r.get('swap') or {}).get('moved'))} |")
        lines.append(f"| {half} | blind: random room / most frequent | {b['random']:.3f} / {b['most_frequent']:.3f} | | | |")
    lines.append("")
    if _not_taken_line(s):
        lines.append(_not_taken_line(s))
    if s["primary"]:
        p = s["primary"]
        lines.append(f"Primary, fixed in advance: {s['primary_comparison'].replace('_minus_', ' − ')} = {_ci(p)}"
                     + (" (excludes 0)." if p["excludes_zero"] else " (includes 0: no difference shown)."))
    held = [k for k in s["compare"] if k in s["holm"]]
    zero = [k for k in held if s["compare"][k]["mean"] == 0 and list(s["compare"][k]["ci"]) == [0, 0]]
    others = [f"{k.replace('_minus_', ' − ')} {_ci(s['compare'][k])} (p_holm {s['holm'][k]['p_holm']:.3f})"
              for k in held if k not in zero]
    if zero:  # both arms 0.000 on every task: listing them says nothing
        others.append(f"{len(zero)} more are exactly 0 [0, 0] (both arms solve nothing there: "
                      f"{', '.join(sorted({k.rsplit('/', 1)[-1] for k in zero}))})")
    if others:
        lines.append("Others (Holm-corrected): " + "; ".join(others) + ".")
    return "\n".join(lines)


def _minutes(seconds: Any) -> str:
    lo, hi = round(min(seconds) / 60), round(max(seconds) / 60)
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def write_figures(results: str | os.PathLike[str], page: str | os.PathLike[str] = FIGURES_PAGE) -> None:
    """Replace the quickstart figures of ``page`` (between ``<!-- quickstart-figures: FILE -->``
    and ``<!-- /quickstart-figures -->``) by :func:`figures_block` of the summary ``results``."""
    text = Path(page).read_text()
    head, rest = text.split(_BEGIN, 1)
    _, tail = rest.split(_END, 1)
    block = figures_block(json.loads(Path(results).read_text()))
    Path(page).write_text(f"{head}{_BEGIN}: {Path(results).as_posix()} -->\n{block}\n{_END}{tail}")


def page_figures(page: str | os.PathLike[str] = FIGURES_PAGE) -> tuple[str, str]:
    """The quickstart figures ``page`` shows: (the results file it names, the block it shows)."""
    _, rest = Path(page).read_text().split(_BEGIN, 1)
    header, rest = rest.split("-->", 1)
    return header.strip(" :"), rest.split(_END, 1)[0].strip("\n")


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"
