"""The pieces every loss shares (docs/algorithms.md §4): the clipped surrogate, KL to the
reference, entropy, masked means and the loss aggregations.

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


def per_row(x: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
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
    eps_low, eps_high = per_row(eps_low, logp), per_row(eps_high, logp)
    if (eps_low < 0).any() or (eps_high < 0).any():
        raise ValueError("clip epsilons must be >= 0")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    adv = per_row(advantages, logp)
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
