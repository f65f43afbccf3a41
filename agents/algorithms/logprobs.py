"""Log-probabilities of sampled tokens under the model being trained, with a shared prefix run once.

Every trajectory of a training batch starts with the same system prompt and tool
schemas (often most of its tokens). :func:`token_logprobs` runs the longest
prefix common to all sequences of a micro-batch once, expands its keys/values
to the batch, and runs only the suffixes batched. Autograd flows through the
shared prefix (its gradient is the sum over the rows that use it), so the
result and its gradient equal those of running every sequence in full.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch

__all__ = ["token_logprobs", "common_prefix"]

MIN_SHARED = 8  # below this, sharing saves less than the extra forward call costs


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
                   temperature: float = 1.0, pad_id: int = 0, share_prefix: bool = True) -> list["torch.Tensor"]:
    """``log softmax(logits / T)`` of tokens ``seqs[i][starts[i]:]`` given everything before them.

    Args:
        model: A causal LM (transformers interface: ``input_ids``, ``attention_mask``,
            ``position_ids``, ``past_key_values``).
        seqs: Whole sequences (prompt + response ids).
        starts: Index of the first token whose log-probability is wanted (``>= 1``).
        temperature: The sampling temperature the tokens were drawn at (``<= 0`` means 1).
        pad_id: Id used for padding (never attended to).
        share_prefix: Run the common prefix once (exact; disable to compare).

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
    cache = None
    if P:
        prefix = torch.tensor([list(seqs[0][:P])], dtype=torch.long, device=dev)
        out = model(input_ids=prefix, use_cache=True)
        layers = [(layer.keys.expand(B, -1, -1, -1), layer.values.expand(B, -1, -1, -1))
                  for layer in out.past_key_values.layers]
        cache = DynamicCache(layers)
    S = max(len(s) for s in seqs) - P
    ids = torch.full((B, S), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P + S), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s) - P] = torch.tensor(list(s[P:]), dtype=torch.long)
        mask[i, :len(s)] = 1
    pos = torch.arange(P, P + S, dtype=torch.long).unsqueeze(0).expand(B, -1)
    out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                past_key_values=cache, use_cache=cache is not None)
    logits = out.logits
    t = temperature if temperature and temperature > 0 else 1.0
    result = []
    for i, s in enumerate(seqs):
        a, b = starts[i] - 1 - P, len(s) - 1 - P  # logits at suffix index j predict token P + j + 1
        row = logits[i, a:b].float() / t
        target = ids[i, a + 1:b + 1].to(dev)
        result.append(torch.log_softmax(row, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1))
    return result
