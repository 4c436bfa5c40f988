"""GSPO and CISPO as registered losses (docs/algorithms.md §4f; ``loss.loss_mode`` ``gspo``,
``cispo``): the sequence-level ratio, and REINFORCE with a clipped, detached importance weight.
"""

from __future__ import annotations

import torch

from rlkit.losses.base import LossContext, LossOutput, register_loss
from rlkit.losses.clipped import CLIP, CLIP_METRICS, clip_metrics
from rlkit.losses.core import ClipStats, masked_mean, per_row


def gspo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: torch.Tensor | float,
    eps_high: torch.Tensor | float,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, ClipStats]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071; docs/algorithms.md §4f): the clipped surrogate
    on the sequence ratio s_i = exp(mean_t (log π_θ − log π_old)) over row i's real tokens, in
    the paper's GSPO-token form with the stop-gradient, verl's ``compute_policy_loss_gspo``::

        s_i,t = sg[s_i] · π_θ(y_i,t) / sg[π_θ(y_i,t)]        (value s_i, ∇ = s_i·∇log π_θ(y_i,t))
        L_i,t = −min(s_i,t·A_i,t, clip(s_i,t, 1 − ε_low, 1 + ε_high)·A_i,t)

    With A_i,t = A_i and the tokens of a row weighted alike (every ``loss.loss_agg``), the
    gradient is GSPO's and TRL's ``importance_sampling_level="sequence"``. A row with
    no real token has s_i = 1. Clip stats: the real tokens whose row's s_i was clipped."""
    eps_low, eps_high = per_row(eps_low, logp), per_row(eps_high, logp)
    adv = per_row(advantages, logp)
    m = mask.to(logp.dtype)
    tokens = m.sum(-1, keepdim=True).clamp_min(1.0)
    log_s = torch.where(mask.bool(), logp - old_logp, 0.0).sum(-1, keepdim=True) / tokens
    ratio = torch.exp(logp - logp.detach() + log_s.detach())
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))
    with torch.no_grad():
        s = log_s.exp()
        low = ((s < 1 - eps_low) & (adv < 0)).to(loss.dtype)
        high = ((s > 1 + eps_high) & (adv > 0)).to(loss.dtype)
        zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
        stats = ClipStats(
            masked_mean(low.expand_as(m), m),
            masked_mean(high.expand_as(m), m),
            masked_mean((low + high).expand_as(m), m),
            zero,
        )
    return loss, stats


def cispo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: torch.Tensor | float,
    eps_high: torch.Tensor | float,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, ClipStats]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, §3.1; docs/algorithms.md §4f): REINFORCE with
    the clipped importance weight detached, verl's ``compute_policy_loss_cispo``::

        r̂_t = clip(ρ_t, 1 − ε_low, 1 + ε_high),   L_t = −sg[r̂_t]·A_t·log π_θ(y_t)

    so every token keeps its gradient, −r̂_t·A_t·∇log π_θ. ``eps_low`` = 1 leaves the weight
    without a lower bound (the paper's setting; TRL's ``loss_type="cispo"`` clamps only above, at
    its ``epsilon_high`` = 1 + ε_high). Clip stats: the real tokens whose weight was clipped
    below (``low``) or above (``high``), whatever the sign of A_t (verl's ``pg_clipfrac`` is
    ``region``)."""
    eps_low, eps_high = per_row(eps_low, logp), per_row(eps_high, logp)
    adv = per_row(advantages, logp)
    ratio = torch.exp(logp - old_logp).detach()
    loss = -ratio.clamp(1 - eps_low, 1 + eps_high) * adv * logp
    low, high = (ratio < 1 - eps_low).to(loss.dtype), (ratio > 1 + eps_high).to(loss.dtype)
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    stats = ClipStats(
        masked_mean(low, mask), masked_mean(high, mask), masked_mean(low + high, mask), zero
    )
    return loss, stats


@register_loss("gspo", CLIP_METRICS, reads=CLIP)  # no dual clip (TRL's and verl's have none)
def gspo_loss(logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
    """GSPO (§4f) with the micro-batch's per-row ε: :func:`gspo`."""
    loss, clipped = gspo(
        logp, ctx.old_logp, sub.advantages, ctx.eps_low, ctx.eps_high, sub.rollouts.completion_mask
    )
    return LossOutput(loss, clip_metrics(clipped))


@register_loss("cispo", CLIP_METRICS, reads=CLIP)  # no dual clip (TRL's and verl's have none)
def cispo_loss(logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
    """CISPO (§4f) with the micro-batch's per-row ε: :func:`cispo`."""
    loss, clipped = cispo(
        logp, ctx.old_logp, sub.advantages, ctx.eps_low, ctx.eps_high, sub.rollouts.completion_mask
    )
    return LossOutput(loss, clip_metrics(clipped))
