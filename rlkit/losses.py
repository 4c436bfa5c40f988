"""Policy loss, KL to the reference, entropy and loss aggregation (docs/algorithms.md §4).

Shapes: per-token tensors are ``[B, T]`` (B sequences, T completion tokens) with a ``mask`` of
real tokens. Per-sequence quantities (advantages, ε) are ``[B]`` or ``[B, 1]`` and broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k3")


@dataclass
class ClipStats:
    """Fractions of real tokens whose ratio was clipped (TRL's clip_ratio metrics)."""

    low: torch.Tensor  # ρ < 1 − ε_low with A < 0: the clipped branch was taken
    high: torch.Tensor  # ρ > 1 + ε_high with A > 0
    region: torch.Tensor  # low + high
    dual: torch.Tensor  # A < 0 tokens capped by the dual clip


def _per_row(x: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    return x.unsqueeze(-1) if x.dim() == 1 else x


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: torch.Tensor | float,
    eps_high: torch.Tensor | float,
    mask: torch.Tensor | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, ClipStats]:
    """Per-token PPO clipped surrogate with asymmetric ε (docs/algorithms.md §4)::

        ρ = exp(log π_θ − log π_old)
        L = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A)

    ε_low / ε_high may be scalars or per-sequence tensors ``[B]`` (AGPO's per-prompt ε). With
    ``dual_clip = c`` (c > 1), tokens with A < 0 are further capped at −c·A (dual-clip PPO).
    """
    eps_low, eps_high = _per_row(eps_low, logp), _per_row(eps_high, logp)
    if (eps_low < 0).any() or (eps_high < 0).any():
        raise ValueError("clip epsilons must be >= 0")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    adv = _per_row(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        capped = torch.minimum(loss, -adv * dual_clip)
        dual = (adv < 0) & (capped < loss)
        loss = torch.where(adv < 0, capped, loss)
    if mask is None:
        mask = torch.ones_like(loss, dtype=torch.bool)
    with torch.no_grad():
        low = (ratio < 1 - eps_low) & (adv < 0)
        high = (ratio > 1 + eps_high) & (adv > 0)
        stats = ClipStats(
            low=masked_mean(low.to(loss.dtype), mask),
            high=masked_mean(high.to(loss.dtype), mask),
            region=masked_mean((low | high).to(loss.dtype), mask),
            dual=masked_mean(dual.to(loss.dtype), mask),
        )
    return loss, stats


def kl_divergence(
    logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate on sampled tokens (docs/algorithms.md §4; Schulman's k1/k3).

    k1 = log π_θ − log π_ref;  k3 = exp(log π_ref − log π_θ) − (log π_ref − log π_θ) − 1 (≥ 0).
    """
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        log_ratio = ref_logp - logp
        return torch.expm1(log_ratio) - log_ratio  # expm1 keeps k3 ≥ 0 for tiny log-ratios
    raise ValueError(f"unknown KL estimator {estimator!r}; known: {list(KL_ESTIMATORS)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of softmax(logits) over the last dim: −Σ p·log p.

    Computed from log-softmax in at least float32 (float64 logits stay float64), so a large
    common offset costs no precision, and −inf logits (masked tokens, p = 0) contribute 0.
    """
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, 0.0).sum(dim=-1)


def aggregate_loss(
    loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", max_len: int | None = None
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar (docs/algorithms.md §4 ``loss_agg``).

    - ``token-mean`` (DAPO): Σ loss·mask / Σ mask over the whole batch;
    - ``seq-mean-token-mean`` (GRPO): mean over sequences of each sequence's token mean;
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): mean over sequences of Σ_t loss / ``max_len``
      (default T, the padded completion length).
    """
    mask = mask.to(loss.dtype)
    if mode == "token-mean":
        return masked_mean(loss, mask)
    if mode == "seq-mean-token-mean":
        per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        return per_seq.mean()
    if mode == "seq-mean-token-sum-norm":
        norm = loss.shape[-1] if max_len is None else max_len
        if norm <= 0:
            raise ValueError(f"max_len must be positive, got {norm}")
        return ((loss * mask).sum(-1) / norm).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}; known: {list(LOSS_AGGREGATIONS)}")


# ---------------------------------------------------------------------------------------------
# loss.loss_mode: EntropyMech's Clip-Cov and KL-Cov (arXiv 2505.22617, docs/algorithms.md §4b),
# GSPO and CISPO (§4f)

# verl's policy_loss.loss_mode names
LOSS_MODES = ("vanilla", "clip_cov", "kl_cov", "gspo", "cispo")


def token_covariance(
    advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """cov_t = (A_t − mean A)·(log π_t − mean log π), both means over the real tokens, detached;
    −inf at padding (never selected). ``advantages`` [B] or [B, T]."""
    adv = _per_row(advantages, logp).expand_as(logp).detach()
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
    adv = _per_row(advantages, logp)
    ratio_t = torch.exp(logp - old_logp)
    eps_low, eps_high = _per_row(eps_low, logp), _per_row(eps_high, logp)
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
    adv = _per_row(advantages, logp)
    log_ratio = logp - old_logp
    loss = -adv * torch.exp(log_ratio)
    cov = token_covariance(advantages, logp, mask).reshape(-1)
    count = max(1, int(mask.sum().item() * ratio))
    top = torch.topk(cov, min(count, int(mask.sum().item())), largest=True).indices
    penalty = torch.zeros_like(loss).reshape(-1)
    penalty[top] = 1.0
    loss = loss + coef * log_ratio.abs() * penalty.reshape(loss.shape)
    return loss, masked_mean(log_ratio.abs().detach(), mask)


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
    eps_low, eps_high = _per_row(eps_low, logp), _per_row(eps_high, logp)
    adv = _per_row(advantages, logp)
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
    eps_low, eps_high = _per_row(eps_low, logp), _per_row(eps_high, logp)
    adv = _per_row(advantages, logp)
    ratio = torch.exp(logp - old_logp).detach()
    loss = -ratio.clamp(1 - eps_low, 1 + eps_high) * adv * logp
    low, high = (ratio < 1 - eps_low).to(loss.dtype), (ratio > 1 + eps_high).to(loss.dtype)
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    stats = ClipStats(
        masked_mean(low, mask), masked_mean(high, mask), masked_mean(low + high, mask), zero
    )
    return loss, stats


LOSS_MODE_METRICS = {  # each loss.loss_mode's own metrics, besides clip_ratio/*
    "vanilla": (),
    "clip_cov": ("clip_cov/pg_clipfrac",),
    "kl_cov": ("kl_cov/ppo_kl",),
    "gspo": (),
    "cispo": (),
}
BATCH_STATISTIC_MODES = ("clip_cov", "kl_cov")  # select tokens by micro-batch statistics (§4b)


def policy_loss(
    loss_cfg,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: torch.Tensor | float,
    eps_high: torch.Tensor | float,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, ClipStats, dict[str, torch.Tensor]]:
    """The per-token policy loss under ``loss_cfg.loss_mode``, its clip stats and the mode's
    metrics (:data:`LOSS_MODE_METRICS`): the clipped surrogate (``vanilla``, with
    ``loss_cfg.dual_clip``), Clip-Cov or KL-Cov on it (KL-Cov's surrogate is unclipped: its clip
    stats are 0; statistics such as the mean log-prob and N are the micro-batch's, as in verl),
    GSPO or CISPO."""
    mode = loss_cfg.loss_mode
    if mode == "gspo":
        return (*gspo(logp, old_logp, advantages, eps_low, eps_high, mask), {})
    if mode == "cispo":
        return (*cispo(logp, old_logp, advantages, eps_low, eps_high, mask), {})
    if mode == "kl_cov":
        loss, kl = kl_cov(
            logp, old_logp, advantages, mask, loss_cfg.kl_cov_ratio, loss_cfg.ppo_kl_coef
        )
        zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
        return loss, ClipStats(zero, zero, zero, zero), {"kl_cov/ppo_kl": kl}
    loss, clipped = clipped_surrogate(
        logp, old_logp, advantages, eps_low, eps_high, mask, loss_cfg.dual_clip
    )
    if mode == "vanilla":
        return loss, clipped, {}
    if mode == "clip_cov":
        loss, frac = clip_cov(
            loss,
            logp,
            old_logp,
            advantages,
            eps_low,
            eps_high,
            mask,
            loss_cfg.clip_cov_ratio,
            loss_cfg.clip_cov_lb,
            loss_cfg.clip_cov_ub,
        )
        return loss, clipped, {"clip_cov/pg_clipfrac": frac}
    raise ValueError(f"unknown loss.loss_mode {mode!r}; known: {list(LOSS_MODES)}")
