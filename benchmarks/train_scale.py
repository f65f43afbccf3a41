"""Training throughput and memory of the Trainer's update (issue 58), every ratio from one run.

    python -m benchmarks.train_scale [--repeats 3] [--positions 1024] [--skip processes,smol,memory]

Prints one JSON object with three sections:

* ``processes``: tokens/s of ``Trainer._update`` on the embedded tiny model, one process (two threads)
  against two processes under ``torchrun`` (gloo, plain data parallel, one thread each), the same global
  batch (16 sequences of 256 tokens) split across the ranks; the two alternate ``--repeats`` times and
  ``processes_2_vs_1_ratio`` is the median 2-process rate over the median 1-process rate.
* ``smol``: a SmolLM2-135M-shaped Llama (random weights: the shapes are what cost), its top 8 of 30 layers
  trained as the smol quickstart trains them: training positions/s of one update (``token_logprobs``
  forward, backward, AdamW) over ``--positions`` positions, against the matmul bound measured in the same
  run on the model's own linear shapes (:func:`benchmarks.rollout.matmul_flops_per_s`, both threads). The
  step's FLOPs count the linear layers only: 2 per weight per position forward (every layer and the output
  layer), 2 more for the gradient with respect to the input (from the output layer down to the lowest
  trained layer) and 2 for the gradient with respect to the trained weights.
* ``memory``: peak resident memory of one update of the same model above the process's memory just before
  it (the kernel's high-water mark reset first, Linux), all 30 layers trained, in a fresh process per variant: full fine-tuning or LoRA (r=16, every linear layer), each with
  and without gradient checkpointing; ratios against full fine-tuning without checkpointing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

SMOL = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048)
BATCH, LENGTH, PROMPT = 16, 256, 32  # the processes section's global batch


# -- processes: one against two, the same global batch ----------------------------------------------------
def _worker(out: str, repeats: int) -> None:
    """One rank (or the only process) of the processes section: time ``repeats`` updates."""
    import random

    import torch

    from agents.algorithms.logprobs import token_logprobs
    from agents.trainer import Sample, Trainer
    from agents.train_config import TrainerConfig

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        torch.set_num_threads(2)
    torch.manual_seed(0)
    tr = Trainer.from_config(TrainerConfig.from_dict({
        "envs": ["Counter-v0"], "tasks": ["counter-0-3"], "respect_splits": False,
        "algorithm": {"name": "grpo", "M": 2}, "optim": {"lr": 1e-5, "micro_batch": 4},
        "output": {"show_progress": False}}))
    w, ln = tr.world, tr.learners[0]
    rng = random.Random(7)
    vocab = ln.policy.tokenizer.vocab_size
    rows = []
    for i in range(BATCH):
        ids = [rng.randrange(3, vocab) for _ in range(LENGTH)]
        rows.append(Sample("agent_0", ids, PROMPT, [1] * (LENGTH - PROMPT), [0.0] * (LENGTH - PROMPT),
                           [1.0 if i % 2 else -1.0] * (LENGTH - PROMPT)))
    mine = rows[w.rank::w.size]
    with torch.no_grad():
        for s, lp in zip(mine, token_logprobs(ln.model, [s.ids for s in mine], [s.start for s in mine])):
            s.old_logprobs = [float(x) for x in lp]
    tr._update(ln, mine)  # warm-up
    times = []
    for _ in range(repeats):
        w.sum(0.0)  # start together
        t0 = time.perf_counter()
        tr._update(ln, mine)
        times.append(time.perf_counter() - t0)
    if w.main:
        tokens = BATCH * (LENGTH - PROMPT)
        with open(out, "w") as f:
            json.dump({"processes": w.size, "tokens": tokens, "seconds": times,
                       "tokens_per_s": tokens / statistics.median(times)}, f)
    tr.close()
    if w.size > 1:
        torch.distributed.destroy_process_group()


def _run_processes(n: int, repeats: int, out: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.train_scale", "--worker", out, "--repeats", str(repeats)]
    if n > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "-m",
               "benchmarks.train_scale", "--worker", out, "--repeats", str(repeats)]
    env = {**os.environ, "OMP_NUM_THREADS": "1" if n > 1 else "2"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{n} process(es) failed: {r.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


def bench_processes(repeats: int) -> dict[str, Any]:
    import tempfile

    runs: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            for n in (1, 2):
                r = _run_processes(n, 3, os.path.join(d, f"{n}-{i}.json"))
                runs[n].append(r["tokens_per_s"])
                print(f"processes={n}: {r['tokens_per_s']:.0f} tokens/s", file=sys.stderr, flush=True)
    one, two = statistics.median(runs[1]), statistics.median(runs[2])
    return {"processes_batch": f"{BATCH} x {LENGTH} tokens ({PROMPT} prompt)", "processes_1_tokens_per_s": runs[1],
            "processes_2_tokens_per_s": runs[2], "processes_2_vs_1_ratio": round(two / one, 3)}


# -- SmolLM2-shaped training against the matmul bound -----------------------------------------------------
def _smol(train_layers: int | None, lora: bool = False, checkpointing: bool = False) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agents.models.smol import freeze_below

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOL))
    freeze_below(model, train_layers)
    if lora:
        from agents.models.adapters import add_lora
        from agents.train_config import LoRAConfig

        add_lora(model, LoRAConfig(r=16))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _batch(positions: int, rows: int = 4) -> tuple[list[list[int]], list[int]]:
    import torch

    g = torch.Generator().manual_seed(1)
    n = positions // rows
    return [torch.randint(0, SMOL["vocab_size"], (n + 1,), generator=g).tolist() for _ in range(rows)], [1] * rows


def _optimizer(model: Any) -> Any:
    import torch

    from agents.models.adapters import trainable_parameters

    return torch.optim.AdamW(trainable_parameters(model), lr=1e-5)


def _update(model: Any, opt: Any, seqs: list[list[int]], starts: list[int], share_prefix: bool = True) -> float:
    """One timed update: ``token_logprobs`` forward, backward, an AdamW step."""
    from agents.algorithms.logprobs import token_logprobs

    t0 = time.perf_counter()
    model.train()
    lps = token_logprobs(model, seqs, starts, share_prefix=share_prefix)
    (-sum(lp.sum() for lp in lps)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def bench_smol(positions: int, repeats: int, train_layers: int = 8) -> dict[str, Any]:
    import torch

    from benchmarks.rollout import matmul_flops_per_s

    torch.set_num_threads(2)
    model = _smol(train_layers)
    seqs, starts = _batch(positions)
    opt = _optimizer(model)
    _update(model, opt, seqs, starts)  # warm-up
    times = [_update(model, opt, seqs, starts) for _ in range(repeats)]
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    total = sum(m.weight.numel() for m in linear)
    layers = model.model.layers
    trained = sum(m.weight.numel() for layer in layers[len(layers) - train_layers:]
                  for m in layer.modules() if isinstance(m, torch.nn.Linear))
    head = model.lm_head.weight.numel()
    flops_per_position = 2 * total + 2 * (trained + head) + 2 * trained
    bound = matmul_flops_per_s(model, batch=positions // 4, threads=2)
    rate = positions / statistics.median(times)
    return {"smol_train_layers": train_layers, "smol_positions": positions,
            "smol_step_s": [round(t, 3) for t in times], "smol_positions_per_s": round(rate, 1),
            "smol_flops_per_position": flops_per_position, "smol_matmul_bound_gflops": round(bound / 1e9, 1),
            "smol_bound_positions_per_s": round(bound / flops_per_position, 1),
            "smol_vs_bound_ratio": round(rate * flops_per_position / bound, 3)}


# -- memory: full fine-tuning or LoRA, with or without checkpointing -----------------------------------------
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _memory_one(lora: bool, checkpointing: bool, positions: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(2)
    model = _smol(None, lora=lora, checkpointing=checkpointing)
    seqs, starts = _batch(positions)
    opt = _optimizer(model)  # its state is allocated by the update's step, inside the measured peak
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark (Linux): the peak of this step alone, not of building the model
    base = _status_kb("VmRSS")
    seconds = _update(model, opt, seqs, starts, share_prefix=not checkpointing)
    peak = _status_kb("VmHWM")
    return {"peak_mb": round((peak - base) / 1024, 1), "seconds": round(seconds, 2)}


def bench_memory(positions: int) -> dict[str, Any]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    out: dict[str, Any] = {}
    ctx = mp.get_context("spawn")
    for lora in (False, True):
        for ckpt in (False, True):
            name = f"memory_{'lora' if lora else 'full'}{'_checkpointing' if ckpt else ''}"
            with ProcessPoolExecutor(1, mp_context=ctx) as pool:  # a fresh process: its own peak
                r = pool.submit(_memory_one, lora, ckpt, positions).result()
            out[f"{name}_peak_mb"], out[f"{name}_step_s"] = r["peak_mb"], r["seconds"]
            print(name, r, file=sys.stderr, flush=True)
    for name in ("full_checkpointing", "lora", "lora_checkpointing"):
        out[f"memory_{name}_vs_full_ratio"] = round(out[f"memory_{name}_peak_mb"] / out["memory_full_peak_mb"], 3)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--skip", default="", help="comma-separated sections to skip: processes, smol, memory")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.worker, args.repeats)
        return 0
    skip = set(filter(None, args.skip.split(",")))
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
                           "bench_load_1m": [round(os.getloadavg()[0], 2)]}
    if "processes" not in skip:
        out.update(bench_processes(args.repeats))
    if "smol" not in skip:
        out.update(bench_smol(args.positions, args.repeats))
    if "memory" not in skip:
        out.update(bench_memory(args.positions))
    out["bench_load_1m"].append(round(os.getloadavg()[0], 2))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
