"""Truncated importance sampling for a sampler that is not the training forward (docs/algorithms.md §4).

rlkit recomputes π_old with the training forward, so the PPO ratio π_θ/π_old is 1 at the first
update. A faster sampler (vLLM, the static-cache decode loop) draws the tokens from a slightly
different policy π_s (other kernels, bf16 LoRA), and the policy gradient is then biased by
π_old/π_s per token. Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training") multiplies each token's policy-gradient term by the
detached weight

    w_t = min(π_old(y_t) / π_s(y_t), C)          C = ``loss.tis_cap``

with both log-probs at the sampling temperature: TRL 1.16's ``vllm_importance_sampling_mode=
"token_truncate"`` (not its default, ``"sequence_mask"``) and verl 0.9.1's token-level rollout
correction (``rollout_is="token"`` with one threshold). ``loss.tis_cap: auto`` (the default) turns
it on with C = 3 (TRL 1.16's ``vllm_importance_sampling_clip_max``, which replaced the deprecated
``vllm_importance_sampling_cap``) whenever the sampler is not the training
forward: an engine other than HF ``generate``, or HF ``generate`` over the dequantized generation
copy (``rollout.generation_copy``, `rlkit.generation_copy`: plain linears where training runs
bitsandbytes' kernels). HF ``generate`` on the training weights *is* the training forward: there
nothing is recorded and nothing changes. The
mismatch is logged under TRL's names (``sampling/sampling_logp_difference/*``,
``sampling/importance_sampling_ratio/*``) plus the share of clipped tokens.

TRL and verl only log the mismatch. rlkit also stops a run whose mismatch says the sampler is
broken (a wrong engine, a stale adapter, a kernel bug: :func:`check_divergence`,
``loss.tis_tripwire``), before the step is logged or saved, so the last checkpoint is the last
good policy.
"""

from __future__ import annotations

import torch

from rlkit.engines import get_engine
from rlkit.losses import Loss, LossContext, LossOutput, Wrapper

DEFAULT_TIS_CAP = 3.0  # TRL 1.16's vllm_importance_sampling_clip_max
# loss.tis_tripwire=auto: a mean gap of half a nat a token means the sampler draws from another
# policy; a correct sampler's is orders of magnitude below (bf16 LoRA and the static loop: about
# 1e-3, benchmarks/README.md's gate on the CPU)
DEFAULT_TIS_TRIPWIRE = 0.5


def resolve_tis_cap(
    tis_cap: float | str, engine: str, generation_copy: str = "none"
) -> float | None:
    """C for ``loss.tis_cap`` with ``rollout.engine`` and ``rollout.generation_copy`` (None: no
    correction).

    ``auto``: :data:`DEFAULT_TIS_CAP` unless the sampler is the training forward (HF
    ``generate`` on the training weights: no generation copy); ``off``: never; a number C > 0:
    always (on the HF path the weights are then 1 up to kernel noise).
    """
    if tis_cap == "auto":
        same = get_engine(engine).same_forward and generation_copy == "none"
        return None if same else DEFAULT_TIS_CAP
    if tis_cap == "off":
        return None
    return float(tis_cap)


def resolve_tis_tripwire(cap: float | None, tripwire: float | str) -> float | None:
    """The divergence tripwire in nats (:func:`check_divergence`) for ``loss.tis_tripwire``
    where the cap is ``cap`` (None: no sampler log-probs are recorded, so none)."""
    if cap is None or tripwire == "off":
        return None
    return DEFAULT_TIS_TRIPWIRE if tripwire == "auto" else float(tripwire)


# loss.tis_mode: TRL 1.16's vllm_importance_sampling_mode values (with its upper bound C alone)
TIS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_weights(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    mode: str = "token_truncate",
) -> torch.Tensor:
    """The detached importance weights of ``mode`` (a weight, never a gradient path), as TRL
    1.16's ``GRPOTrainer`` computes them for ``vllm_importance_sampling_mode`` with
    ``vllm_importance_sampling_clip_max`` = C and no lower bound:

    - ``token_*``: one ratio a token, r_t = exp(log π_old(y_t) − log π_s(y_t)), [B, L];
    - ``sequence_*``: one ratio a sequence, exp(Σ_t over ``mask`` of the same differences),
      [B, 1] (every token of the row gets it);
    - ``*_truncate``: min(r, C); ``*_mask``: r where r ≤ C, 0 above (the token or the whole
      sequence leaves the loss).

    A NaN sampler log-prob (a token the engine returned none for) adds 0 to the log-ratio."""
    delta = torch.nan_to_num(old_logp.detach() - sampler_logp, nan=0.0)
    if mode.startswith("sequence"):
        delta = (delta * mask).sum(dim=-1, keepdim=True)
    ratio = torch.exp(delta)
    if mode.endswith("truncate"):
        return ratio.clamp(max=cap)
    return ratio.masked_fill(ratio > cap, 0.0)


