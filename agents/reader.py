"""The tiny model taught to read tool results: SFT on FindLight-v3's sft split and an endless
supply of fresh tasks, cached per seed.

Pretraining (:mod:`agents.pretrain`) gives the tiny model the chat format and the tools of
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
returns the folder, cached under :func:`agents.tiny.cache_root` keyed by the pretrained
model, the recipe and the seed, published with an atomic rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["READER_CONFIG", "reader_model", "reader_trajectories"]

_FORMAT = 1  # bump when the recipe changes

READER_CONFIG: dict[str, Any] = {
    "env": "FindLight-v3",
    "supply": 3200,       # fresh supply tasks (besides the environment's sft split)
    "made_up": 0.5,      # chance that a supply name is made up
    "epochs": 1,
    "lr": 2e-3,
    "batch_size": 8,
}
"""The default recipe (all of it is part of the cache key)."""


def reader_trajectories(tokenizer: Any, cfg: dict[str, Any], seed: int) -> list[Any]:
    """The reference plays SFT learns from (sft split first, then the supply), as trajectories."""
    import envfactory
    from environments.find_light import v3_supply

    from .algorithms.sft import reference_rollouts

    spec = envfactory.spec(cfg["env"])
    tasks = spec.tasks_in("sft") + v3_supply(cfg["supply"], seed=seed, made_up=cfg["made_up"])
    env = envfactory.make(cfg["env"])
    try:
        return [ro.trajectory for ro in reference_rollouts(tokenizer, [(env, t) for t in tasks])]
    finally:
        env.close()


def reader_model(seed: int = 0, config: dict[str, Any] | None = None, *, cache_dir: str | os.PathLike[str] | None = None,
                 log: Callable[[str], None] | None = None, device: str = "cpu") -> str:
    """The pretrained tiny model of ``seed`` after reader SFT (see the module docstring); its folder.
    Built the first time (minutes on 2 cores; progress goes to ``log``), cached afterwards."""
    import torch

    from .hf_policy import HFPolicy
    from .pretrain import pretrained_tiny_model
    from .tiny import cache_root
    from .train_config import OutputConfig, SFTConfig, TrainerConfig
    from .trainer import Trainer

    cfg = {**READER_CONFIG, **(config or {})}
    say = log or (lambda m: None)
    base = pretrained_tiny_model(seed=seed)
    key = hashlib.sha256(json.dumps({"format": _FORMAT, "base": os.path.basename(base), "cfg": cfg, "seed": seed},
                                    sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    dest = root / f"tiny-qwen2-reader-{key}"
    if (dest / "envfactory-reader.json").exists():
        return str(dest)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    policy = HFPolicy(base, device=device)
    trajs = reader_trajectories(policy.tokenizer, cfg, seed)
    say(f"reader sft (seed {seed}): {len(trajs)} reference plays ({time.perf_counter() - t0:.0f}s); "
        f"{cfg['epochs']} epoch(s) of {len(trajs) // cfg['batch_size']} steps")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        with tempfile.TemporaryDirectory() as logs:
            tr = Trainer(policy, [cfg["env"]], TrainerConfig(
                seed=seed, sft=SFTConfig(epochs=cfg["epochs"], lr=cfg["lr"], batch_size=cfg["batch_size"]),
                output=OutputConfig(dir=logs, show_progress=False)))
            r = tr.sft(trajectories=trajs, log_every=max(1, len(trajs) // cfg["batch_size"] // 10),
                       log=lambda m: say(f"reader sft (seed {seed}): {m} ({time.perf_counter() - t0:.0f}s)"))
            tr.close()
        policy.model.save_pretrained(tmp, safe_serialization=True)
        for f in Path(base).iterdir():
            if f.is_file() and not (tmp / f.name).exists():
                shutil.copy(f, tmp / f.name)
        (tmp / "envfactory-reader.json").write_text(json.dumps(
            {"format": _FORMAT, "seed": seed, "base": os.path.basename(base), "config": cfg,
             "examples": r["examples"], "final_nll": r["final_nll"],
             "seconds": round(time.perf_counter() - t0, 1)}, indent=2))
        try:
            os.rename(tmp, dest)
        except OSError:  # another process published it first
            if not (dest / "envfactory-reader.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        policy.close()
    say(f"reader sft (seed {seed}): done in {time.perf_counter() - t0:.0f}s")
    return str(dest)
