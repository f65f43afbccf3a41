"""agents.policies.decode.lean_decode and HFPolicy's grouped prefill: the fast paths sample what
transformers' own forward samples, for Qwen2 (q/k/v biases) and Llama checkpoints,
and are refused where they would differ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.policies.decode import lean_decode
from agents.policies.hf_policy import HFPolicy
from agents.policies.policy import sampling_stats
from agents.models.tiny import build_tiny_model


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model())


def _random_model(arch: str, **extra):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=len(_tokenizer()), hidden_size=128, intermediate_size=320, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  attn_implementation="sdpa")
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True, **extra)).eval()
    return LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                                        **extra)).eval()


def _prompts(V: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    sys_a = rng.integers(10, V, 80).tolist()
    prompts = [sys_a + rng.integers(10, V, 3 + 9 * i).tolist() for i in range(5)]
    return prompts + [rng.integers(10, V, 150).tolist(), rng.integers(10, V, 7).tolist()]


def _full_forward_logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    logp, _ = sampling_stats(logits, 1.0, 1.0)
    return logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_lean_steps_sample_what_transformers_forward_samples(arch: str) -> None:
    model = _random_model(arch)
    assert lean_decode.supports(model)
    hf = HFPolicy(model, tokenizer=_tokenizer(), device="cpu")
    prompts = _prompts(hf.vocab_size)
    runs = {}
    for lean in (False, True):
        hf.lean_decode = lean
        hf.clear_cache()
        hf.generate(prompts[:2], max_new_tokens=2, seed=0)  # some rows start from cached prefixes
        runs[lean] = (hf.generate(prompts, max_new_tokens=24, temperature=1.0, seed=3, stop_token_ids=[]),
                      hf.generate([p + [11] for p in prompts], max_new_tokens=24, temperature=0.0,
                                  stop_token_ids=[]))
        assert (hf._lean is not None and hf._lean is not False) == lean
    for a, b in zip(runs[False][0] + runs[False][1], runs[True][0] + runs[True][1]):
        assert a.token_ids == b.token_ids
        assert np.allclose(a.logprobs, b.logprobs, atol=1e-4)
        assert np.allclose(a.entropies, b.entropies, atol=1e-4)
    for p, g in zip(prompts, runs[True][0]):
        assert torch.allclose(_full_forward_logprobs(model, p, g.token_ids), torch.tensor(g.logprobs), atol=1e-4)


def test_lean_decoder_is_refused_where_it_would_not_be_exact() -> None:
    class Wrapped(torch.nn.Linear):  # what an adapter (LoRA) or a quantised layer looks like
        pass

    model = _random_model("qwen2")
    old = model.model.layers[1].self_attn.k_proj
    model.model.layers[1].self_attn.k_proj = Wrapped(old.in_features, old.out_features, bias=True)
    assert not lean_decode.supports(model)
    assert not lean_decode.supports(_random_model("llama", hidden_act="gelu"))
    assert not lean_decode.supports(_random_model("llama", attention_bias=True))  # o_proj has a bias too
    assert not lean_decode.supports(_random_model("qwen2", use_sliding_window=True, sliding_window=16,
                                                  max_window_layers=0))
    with pytest.raises(ValueError, match="does not support"):
        lean_decode.LeanDecoder(model)
    hf = HFPolicy(model, tokenizer=_tokenizer(), device="cpu")
    p = _prompts(hf.vocab_size)[0]
    g = hf.generate([p], max_new_tokens=8, seed=0, stop_token_ids=[])[0]
    assert hf._lean is False  # transformers' forward sampled it
    assert torch.allclose(_full_forward_logprobs(model, p, g.token_ids), torch.tensor(g.logprobs), atol=1e-4)


def test_prefill_runs_rows_of_different_lengths_apart_and_each_row_gets_what_it_gets_alone() -> None:
    hf = HFPolicy(build_tiny_model(), device="cpu")
    V = hf.vocab_size
    rng = np.random.default_rng(2)
    long_sys = rng.integers(10, V, 400).tolist()
    hf.generate([long_sys], max_new_tokens=1, seed=0)  # cached: the next rows reuse it
    prompts = [long_sys + rng.integers(10, V, n).tolist() for n in (3, 5, 60, 64)]
    prompts.append(rng.integers(10, V, 300).tolist())  # nothing cached: a whole first prompt
    groups = []
    real = hf._prefill_groups

    def spy(rest, reuse):
        groups.append((real(rest, reuse), [len(r) for r in rest]))
        return groups[-1][0]

    hf._prefill_groups = spy  # type: ignore[method-assign]
    before = (hf.positions_computed, hf.keys_attended)
    batch = hf.generate(prompts, max_new_tokens=10, temperature=0.0, stop_token_ids=[])
    parts, lengths = groups[-1]
    assert [lengths[i] for i in parts[0]] == [300]  # the whole first prompt runs apart from the rest
    assert len(parts) >= 2
    # the work counted: every uncached prompt id and every fed sampled id, with the keys it attends
    rest = [3, 5, 60, 64, 300]
    reuse = [400, 400, 400, 400, 0]
    assert hf.positions_computed - before[0] == sum(rest) + 5 * 9
    keys = sum(w * c + w * (w + 1) // 2 for w, c in zip(rest, reuse))
    keys += sum(len(p) + k + 1 for p in prompts for k in range(9))
    assert hf.keys_attended - before[1] == keys
    # a next turn of every row: two new ids each after cached prefixes of different lengths
    nxt = [p + g.token_ids + [7] for p, g in zip(prompts, batch)]
    for p, g in zip(nxt, hf.generate(nxt, max_new_tokens=6, temperature=1.0, seed=4, stop_token_ids=[])):
        assert torch.allclose(_full_forward_logprobs(hf.model, p, g.token_ids), torch.tensor(g.logprobs),
                              atol=1e-4)
    for p, g in zip(prompts, batch):
        hf.clear_cache()
        alone = hf.generate([p], max_new_tokens=10, temperature=0.0, stop_token_ids=[])[0]
        assert alone.token_ids == g.token_ids
        assert np.allclose(alone.logprobs, g.logprobs, atol=1e-4)
