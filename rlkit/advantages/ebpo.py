"""EBPO's empirical-Bayes shrinkage baseline (``ebpo``, docs/algorithms.md §2)."""

from __future__ import annotations

import torch

from rlkit.advantages.base import (
    AdvantageEstimator,
    AdvantageResult,
    check_whitening,
    register,
    whiten,
)
from rlkit.settings import differs, given, reads
from rlkit.stats import RunningMoments


@register("ebpo")
class EBPO(AdvantageEstimator):
    """Empirical-Bayes shrinkage baseline with batch whitening (docs/algorithms.md §2, EBPO Algorithm 1).

        S_q = (σ²/G) / (σ²/G + τ²)          (S = 1 where σ²/G + τ² ≤ 1e-6)
        V_q = (1 − S_q)·μ_group,q + S_q·μ_glob
        Â   = r − V_q
        A   = (Â − mean Â) / (std Â + 1e-6)  over all P·G  (``whitening="whiten"``)

    μ_glob and τ² are the mean and population variance of group means, σ² the population variance
    of individual rewards. They come from Welford accumulators updated with the current batch
    *before* its advantages are computed: fresh each call (``prior="batch"``, the authors' code) or
    persistent with forgetting factor ``prior_decay`` (``prior="history"``, the paper). With
    ``cluster_ids`` each cluster has its own accumulators; a cluster whose accumulator holds fewer
    than ``min_cluster_count`` group means uses the global one.
    """

    min_group_size = 1  # the prior μ_glob is a baseline even for a group of one
    uses_clusters = True
    reads = (
        reads("algo.cluster_key")
        # prior=batch restarts the prior from the batch every step
        | reads("algo.options.prior_decay", when=differs("algo.options.prior", "batch"))
        | reads("algo.options.min_cluster_count", when=given("algo.cluster_key"))
    )

    def __init__(
        self,
        prior: str = "history",
        prior_decay: float = 1.0,
        whitening: str = "whiten",
        min_cluster_count: float = 8.0,
        var_floor: float = 1e-6,
        whiten_eps: float = 1e-6,
    ):
        if prior not in ("history", "batch"):
            raise ValueError(f"unknown EBPO prior {prior!r}; known: 'history', 'batch'")
        check_whitening("EBPO", whitening)
        if min_cluster_count < 0:
            raise ValueError(f"min_cluster_count must be >= 0, got {min_cluster_count}")
        self.prior, self.whitening = prior, whitening
        self.prior_decay = prior_decay
        self.min_cluster_count = float(min_cluster_count)
        self.var_floor, self.whiten_eps = var_floor, whiten_eps
        self.reset()

    def reset(self) -> None:
        # Slot 0 is the global prior; cluster id c lives in slot self.cluster_slots[c].
        self.reward_moments = RunningMoments(self.prior_decay)  # σ²
        self.group_mean_moments = RunningMoments(self.prior_decay)  # μ_glob, τ²
        self.cluster_slots: dict[int, int] = {}

    def slots_for(self, cluster_ids: torch.Tensor) -> torch.Tensor:
        """Accumulator slot of each prompt's cluster, creating slots for new clusters."""
        unique, inverse = torch.unique(cluster_ids, return_inverse=True)
        for c in unique.tolist():
            self.cluster_slots.setdefault(c, len(self.cluster_slots) + 1)
        lookup = torch.tensor([self.cluster_slots[c] for c in unique.tolist()], dtype=torch.long)
        return lookup[inverse]

    def compute(self, rewards, cluster_ids):
        if self.prior == "batch":
            self.reset()
        num_prompts, g = rewards.shape
        group_mean = rewards.mean(dim=1)
        self.reward_moments.update(rewards)
        self.group_mean_moments.update(group_mean)
        slot = torch.zeros(num_prompts, dtype=torch.long)
        if cluster_ids is not None:
            slot = self.slots_for(cluster_ids)
            self.reward_moments.update(rewards, slot.repeat_interleave(g))
            self.group_mean_moments.update(group_mean, slot)
            enough = self.group_mean_moments.count[slot] >= self.min_cluster_count
            slot = torch.where(enough, slot, torch.zeros_like(slot))

        mu = self.group_mean_moments.mean[slot]
        tau2 = self.group_mean_moments.variance[slot]
        sigma2_over_g = self.reward_moments.variance[slot] / g
        denom = sigma2_over_g + tau2
        shrinkage = torch.where(
            denom > self.var_floor, sigma2_over_g / denom.clamp_min(self.var_floor), 1.0
        )
        baseline = (1 - shrinkage) * group_mean + shrinkage * mu
        raw = rewards - baseline.unsqueeze(1)
        diagnostics = {
            "shrinkage": shrinkage,
            "baseline": baseline,
            "prior_mean": mu,
            "raw_advantages": raw,
            "mu_glob": self.group_mean_moments.mean[0],
            "sigma2": self.reward_moments.variance[0],
            "tau2": self.group_mean_moments.variance[0],
        }
        return whiten(raw, self.whitening, self.whiten_eps), diagnostics

    def metrics(self, result: AdvantageResult) -> dict:
        d = result.diagnostics
        return {
            "ebpo/shrinkage_mean": d["shrinkage"].mean(),
            "ebpo/mu_glob": d["mu_glob"],
            "ebpo/sigma2": d["sigma2"],
            "ebpo/tau2": d["tau2"],
        }

    def state_dict(self) -> dict:
        return {
            "reward_moments": self.reward_moments.state_dict(),
            "group_mean_moments": self.group_mean_moments.state_dict(),
            "cluster_slots": dict(self.cluster_slots),
        }

    def load_state_dict(self, state: dict) -> None:
        self.reward_moments.load_state_dict(state["reward_moments"])
        self.group_mean_moments.load_state_dict(state["group_mean_moments"])
        slots = {int(k): int(v) for k, v in state["cluster_slots"].items()}
        held = self.reward_moments.num_slots
        if any(not 0 <= v < held for v in slots.values()) or len(set(slots.values())) < len(slots):
            raise ValueError(
                f"EBPO's cluster slots {sorted(slots.values())} are not distinct slots of its "
                f"{held} running statistics"
            )
        self.cluster_slots = slots
