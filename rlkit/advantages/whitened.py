"""Baselines followed by EBPO's batch whitening: GRPO's group mean (``grpo_bn``) and SPO's
per-prompt value tracker (``spo``), two of the EBPO authors' added baselines
(github.com/Tonyzhou98/verl at commit 75b0147, verl/trainer/ppo/core_algos.py;
docs/algorithms.md §2c). rlkit shares no code with it."""

from __future__ import annotations

import torch

from rlkit.advantages.base import (
    AdvantageEstimator,
    AdvantageResult,
    check_whitening,
    register,
    whiten,
)


class WhitenedBaseline(AdvantageEstimator):
    """A baseline b, then EBPO's batch whitening of r − b over all P·G entries (:func:`whiten`;
    the authors' ``norm_adv_by_std_in_grpo``: ``whiten`` if true, ``center`` if false).
    Subclasses implement :meth:`baseline`, [P, 1] or [P, G]."""

    def __init__(self, whitening: str = "whiten", whiten_eps: float = 1e-6):
        check_whitening(self.name, whitening)
        if whiten_eps <= 0:
            raise ValueError(f"whiten_eps must be positive, got {whiten_eps}")
        self.whitening, self.whiten_eps = whitening, whiten_eps

    def baseline(self, rewards: torch.Tensor, **keyed) -> torch.Tensor:
        raise NotImplementedError

    def compute(self, rewards, cluster_ids, **keyed):
        baseline = self.baseline(rewards, **keyed)
        raw = rewards - baseline
        diagnostics = {"baseline": baseline.mean(dim=1), "raw_advantages": raw}
        return whiten(raw, self.whitening, self.whiten_eps), diagnostics


@register("grpo_bn")
class GRPOBatchNorm(WhitenedBaseline):
    """GRPO's group-mean baseline with batch normalisation instead of the per-group std (the
    EBPO authors' ablation ``compute_grpo_bn_outcome_advantage``; docs/algorithms.md §2c)::

        Â = r − mean_p,   A = (Â − mean Â) / (std Â + 1e-6)   over all P·G, std with ddof = 1

    ``grpo`` with ``scale_rewards="batch"`` (TRL's) divides by the std of the rewards r, not of
    Â, with eps = 1e-4, and does not re-centre.
    """

    def baseline(self, rewards):
        return rewards.mean(dim=1, keepdim=True)


@register("spo")
class SPO(WhitenedBaseline):
    """A persistent per-prompt value tracker as the baseline (SPO, "Single-stream Policy
    Optimization", arXiv 2509.13232, in the form of the EBPO authors' ``SPOTracker`` and
    ``compute_spo_outcome_advantage``; docs/algorithms.md §2c)::

        v̂_x  = α_x / (α_x + β_x)      (0.5 for a prompt not seen yet)
        Â_ij = r_ij − v̂_x(i)          with the tracker as it was *before* this batch
        A    = (Â − mean Â) / (std Â + 1e-6)   over all P·G (``whitening``)
        then for each prompt x of the batch, r̄ its mean reward clamped to [0, 1]:
        α_x ← ρ·α_x + r̄,   β_x ← ρ·β_x + (1 − r̄),   starting from α_x = β_x = n₀/2,
        n₀ = 1/(1 − ρ_min)

    Keyed by each prompt's id (``prompt_ids``; :class:`rlkit.methods.Method` passes each
    Problem's id). The tracker is the estimator's state: it is checkpointed and, every rank
    updating it from the same gathered batch, identical across ranks (the authors keep it in a
    module global, lost on resume).
    """

    min_group_size = 1  # the tracker is a baseline for a single completion (single-stream)
    needs_prompt_ids = True

    def __init__(
        self,
        rho: float = 0.9,
        rho_min: float = 0.875,
        whitening: str = "whiten",
        whiten_eps: float = 1e-6,
    ):
        if not 0 < rho <= 1:
            raise ValueError(f"rho must be in (0, 1], got {rho}")
        if not 0 <= rho_min < 1:
            raise ValueError(f"rho_min must be in [0, 1), got {rho_min}")
        super().__init__(whitening, whiten_eps)
        self.rho, self.prior_count = float(rho), 1.0 / (1.0 - rho_min)
        self.reset()

    def reset(self) -> None:
        self.tracker: dict[str, tuple[float, float]] = {}  # prompt id → (α, β)

    def value(self, prompt_id: str) -> float:
        """v̂ = α / (α + β), 0.5 for a prompt not seen yet."""
        if prompt_id not in self.tracker:
            return 0.5
        alpha, beta = self.tracker[prompt_id]
        return alpha / (alpha + beta)

    def observe(self, prompt_id: str, reward: float) -> None:
        """Discount the prompt's counts by ρ and add one observation of ``reward`` ∈ [0, 1]."""
        reward = max(0.0, min(1.0, reward))
        half = self.prior_count / 2.0
        alpha, beta = self.tracker.get(prompt_id, (half, half))
        self.tracker[prompt_id] = (self.rho * alpha + reward, self.rho * beta + (1.0 - reward))

    def baseline(self, rewards, prompt_ids):
        values = torch.tensor([self.value(i) for i in prompt_ids], dtype=rewards.dtype)
        rows: dict[str, list[int]] = {}
        for row, prompt_id in enumerate(prompt_ids):
            rows.setdefault(prompt_id, []).append(row)
        for prompt_id, its_rows in rows.items():  # a prompt twice in a batch: one update
            self.observe(prompt_id, rewards[its_rows].mean().item())
        return values.unsqueeze(1)

    def compute(self, rewards, cluster_ids, prompt_ids):
        advantages, diagnostics = super().compute(rewards, cluster_ids, prompt_ids=prompt_ids)
        tracked = torch.tensor(float(len(self.tracker)), dtype=rewards.dtype)
        return advantages, diagnostics | {"tracked_prompts": tracked}

    def metrics(self, result: AdvantageResult) -> dict:
        d = result.diagnostics
        return {
            "spo/baseline_mean": d["baseline"].mean(),
            "spo/tracked_prompts": d["tracked_prompts"],
        }

    def state_dict(self) -> dict:
        return {"tracker": {k: [alpha, beta] for k, (alpha, beta) in self.tracker.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.tracker = {str(k): (float(a), float(b)) for k, (a, b) in state["tracker"].items()}