def logp_gap(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """|log π_old − log π_s| of every real token the sampler gave a log-prob for (a NaN: none),
    flattened: what ``sampling_logp_difference/*`` and the tripwire average."""
    known = mask.bool() & ~torch.isnan(sampler_logp)
    return (old_logp - sampler_logp)[known].abs()


def mismatch_metrics(
    old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> dict[str, float]:
    """The sampler/trainer mismatch over the real tokens, under TRL's metric names, and the
    share of tokens whose weight the cap clipped (``.../clipped_fraction``, rlkit's). A token
    without a sampler log-prob (NaN) counts as TRL 1.16's ``GRPOTrainer`` counts it: left out of
    ``sampling_logp_difference/*``, and in ``importance_sampling_ratio/*`` (and the clipped
    fraction's denominator) with the weight 1 it trains with."""
    mask = mask.bool()
    delta = old_logp - sampler_logp
    gap = logp_gap(old_logp, sampler_logp, mask)
    if gap.numel() == 0:
        gap = torch.zeros(1, dtype=old_logp.dtype, device=old_logp.device)
    ratio = torch.exp(torch.nan_to_num(delta, nan=0.0)[mask])
    if ratio.numel() == 0:
        ratio = torch.ones(1, dtype=old_logp.dtype, device=old_logp.device)
    weights = ratio.clamp(max=cap)
    dtype = old_logp.dtype
    return {
        "sampling/sampling_logp_difference/mean": float(gap.mean()),
        "sampling/sampling_logp_difference/max": float(gap.max()),
        "sampling/importance_sampling_ratio/min": float(weights.min()),
        "sampling/importance_sampling_ratio/mean": float(weights.mean()),
        "sampling/importance_sampling_ratio/max": float(weights.max()),
        "sampling/importance_sampling_ratio/clipped_fraction": float(
            (ratio > cap).to(dtype).mean()
        ),
    }


class SamplerDivergenceError(RuntimeError):
    """The sampler's log-probs of the tokens it drew left the trainer's by more than
    ``loss.tis_tripwire`` (:func:`check_divergence`)."""


def check_divergence(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    tripwire: float,
    dist,
    step: int,
) -> None:
    """Raise :class:`SamplerDivergenceError` naming ``step`` (1-based) when the mean
    |log π_old − log π_s| over every rank's real tokens with a sampler log-prob exceeds
    ``tripwire`` nats. The sum and count are reduced over the ranks (``dist``,
    `rlkit.dist.Collective`), so every rank decides alike and none waits on another."""
    gap = logp_gap(old_logp, sampler_logp, mask).double()
    local = torch.stack([gap.sum(), torch.tensor(gap.numel(), dtype=torch.float64)])
    total, count = dist.all_reduce_sum(local.to(mask.device)).tolist()
    mean = total / max(count, 1.0)
    if mean > tripwire:
        largest = float(gap.max()) if gap.numel() else 0.0  # a rank can hold no such token
        raise SamplerDivergenceError(
            f"step {step}: the sampler's log-probs of its own tokens differ from the trainer's by "
            f"{mean:.3g} nats a token on average (over {int(count)} tokens; largest on this "
            f"process {largest:.3g}), above loss.tis_tripwire={tripwire:g}: the "
            "sampler draws from another policy (a wrong engine, a stale adapter, a kernel bug). "
            "The run stopped before logging or saving this step; its last checkpoint holds the "
            "last good policy. Check rollout.engine and its options, or set "
            "loss.tis_tripwire=off to train on"
        )


class TruncatedIS(Wrapper):
    """A per-token loss times the detached weights of :func:`importance_weights` (cap C,
    ``loss.tis_mode``) of π_old over the sampler, from the rows' recorded sampler log-probs; its
    :meth:`summary` logs :func:`mismatch_metrics` and runs :func:`check_divergence` with the
    ``tripwire`` (None: off)."""

    def __init__(self, inner: Loss, cap: float, mode: str, tripwire: float | None):
        super().__init__(inner)
        self.cap, self.mode, self.tripwire = cap, mode, tripwire

    def __call__(self, logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
        sampler_logp = sub.rollouts.sampler_logp
        if sampler_logp is None:
            raise ValueError(
                f"loss.tis_cap={ctx.cfg.loss.tis_cap} is on, but the rollouts carry no sampler "
                f"log-probs (rollout.engine={ctx.cfg.rollout.engine})"
            )
        out = self.inner(logp, sub, ctx)
        mask = sub.rollouts.completion_mask
        weights = importance_weights(ctx.old_logp, sampler_logp, mask, self.cap, self.mode)
        return LossOutput(out.loss * weights, out.stats)

    def summary(self, batch, old, dist, step: int) -> dict[str, float]:
        sampler_logp, mask = batch.rollouts.sampler_logp, batch.rollouts.completion_mask
        stats = self.inner.summary(batch, old, dist, step)
        stats |= mismatch_metrics(old.logp, sampler_logp, mask, self.cap)
        if self.tripwire is not None:
            check_divergence(old.logp, sampler_logp, mask, self.tripwire, dist, step + 1)
        return stats


def applied_cap(loss: Loss) -> float | None:
    """The cap C of the truncated IS among ``loss``'s wrappers (None: it has none)."""
    while not isinstance(loss, TruncatedIS):
        loss = getattr(loss, "inner", None)
        if loss is None:
            return None
    return loss.cap
