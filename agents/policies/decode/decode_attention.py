"""Decode-step attention for :class:`~agents.policies.hf_policy.HFPolicy`: grouped queries without
copying the cache, and a prefix that many rows share read once.

Registered with transformers' ``AttentionInterface`` as :data:`NAME` and selected by
``HFPolicy`` only while it samples. A forward with more than one query position, or
with gradients on (training, log-probability recomputation), is handed unchanged to
transformers' own SDPA attention, so only sampling's one-token steps take this path.

Two costs of transformers' SDPA path at a decode step, measured on the tiny model with
16 rows and ~1,240 cached positions (``benchmarks/rollout.py``): on CPU with a padding
mask it expands every key/value head to its query heads (``repeat_kv``: a copy of the
whole cache per layer per token, 56% of rollout time), and every row reads its own copy
of the system prompt and tool schemas that all rows of a task share.

* Grouped queries: the ``G`` query heads of a key/value head are one matrix
  ``(G, D)`` multiplied with that head's keys; nothing is expanded.
* Shared prefix (cascade attention, as in FlashInfer): ``HFPolicy`` sorts a batch's rows by
  their ids, so prompts with a common prefix are neighbours, and puts a prefix reused from its
  cache at columns ``[0, S)`` of every row that reuses it. :func:`plan_batch` cuts the rows
  into runs; a run that shares ``S`` ids attends to one row's copy of those columns, all its
  queries in one product, then each row to its own columns from the run's first real one
  on, and the two partial softmaxes are merged exactly by their log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agents.policies.decode.prefix_cache import common_prefix_len

__all__ = ["NAME", "DecodePlan", "Segment", "plan_batch", "register", "sort_rows"]

NAME = "envfactory_decode"
MIN_SHARED = 64  # shorter shared prefixes are read per row: the extra products cost more than they save
MIN_GAP = 32  # shorter runs of masked columns are read: a split read costs more than they do


@dataclass
class Segment:
    """Rows ``[lo, hi)`` of the batch: they read their own keys/values from column ``own``
    on (every column before it is masked for all of them or, below ``shared``, read once),
    and, when ``shared`` > 0, the columns ``[0, shared)`` of row ``lo``, which hold the same
    keys/values in every row of the segment. ``gap``: columns ``[gap[0], gap[1])`` past
    ``own`` that are masked for every row of the segment (the batch layout's padding between
    the longest reused prefix and the right-aligned rest of the prompts), skipped."""

    lo: int
    hi: int
    own: int
    shared: int
    gap: tuple[int, int] | None = None


@dataclass
class DecodePlan:
    """The batch layout the decode attention reads (passed down as the forward kwarg ``ef_plan``)."""

    segments: list[Segment]


def sort_rows(prompts: list[Any]) -> list[int]:
    """Row order that puts prompts with a common prefix next to each other (by their ids)."""
    return sorted(range(len(prompts)), key=lambda i: prompts[i].tolist())


def plan_batch(prompts: list[Any], reused: list[int], mask: torch.Tensor, min_shared: int = MIN_SHARED
               ) -> DecodePlan:
    """Split a batch whose rows are in :func:`sort_rows` order into runs of neighbours that
    share at least ``min_shared`` leading ids, each held at columns ``[0, S)`` (``reused[i]``:
    the ids row ``i`` took from the prefix cache, which the batch layout puts there); rows in
    no such run form runs of their own. ``mask``: the batch's (rows, columns) attention mask,
    1 where a row has a real key; a run reads itself from its first real column past ``S``."""
    n = len(prompts)
    real = mask.bool()
    cols = torch.arange(real.shape[1])

    def first_real(lo: int, hi: int, after: int) -> int:
        m = real[lo:hi] & (cols >= after)
        hit = m.any(dim=0).nonzero()
        return int(hit[0]) if len(hit) else after

    bounds: list[tuple[int, int, int]] = []  # (lo, hi, shared)
    lo, length = 0, 1 << 62
    for i in range(1, n + 1):
        if i < n:
            lcp = common_prefix_len(prompts[i - 1], prompts[i])
            joined = min(length, lcp, reused[i - 1], reused[i])
            if joined >= min_shared:
                length = joined
                continue
        shared = length if i - lo >= 2 and length < (1 << 62) else 0
        bounds.append((lo, i, shared))
        lo, length = i, 1 << 62
    merged: list[tuple[int, int, int]] = []  # neighbouring runs that share nothing read as one
    for b in bounds:
        if merged and b[2] == 0 and merged[-1][2] == 0:
            merged[-1] = (merged[-1][0], b[1], 0)
        else:
            merged.append(b)
    segments = []
    for lo, hi, shared in merged:
        own = first_real(lo, hi, shared)
        segments.append(Segment(lo, hi, own, shared, _gap(real[lo:hi, own:].any(dim=0), own)))
    return DecodePlan(segments)


def _gap(used: torch.Tensor, offset: int) -> tuple[int, int] | None:
    """The longest run of unused columns in ``used`` (one bool per column), as absolute
    columns (``+ offset``), when it is at least :data:`MIN_GAP` long and has used columns on
    both sides."""
    idx = used.nonzero().flatten()
    if len(idx) < 2:
        return None
    runs = idx[1:] - idx[:-1] - 1  # unused columns between consecutive used ones
    k = int(runs.argmax())
    if int(runs[k]) < MIN_GAP:
        return None
    return offset + int(idx[k]) + 1, offset + int(idx[k + 1])


def _partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised attention of ``q (..., M, D)`` over ``k, v (..., N, D)``:
    (row max, sum of exp, exp-weighted values), with an additive ``bias`` (-inf masks)."""
    s = torch.matmul(q, k.transpose(-1, -2))
    if bias is not None:
        s = s + bias
    m = s.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(s.dtype).min)  # a fully masked row: no NaN
    p = torch.exp(s - m)
    return m, p.sum(dim=-1, keepdim=True), torch.matmul(p, v)


