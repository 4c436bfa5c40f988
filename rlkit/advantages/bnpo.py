"""BNPO's Beta-normalised advantage (``bnpo``), one of the EBPO authors' added baselines
(github.com/Tonyzhou98/verl at commit 75b0147, verl/trainer/ppo/core_algos.py;
docs/algorithms.md §2c). rlkit shares no code with it."""

from __future__ import annotations

import torch

from rlkit.advantages.base import AdvantageEstimator, AdvantageResult, register


@register("bnpo")
class BNPO(AdvantageEstimator):
    """Beta-normalised advantage (BNPO, arXiv 2506.02864, the formula of the EBPO authors'
    ``compute_bnpo_outcome_advantage`` docstring; docs/algorithms.md §2c)::

        A_ij = (r_ij − p_i) / max(f_N(clamp(p_i, eps, 1 − eps); α, β), eps),   p_i = mean_p
        f_N  = the Beta(α, β) density,   α = 1 + a/3,   β = 1 + b/3
        (a, b) = the method-of-moments Beta fit of the batch's p_i:
                 a = c·m, b = c·(1 − m), c = m(1 − m)/var − 1,
                 m = clamp(mean_i p_i, eps, 1 − eps), var = Var_unbiased(p_i)

    and a = b = 0 (α = β = 1: f_N = 1, REINFORCE with the group-mean baseline) unless
    eps < var < m(1 − m). α = β = 3/2 would be GRPO's normalisation up to a constant for 0/1
    rewards. Meant for rewards in [0, 1]; a constant group gets A = 0.
    """

    def __init__(self, eps: float = 1e-6):
        if not 0 < eps < 0.5:
            raise ValueError(f"eps must be in (0, 0.5), got {eps}")
        self.eps = eps

    def compute(self, rewards, cluster_ids):
        eps = self.eps
        p = rewards.mean(dim=1)
        var_p = p.var(correction=1) if p.numel() > 1 else p.new_zeros(())
        mean_c = p.mean().clamp(eps, 1 - eps)
        max_var = mean_c * (1 - mean_c)
        a = b = p.new_zeros(())
        if eps < var_p < max_var:
            concentration = max_var / var_p - 1.0
            a, b = concentration * mean_c, concentration * (1 - mean_c)
        alpha, beta = 1.0 + a / 3.0, 1.0 + b / 3.0
        log_beta_fn = torch.lgamma(alpha) + torch.lgamma(beta) - torch.lgamma(alpha + beta)
        pc = p.clamp(eps, 1 - eps)
        log_pdf = (alpha - 1) * torch.log(pc) + (beta - 1) * torch.log(1 - pc) - log_beta_fn
        f_norm = torch.exp(log_pdf).clamp_min(eps)
        advantages = (rewards - p.unsqueeze(1)) / f_norm.unsqueeze(1)
        return advantages, {"alpha": alpha, "beta": beta, "normaliser": f_norm}

    def metrics(self, result: AdvantageResult) -> dict:
        d = result.diagnostics
        return {
            "bnpo/alpha": d["alpha"],
            "bnpo/beta": d["beta"],
            "bnpo/normaliser_mean": d["normaliser"].mean(),
        }
