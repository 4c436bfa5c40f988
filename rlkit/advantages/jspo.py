"""James-Stein shrinkage of the leave-one-out baseline: JSPO (``jspo``), JSPO++
(``jspo_plus_plus``) (docs/algorithms.md §2b) and JSPO in its project-page form as the EBPO
authors implement it (``jspo_page``, §2c)."""

from __future__ import annotations

import math

import torch

from rlkit.advantages.base import (
    AdvantageEstimator,
    AdvantageResult,
    centered,
    loo_group_baseline,
    register,
)

JSPO_SHRINKAGE = ("published", "james_stein")
# wandb's time-weighted EMA (JSPO-Official's ``wandb_tw_ema``): point i is kept with weight
# w ** (VIEWPORT / (i − 1)), w = min(sqrt(coef), 0.999).
WANDB_VIEWPORT = 1642.65


def jspo_lambda(
    v: torch.Tensor, s: torch.Tensor, num_means: int, rule: str, eps: float
) -> torch.Tensor:
    """JSPO's shrinkage coefficient toward the mean of ``num_means`` prompt means, from their mean
    variance ``v`` = mean Var_unbiased(r_k)/G and their spread ``s`` = mean (μ̂_k − μ̄)².

    ``published``: v / (v + s + eps) (JSPO-Official). ``james_stein``: the classical positive-part
    plug-in min(1, (k − 3)·v / (k·s)) with k = ``num_means`` (Efron–Morris, shrinking toward the
    estimated mean; 0 for k ≤ 3, 1 where s = 0 < k − 3): s estimates the true spread *plus* v, so the
    published rule tends to ½ where the prompts are alike, this one to 1.
    """
    if rule == "published":
        return v / (v + s + eps)
    factor = max(num_means - 3, 0) / max(num_means, 1)
    if factor == 0:
        return torch.zeros_like(v)
    ratio = torch.where(s > 0, factor * v / s.clamp_min(torch.finfo(s.dtype).tiny), 1.0)
    return ratio.clamp(0.0, 1.0)


