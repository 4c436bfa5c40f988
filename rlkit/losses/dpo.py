"""DPO's pairwise loss as a registered loss (docs/algorithms.md §4d, eq. 4d.1).

Its units are (chosen, rejected) row pairs (``rlkit.dpo.build_pairs``): a micro-batch holds the
chosen rows of its pairs, then their rejected rows, in the same order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlkit.losses.base import LossContext, LossOutput, register_loss

# TRL's DPOTrainer names (the step's means over its pairs)
DPO_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)


def dpo_loss(
    chosen_logp: torch.Tensor,
    rejected_logp: torch.Tensor,
    ref_chosen_logp: torch.Tensor,
    ref_rejected_logp: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per pair −log σ(β[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))])
    (§4d, eq. 4d.1; Rafailov et al. 2023, TRL's ``sigmoid`` loss) on sequence log-probs [K], and
    the implicit rewards β(log π_θ − log π_ref) of the chosen and rejected completions
    (detached, TRL's ``rewards/chosen`` and ``rewards/rejected``)."""
    chosen = beta * (chosen_logp - ref_chosen_logp)
    rejected = beta * (rejected_logp - ref_rejected_logp)
    return -F.logsigmoid(chosen - rejected), chosen.detach(), rejected.detach()


def pair_statistics(
    chosen_logp: torch.Tensor,
    rejected_logp: torch.Tensor,
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
) -> torch.Tensor:
    """Per pair, the values averaged into :data:`DPO_METRICS`, [K, 6] (detached)."""
    return torch.stack(
        [
            chosen_rewards,
            rejected_rewards,
            (chosen_rewards > rejected_rewards).to(chosen_rewards.dtype),
            chosen_rewards - rejected_rewards,
            chosen_logp.detach(),
            rejected_logp.detach(),
        ],
        dim=1,
    )


@register_loss("dpo", DPO_METRICS, keeps_order=True, pairs=True)
def pairwise(logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
    """The micro-batch's share of the mini-batch's mean of eq. 4d.1 over its pairs, with
    ``dpo.beta``; sequence log-probs sum the completion's real tokens (the reference's from
    ``sub.ref_logp``). Statistics: each pair's :func:`pair_statistics` over the mini-batch's pairs.
    The pairs go through the micro-batches in the drawn order (prompt order would only regroup
    them, and move the float rounding of every metric)."""
    mask = sub.rollouts.completion_mask
    seq, ref = (logp * mask).sum(-1), (sub.ref_logp * mask).sum(-1)
    n = len(sub) // 2
    losses, chosen, rejected = dpo_loss(seq[:n], seq[n:], ref[:n], ref[n:], ctx.cfg.dpo.beta)
    per_pair = pair_statistics(seq[:n], seq[n:], chosen, rejected)
    shares = per_pair.sum(0).double().cpu() / ctx.mini.units
    return LossOutput(losses.sum() / ctx.mini.units, dict(zip(DPO_METRICS, shares, strict=True)))