def _merge(a: tuple[torch.Tensor, torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two :func:`_partial` results over disjoint keys as one (exact, by their log-sum-exp)."""
    (ma, sa, oa), (mb, sb, ob) = a, b
    mx = torch.maximum(ma, mb)
    wa, wb = torch.exp(ma - mx), torch.exp(mb - mx)
    return mx, sa * wa + sb * wb, oa * wa + ob * wb


def _decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
            scaling: float, plan: DecodePlan | None) -> torch.Tensor:
    B, H, _, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    G = H // Hkv
    q = query.reshape(B, Hkv, G, D) * scaling
    bias = None
    if mask is not None:  # (B, 1, 1, L) bool (True: attend) or additive float
        m2 = mask.reshape(B, 1, 1, mask.shape[-1])[..., -L:]
        bias = torch.zeros(m2.shape, dtype=q.dtype, device=q.device).masked_fill(~m2, float("-inf")) \
            if m2.dtype == torch.bool \
            else m2.to(q.dtype)
    segments = plan.segments if plan is not None else [Segment(0, B, 0, 0)]
    outs = []
    for sg in segments:
        lo, hi, c = sg.lo, sg.hi, sg.own
        if sg.gap is None:
            m1, s1, o1 = _partial(q[lo:hi], key[lo:hi, :, c:], value[lo:hi, :, c:],
                                  None if bias is None else bias[lo:hi, ..., c:])
        else:  # the columns before and after the gap, merged
            g0, g1 = sg.gap
            m1, s1, o1 = _partial(q[lo:hi], key[lo:hi, :, c:g0], value[lo:hi, :, c:g0],
                                  None if bias is None else bias[lo:hi, ..., c:g0])
            m1, s1, o1 = _merge((m1, s1, o1), _partial(q[lo:hi], key[lo:hi, :, g1:], value[lo:hi, :, g1:],
                                                       None if bias is None else bias[lo:hi, ..., g1:]))
        if sg.shared:
            n = hi - lo
            qg = q[lo:hi].permute(1, 0, 2, 3).reshape(Hkv, n * G, D)  # every query of the segment at once
            m2, s2, o2 = _partial(qg, key[lo, :, : sg.shared], value[lo, :, : sg.shared], None)
            m2 = m2.reshape(Hkv, n, G, 1).permute(1, 0, 2, 3)
            s2 = s2.reshape(Hkv, n, G, 1).permute(1, 0, 2, 3)
            o2 = o2.reshape(Hkv, n, G, D).permute(1, 0, 2, 3)
            m1, s1, o1 = _merge((m1, s1, o1), (m2, s2, o2))
        outs.append(o1 / s1)
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.reshape(B, 1, H, D)


def decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     ef_plan: DecodePlan | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function (see the module docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (query.shape[2] != 1 or torch.is_grad_enabled() or dropout or kwargs.get("output_attentions")
            or kwargs.get("position_bias") is not None or query.shape[1] % key.shape[1]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return _decode(query, key, value, attention_mask, scale, ef_plan), None


_registered = False


def register() -> str:
    """Register :func:`decode_attention` (and SDPA's mask format) under :data:`NAME`; idempotent."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, decode_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True
    return NAME
