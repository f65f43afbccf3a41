"""Peak memory of one training micro-batch's log-probabilities: the output layer on every position
at once (the baseline) against the bounded output layer (:data:`agents.algorithms.logprobs.LOGITS_BUDGET`).

A SmolLM2-135M-shaped Llama (hidden 576, 30 layers, 9 heads, 3 KV heads, vocabulary 49,152, tied
embeddings) with random weights, its top ``--train-layers`` layers trainable as the smol quickstart
trains them, and a micro-batch shaped like a quickstart arm's (``--rows`` sequences sharing a
``--prefix``-token system prompt, then ``--suffix`` tokens, the longest of a step). Each variant
runs in a fresh process: forward and backward of ``token_logprobs``; its peak resident memory
above the process's after the model was built, and its time. The variants alternate
(``--repeats`` each); the ratios are bounded / full of the same run.

    python benchmarks/logprobs_memory.py [--rows 16] [--prefix 270] [--suffix 437] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _one(budget: int | None, rows: int, prefix: int, suffix: int, train_layers: int) -> dict[str, float]:
    import resource
    import time

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agents.algorithms.logprobs import token_logprobs
    from agents.models.smol import freeze_below

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg)
    freeze_below(model, train_layers)
    g = torch.Generator().manual_seed(1)
    head = torch.randint(0, cfg.vocab_size, (prefix,), generator=g).tolist()
    lengths = [suffix - (suffix * k) // (2 * rows) for k in range(rows)]  # the longest, then shorter ones
    seqs = [head + torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    starts = [prefix + 1] * rows
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    lps = token_logprobs(model, seqs, starts, logits_budget=budget)
    sum(lp.sum() for lp in lps).backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_mb": round((peak - base) / 1024, 1), "seconds": round(seconds, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prefix", type=int, default=270)
    p.add_argument("--suffix", type=int, default=437)
    p.add_argument("--train-layers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from agents.algorithms.logprobs import LOGITS_BUDGET

    runs: dict[str, list[dict[str, float]]] = {"full": [], "bounded": []}
    ctx = mp.get_context("spawn")
    for _ in range(args.repeats):
        for name, budget in (("full", None), ("bounded", LOGITS_BUDGET)):
            with ProcessPoolExecutor(1, mp_context=ctx) as pool:  # a fresh process: its own peak
                r = pool.submit(_one, budget, args.rows, args.prefix, args.suffix, args.train_layers).result()
            runs[name].append(r)
            print(name, r, file=sys.stderr, flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("peak_mb", "seconds")} for k, v in runs.items()}
    print(json.dumps({"rows": args.rows, "prefix": args.prefix, "suffix": args.suffix,
                      "train_layers": args.train_layers, "logits_budget": LOGITS_BUDGET, "runs": runs,
                      "median": med,
                      "peak_ratio_bounded_over_full": round(med["bounded"]["peak_mb"] / med["full"]["peak_mb"], 3),
                      "time_ratio_bounded_over_full": round(med["bounded"]["seconds"] / med["full"]["seconds"], 3)},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
