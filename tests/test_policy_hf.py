"""HFPolicy sampling: exact logprobs with KV reuse, seeds, stop tokens, stale-cache protection."""

from __future__ import annotations

import pytest
import torch

from agents.policies.hf_policy import HFPolicy
from agents.policies.policy import sampling_stats
from agents.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def hf() -> HFPolicy:
    return HFPolicy(build_tiny_model(), device="cpu")


def _reference(hf: HFPolicy, prompt, gen, temperature, top_p):
    with torch.no_grad():
        logits = hf.model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1:-1]
    logp, ent = sampling_stats(logits, temperature, top_p)
    return logp.gather(1, torch.tensor(gen.token_ids)[:, None]).squeeze(1), ent


def test_logprobs_and_entropy_match_a_full_forward_with_cache_reuse(hf: HFPolicy) -> None:
    tok = hf.tokenizer
    base = tok("<|im_start|>user\nList the files in /home and read the notes.<|im_end|>\n<|im_start|>assistant\n",
               add_special_tokens=False)["input_ids"]
    prompts = [base, base[:-4] + [7, 8, 9], list(range(3, 200))]
    first = hf.generate(prompts, max_new_tokens=12, temperature=0.8, top_p=0.9, seed=1)
    # turn 2 and a branch continue from cached prefixes of different lengths
    second_prompts = [prompts[0] + first[0].token_ids + [10, 11], prompts[0] + first[0].token_ids[:3]]
    before = hf.prefill_tokens_computed()
    second = hf.generate(second_prompts, max_new_tokens=12, temperature=0.8, top_p=0.9, seed=2)
    assert hf.prefill_tokens_computed() - before <= 3 + 1
    for p, g in list(zip(prompts, first)) + list(zip(second_prompts, second)):
        ref_lp, ref_ent = _reference(hf, p, g, 0.8, 0.9)
        assert torch.allclose(ref_lp, torch.tensor(g.logprobs), atol=1e-4)
        assert torch.allclose(ref_ent, torch.tensor(g.entropies), atol=1e-5)
        assert all(0.0 <= e <= 1.0 for e in g.entropies)


def test_seeds_stops_and_greedy(hf: HFPolicy) -> None:
    prompts = [list(range(5, 60)), list(range(60, 90))]
    a = hf.generate(prompts, max_new_tokens=10, seed=3)
    b = hf.generate(prompts, max_new_tokens=10, seed=3)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    g = hf.generate(prompts[:1], max_new_tokens=10, temperature=0.0)[0]
    stop = g.token_ids[3]
    s = hf.generate(prompts[:1], max_new_tokens=10, temperature=0.0, stop_token_ids=[stop])[0]
    assert s.finish_reason == "stop" and s.token_ids == g.token_ids[: g.token_ids.index(stop) + 1]
    assert hf.generate(prompts[:1], max_new_tokens=10, temperature=0.0)[0].token_ids == g.token_ids


def test_in_place_weight_update_invalidates_the_cache(hf: HFPolicy) -> None:
    prompt = list(range(5, 80))
    hf.generate([prompt], max_new_tokens=2, seed=0)
    with torch.no_grad():
        for p in hf.model.parameters():
            p.mul_(1.01)
    before = hf.prefill_tokens_computed()
    g = hf.generate([prompt], max_new_tokens=4, temperature=1.0, seed=0)[0]
    assert hf.prefill_tokens_computed() - before == len(prompt)  # recomputed with the new weights
    ref, _ = _reference(hf, prompt, g, 1.0, 1.0)
    assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)
