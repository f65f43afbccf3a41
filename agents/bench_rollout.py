"""Rollout throughput of the HF and vLLM backends on the same tasks in the same run.

Each backend plays the same episodes (4 tasks of each of 2 environments) with
the same seeds. Turn 1 of every episode is a scripted tool call, so that every
episode goes on to sampled turns that continue a multi-turn prefix (the random
tiny model rarely calls a tool itself); only ids the backend sampled count as
generated tokens. Model loading/engine start is timed separately and a short
warm-up precedes the timed rollout.
"""

from __future__ import annotations

import os
import time
from typing import Any

import envfactory

from .policy import Policy
from .rollout import rollout
from .scripted_policy import RecordingPolicy, ScriptedPolicy

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
    mixed = ScriptedPolicy(policy.tokenizer, script, fallback=rec)
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
    return {"s": dt, "tokens": tokens, "episodes": len(trajs), "turns": sum(t.turns for t in trajs),
            "prefill": policy.prefill_tokens_computed() - prefill0}


def bench_rollout(episodes_per_env: int = 4, max_new_tokens: int = 48) -> dict[str, Any]:
    """``rollout_{hf,vllm}_tokens_per_s`` / ``_episodes_per_s`` and their ``_ratio`` (vLLM over HF)."""
    import torch

    from .hf_policy import HFPolicy
    from .tiny import build_tiny_model
    from .vllm_policy import vllm_available

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
    del hf
    if not vllm_available():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            raise RuntimeError("bench rollout: vLLM is not installed but CI=true (run scripts/install-vllm.sh)")
        out["rollout_vllm_skipped"] = "vllm is not installed (scripts/install-vllm.sh); no HF/vLLM ratio"
        return out
    from .vllm_policy import VLLMPolicy

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
