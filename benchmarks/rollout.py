"""Rollout throughput of the HF and vLLM backends on the same tasks in the same run.

Each backend plays the same episodes (4 tasks of each of 2 environments) with
the same seeds. Turn 1 of every episode is a scripted tool call, so that every
episode goes on to sampled turns that continue a multi-turn prefix (the random
tiny model rarely calls a tool itself); only ids the backend sampled count as
generated tokens. Model loading/engine start is timed separately and a short
warm-up precedes the timed rollout.

The HF figures are set against the machine's compute bound, measured in the same
run: the model's FLOPs per token (its matmuls at the rollout's mean context) and
the FLOP/s torch's matmul achieves here on the model's own layer shapes, at the
rollout's decode batch and at a prefill-sized batch, on the policy's thread count.
``rollout_hf_vs_decode_bound_ratio`` is sampled tokens/s over the decode bound;
``rollout_hf_mfu`` counts every token the model computed (prefill included)
against the prefill-shaped (best) matmul rate.
"""

from __future__ import annotations

import os
import time
from typing import Any

import envfactory

from agents.policy import Policy
from agents.rollout import rollout
from agents.scripted_model import RecordingPolicy, ScriptedModel

__all__ = ["bench_rollout"]

ENVS = ("FileSystem-v0", "Bank-v0")
TOOL_CALL = {"FileSystem-v0": '<tool_call>\n{"name": "list_dir", "arguments": {"path": "/"}}\n</tool_call>',
             "Bank-v0": '<tool_call>\n{"name": "list_accounts", "arguments": {}}\n</tool_call>'}


def _measure(policy: Policy, episodes_per_env: int, max_new_tokens: int) -> dict[str, float]:
    def script(prompt: list[int], turn: int) -> str | None:
        if turn:
            return None  # sampled by the backend
        banking = "banking environment" in policy.tokenizer.decode(prompt[:200])
        return TOOL_CALL["Bank-v0" if banking else "FileSystem-v0"]

    rec = RecordingPolicy(policy)
    mixed = ScriptedModel(policy.tokenizer, script, fallback=rec)
    policy.generate([[5, 6, 7, 8]], max_new_tokens=4, seed=0)  # warm-up
    pairs = [(envfactory.make(name, max_turns=3), i) for name in ENVS for i in range(episodes_per_env)]
    prefill0 = policy.prefill_tokens_computed()
    t0 = time.perf_counter()
    trajs = [r.trajectory for r in rollout(mixed, pairs, max_new_tokens=max_new_tokens, temperature=1.0, seed=0)]
    dt = time.perf_counter() - t0
    errors = [t.error for t in trajs if t.error]
    if errors:
        raise RuntimeError(f"rollout benchmark episodes failed: {errors[:3]}")
    tokens = sum(len(g.token_ids) for _, g in rec.calls)
    # each sampled token attends to its prompt and the tokens sampled before it
    context = sum(len(p) * len(g.token_ids) + len(g.token_ids) ** 2 / 2 for p, g in rec.calls)
    return {"s": dt, "tokens": tokens, "episodes": len(trajs), "turns": sum(t.turns for t in trajs),
            "prefill": policy.prefill_tokens_computed() - prefill0,
            "mean_context": context / max(tokens, 1), "batch": len(pairs)}


def flops_per_token(model: Any, context: float) -> float:
    """Forward FLOPs of one token: 2 per weight of every linear layer (the output head
    included, tied or not) plus attention's scores and weighted sum over ``context``
    keys (2 x 2 x layers x context x query width)."""
    import torch

    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = 4 * cfg.num_hidden_layers * context * cfg.num_attention_heads * head_dim
    return 2.0 * linear + attention


def matmul_flops_per_s(model: Any, batch: int, threads: int, repeats: int = 30) -> float:
    """FLOP/s torch's matmul reaches on this machine for ``model``'s linear layers with
    ``batch`` rows (the layers' own weight shapes, in proportion to their use), on
    ``threads`` threads: the best of ``repeats`` passes over all of them."""
    import torch

    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            xs = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
            flops = sum(2.0 * batch * w.numel() for w in weights)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                for w in weights:
                    torch.nn.functional.linear(xs[w.shape[1]], w)
                best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return flops / best


