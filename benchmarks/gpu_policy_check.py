"""Check and measure the CUDA path of the HF policy (run on a GPU machine).

1. Correctness: on random prompts, the logprobs the CUDA HFPolicy reports for
   its sampled ids (KV-cache decoding, batched) match a single full forward pass
   of prompt + response, in float32 (relative error printed).
2. Token-in/token-out: rollouts on CUDA pass the same invariant checks as on CPU.
3. Speed: rollout tokens/s on CUDA against the CPU in the same run (ratio).

    python benchmarks/gpu_policy_check.py
"""

from __future__ import annotations

import json
import random
import sys
import time


def main() -> int:
    import torch

    from benchmarks.rollout import _measure
    from agents.policies.hf_policy import HFPolicy
    from agents.rollout import rollout
    from agents.rollout_check import invariant_problems
    from agents.models.tiny import build_tiny_model

    import envfactory

    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    t0 = time.perf_counter()
    path = build_tiny_model()
    out["tiny_build_s"] = round(time.perf_counter() - t0, 2)
    gpu = HFPolicy(path, device="cuda")
    rng = random.Random(0)
    V = len(gpu.tokenizer)
    prompts = [[rng.randrange(V) for _ in range(rng.randint(5, 60))] for _ in range(16)]
    gens = gpu.generate(prompts, max_new_tokens=32, temperature=1.0, seed=1)
    worst = 0.0
    model = gpu.model
    with torch.no_grad():
        for p, g in zip(prompts, gens):
            ids = torch.tensor([p + g.token_ids], device="cuda")
            logits = model(ids).logits[0, len(p) - 1:-1].float()
            ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(g.token_ids, device="cuda")[:, None])[:, 0]
            got = torch.tensor(g.logprobs, device="cuda")
            worst = max(worst, float((got - ref).norm() / ref.norm()))
    out["cuda_logprob_rel_error_vs_full_forward"] = worst
    trajs = [r.trajectory for r in rollout(gpu, [(envfactory.make("Counter-v0", max_turns=3), i) for i in range(8)],
                                           max_new_tokens=32, temperature=1.0, seed=0)]
    problems = [p for t in trajs for p in invariant_problems(t, gpu.tokenizer)]
    out["cuda_rollout_invariant_problems"] = problems[:5]
    g = _measure(gpu, 4, 48)
    cpu = HFPolicy(path, device="cpu")
    c = _measure(cpu, 4, 48)
    out |= {"rollout_cuda_tokens_per_s": round(g["tokens"] / g["s"], 1),
            "rollout_cpu_tokens_per_s": round(c["tokens"] / c["s"], 1),
            "rollout_cuda_vs_cpu_ratio": round((g["tokens"] / g["s"]) / (c["tokens"] / c["s"]), 2)}
    print(json.dumps(out, indent=1))
    ok = worst < 1e-3 and not problems
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
