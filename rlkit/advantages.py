"""Advantage estimators behind one interface and a registry by name (docs/algorithms.md §1, §2).

Every estimator maps a ``[P, G]`` reward tensor (P prompts, G completions each) to ``[P, G]``
advantages plus a diagnostics dict. Estimators are pure functions of the whole batch's rewards and
of their own state, so every rank of a distributed trainer that gathers the rewards computes the
same advantages. Arithmetic is done in float64 and the result is returned in the rewards' dtype.

    est = get_estimator("ebpo", prior="history")
    out = est(rewards)            # out.advantages [P, G], out.diagnostics {"shrinkage": [P], ...}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlkit.dpo import pair_roles
from rlkit.registry import Registry
from rlkit.settings import When, differs, equals, given, reads
from rlkit.stats import RunningMoments, check_dispersion, dispersion, group_std

ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry("advantage estimator", sort_known=True)
# Largest |reward| accepted: squares and sums over a batch stay far inside float64 (max ~1.8e308).
MAX_ABS_REWARD = 1e150


def register(name: str):
    """Class decorator adding an estimator to :data:`ESTIMATORS` under ``name``; a name
    registered twice is a ValueError naming both classes."""

    def add(cls):
        ESTIMATORS.add(name, cls)
        cls.name = name
        return cls

    return add


def get_estimator(name: str, **options) -> AdvantageEstimator:
    """Build the estimator registered as ``name`` with its ``options``; an unknown name is a
    ValueError listing the known ones."""
    return ESTIMATORS.get(name)(**options)


@dataclass
class AdvantageResult:
    advantages: torch.Tensor  # [P, G]
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)


class AdvantageEstimator:
    """Base class: validates input, computes in float64, adds shared diagnostics.

    Subclasses implement :meth:`compute` on float64 rewards. Stateless estimators inherit the
    empty ``state_dict``/``load_state_dict``/``reset``.
    """

    name = "base"
    min_group_size = 2  # G = 1 leaves no group baseline: every advantage would be 0
    uses_clusters = False  # reads ``cluster_ids`` (EBPO's per-cluster priors)
    # options set by another config section's key, {option: "section.key"} (AGPO's advantage
    # shares the probe's dispersion, §1); ``algo.options`` may not set them otherwise
    shared_settings: dict[str, str] = {}
    reads: dict[str, When | None] = {}  # the config settings it reads (`rlkit.settings`)
    # the estimator keeps state per prompt: __call__ needs each prompt's ``prompt_ids`` (SPO)
    needs_prompt_ids = False

    def __call__(
        self,
        rewards: torch.Tensor,
        cluster_ids: torch.Tensor | None = None,
        prompt_ids: Sequence[str] | None = None,
    ) -> AdvantageResult:
        rewards = check_rewards(rewards)
        cluster_ids = check_cluster_ids(cluster_ids, rewards.shape[0])
        r = rewards.to(torch.float64)
        keyed = {}
        if self.needs_prompt_ids:
            keyed["prompt_ids"] = check_prompt_ids(prompt_ids, rewards.shape[0], self.name)
        advantages, diagnostics = self.compute(r, cluster_ids, **keyed)
        diagnostics["frac_reward_zero_std"] = zero_variance_groups(r).to(torch.float64).mean()
        out_dtype = rewards.dtype
        big = torch.finfo(out_dtype).max
        return AdvantageResult(
            advantages.clamp(-big, big).to(out_dtype),
            {k: v.to(torch.float32) for k, v in diagnostics.items()},
        )

    def compute(
        self, rewards: torch.Tensor, cluster_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def metrics(self, result: AdvantageResult) -> dict:
        """The estimator's own logged signals (after the common keys; docs/algorithms.md §5)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def reset(self) -> None:
        pass


