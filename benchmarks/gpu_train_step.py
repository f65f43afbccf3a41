"""One GRPO/ARPO training step of a randomly initialised ~0.5B Qwen2-architecture model on CUDA.

Builds a Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 KV heads,
vocab 151,936) with random weights (no download), makes a batch shaped like an
ARPO step (G groups of M trajectories sharing a prompt), and times the forward +
backward of the clipped token-mean loss (:func:`agents.algorithms.loss.policy_loss`
over :func:`agents.algorithms.logprobs.token_logprobs`, shared prefix run once)
plus the AdamW step. Prints JSON with tokens per second, and the same step
without prefix sharing as the in-run baseline (``..._ratio``).

    python benchmarks/gpu_train_step.py [--groups 4] [--M 16] [--prompt 512] [--response 512]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--M", type=int, default=16)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--response", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agents.algorithms.logprobs import token_logprobs
    from agents.algorithms.loss import policy_loss

    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device: run this on a GPU machine"}))
        return 2
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, rope_theta=1e6)
    model = Qwen2ForCausalLM(cfg).to("cuda", dtype=torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    V = cfg.vocab_size
    seqs, starts = [], []
    for g in range(args.groups):
        prompt = torch.randint(0, V, (args.prompt,)).tolist()
        for _ in range(args.M):
            seqs.append(prompt + torch.randint(0, V, (args.response,)).tolist())
            starts.append(args.prompt)
    n_tokens = args.response * len(seqs)

    def step(share: bool) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for b in range(0, len(seqs), args.micro_batch):
            s, st = seqs[b:b + args.micro_batch], starts[b:b + args.micro_batch]
            lps = token_logprobs(model, s, st, share_prefix=share)
            logp = torch.nn.utils.rnn.pad_sequence([x.float() for x in lps], batch_first=True)
            adv = torch.randn(logp.shape[0], 1, device="cuda").expand_as(logp)
            loss, _ = policy_loss(logp, logp.detach(), adv, torch.ones_like(logp), num_tokens=n_tokens)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    step(True)  # warm-up
    shared = min(step(True) for _ in range(args.repeats))
    full = min(step(False) for _ in range(args.repeats))
    total = (args.prompt + args.response) * len(seqs)
    print(json.dumps({
        "device": torch.cuda.get_device_name(0), "params": params, "sequences": len(seqs),
        "tokens_per_step": total, "trained_tokens_per_step": n_tokens,
        "step_s": round(shared, 3), "tokens_per_s": round(total / shared),
        "step_no_prefix_sharing_s": round(full, 3), "tokens_per_s_no_prefix_sharing": round(total / full),
        "prefix_sharing_speedup_ratio": round(full / shared, 3),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
