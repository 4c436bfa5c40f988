"""The clipped surrogate and EntropyMech's Clip-Cov and KL-Cov as registered losses
(docs/algorithms.md §4 and §4b; ``loss.loss_mode`` ``vanilla``, ``clip_cov``, ``kl_cov``).

Each reads the micro-batch's advantages, π_old's log-probs and the per-row clip radii ε_low /
ε_high the method's clip rule gave (AGPO's per-prompt ε, or the loss's), and returns the per-token
loss with TRL's ``clip_ratio/*`` statistics.
"""

from __future__ import annotations

import torch

from rlkit.losses.base import LossContext, LossOutput, register_loss
from rlkit.losses.core import ClipStats, clipped_surrogate, masked_mean, per_row
from rlkit.settings import reads

CLIP_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
CLIP = reads("loss.eps_low", "loss.eps_high")  # the ratio's clip (the method's clip rule's ε)
DUAL_CLIP = CLIP | reads("loss.dual_clip")


def clip_metrics(clipped: ClipStats) -> dict[str, torch.Tensor]:
    """TRL's ``clip_ratio/*`` of the micro-batch."""
    return dict(zip(CLIP_METRICS, (clipped.low, clipped.high, clipped.region), strict=True))


@register_loss("vanilla", CLIP_METRICS, reads=DUAL_CLIP)
def vanilla(logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
    """The PPO clipped surrogate with asymmetric per-row ε and, with ``loss.dual_clip`` = c,
    dual-clip PPO's cap at −c·A for A < 0 (§4, :func:`~rlkit.losses.core.clipped_surrogate`)."""
    loss, clipped = clipped_surrogate(
        logp,
        ctx.old_logp,
        sub.advantages,
        ctx.eps_low,
        ctx.eps_high,
        sub.rollouts.completion_mask,
        ctx.cfg.loss.dual_clip,
    )
    return LossOutput(loss, clip_metrics(clipped))


def token_covariance(
    advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """cov_t = (A_t − mean A)·(log π_t − mean log π), both means over the real tokens, detached;
    −inf at padding (never selected). ``advantages`` [B] or [B, T]."""
    adv = per_row(advantages, logp).expand_as(logp).detach()
    logp = logp.detach()
    cov = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))
    return cov.masked_fill(~mask.bool(), -torch.inf)


def clip_cov(
    loss: torch.Tensor,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: torch.Tensor | float,
    eps_high: torch.Tensor | float,
    mask: torch.Tensor,
    ratio: float = 2e-4,
    lb: float = 1.0,
    ub: float = 5.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip-Cov (verl's ``compute_policy_loss_clip_cov``): the per-token surrogate ``loss`` with the
    policy-gradient term of max(1, ⌊ratio·N⌋) tokens set to 0, drawn uniformly (``torch.randperm``
    on the global torch RNG, as verl) among the N real tokens with lb < cov_t < ub that the ratio
    clip did not already clip. Returns the loss and the fraction of real tokens zeroed (verl's
    ``actor/pg_clipfrac`` under clip_cov)."""
    adv = per_row(advantages, logp)
    ratio_t = torch.exp(logp - old_logp)
    eps_low, eps_high = per_row(eps_low, logp), per_row(eps_high, logp)
    clipped = (
        -adv * ratio_t.clamp(1 - eps_low, 1 + eps_high) > -adv * ratio_t
    )  # verl's clip_by_origin
    cov = token_covariance(advantages, logp, mask).masked_fill(clipped, -torch.inf)
    count = max(int(ratio * mask.sum().item()), 1)
    candidates = torch.nonzero((cov > lb) & (cov < ub) & mask.bool())
    chosen = candidates[torch.randperm(len(candidates))[:count]] if len(candidates) else candidates
    keep = torch.ones_like(loss)
    keep[chosen[:, 0], chosen[:, 1]] = 0
    return loss * keep, masked_mean((keep == 0).to(loss.dtype), mask)


def kl_cov(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ratio: float = 2e-3,
    coef: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL-Cov (verl's ``compute_policy_loss_kl_cov``): the unclipped −ρ_t·A_t on every token, plus
    ``coef``·|log π_θ − log π_old| on the max(1, ⌊ratio·N⌋) real tokens of largest cov_t. Returns
    the per-token loss and mean |log π_θ − log π_old| over the real tokens (verl's
    ``actor/ppo_kl`` under kl_cov)."""
    adv = per_row(advantages, logp)
    log_ratio = logp - old_logp
    loss = -adv * torch.exp(log_ratio)
    cov = token_covariance(advantages, logp, mask).reshape(-1)
    count = max(1, int(mask.sum().item() * ratio))
    top = torch.topk(cov, min(count, int(mask.sum().item())), largest=True).indices
    penalty = torch.zeros_like(loss).reshape(-1)
    penalty[top] = 1.0
    loss = loss + coef * log_ratio.abs() * penalty.reshape(loss.shape)
    return loss, masked_mean(log_ratio.abs().detach(), mask)


@register_loss(
    "clip_cov",
    (*CLIP_METRICS, "clip_cov/pg_clipfrac"),
    keeps_order=True,
    reads=DUAL_CLIP | reads("loss.clip_cov_ratio", "loss.clip_cov_lb", "loss.clip_cov_ub"),
)
def clip_cov_loss(logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
    """Clip-Cov (§4b): the clipped surrogate (:func:`vanilla`, dual clip included) with
    :func:`clip_cov`'s tokens detached, N the micro-batch's real tokens, as in verl."""
    out, cfg = vanilla(logp, sub, ctx), ctx.cfg.loss
    loss, frac = clip_cov(
        out.loss,
        logp,
        ctx.old_logp,
        sub.advantages,
        ctx.eps_low,
        ctx.eps_high,
        sub.rollouts.completion_mask,
        cfg.clip_cov_ratio,
        cfg.clip_cov_lb,
        cfg.clip_cov_ub,
    )
    return LossOutput(loss, out.stats | {"clip_cov/pg_clipfrac": frac})


@register_loss(  # its surrogate −ρ·A is not clipped (verl's kl_cov): no loss.eps_*
    "kl_cov",
    (*CLIP_METRICS, "kl_cov/ppo_kl"),
    keeps_order=True,
    reads=reads("loss.kl_cov_ratio", "loss.ppo_kl_coef"),
)
def kl_cov_loss(logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
    """KL-Cov (§4b): :func:`kl_cov` on the micro-batch's statistics, as in verl. Its
    surrogate is unclipped: its ``clip_ratio/*`` are 0."""
    cfg = ctx.cfg.loss
    loss, kl = kl_cov(
        logp,
        ctx.old_logp,
        sub.advantages,
        sub.rollouts.completion_mask,
        cfg.kl_cov_ratio,
        cfg.ppo_kl_coef,
    )
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    return LossOutput(loss, dict.fromkeys(CLIP_METRICS, zero) | {"kl_cov/ppo_kl": kl})