def zero_variance_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[P] bool: the groups of ``rewards`` [P, G] whose G rewards are all equal."""
    return rewards.amax(1) == rewards.amin(1)


def check_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """A finite, floating ``[P, G]`` tensor with P, G ≥ 1 and |r| ≤ :data:`MAX_ABS_REWARD`, or a
    ValueError saying what is wrong."""
    if not isinstance(rewards, torch.Tensor):
        raise ValueError(
            f"rewards must be a torch.Tensor of shape [P, G], got {type(rewards).__name__}"
        )
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have rank 2 [P, G], got shape {tuple(rewards.shape)}")
    if rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(
            f"rewards must have P >= 1 prompts and G >= 1 completions, got {tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    largest = float(rewards.abs().max())
    if largest > MAX_ABS_REWARD:
        raise ValueError(
            f"rewards must satisfy |r| <= {MAX_ABS_REWARD:g} (got {largest:g}): their squares "
            "(variances) would overflow float64; rescale the reward"
        )
    return rewards


def check_cluster_ids(cluster_ids: torch.Tensor | None, num_prompts: int) -> torch.Tensor | None:
    """None, or a non-negative integer tensor with one id per prompt."""
    if cluster_ids is None:
        return None
    cluster_ids = torch.as_tensor(cluster_ids)
    if cluster_ids.is_floating_point() or cluster_ids.dtype == torch.bool:
        raise ValueError(f"cluster_ids must be integers, got dtype {cluster_ids.dtype}")
    if cluster_ids.shape != (num_prompts,):
        raise ValueError(
            f"cluster_ids must have shape [P] = [{num_prompts}], got {tuple(cluster_ids.shape)}"
        )
    if (cluster_ids < 0).any():
        raise ValueError("cluster_ids must be non-negative")
    return cluster_ids.to(torch.long)


def check_prompt_ids(prompt_ids: Sequence[str] | None, num_prompts: int, name: str) -> list[str]:
    """One id per prompt (row of the rewards), as strings, or a ValueError naming the estimator."""
    if prompt_ids is None:
        raise ValueError(
            f"advantage estimator {name!r} keeps state per prompt: pass prompt_ids, one per "
            "row of the rewards (rlkit.methods.Method passes each Problem's id)"
        )
    if isinstance(prompt_ids, (str, bytes)) or len(prompt_ids) != num_prompts:
        got = "a string" if isinstance(prompt_ids, (str, bytes)) else f"{len(prompt_ids)} ids"
        raise ValueError(f"prompt_ids must hold one id per prompt ({num_prompts}), got {got}")
    return [str(i) for i in prompt_ids]


def centered(rewards: torch.Tensor) -> torch.Tensor:
    """r − mean_p: the group-mean baseline shared by GRPO, Dr. GRPO and AGPO."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def loo_group_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """mean_{j'≠j} r_ij' (RLOO's baseline), [P, G]; G ≥ 2."""
    g = rewards.shape[1]
    return (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)


WHITENINGS = ("whiten", "center", "none")


def check_whitening(owner: str, mode: str) -> None:
    """ValueError naming an unknown batch ``whitening`` mode of estimator ``owner``."""
    if mode not in WHITENINGS:
        raise ValueError(
            f"unknown {owner} whitening {mode!r}; known: {', '.join(map(repr, WHITENINGS))}"
        )


def whiten(raw: torch.Tensor, mode: str = "whiten", eps: float = 1e-6) -> torch.Tensor:
    """EBPO's batch normalisation over all P·G entries (docs/algorithms.md §2): ``whiten`` →
    (x − mean) / (std + eps) with the ddof = 1 std (as verl), ``center`` → x − mean, ``none``."""
    check_whitening("EBPO", mode)
    if mode == "none":
        return raw
    out = raw - raw.mean()
    if mode == "whiten":
        out = out / (group_std(raw.reshape(-1), dim=0, ddof=1) + eps)
    return out


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


@register("ppo")
class PPOReward(AdvantageEstimator):
    """PPO's per-row input: each completion's verifiable reward, no group baseline (the critic is
    the baseline); ``rlkit.methods.PPO`` puts it on the last token and GAE turns it into per-token
    advantages (docs/algorithms.md §4c). A group of one is fine."""

    min_group_size = 1

    def compute(self, rewards, cluster_ids):
        return rewards.clone(), {}


@register("dpo")
class DPOPairRoles(AdvantageEstimator):
    """DPO's per-row input: +1 for a chosen completion, −1 for a rejected one, 0 for one in no
    pair (``rlkit.dpo.pair_roles``); ``rlkit.methods.DPO`` trains on the pairs themselves with the
    preference loss (docs/algorithms.md §4d)."""

    def compute(self, rewards, cluster_ids):
        return pair_roles(rewards), {}


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
