"""The group baselines of docs/algorithms.md §1: GRPO (``grpo``), Dr. GRPO (``dr_grpo``), RLOO
(``rloo``) and AGPO's advantage (``agpo``), each from its own group's rewards."""

from __future__ import annotations

import torch

from rlkit.advantages.base import AdvantageEstimator, centered, loo_group_baseline, register
from rlkit.settings import equals, reads
from rlkit.stats import check_dispersion, dispersion, group_std


@register("grpo")
class GRPO(AdvantageEstimator):
    """A = (r − mean_p) / (std + eps)  (docs/algorithms.md §1; std with ``std_ddof``, TRL's eps = 1e-4).

    ``scale_rewards`` as TRL's: ``group`` divides by each group's std, ``batch`` by one std over
    all P·G rewards (TRL's ``scale_rewards="batch"``; the baseline stays the group mean).
    """

    def __init__(self, std_ddof: int = 1, eps: float = 1e-4, scale_rewards: str = "group"):
        if std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {std_ddof}")
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        if scale_rewards not in ("group", "batch"):
            raise ValueError(
                f"unknown GRPO scale_rewards {scale_rewards!r}; known: 'group', 'batch'"
            )
        self.std_ddof, self.eps, self.scale_rewards = std_ddof, eps, scale_rewards

    def compute(self, rewards, cluster_ids):
        if self.scale_rewards == "batch":
            std = group_std(rewards.reshape(-1), dim=0, ddof=self.std_ddof)
            return centered(rewards) / (std + self.eps), {"batch_std": std}
        std = group_std(rewards, dim=1, ddof=self.std_ddof)
        return centered(rewards) / (std.unsqueeze(1) + self.eps), {}


@register("dr_grpo")
class DrGRPO(AdvantageEstimator):
    """A = r − mean_p  (docs/algorithms.md §1; Dr. GRPO, arXiv 2503.20783: no std division)."""

    def compute(self, rewards, cluster_ids):
        return centered(rewards), {}


@register("rloo")
class RLOO(AdvantageEstimator):
    """A_i = r_i − mean_{j≠i} r_j  (docs/algorithms.md §1; leave-one-out). A group of one gets A = 0."""

    def compute(self, rewards, cluster_ids):
        g = rewards.shape[1]
        if g == 1:
            return torch.zeros_like(rewards), {}
        return rewards - loo_group_baseline(rewards), {}


@register("agpo")
class AGPOAdvantage(AdvantageEstimator):
    """A = (r − mean_p) / max(disp_p, 1e-8), disp ∈ {std, mad, iqr} of the training group (docs/algorithms.md §1).

    ``mad_median``: the MAD's median at even G, ``midpoint`` or the authors' ``lower`` (§1)."""

    shared_settings = {"dispersion": "agpo.dispersion", "mad_median": "agpo.mad_median"}
    reads = reads("agpo.dispersion") | reads(
        "agpo.mad_median",
        when=equals("agpo.dispersion", "mad"),  # only the MAD has a median
    )

    def __init__(self, dispersion: str = "std", mad_median: str = "midpoint"):
        check_dispersion(dispersion, mad_median)
        self.dispersion, self.mad_median = dispersion, mad_median

    def compute(self, rewards, cluster_ids):
        disp = dispersion(rewards, self.dispersion, dim=1, ddof=1, mad_median=self.mad_median)
        return centered(rewards) / disp.clamp_min(1e-8).unsqueeze(1), {}
