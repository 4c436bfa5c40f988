"""DPO on the policy's own rollouts (docs/algorithms.md §4d): preference pairs from each prompt's
group and the sigmoid preference loss against the reference policy.

Rows are laid out prompt-major (B = P·G) as everywhere in rlkit; a pair is two row indices of the
same prompt's group, the chosen one with the strictly higher reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# TRL's DPOTrainer names (the step's means over its pairs)
DPO_METRICS = [
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
]


@dataclass(frozen=True)
class Pairs:
    """K preference pairs as row indices ``chosen`` [K] and ``rejected`` [K] (prompt-major, then
    best-first within a prompt), and how many prompts had none (all rewards equal)."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    prompts_without_pair: int

    def __len__(self) -> int:
        return len(self.chosen)


def build_pairs(rewards: torch.Tensor) -> Pairs:
    """Disjoint pairs within each prompt's group (§4d): its completions sorted by reward (ties
    by index), the best with the worst, the second-best with the second-worst, and so on while
    the first's reward is strictly greater. With 0/1 rewards that is min(#correct, #incorrect)
    pairs of a correct and an incorrect completion; a group whose rewards are all equal (all
    correct or all wrong) has none and is counted in ``prompts_without_pair``."""
    p, g = rewards.shape
    order = torch.sort(rewards, dim=1, descending=True, stable=True).indices
    half = g // 2
    best, worst = order[:, :half], order.flip(1)[:, :half]
    # rewards along ``best`` fall and along ``worst`` rise: the kept pairs are a prefix
    keep = rewards.gather(1, best) > rewards.gather(1, worst)
    offset = (torch.arange(p) * g)[:, None]
    return Pairs(
        (best + offset)[keep],
        (worst + offset)[keep],
        int((~keep.any(1)).sum()),
    )


def pair_roles(rewards: torch.Tensor) -> torch.Tensor:
    """[P, G]: +1 for a chosen completion, −1 for a rejected one, 0 for one in no pair (the sign
    of the DPO gradient's weight on its log-probability)."""
    pairs = build_pairs(rewards)
    roles = torch.zeros(rewards.numel(), dtype=rewards.dtype)
    roles[pairs.chosen] = 1.0
    roles[pairs.rejected] = -1.0
    return roles.view(rewards.shape)


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
