"""Run by ``torchrun`` from ``tests/test_train_parallel.py`` (not a test module itself).

``python -m torch.distributed.run --nproc-per-node 2 tests/parallel_step.py MODE OUT`` builds the same tiny
Trainer on every rank (``learner.parallel: MODE``), gives rank ``r`` its own fixed samples
(:func:`samples`, unequal counts so FSDP2's ranks run different numbers of real micro-batches), runs one
``Trainer._update`` (or several, ``--updates``), and writes from rank 0 the full parameters after the step
and the losses to ``OUT`` (safetensors + json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = {"envs": ["Counter-v0"], "tasks": ["counter-0-3"], "respect_splits": False, "steps": 1,
        "algorithm": {"name": "grpo", "M": 2}, "sampling": {"max_new_tokens": 8, "max_turns": 1},
        "optim": {"lr": 1.0e-3, "tasks_per_step": 1, "micro_batch": 2, "grad_clip": 1.0},
        "output": {"show_progress": False}}
COUNTS = (3, 5)  # samples of rank 0 and rank 1


def trainer(mode: str, lora: bool = False, autocast: bool = False, kl: float = 0.0, lr: float = 1e-3,
            checkpointing: bool = False):
    import torch

    from agents.trainer import Trainer
    from agents.train_config import TrainerConfig

    torch.manual_seed(0)
    learner = {"parallel": mode, **({"lora": {"r": 4, "alpha": 8.0}} if lora else {}),
               **({"autocast": "bf16"} if autocast else {}), "gradient_checkpointing": checkpointing}
    algorithm = {**TINY["algorithm"], "kl_coef": kl}
    optim = {**TINY["optim"], "lr": lr}
    return Trainer.from_config(TrainerConfig.from_dict({**TINY, "algorithm": algorithm, "optim": optim,
                                                        "learner": learner}))


def samples(tr, rank: int) -> list:
    """Rank ``rank``'s fixed samples: random token sequences, a prompt of 6 tokens, every response token
    masked in but one in five, advantages of both signs (old log-probs: :func:`old_logprobs`)."""
    from agents.trainer import Sample

    rng = random.Random(1234 + rank)
    vocab = tr.learners[0].policy.tokenizer.vocab_size
    out = []
    for i in range(COUNTS[rank]):
        ids = [rng.randrange(3, vocab) for _ in range(rng.randrange(12, 20))]
        n = len(ids) - 6
        out.append(Sample("agent_0", ids, 6, [0 if rng.random() < 0.2 else 1 for _ in range(n)], [0.0] * n,
                          [rng.choice([-1.0, 0.5, 1.0])] * n))
    return out


def old_logprobs(tr, rows: list) -> None:
    """Set each sample's old log-probs to the starting model's (ratios start at 1)."""
    import torch

    from agents.algorithms.logprobs import token_logprobs

    with torch.no_grad():
        model = tr.learners[0].model
        lps = token_logprobs(model, [s.ids for s in rows], [s.start for s in rows], pad_id=tr.learners[0].pad_id)
    for s, lp in zip(rows, lps):
        s.old_logprobs = [float(x) for x in lp]


def main() -> None:
    import torch
    from safetensors.torch import save_file

    from agents.models.parallel import full_state_dict, gathered

    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("out")
    ap.add_argument("--updates", type=int, default=1)
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--save", help="write a checkpoint there after the updates")
    ap.add_argument("--kl", type=float, default=0.0, help="the KL penalty's coefficient (a reference model)")
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    tr = trainer(args.mode, lora=args.lora, kl=args.kl, lr=args.lr)
    rank = tr.world.rank
    rows = samples(tr, rank)
    with gathered(tr.learners[0].model):
        old_logprobs(tr, rows)
    losses = [tr._update(tr.learners[0], rows)["loss"] for _ in range(args.updates)]
    if args.save:
        tr.save(args.save)
    state, _ = full_state_dict(tr.learners[0].model)
    if rank == 0:
        save_file({k: v.detach().cpu().clone() for k, v in state.items()}, args.out + ".safetensors")
        Path(args.out + ".json").write_text(json.dumps({"losses": losses, "world": tr.world.size,
                                                        "mode": tr.world.mode}))
    tr.close()
    torch.distributed.destroy_process_group()
    # What the ranks did is written; the interpreter's finalization is skipped: there gloo's C++
    # threads can still be torn down under it, and a rank once died of SIGABRT ("terminate called
    # without an active exception") after writing everything (fresh-clone CI of 2026-12-08; never
    # reproduced in 3 reruns; pytorch/pytorch#179291 describes the race).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
