"""The tiny model taught to read tool results: SFT on FindLight-v3's sft split and an endless
supply of fresh tasks, cached per seed.

Pretraining (:mod:`agents.models.pretrain`) gives the tiny model the chat format and the tools of
35 environments, but it looks up the wrong item on FindLight nine times in ten: copying a
name from the instruction into a call, and a room from a tool response into the next call,
needs many more examples than the registered tasks hold. This stage fine-tunes the
pretrained model (loss on its own turns only, exactly the SFT of :meth:`agents.trainer.Trainer.sft`)
on the reference plays of

* FindLight-v3's ``sft``-split tasks, and
* ``supply`` fresh tasks of the same world (:func:`environments.find_light.v3_supply`),
  about half of whose names are made up, so that recalling names cannot work and copying
  what was read must.

No evaluation task is played, and no held-out name or phrasing occurs (the supply's
construction guarantees it; ``tests/test_reader.py`` checks it). :func:`reader_model`
returns the folder, cached under :func:`agents.models.tiny.cache_root` keyed by the pretrained
model, the recipe and the seed, published with an atomic rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["READER_CONFIG", "SMOL_READER_CONFIG", "COPY_CHECK", "reader_model", "copy_check", "reader_plays",
           "base_model", "schedule_lr", "sft_step", "save_beside_base", "packed_sft", "train_top"]

_FORMAT = 1  # bump when the recipe changes

COPY_CHECK: dict[str, Any] = {"tasks": 40, "min_success": 0.25, "rounds": 3}
"""The copy check (``READER_CONFIG["check"]``; see there)."""

READER_CONFIG: dict[str, Any] = {
    "env": "FindLight-v3",
    "supply": 6400,       # fresh supply tasks (besides the environment's sft split)
    "sft_tasks": None,    # how many of the sft split's tasks (None: all)
    "made_up": 0.5,      # chance that a supply name is made up
    "epochs": 1,          # passes over the plays
    "lr": 2e-3,           # AdamW peak learning rate
    "batch": 1,           # rows per step
    "seq_len": 2048,      # positions per row: one opening and the plays after it
    "pretrained": True,   # start from the pretrained tiny model (False: the random build, for tests)
    "base_seed": 0,       # which pretrained checkpoint every seed starts from (None: the seed's own)
    "check": COPY_CHECK,  # after SFT, greedy copying on fresh tasks, or SFT again (None: no check)
}
"""The default recipe (all of it is part of the cache key; the base through its folder).