def loo_prompt_statistics(
    rewards: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt i's leave-one-prompt-out statistics over the other k = P − 1 prompts, each [P]
    (P ≥ 2, G ≥ 2; docs/algorithms.md §2b):

        m_i = mean_{k≠i} μ̂_k,   v_i = mean_{k≠i} Var_unbiased(r_k)/G,   s_i = mean_{k≠i} (μ̂_k − m_i)²
    """
    num_prompts, g = rewards.shape
    k = num_prompts - 1
    mu = rewards.mean(dim=1)
    var_of_mean = rewards.var(dim=1, correction=1) / g
    others_mean = (mu.sum() - mu) / k
    v = (var_of_mean.sum() - var_of_mean) / k
    # Σ_{k≠i}(μ̂_k − m_i)² = Σ_{k≠i}(μ̂_k − c)² − k·(m_i − c)², centred at c for precision
    d = mu - mu.mean()
    s = (((d * d).sum() - d * d) / k - (others_mean - mu.mean()) ** 2).clamp_min(0.0)
    return others_mean, v, s


def jspo_baseline(rewards: torch.Tensor, lam: torch.Tensor, others_mean: torch.Tensor):
    """b_ij = (1 − λ_i)·mean_{j'≠j} r_ij' + λ_i·m_i  (docs/algorithms.md §2b), [P, G]."""
    lam_ = lam.unsqueeze(1)
    return (1 - lam_) * loo_group_baseline(rewards) + lam_ * others_mean.unsqueeze(1)


class JSPOBase(AdvantageEstimator):
    """Shared options and checks of ``jspo`` and ``jspo_plus_plus`` (docs/algorithms.md §2b)."""

    def __init__(self, shrinkage: str = "published", eps: float | None = None):
        if shrinkage not in JSPO_SHRINKAGE:
            raise ValueError(
                f"unknown JSPO shrinkage {shrinkage!r}; known: {', '.join(map(repr, JSPO_SHRINKAGE))}"
            )
        if eps is not None and shrinkage != "published":
            raise ValueError(f"eps={eps} is used only by shrinkage='published'; leave it out")
        eps = 1e-6 if eps is None else eps  # JSPO-Official's epsilon
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.shrinkage, self.eps = shrinkage, eps

    def metrics(self, result: AdvantageResult) -> dict:
        # JSPO-Official's trace/js_lambda, trace/v_square, trace/s_square under the method's
        # prefix (ray_trainer: the mean over samples; groups have equal size)
        d = result.diagnostics
        return {
            "jspo/lambda_mean": d["shrinkage"].mean(),
            "jspo/v_square_mean": d["v_square"].mean(),
            "jspo/s_square_mean": d["s_square"].mean(),
        }


@register("jspo")
class JSPO(JSPOBase):
    """James-Stein shrinkage of the leave-one-out baseline (JSPO, arXiv 2511.03710; its code's
    ``compute_jspo_outcome_advantage``; docs/algorithms.md §2b)::

        b_ij = (1 − λ_i)·mean_{j'≠j} r_ij' + λ_i·mean_{k≠i} μ̂_k,   A_ij = r_ij − b_ij
        λ_i  = v_i / (v_i + s_i + eps)
        v_i  = mean_{k≠i} Var_unbiased(r_k)/G,   s_i = mean_{k≠i} (μ̂_k − mean_{k'≠i} μ̂_k')²

    Every statistic of prompt i leaves prompt i out, so b_ij does not depend on r_ij and the
    gradient stays unbiased; no std normalisation. Vectorised in O(P·G) (the published code loops
    over samples). A batch of one prompt has no other prompts: λ = 0, RLOO (the published code
    returns NaN there); G = 1 gives A = 0 (the published code asserts G ≥ 2).
    """

    def compute(self, rewards, cluster_ids):
        num_prompts, g = rewards.shape
        zeros = torch.zeros(num_prompts, dtype=rewards.dtype)
        if g == 1:
            d = {"shrinkage": zeros, "v_square": zeros, "s_square": zeros}
            return torch.zeros_like(rewards), d
        if num_prompts == 1:
            lam, v, s, others_mean = zeros, zeros, zeros, rewards.mean(dim=1)
        else:
            others_mean, v, s = loo_prompt_statistics(rewards)
            lam = jspo_lambda(v, s, num_prompts - 1, self.shrinkage, self.eps)
        return rewards - jspo_baseline(rewards, lam, others_mean), {
            "shrinkage": lam,
            "v_square": v,
            "s_square": s,
        }


@register("jspo_plus_plus")
class JSPOPlusPlus(JSPOBase):
    """JSPO++ (JSPO-Official's ``compute_jspo_plus_plus_outcome_advantage``; docs/algorithms.md §2b):
    one batch-wide λ = v / (v + s + eps) with v = mean_k Var_unbiased(r_k)/G and
    s = mean_k (μ̂_k − r̄)², r̄ the batch mean (prompt i included), and
    b_ij = (1 − λ)·mean_{j'≠j} r_ij' + λ·r̄.

    With ``smooth_coef`` > 0 (the authors' run_math.sh: 0.99; their default 0.0), λ and r̄ are
    replaced by wandb's time-weighted EMA of every step's values so far (``wandb_tw_ema``),
    kept as running sums in :meth:`state_dict` so a resumed run continues identically.
    """

    def __init__(
        self, shrinkage: str = "published", eps: float | None = None, smooth_coef: float = 0.0
    ):
        super().__init__(shrinkage, eps)
        if not 0.0 <= smooth_coef < 1.0:
            raise ValueError(f"smooth_coef must be in [0, 1), got {smooth_coef}")
        self.smooth_coef = float(smooth_coef)
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.sums = {"lambda": 0.0, "batch_mean": 0.0, "weight": 0.0}

    def smooth(self, current_lambda: float, batch_mean: float) -> tuple[float, float]:
        """Add this step to the EMA and return the smoothed (λ, r̄)."""
        self.steps += 1
        w = min(math.sqrt(self.smooth_coef), 0.999)
        keep = 1.0 if self.steps == 1 else w ** (WANDB_VIEWPORT / (self.steps - 1))
        for key, y in (("lambda", current_lambda), ("batch_mean", batch_mean), ("weight", 1.0)):
            self.sums[key] = self.sums[key] * keep + y
        return self.sums["lambda"] / self.sums["weight"], self.sums["batch_mean"] / self.sums[
            "weight"
        ]

    def compute(self, rewards, cluster_ids):
        num_prompts, g = rewards.shape
        mu = rewards.mean(dim=1)
        batch_mean = rewards.mean()
        v = (rewards.var(dim=1, correction=1) / g).mean() if g > 1 else batch_mean * 0
        s = ((mu - batch_mean) ** 2).mean()
        lam = jspo_lambda(v, s, num_prompts, self.shrinkage, self.eps)
        if self.smooth_coef > 0:
            smoothed = self.smooth(float(lam), float(batch_mean))
            lam, batch_mean = (torch.tensor(x, dtype=rewards.dtype) for x in smoothed)
        full = torch.full((num_prompts,), 1.0, dtype=rewards.dtype)
        d = {"shrinkage": lam * full, "v_square": v * full, "s_square": s * full}
        if g == 1:
            return torch.zeros_like(rewards), d
        baseline = (1 - lam) * loo_group_baseline(rewards) + lam * batch_mean
        return rewards - baseline, d

    def state_dict(self) -> dict:
        return {"steps": self.steps, "sums": dict(self.sums)}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        self.sums = {k: float(v) for k, v in state["sums"].items()}


# ---------------------------------------------------------------------------------------------
# The EBPO authors' added baselines (github.com/Tonyzhou98/verl at commit 75b0147,
# verl/trainer/ppo/core_algos.py; docs/algorithms.md §2c). rlkit shares no code with it.


@register("jspo_page")
class JSPOPage(JSPOBase):
    """JSPO in its project-page form, with the (n − 1)/n factor (the EBPO authors'
    ``compute_shrinkage_js_outcome_advantage``; docs/algorithms.md §2c)::

        λ_i  = ((n − 1)/n) · v_i / (v_i + s_i)      (λ_i = 0 where v_i + s_i ≤ eps = 1e-6)
        b_ij = (1 − λ_i)·mean_{j'≠j} r_ij' + λ_i·m_i,   A_ij = r_ij − b_ij

    n = P prompts; m_i, v_i, s_i are ``jspo``'s leave-one-prompt-out statistics
    (:func:`loo_prompt_statistics`). ``jspo`` follows the JSPO authors' code: λ_i = v_i/(v_i + s_i
    + eps), no factor. One prompt (n = 1) or G = 1: b = the group mean, A = r − mean_p (the EBPO
    authors' fallback; ``jspo`` gives RLOO at n = 1).
    """

    def __init__(self, eps: float = 1e-6):
        super().__init__("published", eps)

    def compute(self, rewards, cluster_ids):
        num_prompts, g = rewards.shape
        zeros = torch.zeros(num_prompts, dtype=rewards.dtype)
        if num_prompts == 1 or g == 1:
            return centered(rewards), {"shrinkage": zeros, "v_square": zeros, "s_square": zeros}
        others_mean, v, s = loo_prompt_statistics(rewards)
        denom = v + s
        ratio = v / denom.clamp_min(torch.finfo(denom.dtype).tiny)
        lam = torch.where(denom > self.eps, (num_prompts - 1) / num_prompts * ratio, 0.0)
        return rewards - jspo_baseline(rewards, lam, others_mean), {
            "shrinkage": lam,
            "v_square": v,
            "s_square": s,
        }
