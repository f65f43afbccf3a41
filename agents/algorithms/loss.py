"""The clipped policy-gradient loss of GRPO/ARPO, token-mean over sampled tokens.

For each response token ``t`` of trajectory ``i`` (symbols as in PPO/GRPO):

* ``ρ = exp(log π_θ(o_t) − log π_old(o_t))`` — the importance ratio;
* ``L_clip = −min(ρ·Â, clip(ρ, 1−ε, 1+ε)·Â)``;
* ``D_KL ≈ k3 = exp(r) − r − 1`` with ``r = log π_ref(o_t) − log π_θ(o_t)`` — the
  ``k3`` estimator (Schulman 2020) of the reverse KL, KL(π_θ ‖ π_ref) =
  E_{o∼π_θ}[log π_θ(o) − log π_ref(o)]: never negative, and unbiased when the tokens
  are drawn from π_θ (here they come from π_old, so it is exact at the first update
  of a batch and approximate after). ``r`` is clamped to ``[−10, 10]``
  (:data:`KL_LOG_RATIO_CLAMP`) so that ``exp(r)`` cannot overflow on extreme
  log-probs (an inf times a mask of 0 would make the loss NaN);
* ``L = Σ_t mask·L_clip / N_pg + β·Σ_t mask·D_KL / N`` — token-means over the
  sampled tokens of the batch. ``mask`` is the rollout's ``loss_mask``: tool
  responses and other inserted tokens (mask 0) never contribute. ``N`` counts every
  sampled token; ``N_pg`` (``pg_num_tokens``) only those of samples that carry a
  policy-gradient signal, i.e. of groups whose advantages are not all zero. A group
  of equal rewards has ``Â = 0``, so its tokens add nothing to the policy-gradient
  sum; with a KL penalty its samples are still trained on (for the KL term), and
  counting them in the policy-gradient denominator would shrink the policy gradient
  by the share of such groups -- a factor that differs between runs and arms. So the
  policy-gradient term is the same with or without a KL penalty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["policy_loss", "LossStats", "kl_k3", "KL_LOG_RATIO_CLAMP"]

KL_LOG_RATIO_CLAMP = 10.0
"""``|log π_ref − log π_θ|`` is clamped to this in :func:`kl_k3` (``exp(10) ≈ 2.2e4``: finite)."""


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
    """Per-token ``k3 = exp(r) − r − 1``, ``r = log π_ref − log π_θ`` (clamped to
    ``±KL_LOG_RATIO_CLAMP``): an estimate of KL(π_θ ‖ π_ref) from the log-probs of tokens
    drawn from the policy (see the module docstring). Finite for any finite inputs."""
    import torch

    d = torch.clamp(ref_logp - logp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
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
    pg_num_tokens: int | float | None = None,
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
        pg_num_tokens: The denominator of the policy-gradient term (default: that of the
            token-mean): the batch's sampled tokens of samples with a non-zero advantage,
            so that samples kept only for the KL term do not dilute the policy gradient.

    Returns:
        ``(loss, stats)``; ``loss`` is a scalar tensor to call ``backward`` on.
    """
    import torch

    mask = mask.to(logp.dtype)
    denom = float(num_tokens) if num_tokens is not None else float(mask.sum().item())
    denom = max(denom, 1.0)
    pg_denom = max(float(pg_num_tokens), 1.0) if pg_num_tokens is not None else denom
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    pg = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(logp)
    loss = (pg * mask).sum() / pg_denom
    if ref_logp is not None and kl_coef:
        kl = kl_k3(logp, ref_logp)
        loss = loss + kl_coef * (kl * mask).sum() / denom
    with torch.no_grad():
        n = max(float(mask.sum().item()), 1.0)
        was_clipped = ((ratio - 1.0).abs() > clip_eps).to(logp.dtype)
        stats = LossStats(
            loss=float(loss.item()),
            pg_loss=float((pg * mask).sum().item() / pg_denom),
            kl=float((kl * mask).sum().item() / n),
            clip_fraction=float((was_clipped * mask).sum().item() / n),
            ratio_mean=float((ratio * mask).sum().item() / n),
            tokens=int(mask.sum().item()),
        )
    return loss, stats
