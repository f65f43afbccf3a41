"""agents.policies.decode.decode_attention: grouped-query decode steps and shared prefixes read once
give what transformers' SDPA attention gives, on random tensors and through HFPolicy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.policies.decode import decode_attention as da
from agents.policies.hf_policy import HFPolicy
from agents.policies.policy import sampling_stats
from agents.models.tiny import build_tiny_model


def _sdpa(q, k, v, mask):
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


def test_segments_with_shared_prefixes_equal_plain_attention() -> None:
    torch.manual_seed(0)
    B, Hkv, G, D, L = 7, 2, 3, 16, 90
    q = torch.randn(B, Hkv * G, 1, D)
    k, v = torch.randn(B, Hkv, L, D), torch.randn(B, Hkv, L, D)
    # rows 0-2 share columns [0, 40), rows 3-4 share [0, 25), rows 5-6 share nothing
    k[1:3, :, :40], v[1:3, :, :40] = k[0, :, :40], v[0, :, :40]
    k[4, :, :25], v[4, :, :25] = k[3, :, :25], v[3, :, :25]
    mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
    mask[3:5, ..., 25:50] = False  # padding between the shared prefix and a row's own ids
    mask[5, ..., :30] = False  # left padding
    mask[6, ..., -1] = False  # a finished row fed padding
    plan = da.DecodePlan([da.Segment(0, 3, 40, 40), da.Segment(3, 5, 50, 25), da.Segment(5, 7, 0, 0)])
    ref = _sdpa(q, k, v, mask)
    for p in (plan, None):
        got = da._decode(q, k, v, mask, D ** -0.5, p)
        assert torch.allclose(got, ref, atol=1e-5), p


def test_plan_batch_finds_runs_of_shared_prefixes_and_their_first_real_column() -> None:
    a, b = list(range(10, 110)), list(range(200, 300))
    prompts = [np.asarray(x) for x in (a + [1, 2], a + [3], a[:50] + [9] * 60, b + [4], [5] * 20)]
    order = da.sort_rows(prompts)
    rows = [prompts[i] for i in order]
    reused = [100 if len(r) > 100 and r[0] == 10 else 0 for r in rows]
    mask = torch.ones(len(rows), 130, dtype=torch.long)
    plan = da.plan_batch(rows, reused, mask, min_shared=64)
    shared = [(s.hi - s.lo, s.shared) for s in plan.segments if s.shared]
    assert shared == [(2, 100)]  # a+[1,2] and a+[3]; a[:50]+... shares only 50 ids; b is alone
    assert sum(s.hi - s.lo for s in plan.segments) == len(rows)
    assert all(s.own == (s.shared if s.shared else 0) for s in plan.segments)


def test_a_gap_of_columns_masked_for_a_whole_segment_is_skipped_exactly() -> None:
    torch.manual_seed(1)
    B, Hkv, G, D, L = 5, 2, 2, 16, 120
    q = torch.randn(B, Hkv * G, 1, D)
    k, v = torch.randn(B, Hkv, L, D), torch.randn(B, Hkv, L, D)
    k[1:3, :, :30], v[1:3, :, :30] = k[0, :, :30], v[0, :, :30]
    mask = torch.ones(B, 1, 1, L, dtype=torch.bool)
    # the batch layout: reused prefixes of 30-36 ids, padding, then each row's rest right-aligned
    for i, (c, w) in enumerate([(36, 20), (33, 41), (30, 25), (10, 70), (0, 90)]):
        mask[i, ..., c:L - w] = False
    real = mask.reshape(B, L)
    plan = da.plan_batch([np.arange(40) + (0 if i < 3 else 1000 * i) for i in range(B)],
                         [36, 33, 30, 10, 0], real.long(), min_shared=16)
    first = plan.segments[0]
    assert (first.lo, first.hi, first.shared, first.gap) == (0, 3, 30, (36, L - 41))
    ref = _sdpa(q, k, v, mask)
    assert torch.allclose(da._decode(q, k, v, mask, D ** -0.5, plan), ref, atol=1e-5)
    bias = torch.zeros(B, 1, 1, L).masked_fill(~mask, float("-inf"))  # lean_decode passes an additive mask
    assert torch.allclose(da._decode(q, k, v, bias, D ** -0.5, plan), ref, atol=1e-5)
    no_gap = da.DecodePlan([da.Segment(s.lo, s.hi, s.own, s.shared) for s in plan.segments])
    assert torch.allclose(da._decode(q, k, v, mask, D ** -0.5, no_gap), ref, atol=1e-5)


@pytest.fixture(scope="module")
def hf() -> HFPolicy:
    return HFPolicy(build_tiny_model(), device="cpu")


def test_policy_samples_the_same_with_and_without_decode_attention(hf: HFPolicy) -> None:
    rng = np.random.default_rng(0)
    V = hf.vocab_size
    sys_a, sys_b = rng.integers(10, V, 120).tolist(), rng.integers(10, V, 90).tolist()
    prompts = [(sys_a if i % 3 else sys_b) + rng.integers(10, V, 5 + 7 * i).tolist() for i in range(7)]
    prompts.append(rng.integers(10, V, 33).tolist())  # shares nothing
    runs = {}
    for on in (False, True):
        hf.decode_attention = on
        hf.clear_cache()
        hf.generate(prompts[:3], max_new_tokens=2, seed=0)  # a cached prefix for some rows, not others
        first = hf.generate(prompts, max_new_tokens=20, temperature=1.0, seed=5)
        greedy = hf.generate([p + [11] for p in prompts], max_new_tokens=20, temperature=0.0)
        runs[on] = first, greedy
    hf.decode_attention = True
    assert hf.model.config._attn_implementation == "sdpa"  # restored after sampling
    for a, b in zip(runs[False][0] + runs[False][1], runs[True][0] + runs[True][1]):
        assert a.token_ids == b.token_ids
        assert np.allclose(a.logprobs, b.logprobs, atol=1e-4)
    # and the sampled logprobs are the model's: a full forward of one sequence agrees
    p, g = prompts[4], runs[True][0][4]
    with torch.no_grad():
        logits = hf.model(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1:-1]
    logp, _ = sampling_stats(logits, 1.0, 1.0)
    assert torch.allclose(logp.gather(1, torch.tensor(g.token_ids)[:, None]).squeeze(1),
                          torch.tensor(g.logprobs), atol=1e-4)


def test_stops_in_a_shared_run_leave_the_other_rows_exact(hf: HFPolicy) -> None:
    V = hf.vocab_size
    base = list(range(20, 20 + 100))
    prompts = [base + [5 + i] for i in range(4)]
    free = hf.generate(prompts, max_new_tokens=12, temperature=0.0)
    stop = free[1].token_ids[2]  # row 1 stops early; the others go on beside it
    cut = hf.generate(prompts, max_new_tokens=12, temperature=0.0, stop_token_ids=[stop])
    for f, c in zip(free, cut):
        n = f.token_ids.index(stop) + 1 if stop in f.token_ids else len(f.token_ids)
        assert c.token_ids == f.token_ids[:n]
        assert np.allclose(c.logprobs, f.logprobs[:n], atol=1e-4)
    assert max(base) < V


def test_sample_ids_draws_each_id_with_its_probability_and_never_a_masked_one() -> None:
    from agents.policies.hf_policy import sample_ids

    p = torch.tensor([0.05, 0.0, 0.55, 0.3, 0.0, 0.1])
    logp = p.log().expand(4000, -1).contiguous()  # -inf where the mass is 0
    gens = [torch.Generator().manual_seed(i) for i in range(4000)]
    ids = sample_ids(logp, gens)
    freq = torch.bincount(ids, minlength=6).float() / 4000
    assert freq[1] == 0 and freq[4] == 0
    assert torch.allclose(freq, p, atol=0.03), freq  # 3 standard errors at most ~0.024
    assert torch.equal(ids, sample_ids(logp, [torch.Generator().manual_seed(i) for i in range(4000)]))
    assert sample_ids(torch.log(torch.tensor([[0.0, 0.0, 1.0]]))).item() == 2


def test_rows_that_finish_leave_the_batch_and_their_cache_is_kept_exact(hf: HFPolicy) -> None:
    hf.clear_cache()
    prompts = [list(range(30, 130)) + [7 + i] for i in range(8)]
    free = hf.generate(prompts, max_new_tokens=16, temperature=0.0)
    # ids that end about half the rows early: the batch shrinks (a quarter finished) more than once
    stops = sorted({g.token_ids[2] for g in free[:3]} | {free[5].token_ids[6]})
    cut = hf.generate(prompts, max_new_tokens=16, temperature=0.0, stop_token_ids=stops)
    assert sum(c.finish_reason == "stop" for c in cut) >= 2
    for f, c in zip(free, cut):
        n = next((k + 1 for k, t in enumerate(f.token_ids) if t in stops), len(f.token_ids))
        assert c.token_ids == f.token_ids[:n]
        assert np.allclose(c.logprobs, f.logprobs[:n], atol=1e-4)
    # a next turn of a row that left early starts from the keys/values kept when it left
    early = min(range(8), key=lambda i: len(cut[i].token_ids))
    nxt = prompts[early] + cut[early].token_ids + [9, 10]
    before = hf.prefill_tokens_computed()
    g = hf.generate([nxt], max_new_tokens=6, temperature=0.0)[0]
    assert hf.prefill_tokens_computed() - before <= 3
    with torch.no_grad():
        logits = hf.model(torch.tensor([nxt + g.token_ids])).logits[0, len(nxt) - 1:-1]
    logp, _ = sampling_stats(logits, 0.0, 1.0)
    assert torch.allclose(logp.gather(1, torch.tensor(g.token_ids)[:, None]).squeeze(1),
                          torch.tensor(g.logprobs), atol=1e-4)
