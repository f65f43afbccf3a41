"""The clipped policy-gradient loss of GRPO/ARPO, token-mean over sampled tokens.

For each response token ``t`` of trajectory ``i`` (symbols as in PPO/GRPO):

* ``ρ = exp(log π_θ(o_t) − log π_old(o_t))`` — the importance ratio;
* ``L_clip = −min(ρ·Â, clip(ρ, 1−ε, 1+ε)·Â)``;
* ``D_KL ≈ exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1`` — the ``k3``
  estimator of KL(π_θ ‖ π_ref) (Schulman 2020), unbiased and never negative;
* ``L = Σ_t mask·(L_clip + β·D_KL) / Σ_t mask`` — the token-mean over every
  sampled token of the batch. ``mask`` is the rollout's ``loss_mask``: tool
  responses and other inserted tokens (mask 0) never contribute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["policy_loss", "LossStats", "kl_k3"]


@dataclass
class LossStats:
    """Diagnostics of one loss evaluation (plain floats)."""

    loss: float
    pg_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    tokens: int


def kl_k3(logp: "torch.Tensor", ref_logp: "torch.Tensor") -> "torch.Tensor":
    """Per-token ``k3`` estimate of KL(π_θ ‖ π_ref) from sampled-token log-probs."""
    import torch

    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def policy_loss(
    logp: "torch.Tensor",
    old_logp: "torch.Tensor",
    advantages: "torch.Tensor",
    mask: "torch.Tensor",
    *,
    clip_eps: float = 0.2,
    ref_logp: "torch.Tensor | None" = None,
    kl_coef: float = 0.0,
    num_tokens: int | float | None = None,
) -> tuple["torch.Tensor", LossStats]:
    """The token-mean clipped surrogate loss (plus ``β·KL`` when ``ref_logp`` is given).

    Args:
        logp: ``log π_θ`` of each response token, shape ``[B, T]`` (requires grad).
        old_logp: ``log π_old`` of the same tokens (the policy that sampled them).
        advantages: ``Â`` per token, ``[B, T]`` (soft or hard attribution).
        mask: 1 on sampled tokens, 0 on tool/inserted tokens and padding, ``[B, T]``.
        clip_eps: ``ε`` of the ratio clip.
        ref_logp: ``log π_ref`` for the KL term; ``None`` disables it.
        kl_coef: ``β``, the weight of the KL term.
        num_tokens: The denominator of the token-mean. Defaults to ``mask.sum()``;
            pass the whole batch's count when a batch is split into micro-batches
            so that their gradients add up to the full batch's.

    Returns:
        ``(loss, stats)``; ``loss`` is a scalar tensor to call ``backward`` on.
    """
    import torch

    mask = mask.to(logp.dtype)
    denom = float(num_tokens) if num_tokens is not None else float(mask.sum().item())
    denom = max(denom, 1.0)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    pg = -torch.minimum(unclipped, clipped)
    per_token = pg
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_coef:
        kl = kl_k3(logp, ref_logp)
        per_token = pg + kl_coef * kl
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        n = max(float(mask.sum().item()), 1.0)
        was_clipped = ((ratio - 1.0).abs() > clip_eps).to(logp.dtype)
        stats = LossStats(
            loss=float(loss.item()),
            pg_loss=float((pg * mask).sum().item() / denom),
            kl=float((kl * mask).sum().item() / n),
            clip_fraction=float((was_clipped * mask).sum().item() / n),
            ratio_mean=float((ratio * mask).sum().item() / n),
            tokens=int(mask.sum().item()),
        )
    return loss, stats