def bench_rollout(episodes_per_env: int = 4, max_new_tokens: int = 48) -> dict[str, Any]:
    """``rollout_{hf,vllm}_tokens_per_s`` / ``_episodes_per_s`` and their ``_ratio`` (vLLM over HF)."""
    import torch

    from agents.hf_policy import HFPolicy
    from agents.tiny import build_tiny_model
    from agents.vllm_policy import vllm_available

    path = build_tiny_model()
    out: dict[str, Any] = {"rollout_episodes": episodes_per_env * len(ENVS), "rollout_max_new_tokens": max_new_tokens}
    t0 = time.perf_counter()
    hf = HFPolicy(path, device="cpu")
    out["rollout_hf_load_s"] = round(time.perf_counter() - t0, 2)
    out["rollout_hf_torch_threads"] = hf.threads or torch.get_num_threads()
    m = _measure(hf, episodes_per_env, max_new_tokens)
    out |= {"rollout_hf_s": round(m["s"], 3), "rollout_hf_generated_tokens": m["tokens"],
            "rollout_hf_tokens_per_s": round(m["tokens"] / m["s"], 1),
            "rollout_hf_episodes_per_s": round(m["episodes"] / m["s"], 3),
            "rollout_hf_prefill_tokens": m["prefill"]}
    threads = out["rollout_hf_torch_threads"]
    fpt = flops_per_token(hf.model, m["mean_context"])
    decode = matmul_flops_per_s(hf.model, m["batch"], threads)
    peak = matmul_flops_per_s(hf.model, 512, threads)
    bound = decode / fpt
    out |= {"rollout_hf_mean_context_tokens": round(m["mean_context"], 1),
            "rollout_model_mflops_per_token": round(fpt / 1e6, 2),
            "rollout_matmul_decode_gflops_per_s": round(decode / 1e9, 2),
            "rollout_matmul_prefill_gflops_per_s": round(peak / 1e9, 2),
            "rollout_hf_decode_bound_tokens_per_s": round(bound, 1),
            "rollout_hf_vs_decode_bound_ratio": round(out["rollout_hf_tokens_per_s"] / bound, 3),
            "rollout_hf_mfu": round((m["tokens"] + m["prefill"]) * fpt / m["s"] / peak, 3)}
    # both cores: the same episodes on two threads, against the one-thread default
    hf.threads = 2
    hf.clear_cache()
    m2 = _measure(hf, episodes_per_env, max_new_tokens)
    out |= {"rollout_hf_2threads_s": round(m2["s"], 3),
            # tokens computed (prefill + sampled) per second: sampling may differ across thread counts
            "rollout_hf_2threads_vs_1thread_speed_ratio": round(
                (m2["tokens"] + m2["prefill"]) / m2["s"] / ((m["tokens"] + m["prefill"]) / m["s"]), 3),
            "rollout_matmul_prefill_2threads_vs_1thread_ratio": round(
                matmul_flops_per_s(hf.model, 512, 2) / (peak if threads == 1 else matmul_flops_per_s(hf.model, 512, 1)),
                3)}
    del hf
    if not vllm_available():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            raise RuntimeError("bench rollout: vLLM is not installed but CI=true (run scripts/install-vllm.sh)")
        out["rollout_vllm_skipped"] = "vllm is not installed (scripts/install-vllm.sh); no HF/vLLM ratio"
        return out
    from agents.vllm_policy import VLLMPolicy

    t0 = time.perf_counter()
    vl = VLLMPolicy(path)
    out["rollout_vllm_engine_start_s"] = round(time.perf_counter() - t0, 2)
    try:
        m = _measure(vl, episodes_per_env, max_new_tokens)
    finally:
        vl.close()
    out |= {"rollout_vllm_s": round(m["s"], 3), "rollout_vllm_generated_tokens": m["tokens"],
            "rollout_vllm_tokens_per_s": round(m["tokens"] / m["s"], 1),
            "rollout_vllm_episodes_per_s": round(m["episodes"] / m["s"], 3),
            "rollout_vllm_prefill_tokens": m["prefill"]}
    out["rollout_vllm_vs_hf_tokens_per_s_ratio"] = round(out["rollout_vllm_tokens_per_s"] / out["rollout_hf_tokens_per_s"], 3)
    out["rollout_vllm_vs_hf_episodes_per_s_ratio"] = round(
        out["rollout_vllm_episodes_per_s"] / out["rollout_hf_episodes_per_s"], 3)
    return out
