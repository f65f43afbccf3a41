"""Does reader SFT teach the tiny model to read, from which pretrained checkpoint?

Trains reader SFT (the recipe of :mod:`agents.quickstart.reader`: loss on the model's own turns of
FindLight-v3 reference plays, packed after one shared opening) from a chosen pretrained
checkpoint with a chosen SFT seed, on a longer schedule, and every ``--every`` steps plays
``--tasks`` unseen evaluation tasks greedily: success, whether the first call looked up the
instruction's item, and whether the room was shown. Nothing is cached or published; the
quickstart's readers are :func:`agents.quickstart.reader.reader_model`.

    python benchmarks/reader_bases.py --seed 1 --base-seed 0 --steps 400 --every 200
    python benchmarks/reader_bases.py --seed 1 --base-seed 1 --steps 400 --every 200

Measured 2026-11-25 (2 shared cores, 1 thread each, SFT seed 1, a 1,600-step schedule stopped at
step 400, 40 tasks): from checkpoint 0, greedy success 0.10 at step 200 and 0.80 at step 400
(first call right 0.23 -> 0.83); from checkpoint 1, 0.075 and 0.025 (first call right 0.05 -> 0.00).
Measured 2026-11-29 on an AVX-512 host, whose checkpoint 0 (pretrained there) differs, SFT seeds 0
and 1, a 1,200-step schedule, 12,000 supply tasks: greedy success 0.10 / 0.15 at step 200, 0.55 /
0.78 at 400, 0.95 / 0.95 at 600, 1.00 / 0.975 at 800.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1, help="SFT seed (supply tasks and their order)")
    ap.add_argument("--base-seed", type=int, default=0, help="pretrained checkpoint to start from")
    ap.add_argument("--steps", type=int, default=400, help="steps to run")
    ap.add_argument("--schedule", type=int, default=1600, help="steps the learning-rate schedule spans")
    ap.add_argument("--every", type=int, default=200, help="evaluate every this many steps")
    ap.add_argument("--tasks", type=int, default=40, help="unseen evaluation tasks per evaluation")
    ap.add_argument("--supply", type=int, default=12000, help="fresh supply tasks besides the sft split")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.policies.hf_policy import HFPolicy
    from agents.models.pretrain import _shared_rows, pretrained_tiny_model
    from agents.quickstart.probe import episode_facts, play
    from agents.quickstart.experiment import eval_tasks
    from agents.quickstart.reader import READER_CONFIG, reader_plays, save_beside_base, schedule_lr, sft_step

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    base = pretrained_tiny_model(seed=a.base_seed)
    tok = AutoTokenizer.from_pretrained(base)
    plays = reader_plays(tok, {**READER_CONFIG, "supply": a.supply}, a.seed)
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    rows = _shared_rows(plays, lambda s: tok(s, add_special_tokens=False)["input_ids"], a.schedule,
                        READER_CONFIG["seq_len"], pad, random.Random(a.seed), assistant_only=True)
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    tasks = eval_tasks("FindLight-v3", a.tasks)["unseen"]
    losses: list[float] = []
    folder = Path(tempfile.mkdtemp(prefix="reader-bases-"))
    try:
        model.train()
        for step in range(a.steps):  # the reader's step and schedule, spanning --schedule steps
            losses.append(sft_step(model, opt, rows, step, 1, schedule_lr(a.lr, step, 20, a.schedule)))
            if (step + 1) % a.every and step + 1 != a.steps:
                continue
            save_beside_base(model, base, folder)
            pol = HFPolicy(str(folder))
            facts = [episode_facts(t, e[0]) for t, e in
                     zip(tasks, play(pol, "FindLight-v3", tasks, samples=1, seed=1, temperature=0.0))]
            pol.close()
            row = {"seed": a.seed, "base_seed": a.base_seed, "step": step + 1,
                   "nll": round(sum(losses[-50:]) / len(losses[-50:]), 4),
                   **{k: round(sum(f[k] for f in facts) / len(facts), 4)
                      for k in ("success", "item_first", "container_second", "shown")},
                   "seconds": round(time.perf_counter() - t0, 1)}
            print(json.dumps(row), flush=True)
            model.train()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert math.isfinite(losses[-1])


if __name__ == "__main__":
    main()
