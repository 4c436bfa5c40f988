"""DPO on the policy's own rollouts (docs/algorithms.md §4d): preference pairs from each prompt's
group (the sigmoid preference loss against the reference policy is ``rlkit.losses.dpo``).

Rows are laid out prompt-major (B = P·G) as everywhere in rlkit; a pair is two row indices of the
same prompt's group, the chosen one with the strictly higher reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Pairs:
    """K preference pairs as row indices ``chosen`` [K] and ``rejected`` [K] (prompt-major, then
    best-first within a prompt), and how many prompts had none (all rewards equal)."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    prompts_without_pair: int

    def __len__(self) -> int:
        return len(self.chosen)

    @property
    def units(self) -> torch.Tensor:
        """[K, 2]: each pair's (chosen, rejected) rows, the units the update draws."""
        return torch.stack([self.chosen, self.rejected], 1)


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
