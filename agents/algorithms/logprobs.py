"""Log-probabilities of sampled tokens under the model being trained, with a shared prefix run once.

Every trajectory of a training batch starts with the same system prompt and tool
schemas (often most of its tokens). :func:`token_logprobs` runs the longest
prefix common to all sequences of a micro-batch once, expands its keys/values
to the batch, and runs only the suffixes batched. Autograd flows through the
shared prefix (its gradient is the sum over the rows that use it), so the
result and its gradient equal those of running every sequence in full.

A batch's vocabulary-wide logits can outweigh the model: 16 sequences of 450 tokens over
SmolLM2's 49,152-token vocabulary are 1.4 GB in float32, held for the backward pass with their
log-softmax and their gradient. Past ``logits_budget`` elements the output layer runs on the
wanted positions only, a row at a time and under activation checkpointing (its logits are
computed again in the backward pass instead of kept): the same log-probabilities up to float
rounding, at most ``logits_budget`` logits alive at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch

__all__ = ["token_logprobs", "common_prefix"]

MIN_SHARED = 8  # below this, sharing saves less than the extra forward call costs
LOGITS_BUDGET = 2**27  # full-vocabulary logits a call may hold at once (512 MB in float32)


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix shared by every sequence."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in seqs):
            return i
    return n


def token_logprobs(model: "torch.nn.Module", seqs: Sequence[Sequence[int]], starts: Sequence[int], *,
                   temperature: float = 1.0, pad_id: int = 0, share_prefix: bool = True,
                   logits_budget: int | None = LOGITS_BUDGET) -> list["torch.Tensor"]:
    """``log softmax(logits / T)`` of tokens ``seqs[i][starts[i]:]`` given everything before them.

    Args:
        model: A causal LM (transformers interface: ``input_ids``, ``attention_mask``,
            ``position_ids``, ``past_key_values``).
        seqs: Whole sequences (prompt + response ids).
        starts: Index of the first token whose log-probability is wanted (``>= 1``).
        temperature: The sampling temperature the tokens were drawn at (``<= 0`` means 1).
        pad_id: Id used for padding (never attended to).
        share_prefix: Run the common prefix once (exact; disable to compare).
        logits_budget: Past this many logits for the batch (rows x positions x vocabulary), run
            the output layer per row on the wanted positions, checkpointed (``None``: never).

    Returns:
        One 1-D tensor per sequence, of length ``len(seqs[i]) - starts[i]``, with grad
        when grad is enabled.
    """
    import torch
    from transformers import DynamicCache

    if any(s < 1 for s in starts):
        raise ValueError("token_logprobs: starts must be >= 1 (the first token has no context)")
    dev = next(model.parameters()).device
    B = len(seqs)
    # The prefix stops before every start, so each wanted logit comes from the suffix pass.
    P = min(common_prefix(seqs), min(starts) - 1) if share_prefix and B > 1 else 0
    if P < MIN_SHARED:
        P = 0
    S = max(len(s) for s in seqs) - P
    V = model.get_output_embeddings().weight.shape[0]
    bounded = logits_budget is not None and B * S * V > logits_budget
    run = model.get_decoder() if bounded else model  # bounded: hidden states, the output layer below
    cache = None
    if P:
        prefix = torch.tensor([list(seqs[0][:P])], dtype=torch.long, device=dev)
        out = run(input_ids=prefix, use_cache=True)
        layers = [(layer.keys.expand(B, -1, -1, -1), layer.values.expand(B, -1, -1, -1))
                  for layer in out.past_key_values.layers]
        cache = DynamicCache(layers)
    ids = torch.full((B, S), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P + S), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s) - P] = torch.tensor(list(s[P:]), dtype=torch.long)
        mask[i, :len(s)] = 1
    pos = torch.arange(P, P + S, dtype=torch.long).unsqueeze(0).expand(B, -1)
    out = run(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
              past_key_values=cache, use_cache=cache is not None)
    t = temperature if temperature and temperature > 0 else 1.0
    ids = ids.to(dev)
    result = []
    if bounded:
        from torch.utils.checkpoint import checkpoint

        head, hidden, step = model.get_output_embeddings(), out.last_hidden_state, max(1, logits_budget // V)
    for i, s in enumerate(seqs):
        a, b = starts[i] - 1 - P, len(s) - 1 - P  # logits at suffix index j predict token P + j + 1
        if bounded:
            result.append(torch.cat([checkpoint(_head_logprobs, head, hidden[i, c:min(b, c + step)],
                                                ids[i, c + 1:min(b, c + step) + 1], t, use_reentrant=False)
                                     for c in range(a, b, step)]))
        else:
            result.append(_picked(out.logits[i, a:b], ids[i, a + 1:b + 1], t))
    return result


def _picked(logits: "torch.Tensor", target: "torch.Tensor", t: float) -> "torch.Tensor":
    """``log softmax(logits / t)`` at ``target``, in float32."""
    import torch

    return torch.log_softmax(logits.float() / t, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)


def _head_logprobs(head: "torch.nn.Module", hidden: "torch.Tensor", target: "torch.Tensor", t: float) -> "torch.Tensor":
    """:func:`_picked` of ``head(hidden)``: one row's wanted positions (checkpointed by the caller)."""
    return _picked(head(hidden), target, t)
