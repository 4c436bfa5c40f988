"""Closed forms that sit beside the simulations (EBPO, arXiv 2602.05165, §3).

Model: θ_q has mean μ and variance τ² across prompts; the G rewards of prompt q are independent
with mean θ_q and average within-prompt variance σ² (for Bernoulli rewards σ² = E[θ(1 − θ)]).
The group mean μ_group then has E[(μ_group − θ)²] = σ²/G.

Linear shrinkage baselines V = (1 − S)·μ_group + S·μ are unbiased-in-mean for θ, and their risk is

    MSE(S) = (1 − S)²·σ²/G + S²·τ²                                        (any fixed S)

which is minimised by S* = (σ²/G)/(σ²/G + τ²), giving the Bayes risk (1 − S*)·σ²/G (Thm 3.3).
The formulas below take floats or tensors and broadcast.
"""

from __future__ import annotations

import math

import torch

from simulations.population import ClusteredPopulation


def shrinkage_factor(sigma2, tau2, group_size: int):
    """S = (σ²/G) / (σ²/G + τ²)  (docs/algorithms.md §2)."""
    v = sigma2 / group_size
    return v / (v + tau2)


def group_mean_mse(sigma2, group_size: int):
    """E[(μ_group − θ)²] = σ²/G; for one prompt with Bernoulli rewards σ² = θ(1 − θ)."""
    return sigma2 / group_size


def linear_baseline_mse(shrinkage, sigma2, tau2, group_size: int):
    """MSE of V = (1 − S)·μ_group + S·μ for a fixed S: (1 − S)²σ²/G + S²τ²."""
    return (1 - shrinkage) ** 2 * sigma2 / group_size + shrinkage**2 * tau2


def bayes_risk(sigma2, tau2, group_size: int):
    """Thm 3.3: MSE(V^EB) = (1 − S)·σ²/G with the optimal S, strictly below σ²/G when τ² < ∞."""
    return (1 - shrinkage_factor(sigma2, tau2, group_size)) * sigma2 / group_size


def oracle_baseline(group_mean, mu, sigma2, tau2, group_size: int):
    """The posterior-mean baseline with *known* hyper-parameters (the object of Thm 3.3)."""
    s = shrinkage_factor(sigma2, tau2, group_size)
    return (1 - s) * group_mean + s * mu


def raw_hyperparameters(sigma2, tau2, group_size: int):
    """Large-batch limits of the statistics EBPO actually plugs in (docs/algorithms.md §2):

    σ²_raw = variance of all individual rewards = σ² + τ²  (law of total variance);
    τ²_raw = variance of the group means          = τ² + σ²/G  (not de-noised, by design).
    """
    return sigma2 + tau2, tau2 + sigma2 / group_size


def raw_shrinks_less(sigma2, tau2, group_size: int):
    """Whether the raw plug-in S_raw (:func:`raw_hyperparameters`) is below the optimal S*.

    With a = σ²/G, S_raw = (a + τ²/G)/(2a + τ² + τ²/G) and S* = a/(a + τ²); cross-multiplying,
    S_raw < S*  ⇔  τ⁴/G < a²  ⇔  τ² < σ²/√G. Otherwise EBPO's raw statistics shrink *more*.
    """
    return tau2 < sigma2 / math.sqrt(group_size)


def jspo_lambda_limit(sigma2, tau2, group_size: int, rule: str = "published"):
    """Large-batch limit of JSPO's λ (docs/algorithms.md §2b). v → σ²/G, and s, the spread of the
    *empirical* prompt means, → τ² + σ²/G. ``published`` λ = v/(v + s) → a/(2a + τ²) with
    a = σ²/G: ½ when the prompts are alike (τ² → 0), not 1. ``james_stein`` λ ∝ v/s →
    a/(a + τ²) = S*: 1 when τ² → 0."""
    a = sigma2 / group_size
    if rule == "published":
        return a / (2 * a + tau2)
    if rule == "james_stein":
        return a / (a + tau2)
    raise ValueError(f"unknown JSPO rule {rule!r}; known: 'published', 'james_stein'")


def jspo_baseline_mse(shrinkage, sigma2, tau2, group_size: int):
    """MSE against θ of JSPO's b = (1 − λ)·(leave-one-out mean) + λ·μ for a fixed λ: the
    leave-one-out mean averages G − 1 rewards, so (1 − λ)²σ²/(G − 1) + λ²τ²."""
    return linear_baseline_mse(shrinkage, sigma2, tau2, group_size - 1)


def prob_all_zero(theta, group_size: int):
    """P(all G rewards are 0 | θ) = (1 − θ)^G."""
    return (1 - theta) ** group_size


def prob_constant_group(theta, group_size: int):
    """P(a group is all 0 or all 1 | θ) = (1 − θ)^G + θ^G: GRPO's null-gradient probability."""
    return (1 - theta) ** group_size + theta**group_size


def batch_prior_error(tau2, sigma2, group_size: int, batch_size: int):
    """E[(θ_q − μ̂)²] when μ̂ is the mean of the B group means of q's own batch (prior="batch")::

        J = τ²·(1 − 1/B) + σ²/(G·B)

    with τ² and σ² the variances *within the batch's population*: Var θ for a shuffled stream,
    Var(θ | k) for a cluster-coherent one (Prop 3.8 plus its finite-batch correction).
    """
    return tau2 * (1 - 1 / batch_size) + sigma2 / (group_size * batch_size)