Three keys are optional and absent here (the tiny model's recipe predates them): ``"tokenizer"``,
how the tiny base's tokenizer cuts words (:data:`agents.models.tiny.TOKENIZERS`; absent: ``"qwen"``);
``"base"``, the model reader SFT starts from (``"tiny"``, the default: the pretrained tiny model;
``"smol"``: the packaged SmolLM2-135M-Instruct, :mod:`agents.models.smol`, prompts with one-line tool
signatures; or any local HF model folder), and ``"train_layers"`` (train only the top N decoder
layers, in SFT and in RL: :func:`agents.models.smol.freeze_below`; absent or ``None``: all).

``"check"`` (:data:`COPY_CHECK`; ``None`` or absent: no check) is the copy check after SFT:
greedy success on ``tasks`` fresh supply tasks of a stream of their own (``"reader-check"``; no
evaluation task, no held-out name) must reach ``min_success`` (twice a random room's 0.125), or
SFT runs again, the same recipe on the plays of ``supply`` fresh tasks, up to ``rounds`` rounds.
A seed whose first round passes gets exactly the weights it got without the check. It is the
default since three of ten tiny readers (seeds 3, 7, 9 of ``arpo_vs_grpo``, 2026-12-02) never
learned to copy in one round on one machine's base."""

SMOL_READER_CONFIG: dict[str, Any] = {
    **READER_CONFIG,
    "base": "smol",
    "base_seed": None,    # one published model: every seed starts from it
    "sft_tasks": 120,     # 120 of the sft split's tasks and 120 supply tasks (half their names made up):
    "supply": 120,        # a pretrained LLM copies already; a few hundred plays teach the format and the chain
    "lr": 1e-4,
    "train_layers": 8,    # the top 8 of 30 layers (28.3M of 134.5M parameters)
    "check": None,        # it copies after one round (greedy 0.55, 0.52 on unseen tasks, 2026-12-02)
}
"""Reader SFT for SmolLM2-135M-Instruct (``envfactory quickstart --model smol``)."""


def reader_plays(tokenizer: Any, cfg: dict[str, Any], seed: int) -> list[Any]:
    """The reference plays SFT learns from (the sft split, then the supply), rendered with
    ``tokenizer``'s chat template as rollouts render them (:class:`agents.models.pretrain.Play`)."""
    import envfactory
    from envfactory.checks.scripted import OraclePolicy
    from environments.find_light import v3_supply

    from agents.models.pretrain import Play

    spec = envfactory.spec(cfg["env"])
    tasks = spec.tasks_in("sft")[:cfg["sft_tasks"]] + v3_supply(cfg["supply"], seed=seed, made_up=cfg["made_up"])
    env = envfactory.make(cfg["env"])
    schemas = env.tool_schemas()
    plays = []
    try:
        for t in tasks:
            env.reset(t)
            for action in OraclePolicy.actions(t):
                if env.done:
                    break
                env.step(action)
            if not env.success:
                raise RuntimeError(f"{cfg['env']}/{t.id}: the reference solution did not succeed")
            plays.append(Play(cfg["env"], t.id, "sft", "oracle",
                              tokenizer.apply_chat_template(env.transcript(), tools=schemas, tokenize=False)))
    finally:
        env.close()
    return plays


def base_model(seed: int, config: dict[str, Any] | None = None, *, log: Callable[[str], None] | None = None,
               device: str = "cpu") -> str:
    """The model reader SFT starts from: one pretrained checkpoint for every seed, that of
    ``config["base_seed"]`` (the seed's own when it is ``None``), or the random build of ``seed``
    when ``config["pretrained"]`` is false; with ``config["base"]`` set, that model instead
    (see :data:`READER_CONFIG`).

    One checkpoint, as a study of fine-tuning starts every seed from one published model: the
    seeds vary the SFT data, its order and everything after. Checkpoints differ in how soon reader
    SFT teaches them to copy: with the earlier 400-step recipe, checkpoint 1 never did (greedy 0.00
    of 40 unseen tasks) and checkpoint 0 reached 0.80 on one machine; checkpoint 0 pretrained on
    another machine (its float rounding differs, so its weights do) reached 0.11 sampled. The
    recipe's 720 steps take it to 0.76-0.85 on that machine (``benchmarks/results/RESULTS.md``).

    ``log`` gets pretraining's progress lines when the checkpoint is built here (``device``: where)."""
    from agents.models.pretrain import pretrained_tiny_model
    from agents.models.tiny import build_tiny_model

    cfg = {**READER_CONFIG, **(config or {})}
    base = cfg.get("base", "tiny")
    if base == "smol":
        from agents.models.smol import smol_model_path

        return smol_model_path(tools="signatures")
    if base != "tiny":
        if not Path(base, "config.json").is_file():
            raise ValueError(f"reader base must be 'tiny', 'smol' or a local HF model folder; {base!r} has no config.json")
        return str(base)
    tokenizer = cfg.get("tokenizer", "qwen")
    if not cfg["pretrained"]:
        return build_tiny_model(seed=seed, tokenizer=tokenizer)
    return pretrained_tiny_model(seed=seed if cfg["base_seed"] is None else cfg["base_seed"], log=log, device=device,
                                 tokenizer=tokenizer)


def reader_model(seed: int = 0, config: dict[str, Any] | None = None, *, cache_dir: str | os.PathLike[str] | None = None,
                 log: Callable[[str], None] | None = None, device: str = "cpu") -> str:
    """The pretrained tiny model of ``seed`` after reader SFT (see the module docstring); its folder.
    Built the first time (minutes on 2 cores; progress lines go to ``log``), cached afterwards.

    Training packs one opening (system prompt and tools) and the conversations of several
    plays per row, each conversation attending to the opening and itself at its own episode
    positions, loss on the model's own tokens only (:func:`agents.models.pretrain._shared_rows` with
    ``assistant_only``): per play exactly the SFT loss of a rollout, on about a third of the
    positions of one sequence per play (token arithmetic: ~183 against ~616 on FindLight-v3)."""
    import math
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.models.pretrain import _shared_rows, assistant_mask, rows_on
    from agents.models.tiny import cache_root, publish_folder

    cfg = {**READER_CONFIG, **(config or {})}
    say = log or (lambda m: None)
    base = base_model(seed, cfg, log=say, device=device)
    # the base is keyed by its folder (base_seed and tokenizer choose it); "check": None keys as an
    # absent check (readers built before it)
    recipe = {k: v for k, v in cfg.items()
              if k not in ("base_seed", "tokenizer") and not (k == "check" and v is None)}
    key = hashlib.sha256(json.dumps({"format": _FORMAT, "base": os.path.basename(base), "cfg": recipe, "seed": seed},
                                    sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    kind = cfg.get("base", "tiny")
    dest = root / f"{_FOLDER_NAMES.get(kind, Path(base).name)}-reader-{key}"
    if (dest / "envfactory-reader.json").exists():
        return str(dest)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(base)
    plays = reader_plays(tok, cfg, seed)

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    opening = len(encode(plays[0].text.split("<|im_start|>user\n", 1)[0]))
    conv = sum(len(assistant_mask(encode, p.text[p.text.index("<|im_start|>user\n"):])[0]) for p in plays[:50]) / 50
    per_row = max(1, int((cfg["seq_len"] - opening) // conv))
    pad = tok.convert_tokens_to_ids("<|endoftext|>")

    def rows_of(plays: list[Any], stream: int | str) -> tuple[Any, int]:
        n = math.ceil(cfg["epochs"] * len(plays) / per_row / cfg["batch"])
        return rows_on(_shared_rows(plays, encode, n * cfg["batch"], cfg["seq_len"], pad, random.Random(stream),
                                    assistant_only=True), device), n

    rows, steps = rows_of(plays, seed)
    say(f"reader sft (seed {seed}): {len(plays)} reference plays, {steps} steps of {cfg['batch']} rows "
        f"(~{per_row} plays each) ({time.perf_counter() - t0:.0f}s)")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa").to(device)
    train_top(model, cfg)

    def train(rows: Any, n: int, label: str) -> list[float]:
        # a large vocabulary (SmolLM2's 49,152) makes the output layer at unscored positions a large
        # share of the step; the tiny model's recipe was measured without this
        return packed_sft(model, rows, steps=n, batch=cfg["batch"], lr=cfg["lr"], log=say, label=label,
                          started=t0, scored_only=kind != "tiny")

    losses = train(rows, steps, f"reader sft (seed {seed})")
    rounds = [{"plays": len(plays), "steps": steps, "nll_last": round(losses[-1], 4)}]
    check = cfg.get("check")
    while check:
        rounds[-1]["check"] = got = copy_check(model, tok, cfg, device=device)
        say(f"reader sft (seed {seed}): copy check {got:.3f} greedy on {check['tasks']} fresh tasks after round "
            f"{len(rounds)} (needs {check['min_success']}) ({time.perf_counter() - t0:.0f}s)")
        if got >= check["min_success"] or len(rounds) >= check["rounds"]:
            break
        stream = f"{seed}.{len(rounds)}"  # a supply stream no other round or seed reads
        more = reader_plays(tok, {**cfg, "sft_tasks": 0}, stream)
        rows, n = rows_of(more, stream)
        say(f"reader sft (seed {seed}): round {len(rounds) + 1}, {len(more)} fresh plays, {n} steps")
        losses += train(rows, n, f"reader sft (seed {seed}, round {len(rounds) + 1})")
        rounds.append({"plays": len(more), "steps": n, "nll_last": round(losses[-1], 4)})
    if check and rounds[-1]["check"] < check["min_success"]:
        say(f"reader sft (seed {seed}): the copy check still fails after {len(rounds)} rounds; "
            f"keeping this model (the quickstart names such a seed)")

    def save(tmp: Path) -> None:
        save_beside_base(model, base, tmp)
        (tmp / "envfactory-reader.json").write_text(json.dumps(
            {"format": _FORMAT, "seed": seed, "base": os.path.basename(base), "config": cfg, "plays": len(plays),
             "steps": sum(r["steps"] for r in rounds), "rounds": rounds,
             "nll_first": round(losses[0], 4), "nll_last": round(losses[-1], 4),
             "seconds": round(time.perf_counter() - t0, 1)}, indent=2))

    model.to("cpu")
    publish_folder(dest, "envfactory-reader.json", save)
    say(f"reader sft (seed {seed}): done in {time.perf_counter() - t0:.0f}s")
    return str(dest)


def copy_check(model: Any, tokenizer: Any, config: dict[str, Any] | None = None, *, device: str = "cpu") -> float:
    """Greedy success of ``model`` on the copy check's fresh tasks (``config["check"]``, see
    :data:`READER_CONFIG`): tasks of the supply stream ``"reader-check"``, which no reader trains on
    and no evaluation draws from, names made up as often as in training. Leaves ``model`` in eval mode."""
    from environments.find_light import v3_supply

    from agents.policies.hf_policy import HFPolicy
    from agents.quickstart.probe import reading_report

    cfg = {**READER_CONFIG, **(config or {})}
    tasks = v3_supply((cfg.get("check") or COPY_CHECK)["tasks"], seed="reader-check", made_up=cfg["made_up"])
    policy = HFPolicy(model, tokenizer=tokenizer, device=device)
    return reading_report(policy, cfg["env"], tasks, samples=1, temperature=0.0, swap=False,
                          max_new_tokens=40)["success"]  # the quickstart's evaluation budget


_FOLDER_NAMES = {"tiny": "tiny-qwen2", "smol": "smollm2-135m"}  # cached readers' folder names, by base


def train_top(model: Any, config: dict[str, Any] | None) -> int:
    """Make only the top ``config["train_layers"]`` decoder layers of ``model`` trainable (all of them
    when the key is absent or ``None``); how many parameters train. Reader SFT and every RL arm
    of the same recipe train the same parameters."""
    from agents.models.smol import freeze_below

    return freeze_below(model, (config or {}).get("train_layers"))


def packed_sft(model: Any, rows: Any, *, steps: int, batch: int, lr: float,
               log: Callable[[str], None] | None = None, label: str = "sft", started: float | None = None,
               scored_only: bool = False) -> list[float]:
    """Train ``model`` in place for ``steps`` AdamW steps of ``batch`` packed rows each (rows from
    :func:`agents.models.pretrain._shared_rows`), the learning rate warmed up over a twentieth of the steps
    and decayed to a tenth (:func:`schedule_lr`); a progress line to ``log`` every tenth of the run.
    Parameters that do not require grad stay as they are (see :func:`agents.models.smol.freeze_below`);
    ``scored_only``: the output layer runs at scored positions only (:func:`agents.models.pretrain._loss_sums`).
    Returns every step's loss."""
    import torch

    say = log or (lambda m: None)
    t0 = time.perf_counter() if started is None else started
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    warm = max(1, steps // 20)
    losses: list[float] = []
    for step in range(steps):
        losses.append(sft_step(model, opt, rows, step * batch, batch, schedule_lr(lr, step, warm, steps),
                               scored_only=scored_only))
        if (step + 1) % max(1, steps // 10) == 0 or step == steps - 1:
            recent = losses[-max(1, steps // 10):]
            say(f"{label}: step {step + 1}/{steps} nll {sum(recent) / len(recent):.3f} "
                f"({time.perf_counter() - t0:.0f}s)")
    return losses


def schedule_lr(peak: float, step: int, warm: int, total: int) -> float:
    """Reader SFT's learning rate at ``step``: linear warmup over ``warm`` steps, then linear
    decay to a tenth of ``peak`` at ``total``."""
    return peak * min((step + 1) / warm, 1.0 - 0.9 * max(0, step - warm) / max(1, total - warm))


def sft_step(model: Any, opt: Any, rows: Any, i: int, n: int, lr: float, scored_only: bool = False) -> float:
    """One optimizer step of the loss on rows ``i .. i+n`` (scored positions only) at ``lr``,
    gradients clipped to norm 1; the step's mean loss."""
    import torch

    from agents.models.pretrain import _loss_sums

    for g in opt.param_groups:
        g["lr"] = lr
    lo, valid = _loss_sums(model, rows, i, n, scored_only)
    loss = lo[valid].mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def save_beside_base(model: Any, base: str, folder: Path) -> None:
    """Save ``model`` into ``folder`` with the files of the model folder ``base`` it lacks
    (tokenizer, chat template, envfactory's markers), so the folder loads on its own."""
    model.save_pretrained(folder, safe_serialization=True)
    for f in Path(base).iterdir():
        if f.is_file() and not (folder / f.name).exists():
            shutil.copy(f, folder / f.name)
