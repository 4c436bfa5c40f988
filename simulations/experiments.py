"""Vectorized experiment drivers behind notebooks 02–05 and 07.

Each driver takes a seed (or a list of paired seeds: the same seed gives every method the same
prompts, starting policy and random stream) and returns plain numbers and numpy arrays; the
notebooks only plot, print and assert. Algorithms come from ``rlkit``; this module only wires them
to the synthetic populations and the softmax bandit. Loops run over seeds, methods and steps,
never over prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
from tqdm import tqdm

from rlkit.advantages import AdvantageResult, get_estimator, whiten
from rlkit.controllers import AdaptiveClip, AdaptiveTemperature, ProbeStats
from rlkit.methods import AGPO
from rlkit.sampling import epoch_order
from rlkit.stats import group_std
from simulations import closed_forms as cf
from simulations.bandit import SoftmaxBandit
from simulations.population import (
    BetaPopulation,
    ClusteredPopulation,
    DriftingPopulation,
    GaussianPopulation,
    bernoulli_rewards,
    gaussian_rewards,
)
from simulations.stats import mean_ci

# --- Estimators compared in the notebooks ------------------------------------------------------


class BatchWhitened:
    """Dr. GRPO's centred rewards r − mean_p followed by EBPO's batch whitening, without shrinkage:
    the "whitening only" arm that separates the two halves of EBPO (docs/algorithms.md §2, Prop 3.6 note)."""

    def __init__(self):
        self.base = get_estimator("dr_grpo")

    def __call__(self, rewards, cluster_ids=None) -> AdvantageResult:
        out = self.base(rewards)
        return AdvantageResult(whiten(out.advantages.to(torch.float64)), out.diagnostics)


METHODS: dict[str, tuple[str, dict]] = {
    "GRPO": ("grpo", {}),
    "Dr. GRPO": ("dr_grpo", {}),
    "EBPO": ("ebpo", {}),
    "EBPO shrinkage only": ("ebpo", {"whitening": "none"}),
    "EBPO whitening only": ("whitened_dr_grpo", {}),
}


# Known to make_estimator but left out of the notebooks' sweeps over METHODS (notebook 03 only)
OTHER_METHODS: dict[str, tuple[str, dict]] = {"JSPO": ("jspo", {})}


def make_estimator(method: str):
    """A fresh estimator for a display name of :data:`METHODS` or :data:`OTHER_METHODS`."""
    known = {**METHODS, **OTHER_METHODS}
    if method not in known:
        raise ValueError(f"unknown method {method!r}; known: {sorted(known)}")
    name, options = known[method]
    return BatchWhitened() if name == "whitened_dr_grpo" else get_estimator(name, **options)


def rewards_for(population, theta: torch.Tensor, group_size: int, rng) -> torch.Tensor:
    """Gaussian rewards for the Gaussian model, Bernoulli (verifiable) rewards otherwise."""
    if isinstance(population, GaussianPopulation):
        return gaussian_rewards(theta, group_size, population.sigma2, rng)
    return bernoulli_rewards(theta, group_size, rng)


# --- Notebook 02: Thm 3.3, MSE of the baseline ------------------------------------------------

# JSPO's two shrinkage rules (docs/algorithms.md §2b), by the key notebook 02 reports them under
JSPO_RULES = {"jspo": "published", "jspo_js": "james_stein"}


def shrinkage_mse(
    population, group_size: int, num_prompts: int, num_batches: int, seed: int, prior: str = "batch"
) -> dict:
    """MSE against θ of three baselines, per batch of ``num_prompts`` prompts:

    - ``group_mean``: μ_group (GRPO's baseline), closed form σ²/G;
    - ``oracle``: the posterior mean with the true μ, σ², τ² (Thm 3.3), closed form (1 − S)σ²/G;
    - ``ebpo``: rlkit's EBPO baseline with hyper-parameters estimated from the rewards
      (``prior``), whose large-batch limit uses the raw σ², τ² (:func:`cf.raw_hyperparameters`).
    - ``jspo``, ``jspo_js``: rlkit's JSPO baselines b_ij = r_ij − A_ij (one per completion: the
      leave-one-out mean shrunk toward the other prompts' mean, docs/algorithms.md §2b) with the
      published λ and with the classical James-Stein λ; their mean λ (``jspo_lambda``,
      ``jspo_js_lambda``) and the large-batch limits (``closed_jspo``, ``closed_jspo_lambda``, …:
      :func:`cf.jspo_lambda_limit`, :func:`cf.jspo_baseline_mse`).

    Returns Intervals over batches for each MSE and for the paired gains MSE(μ_group) − MSE(EBPO)
    (``gain``) and MSE(μ_group) − MSE(oracle) (``oracle_gain``), the paired differences
    MSE(JSPO) − MSE(EBPO) (``jspo_vs_ebpo``) and MSE(JSPO) − MSE(JSPO, James-Stein λ) (``jspo_vs_js``),
    the closed forms, and the estimated vs true hyper-parameters.
    """
    rng = np.random.default_rng(seed)
    estimator = get_estimator("ebpo", prior=prior, whitening="none")
    jspo = {name: get_estimator("jspo", shrinkage=rule) for name, rule in JSPO_RULES.items()}
    mu, sigma2, tau2 = population.mean, population.sigma2, population.tau2
    keys = (
        "group_mean",
        "oracle",
        "ebpo",
        "jspo",
        "jspo_js",
        "shrinkage",
        "sigma2_hat",
        "tau2_hat",
    )
    rows = {k: [] for k in (*keys, "jspo_lambda", "jspo_js_lambda")}
    for _ in range(num_batches):
        theta = population.sample(num_prompts, rng)
        rewards = rewards_for(population, theta, group_size, rng)
        group_mean = rewards.mean(1)
        out = estimator(rewards)
        baselines = {
            "group_mean": group_mean,
            "oracle": cf.oracle_baseline(group_mean, mu, sigma2, tau2, group_size),
            "ebpo": out.diagnostics["baseline"].to(torch.float64),
        }
        for name, estimate in jspo.items():
            js = estimate(rewards)  # b_ij = r_ij − A_ij: one baseline per completion
            baselines[name] = (rewards - js.advantages).to(torch.float64)
            rows[f"{name}_lambda"].append(float(js.diagnostics["shrinkage"].mean()))
        for name, baseline in baselines.items():
            error = baseline - (theta if baseline.dim() == 1 else theta.unsqueeze(1))
            rows[name].append(float((error**2).mean()))
        rows["shrinkage"].append(float(out.diagnostics["shrinkage"].mean()))
        rows["sigma2_hat"].append(float(out.diagnostics["sigma2"]))
        rows["tau2_hat"].append(float(out.diagnostics["tau2"]))
    sigma2_raw, tau2_raw = cf.raw_hyperparameters(sigma2, tau2, group_size)
    s_raw = cf.shrinkage_factor(sigma2_raw, tau2_raw, group_size)
    closed_jspo = {}
    for name, rule in JSPO_RULES.items():
        lam = cf.jspo_lambda_limit(sigma2, tau2, group_size, rule)
        closed_jspo[f"closed_{name}_lambda"] = lam
        closed_jspo[f"closed_{name}"] = cf.jspo_baseline_mse(lam, sigma2, tau2, group_size)
    return {
        "G": group_size,
        "jspo_vs_ebpo": mean_ci(np.subtract(rows["jspo"], rows["ebpo"])),
        "jspo_vs_js": mean_ci(np.subtract(rows["jspo"], rows["jspo_js"])),
        **{name: mean_ci(values) for name, values in rows.items()},
        "gain": mean_ci(np.subtract(rows["group_mean"], rows["ebpo"])),
        "oracle_gain": mean_ci(np.subtract(rows["group_mean"], rows["oracle"])),
        "closed_group_mean": cf.group_mean_mse(sigma2, group_size),
        "closed_bayes": cf.bayes_risk(sigma2, tau2, group_size),
        "closed_plugin_raw": cf.linear_baseline_mse(s_raw, sigma2, tau2, group_size),
        **closed_jspo,
        "shrinkage_star": cf.shrinkage_factor(sigma2, tau2, group_size),
        "shrinkage_raw": s_raw,
        "sigma2": sigma2,
        "tau2": tau2,
        "sigma2_raw": sigma2_raw,
        "tau2_raw": tau2_raw,
    }


def baseline_gradient_variance(
    population: BetaPopulation,
    group_size: int,
    num_prompts: int,
    replicates: int,
    num_answers: int,
    seed: int,
) -> dict[str, dict[str, np.ndarray]]:
    """Why the baseline's MSE matters for training: policy-gradient variance per baseline.

    ``num_prompts`` prompts (θ from ``population``) become softmax-bandit prompts; each draws
    ``replicates`` independent groups of G answers. For every baseline b — none (0), the group
    mean, rlkit's EBPO baseline (batch prior, one batch per replicate), the oracle posterior mean
    (known μ, σ², τ²) and the true θ — the one-step policy gradient of the advantage r − b is
    computed per replicate. Returns per baseline the MSE E[(b − θ)²], the gradient variance (trace
    of its covariance over replicates) and its mean squared error against the exact gradient
    ∇_z θ_q = π ⊙ (correct − θ_q), each per prompt ([num_prompts] arrays; every baseline sees the
    same prompts and samples, so differences between baselines are paired by prompt).
    """
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    theta = population.sample(num_prompts, rng)
    bandit = SoftmaxBandit.from_success_rates(theta, num_answers)
    prompts = torch.arange(num_prompts).repeat(replicates)
    actions, rewards = bandit.sample(group_size, gen, prompts=prompts)
    group_mean = rewards.mean(1)
    ebpo = get_estimator("ebpo", prior="batch", whitening="none")
    ebpo_baseline = torch.cat(
        [ebpo(r).diagnostics["baseline"].to(torch.float64) for r in rewards.split(num_prompts)]
    )
    oracle = cf.oracle_baseline(
        group_mean, population.mean, population.sigma2, population.tau2, group_size
    )
    baselines = {
        "none (b = 0)": torch.zeros_like(group_mean),
        "group mean (GRPO)": group_mean,
        "EBPO (estimated)": ebpo_baseline,
        "oracle EB": oracle,
        "true θ": theta[prompts],
    }
    probs = bandit.log_probs().exp()
    true_grad = probs * (
        bandit.correct.to(probs.dtype) - bandit.success_rate().unsqueeze(1)
    )  # ∇_z θ_q
    out = {}
    for name, baseline in baselines.items():
        grad, _, _ = bandit.policy_gradient(actions, rewards - baseline.unsqueeze(1), prompts)
        ascent = -grad.reshape(replicates, num_prompts, -1)  # the step direction, per replicate
        variance = ascent.var(0).sum(-1)
        error = ((ascent - true_grad) ** 2).sum(-1).mean(0)
        mse = ((baseline - theta[prompts]) ** 2).reshape(replicates, num_prompts).mean(0)
        out[name] = {
            "mse": mse.numpy(),
            "grad_variance": variance.numpy(),
            "grad_error": error.numpy(),
        }
    return out


# --- Notebook 03: Thm 3.2 / Cor 3.5, vanishing gradients ---------------------------------------


def null_group_rates(
    thetas, group_size: int, groups_per_theta: int, seed: int
) -> dict[str, np.ndarray]:
    """Fraction of groups whose advantages are all exactly zero (a null gradient), per θ.

    One batch holds ``groups_per_theta`` prompts at each θ of ``thetas``; GRPO, EBPO and JSPO
    (default options) see the same rewards. Returns per-θ fractions for each, their standard errors and
    the closed forms P(constant group) = (1 − θ)^G + θ^G and P(all zero) = (1 − θ)^G.
    """
    rng = np.random.default_rng(seed)
    thetas = torch.as_tensor(thetas, dtype=torch.float64)
    theta = thetas.repeat_interleave(groups_per_theta)
    rewards = bernoulli_rewards(theta, group_size, rng)
    shape = (len(thetas), groups_per_theta)
    out = {"theta": thetas.numpy(), "G": group_size}
    for name in ("grpo", "ebpo", "jspo"):
        null = (
            (get_estimator(name)(rewards).advantages == 0).all(1).to(torch.float64).reshape(shape)
        )
        ci = mean_ci(null.numpy(), axis=1)
        out[f"{name}_null"], out[f"{name}_null_se"] = ci.mean, ci.se
    out["all_zero"] = (rewards.sum(1) == 0).to(torch.float64).reshape(shape).mean(1).numpy()
    out["closed_constant"] = cf.prob_constant_group(thetas, group_size).numpy()
    out["closed_all_zero"] = cf.prob_all_zero(thetas, group_size).numpy()
    return out


def beta_all_zero_rate(
    population: BetaPopulation, group_size: int, num_prompts: int, seed: int
) -> float:
    """Simulated fraction of all-zero groups when θ ~ Beta(a, b) (closed form E[(1 − θ)^G])."""
    rng = np.random.default_rng(seed)
    rewards = bernoulli_rewards(population.sample(num_prompts, rng), group_size, rng)
    return float((rewards.sum(1) == 0).to(torch.float64).mean())


def gradient_by_group_type(
    population: BetaPopulation,
    num_prompts: int,
    num_answers: int,
    group_size: int,
    lr: float,
    seed: int,
    methods=("GRPO", "EBPO"),
) -> dict[str, dict[str, float]]:
    """Policy-gradient norm on the softmax bandit by group type (all-zero, mixed, all-one), and the
    one-step change of π(correct) on all-zero groups, for each method on the same samples."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    theta = population.sample(num_prompts, rng)
    start = SoftmaxBandit.from_success_rates(theta, num_answers)
    actions, rewards = start.sample(group_size, gen)
    kind = {
        "all_zero": rewards.sum(1) == 0,
        "mixed": (rewards.sum(1) > 0) & (rewards.sum(1) < group_size),
        "all_one": rewards.sum(1) == group_size,
    }
    out = {}
    for method in methods:
        bandit = SoftmaxBandit(start.logits, start.correct)
        result = bandit.update(actions, make_estimator(method)(rewards).advantages, lr)
        gain = bandit.success_rate() - start.success_rate()
        out[method] = {f"grad_norm_{k}": float(result.grad_norm[m].mean()) for k, m in kind.items()}
        out[method]["success_gain_all_zero"] = float(gain[kind["all_zero"]].mean())
    out["counts"] = {k: int(m.sum()) for k, m in kind.items()}
    return out


def jspo_failure_advantage(
    population: BetaPopulation, group_size: int, num_prompts: int, num_batches: int, seed: int
) -> dict:
    """JSPO on all-fail groups (docs/algorithms.md §2b): a group of zeros has leave-one-out mean 0,
    so its baseline is λ_i·mean_{k≠i} μ̂_k and every answer gets A = −λ_i·mean_{k≠i} μ̂_k, which is
    0 only if every other prompt's group is constant (λ_i = 0) or every other prompt failed too.

    Per batch of ``num_prompts`` prompts (θ from ``population``): the share of all-zero groups
    whose advantages are all exactly 0 (``null_share``), their mean advantage (``advantage``) and
    EBPO's (batch prior, no whitening: −S·μ̂) on the same rewards (``ebpo_advantage``), as
    Intervals over batches; the closed form −λ·μ with λ's large-batch limit
    (:func:`cf.jspo_lambda_limit`); and one batch in which every prompt fails
    (``all_fail_batch_advantage``: its largest |A|, 0 because no other prompt differs).
    """
    rng = np.random.default_rng(seed)
    jspo = get_estimator("jspo")
    ebpo = get_estimator("ebpo", prior="batch", whitening="none")
    rows = {k: [] for k in ("null_share", "advantage", "ebpo_advantage")}
    for _ in range(num_batches):
        rewards = bernoulli_rewards(population.sample(num_prompts, rng), group_size, rng)
        failed = rewards.sum(1) == 0
        advantages = jspo(rewards).advantages[failed]
        rows["null_share"].append(float((advantages == 0).all(1).to(torch.float64).mean()))
        rows["advantage"].append(float(advantages.mean()))
        rows["ebpo_advantage"].append(float(ebpo(rewards).advantages[failed].mean()))
    lam = cf.jspo_lambda_limit(population.sigma2, population.tau2, group_size)
    all_fail = jspo(torch.zeros(num_prompts, group_size, dtype=torch.float64)).advantages
    return {
        **{name: mean_ci(values) for name, values in rows.items()},
        "closed": -lam * population.mean,
        "closed_lambda": lam,
        "all_fail_batch_advantage": float(all_fail.abs().max()),
    }


def failure_penalty_by_cluster(
    population: ClusteredPopulation, group_size: int, num_prompts: int, num_batches: int, seed: int
) -> dict[str, np.ndarray]:
    """Cor 3.5: EBPO's raw advantage on all-zero groups, −S_k·μ_k, per cluster (per-cluster prior).

    Uses EBPO with the batch prior, per-cluster accumulators and no whitening, so the advantage
    of a failed group is exactly −V = −S·μ̂_k. Per cluster: the mean penalty over batches with its
    standard error, the mean S and prior mean, and the closed form −S_k·μ_k from the cluster's
    large-batch raw hyper-parameters (:func:`cf.raw_hyperparameters`).
    """
    rng = np.random.default_rng(seed)
    estimator = get_estimator("ebpo", prior="batch", whitening="none", min_cluster_count=1)
    k_all = range(population.num_clusters)
    per_batch = {
        k: np.full((num_batches, population.num_clusters), np.nan) for k in ("penalty", "shrinkage")
    }
    for b in range(num_batches):
        theta, cluster = population.sample(num_prompts, rng)
        rewards = bernoulli_rewards(theta, group_size, rng)
        out = estimator(rewards, cluster_ids=cluster)
        failed = rewards.sum(1) == 0
        for k in k_all:
            sel = failed & (cluster == k)
            if sel.any():
                per_batch["penalty"][b, k] = float(out.advantages[sel, 0].mean())
                per_batch["shrinkage"][b, k] = float(out.diagnostics["shrinkage"][sel].mean())
    # an easy cluster may have no failed group in a batch: average over the batches that have one
    penalty = [mean_ci(col[~np.isnan(col)]) for col in per_batch["penalty"].T]
    closed = []
    for k in k_all:
        sub = population.cluster(k)
        sigma2_raw, tau2_raw = cf.raw_hyperparameters(sub.sigma2, sub.tau2, group_size)
        closed.append(-cf.shrinkage_factor(sigma2_raw, tau2_raw, group_size) * sub.mean)
    return {
        "mean": np.asarray(population.means),
        "penalty": np.array([ci.mean for ci in penalty]),
        "penalty_se": np.array([ci.se for ci in penalty]),
        "shrinkage": np.nanmean(per_batch["shrinkage"], axis=0),
        "closed": np.asarray(closed),
    }


# --- Notebook 07: Prop 3.6, entropy dynamics on the softmax bandit -----------------------------


@dataclass(frozen=True)
class BanditConfig:
    """A softmax-bandit training run: every prompt of the pool is trained at every step."""

    population: BetaPopulation = field(default_factory=lambda: BetaPopulation(1.0, 3.0))
    num_prompts: int = 64
    num_answers: int = 8
    num_correct: int = 1
    group_size: int = 4
    steps: int = 200
    lr: float = 0.5
    epochs: int = 1


def train_bandit(method: str, config: BanditConfig, seed: int, snapshot_every: int = 0) -> dict:
    """Train the bandit with one method; per-step batch means as numpy arrays [steps].

    Records entropy, success rate, gradient norm, the null-group fraction and, for every step, the
    measured entropy change and its first-order prediction −η·Cov(log π, π·Ā) (the prediction is
    exact to first order only for ``epochs = 1``). ``snapshot_every`` > 0 also returns the logits
    every that many steps (for :func:`entropy_mechanism_terms`).
    """
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    theta = config.population.sample(config.num_prompts, rng)
    bandit = SoftmaxBandit.from_success_rates(theta, config.num_answers, config.num_correct)
    estimator = make_estimator(method)
    keys = ("entropy", "success", "grad_norm", "null_frac", "delta_entropy", "predicted_delta")
    log = {k: np.empty(config.steps) for k in keys}
    snapshots = []
    for step in range(config.steps):
        if snapshot_every and step % snapshot_every == 0:
            snapshots.append(bandit.logits.clone())
        log["success"][step] = float(bandit.success_rate().mean())
        actions, rewards = bandit.sample(config.group_size, gen)
        advantages = estimator(rewards).advantages
        predicted = cf.entropy_decay_prediction(bandit.logits, actions, advantages, config.lr)
        result = bandit.update(actions, advantages, config.lr, epochs=config.epochs)
        log["entropy"][step] = float(result.entropy_before.mean())
        log["grad_norm"][step] = float(result.grad_norm.mean())
        log["null_frac"][step] = float((advantages == 0).all(1).to(torch.float64).mean())
        log["delta_entropy"][step] = float((result.entropy_after - result.entropy_before).mean())
        log["predicted_delta"][step] = float(predicted.mean())
    if snapshot_every:
        log["snapshots"] = snapshots
        log["correct"] = bandit.correct
    return log


def train_bandits(methods, config: BanditConfig, seeds, snapshot_every: int = 0) -> dict:
    """:func:`train_bandit` for every method and paired seed: {method: {key: array [S, steps]}}."""
    out = {}
    for method in tqdm(methods, desc="methods"):
        runs = [train_bandit(method, config, seed, snapshot_every) for seed in seeds]
        out[method] = {
            k: np.stack([r[k] for r in runs]) for k in runs[0] if k not in ("snapshots", "correct")
        }
        if snapshot_every:
            out[method]["snapshots"] = [(r["snapshots"], r["correct"]) for r in runs]
    return out


def first_order_error(method: str, config: BanditConfig, seed: int, lrs) -> np.ndarray:
    """Relative error Σ|ΔH − ΔH_pred| / Σ|ΔH| of the first-order entropy prediction over a short
    run at each learning rate of ``lrs`` (it should shrink like η)."""
    errors = []
    for lr in lrs:
        log = train_bandit(method, replace(config, lr=lr, epochs=1), seed)
        gap = np.abs(log["delta_entropy"] - log["predicted_delta"]).sum()
        errors.append(gap / np.abs(log["delta_entropy"]).sum())
    return np.asarray(errors)


def entropy_mechanism_terms(
    logits: torch.Tensor, correct: torch.Tensor, group_size: int, seed: int
) -> dict[str, np.ndarray]:
    """The pieces of Prop 3.6 on one sampled batch from the policy ``logits``.

    With centred rewards c = r − mean_p (Dr. GRPO's advantages), Ω_q = Cov(log π, π·Ā_c) is the
    per-prompt entropy "force" (ΔH_q ≈ −η·Ω_q). GRPO divides c by σ_q (+1e-4), batch whitening by
    σ_batch = std of all c. Returned per prompt: Ω_q, σ_q, and the GRPO and whitening-only
    first-order predictions computed from the rlkit advantages themselves (per unit η). For EBPO
    (batch prior on this one batch) also what its whitening divides by: ``ebpo_sigma_batch`` (std
    of all raw advantages r − V, ddof = 1, as rlkit whitens) and the terms of
    :func:`cf.shrunk_batch_variance` (``within``, ``between_shrunk``, ``between_full``,
    ``ebpo_variance``).
    """
    gen = torch.Generator().manual_seed(seed)
    bandit = SoftmaxBandit(logits, correct)
    actions, rewards = bandit.sample(group_size, gen)
    centred = get_estimator("dr_grpo")(rewards).advantages
    pred = lambda adv: cf.entropy_decay_prediction(bandit.logits, actions, adv, 1.0).numpy()
    ebpo = get_estimator("ebpo", prior="batch", whitening="none")(rewards).diagnostics
    raw = ebpo["raw_advantages"].to(torch.float64)
    shrinkage = float(ebpo["shrinkage"][0])  # one S for the whole batch (no clusters)
    return {
        "omega": -pred(centred),
        "sigma_q": group_std(rewards, dim=1, ddof=1).numpy(),
        "sigma_batch": float(group_std(centred.reshape(-1), dim=0, ddof=1)),
        "grpo": pred(get_estimator("grpo")(rewards).advantages),
        "whitening_only": pred(BatchWhitened()(rewards).advantages),
        "ebpo_sigma_batch": float(group_std(raw.reshape(-1), dim=0, ddof=1)),
        "ebpo_variance": float(raw.var(unbiased=False)),
        "shrinkage": shrinkage,
        **cf.shrunk_batch_variance(rewards, shrinkage),
    }


MATCHED_STEP = "GRPO (matched step)"


def effective_step_ratio(runs: dict, method: str, reference: str = "GRPO") -> float:
    """How much larger ``method``'s first step is than ``reference``'s: the mean over paired seeds
    of their step-0 gradient-norm ratio. At step 0 paired seeds share the policy *and* the
    sampled answers, so the ratio compares the two advantage scalings on identical data."""
    return float(np.mean(runs[method]["grad_norm"][:, 0] / runs[reference]["grad_norm"][:, 0]))


def step_size_sweep(methods, config: BanditConfig, lrs, seeds, horizon: float) -> dict:
    """:func:`train_bandits` at each learning rate η of ``lrs`` for ceil(``horizon``/η) steps (a
    smaller step needs proportionally more steps to reach the same success).

    Each η also gets the arm :data:`MATCHED_STEP`: GRPO at k·η, with k the
    :func:`effective_step_ratio` of EBPO over GRPO at that η, so it moves as far per step as EBPO.
    Returns {η: {"k": k, "runs": {method: {key: [S, steps]}}}}.
    """
    out = {}
    for lr in lrs:
        sized = replace(config, lr=lr, steps=int(np.ceil(horizon / lr)))
        runs = train_bandits(methods, sized, seeds)
        k = effective_step_ratio(runs, "EBPO")
        runs[MATCHED_STEP] = train_bandits(["GRPO"], replace(sized, lr=k * lr), seeds)["GRPO"]
        out[lr] = {"k": k, "runs": runs}
    return out


def value_at_level(level_curve, value_curve, level: float) -> np.ndarray:
    """``value_curve`` where ``level_curve`` first reaches ``level``, per seed ([S, T] → [S]).

    Linear interpolation between the last step below ``level`` and the first step at or above it,
    so an arm that jumps past the level in one large step is not credited with the value after the
    jump. NaN for a seed that never reaches the level (or starts above it).
    """
    x, y = np.atleast_2d(level_curve), np.atleast_2d(value_curve)
    out = np.full(x.shape[0], np.nan)
    for s, (xs, ys) in enumerate(zip(x, y)):
        above = np.flatnonzero(xs >= level)
        if above.size and above[0] > 0:
            i = above[0]
            w = (level - xs[i - 1]) / (xs[i] - xs[i - 1])
            out[s] = ys[i - 1] + w * (ys[i] - ys[i - 1])
    return out


def steps_to_level(curve, level: float, start: int = 0) -> np.ndarray:
    """Steps after ``start`` until ``curve`` first reaches ``level`` ([S, T] → [S]), interpolated
    linearly between steps; NaN for a seed that never reaches it."""
    tail = np.atleast_2d(curve)[:, start:]
    return value_at_level(tail, np.broadcast_to(np.arange(tail.shape[1]), tail.shape), level)


# --- Notebook 04: Prop 3.8, clustered priors ---------------------------------------------------

STREAM_ORDERS = ("shuffle", "topic", "difficulty")


def clustered_pool(
    population: ClusteredPopulation, per_cluster: int, rng
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_cluster`` prompts from every cluster (exact counts, so topic batches are pure)."""
    cluster = torch.arange(population.num_clusters).repeat_interleave(per_cluster)
    theta = torch.cat(
        [population.cluster(k).sample(per_cluster, rng) for k in range(population.num_clusters)]
    )
    return theta, cluster


def stream_order(theta, cluster, order: str, rng, probe_samples: int = 8) -> torch.Tensor:
    """Permutation of the pool for one pass (docs/algorithms.md §2, clustered sampling), by the
    trainer's own ordering (``rlkit.sampling.epoch_order``) with the clusters as topics.

    ``shuffle``: uniformly random; ``topic``: cluster by cluster in random cluster order, shuffled
    within; ``difficulty``: by the starting policy's pass rate over ``probe_samples`` samples,
    easy → hard (stable: ties keep the pool's order, as the trainer's curriculum keeps its
    problems'). The permutations draw from a torch generator seeded from ``rng``.
    """
    if order not in STREAM_ORDERS:
        raise ValueError(f"unknown stream order {order!r}; known: {STREAM_ORDERS}")
    pass_rates = None
    if order == "difficulty":
        pass_rates = bernoulli_rewards(theta, probe_samples, rng).mean(1)
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return epoch_order(order, cluster.tolist(), pass_rates, generator)


PRIORS: dict[str, dict] = {
    "batch": {"prior": "batch"},
    "history": {"prior": "history"},
    "history (decay 0.9)": {"prior": "history", "prior_decay": 0.9},
    "per-cluster history": {"prior": "history", "min_cluster_count": 8},
}


def prior_error(
    population: ClusteredPopulation,
    order: str,
    prior: str,
    per_cluster: int,
    batch_size: int,
    group_size: int,
    seed: int,
) -> dict[str, float]:
    """One pass over a clustered pool in ``order`` with EBPO's ``prior`` (a key of :data:`PRIORS`).

    Returns J = mean (θ_q − prior mean_q)² (the prior-estimation error of Prop 3.8) and the MSE of
    EBPO's baseline against θ, averaged over the pass.
    """
    if prior not in PRIORS:
        raise ValueError(f"unknown prior {prior!r}; known: {sorted(PRIORS)}")
    rng = np.random.default_rng(seed)
    theta, cluster = clustered_pool(population, per_cluster, rng)
    perm = stream_order(theta, cluster, order, rng)
    estimator = get_estimator("ebpo", whitening="none", **PRIORS[prior])
    with_clusters = prior.startswith("per-cluster")
    sq_prior, sq_baseline = [], []
    for batch in perm.split(batch_size):
        rewards = bernoulli_rewards(theta[batch], group_size, rng)
        out = estimator(rewards, cluster_ids=cluster[batch] if with_clusters else None)
        sq_prior.append((out.diagnostics["prior_mean"].to(torch.float64) - theta[batch]) ** 2)
        sq_baseline.append((out.diagnostics["baseline"].to(torch.float64) - theta[batch]) ** 2)
    return {
        "J": float(torch.cat(sq_prior).mean()),
        "baseline_mse": float(torch.cat(sq_baseline).mean()),
    }


# --- Notebook 05: AGPO controllers on a bandit with a difficulty shift --------------------------


@dataclass(frozen=True)
class ShiftConfig:
    """A difficulty shift: a pool drawn from ``population.before`` is trained until
    ``population.shift_step``, then a fresh pool drawn from the harder ``population.after``."""

    population: DriftingPopulation = field(
        default_factory=lambda: DriftingPopulation(
            BetaPopulation(3.0, 2.0), BetaPopulation(1.0, 6.0), 150
        )
    )
    num_prompts: int = 64
    num_answers: int = 8
    group_size: int = 4
    steps: int = 300
    lr: float = 0.5
    epochs: int = 4
    eps: float = 0.2
    tau: float = 1.0
    dispersion: str = "std"
    clip: dict = field(default_factory=dict)
    """Keyword arguments of the adaptive clip (``rlkit.controllers.AdaptiveClip``) besides
    ``eps_base``: ``alpha=0, delta=0`` leave the probe's signals out of ε,
    ``entropy_ratio=False`` the policy-entropy ratio (notebook 05's leave-one-outs)."""
    eps_schedule: tuple[float, ...] | None = None
    """The clip radius at each step (``steps`` values, one ε for every prompt) for an arm without
    the adaptive clip: notebook 05's fixed-ε controls (a step at the shift, or the adaptive arm's
    mean ε step by step); None: ``eps`` every step. An arm with the adaptive clip and a schedule
    is an error: its controller sets ε."""

    def __post_init__(self):
        schedule = self.eps_schedule
        if schedule is not None and (
            len(schedule) != self.steps or not all(0 < float(e) < 1 for e in schedule)
        ):
            raise ValueError(
                f"ShiftConfig.eps_schedule must hold one ε per step ({self.steps}), each in "
                f"(0, 1); got {len(schedule)} values from {min(schedule, default=None)} to "
                f"{max(schedule, default=None)}"
            )


def answer_keys(actions: torch.Tensor) -> list[list[str]]:
    """The bandit's sampled answers as strings, the input of rlkit's vote entropy."""
    return [[str(a) for a in row] for row in actions.tolist()]


@dataclass
class BanditGroups:
    """A bandit batch as AGPO's methods read it: G answers per prompt, their rewards, the
    temperature each prompt's group was sampled at and the probe statistics behind it."""

    problems: list[int]
    actions: torch.Tensor  # [P, G]
    rewards: torch.Tensor  # [P, G]
    temperatures: torch.Tensor  # [P]
    probe_stats: ProbeStats | None = None

    @property
    def answers(self) -> list[list[str]]:
        return answer_keys(self.actions)


class BanditSampler:
    """The bandit as the sampler of ``rlkit.methods.AGPO.groups``: G answers per prompt at its
    temperature (the probe, ``full``, is drawn like any group)."""

    def __init__(self, bandit: SoftmaxBandit, group_size: int, gen: torch.Generator):
        self.bandit, self.group_size, self.gen = bandit, group_size, gen

    def __call__(self, problems, temperatures, stats=None, probe=False) -> BanditGroups:
        actions, rewards = self.bandit.sample(self.group_size, self.gen, temperature=temperatures)
        return BanditGroups(list(problems), actions, rewards, temperatures, stats)


def train_shift_bandit(
    config: ShiftConfig, seed: int, adaptive_clip: bool, adaptive_temperature: bool
) -> dict[str, np.ndarray]:
    """AGPO's loop (docs/algorithms.md §3) on the bandit, across a shift: the trainer's own
    ``rlkit.methods.AGPO`` object, its steps called in the trainer's order.

    Every step draws the probe (also for fixed ε/τ, so paired seeds share the random stream).
    Returns per-step arrays: success and entropy of the pool in training, ε and τ (mean/min/max),
    U, Ū, probe dispersion and vote entropy, D̂_KL and the clipped fraction, and what pins ε:
    ``eps_at_floor`` (share of prompts whose ε sits at ε_min), ``entropy_ratio`` (mean of the
    clip controller's H/H̄_ref before its clamp to [0.5, 1.5]) and ``ratio_at_floor`` (share of
    prompts whose ratio is clamped at 0.5).

    ``config.eps_schedule`` replaces the fixed arm's ε by the schedule's value at each step; it
    draws nothing, so the random stream stays paired with the other arms'.
    """
    if adaptive_clip and config.eps_schedule is not None:
        raise ValueError(
            "ShiftConfig.eps_schedule is a fixed clip radius per step: it needs adaptive_clip=False"
        )
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    pools = [
        SoftmaxBandit.from_success_rates(pop.sample(config.num_prompts, rng), config.num_answers)
        for pop in (config.population.before, config.population.after)
    ]
    agpo = AGPO(
        get_estimator("agpo", dispersion=config.dispersion),
        AdaptiveTemperature(tau_base=config.tau),
        AdaptiveClip(eps_base=config.eps, **config.clip),
        eps=(config.eps, config.eps),
        tau_base=config.tau,
        dispersion=config.dispersion,
        adaptive_temperature=adaptive_temperature,
        adaptive_clip=adaptive_clip,
    )
    temperature, clip = agpo.temperature_ctl, agpo.clip_ctl
    keys = (
        "success",
        "entropy",
        "eps_mean",
        "eps_min",
        "eps_max",
        "tau_mean",
        "tau_min",
        "tau_max",
        "u",
        "u_bar",
        "dispersion",
        "vote_entropy",
        "kl",
        "clip_fraction",
        "eps_at_floor",
        "entropy_ratio",
        "ratio_at_floor",
    )
    log = {k: np.empty(config.steps) for k in keys}
    for step in range(config.steps):
        bandit = pools[int(step >= config.population.shift_step)]
        if config.eps_schedule is not None:
            agpo.eps = (float(config.eps_schedule[step]),) * 2  # the fixed clip rule reads it
        prompts = list(range(bandit.num_prompts))
        groups = agpo.groups(prompts, BanditSampler(bandit, config.group_size, gen))  # 1–3
        stats, tau = groups.probe_stats, groups.temperatures
        entropy = bandit.entropy()
        reference = clip.entropy_ref.value  # H̄_ref as the clip controller will use it
        ratio = entropy / reference if reference is not None else torch.ones_like(entropy)
        log["entropy_ratio"][step] = float(ratio.mean())
        log["ratio_at_floor"][step] = float((ratio <= 0.5).to(torch.float64).mean())
        eps, _ = agpo.clip_rule(groups)(entropy)  # 4
        log["success"][step] = float(bandit.success_rate().mean())
        log["entropy"][step] = float(entropy.mean())
        result = bandit.update(
            groups.actions,
            agpo.advantages(groups.rewards, prompts).advantages,
            config.lr,
            temperature=tau,
            epochs=config.epochs,
            eps_low=eps,
            eps_high=eps,
        )
        drift = lambda kl=result.kl: kl  # noqa: E731 - the bandit's update measured the drift
        log["kl"][step] = agpo.after_update(groups, drift)["agpo/kl_drift"]  # 5
        log["clip_fraction"][step] = float(result.clip_fraction)
        for name, values in (("eps", eps), ("tau", tau)):
            log[f"{name}_mean"][step], log[f"{name}_min"][step], log[f"{name}_max"][step] = (
                float(values.mean()),
                float(values.min()),
                float(values.max()),
            )
        log["eps_at_floor"][step] = float((eps <= clip.eps_min + 1e-6).to(torch.float64).mean())
        log["u"][step] = float(temperature.uncertainty(stats).mean())
        log["u_bar"][step] = temperature.u_bar
        log["dispersion"][step] = float(stats.dispersion.mean())
        log["vote_entropy"][step] = float(stats.vote_entropy.mean())
    return log


SHIFT_ARMS = {
    "fixed ε, τ": (False, False),
    "adaptive ε": (True, False),
    "adaptive τ": (False, True),
    "AGPO (both)": (True, True),
}


def train_shift_bandits(config: ShiftConfig, seeds, arms=tuple(SHIFT_ARMS)) -> dict:
    """{arm: {key: array [S, steps]}} over paired seeds."""
    out = {}
    for arm in tqdm(arms, desc="arms"):
        runs = [train_shift_bandit(config, seed, *SHIFT_ARMS[arm]) for seed in seeds]
        out[arm] = {k: np.stack([r[k] for r in runs]) for k in runs[0]}
    return out


__all__ = [
    "JSPO_RULES",
    "MATCHED_STEP",
    "METHODS",
    "OTHER_METHODS",
    "PRIORS",
    "SHIFT_ARMS",
    "STREAM_ORDERS",
    "BanditConfig",
    "BatchWhitened",
    "baseline_gradient_variance",
    "beta_all_zero_rate",
    "first_order_error",
    "ShiftConfig",
    "clustered_pool",
    "effective_step_ratio",
    "entropy_mechanism_terms",
    "failure_penalty_by_cluster",
    "gradient_by_group_type",
    "make_estimator",
    "jspo_failure_advantage",
    "null_group_rates",
    "prior_error",
    "shrinkage_mse",
    "step_size_sweep",
    "steps_to_level",
    "stream_order",
    "train_bandit",
    "train_bandits",
    "train_shift_bandit",
    "train_shift_bandits",
    "value_at_level",
]