def beta_prob_all_zero(a: float, b: float, group_size: int) -> float:
    """E[(1 − θ)^G] for θ ~ Beta(a, b) = B(a, b + G)/B(a, b) = Π_{j<G} (b + j)/(a + b + j)."""
    return math.prod((b + j) / (a + b + j) for j in range(group_size))


def beta_prob_constant_group(a: float, b: float, group_size: int) -> float:
    """E[(1 − θ)^G + θ^G] for θ ~ Beta(a, b)."""
    return beta_prob_all_zero(a, b, group_size) + beta_prob_all_zero(b, a, group_size)


def variance_decomposition(population: ClusteredPopulation) -> dict[str, float]:
    """Law of total variance Var θ = E_k[Var(θ | k)] + Var_k(μ_k) (Prop 3.8).

    Returns ``within`` (= J_coherent, the prior error of a cluster-coherent batch), ``between``
    (Var_k μ_k) and ``total`` (= J_shuffle).
    """
    w = population.cluster_weights
    means = torch.tensor(population.means, dtype=torch.float64)
    within_k = torch.tensor([population.cluster(k).tau2 for k in range(population.num_clusters)])
    w = torch.as_tensor(w)
    grand = (w * means).sum()
    within = float((w * within_k).sum())
    between = float((w * (means - grand) ** 2).sum())
    return {"within": within, "between": between, "total": within + between}


def shrunk_batch_variance(rewards: torch.Tensor, shrinkage: float) -> dict[str, float]:
    """What EBPO's batch whitening divides by, term by term (Prop 3.6, corrected).

    The raw advantage is Â = r − V = (r − μ_q) + S·(μ_q − μ_glob) with one S for the batch, so
    (population variances over the P·G entries; the cross term vanishes because r − μ_q sums to
    zero within each group)::

        Var(Â) = E_q[σ²_q] + S²·Var_q(μ_q)

    Returns ``within`` = E_q[σ²_q], ``between_shrunk`` = S²·Var_q(μ_q) and, for comparison, the
    unshrunk ``between_full`` = Var_q(μ_q) that the paper's decomposition uses.
    """
    r = rewards.to(torch.float64)
    between = float(r.mean(1).var(unbiased=False))
    return {
        "within": float(r.var(1, unbiased=False).mean()),
        "between_shrunk": shrinkage**2 * between,
        "between_full": between,
    }


# --- Entropy of a softmax policy (Prop 3.6) --------------------------------------------------


def entropy_gradient(logits: torch.Tensor) -> torch.Tensor:
    """∂H/∂z_k = −π_k·(log π_k + H) for a softmax over logits z."""
    logp = torch.log_softmax(logits, dim=-1)
    h = -(logp.exp() * logp).sum(-1, keepdim=True)
    return -logp.exp() * (logp + h)


def first_order_entropy_change(logits: torch.Tensor, delta_logits: torch.Tensor) -> torch.Tensor:
    """ΔH ≈ ∇H · Δz: the exact linearisation of the entropy change of one logit update."""
    return (entropy_gradient(logits) * delta_logits).sum(-1)


def policy_covariance(logits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Cov_{k∼π}(log π_k, values_k) over the last dim."""
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    centred = logp - (p * logp).sum(-1, keepdim=True)
    return (p * centred * (values - (p * values).sum(-1, keepdim=True))).sum(-1)


def answer_advantage(actions: torch.Tensor, advantages: torch.Tensor, num_answers: int, probs):
    """Importance-weighted advantage of each answer, Ā_k = Σ_i A_i·1[a_i = k] / (G·π_k).

    With it a vanilla policy-gradient step on softmax logits is Δz_k = η·π_k·(Ā_k − Σ_j π_j Ā_j).
    """
    g = actions.shape[-1]
    summed = torch.zeros(*actions.shape[:-1], num_answers, dtype=probs.dtype)
    summed.scatter_add_(-1, actions, advantages.to(probs.dtype))
    return summed / (g * probs)


def entropy_decay_prediction(logits, actions, advantages, lr: float) -> torch.Tensor:
    """Prop 3.6's first-order entropy change for one vanilla policy-gradient step (per prompt)::

        ΔH ≈ −η · Cov_{k∼π}(log π_k, π_k·(Ā_k − Ā)),     Ā = mean_i A_i

    the tabular-softmax form of −η·Cov(log π, A) (Cui et al., arXiv 2505.22617, Lemma 1): the
    factor π_k appears because the step is a plain, not a natural, gradient, and Ā matters only
    for advantages that do not sum to zero within the group (EBPO's shrinkage baseline).
    """
    probs = torch.softmax(logits, dim=-1)
    a_bar = answer_advantage(actions, advantages, logits.shape[-1], probs)
    mean_adv = advantages.to(probs.dtype).mean(-1, keepdim=True)
    return -lr * policy_covariance(logits, probs * (a_bar - mean_adv))
