"""token_logprobs: the shared-prefix pass and the bounded output layer give the log-probabilities
and gradients of a plain full forward; the bounded path never holds more logits than its budget.
Needs torch; a random tiny model (a few seconds)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agents.algorithms.logprobs import token_logprobs  # noqa: E402


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from agents.models.tiny import build_tiny_model

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32)


def _batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(5, vocab, (20,), generator=g).tolist()
    seqs = [prefix + torch.randint(5, vocab, (n,), generator=g).tolist() for n in (7, 15, 11)]
    return seqs, [22, 25, 21]


def _run(model, seqs, starts, **kw):
    model.zero_grad(set_to_none=True)
    lps = token_logprobs(model, seqs, starts, temperature=0.7, **kw)
    sum((lp * (k + 1)).sum() for k, lp in enumerate(lps)).backward()
    return [lp.detach() for lp in lps], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("budget", [1, 3 * 4096, 2**27])
def test_every_path_gives_the_full_forwards_log_probs_and_gradients(model, budget):
    seqs, starts = _batch(model.config.vocab_size)
    want, gwant = _run(model, seqs, starts, share_prefix=False, logits_budget=None)
    got, ggot = _run(model, seqs, starts, logits_budget=budget)
    assert [len(x) for x in got] == [len(s) - st for s, st in zip(seqs, starts)]
    for w, x in zip(want, got):
        assert torch.allclose(w, x, atol=1e-5), (w - x).abs().max()
    assert gwant.keys() == ggot.keys() and gwant
    for n in gwant:  # float rounding only: sums in another order (the tied embeddings' grad is ~25)
        assert torch.allclose(gwant[n], ggot[n], atol=1e-5 * max(1.0, gwant[n].abs().max().item()), rtol=1e-4), n


def test_the_bounded_output_layer_holds_at_most_its_budget_of_logits(model):
    """Before: the output layer ran on every position of every row at once (rows x positions x
    vocabulary logits, 1.4 GB for a SmolLM2 micro-batch)."""
    seqs, starts = _batch(model.config.vocab_size)
    V, budget = model.config.vocab_size, 4 * model.config.vocab_size
    sizes: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o: sizes.append(o.numel()))
    try:
        _run(model, seqs, starts, logits_budget=budget)
        bounded = list(sizes)
        sizes.clear()
        _run(model, seqs, starts, logits_budget=None)
    finally:
        hook.remove()
    assert bounded and max(bounded) <= budget  # backward runs the head again (checkpointed): also bounded
    assert sum(bounded) >= 2 * sum(len(s) - st for s, st in zip(seqs, starts)) * V  # forward + recompute
    assert max(sizes) == 3 * (len(max(seqs, key=len)) - 20) * V  # the full path: one call, every row
