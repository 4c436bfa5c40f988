"""Synthetic prompt populations: latent success rates θ_q and the rewards they generate.

A population answers one question: "draw n prompts, give me their latent success rates θ_q"
(and, for a clustered population, each prompt's cluster id). Rewards are then G draws per prompt
from :func:`bernoulli_rewards` (verifiable 0/1 rewards) or :func:`gaussian_rewards` (the Gaussian
model of EBPO's Thm 3.3, arXiv 2602.05165). Draws come from a seeded ``numpy.random.Generator``,
are vectorized over prompts, and are returned as float64 torch tensors (the estimators' input).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def _tensor(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")


@dataclass(frozen=True)
class BetaPopulation:
    """θ_q ~ Beta(a, b): mean a/(a+b), Var θ = ab / ((a+b)²(a+b+1))."""

    a: float
    b: float

    def __post_init__(self):
        _check_positive(a=self.a, b=self.b)

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)

    @property
    def tau2(self) -> float:
        """Var θ: the latent between-prompt variance τ² of EBPO's model."""
        n = self.a + self.b
        return self.a * self.b / (n**2 * (n + 1))

    @property
    def sigma2(self) -> float:
        """E[θ(1−θ)]: the average within-prompt Bernoulli variance σ² of EBPO's model."""
        n = self.a + self.b
        return self.a * self.b / (n * (n + 1))

    def sample(self, n: int, rng: np.random.Generator) -> torch.Tensor:
        return _tensor(rng.beta(self.a, self.b, size=n))


@dataclass(frozen=True)
class GaussianPopulation:
    """θ_q ~ N(mu, tau2) with Gaussian rewards r ~ N(θ_q, sigma2): Thm 3.3's exact model."""

    mu: float
    tau2: float
    sigma2: float

    def __post_init__(self):
        _check_positive(tau2=self.tau2, sigma2=self.sigma2)

    @property
    def mean(self) -> float:
        return self.mu

    def sample(self, n: int, rng: np.random.Generator) -> torch.Tensor:
        return _tensor(rng.normal(self.mu, np.sqrt(self.tau2), size=n))


@dataclass(frozen=True)
class ClusteredPopulation:
    """A mixture of Beta clusters (topics) with different mean difficulty.

    Cluster k has weight ``weights[k]`` and θ | k ~ Beta(m_k·c, (1 − m_k)·c) with m_k =
    ``means[k]`` and c = ``concentration``, so Var(θ | k) = m_k(1 − m_k)/(c + 1).
    """

    means: tuple[float, ...]
    concentration: float
    weights: tuple[float, ...] | None = None

    def __post_init__(self):
        _check_positive(concentration=self.concentration)
        if not all(0 < m < 1 for m in self.means):
            raise ValueError(f"cluster means must lie in (0, 1), got {self.means}")
        if self.weights is not None and (
            len(self.weights) != len(self.means) or not np.isclose(sum(self.weights), 1.0)
        ):
            raise ValueError(
                f"weights must be {len(self.means)} numbers summing to 1, got {self.weights}"
            )

    @property
    def num_clusters(self) -> int:
        return len(self.means)

    @property
    def cluster_weights(self) -> np.ndarray:
        if self.weights is None:
            return np.full(self.num_clusters, 1.0 / self.num_clusters)
        return np.asarray(self.weights, dtype=np.float64)

    def cluster(self, k: int) -> BetaPopulation:
        m = self.means[k]
        return BetaPopulation(m * self.concentration, (1 - m) * self.concentration)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(θ [n], cluster id [n])."""
        ids = rng.choice(self.num_clusters, size=n, p=self.cluster_weights)
        m = np.asarray(self.means)[ids]
        theta = rng.beta(m * self.concentration, (1 - m) * self.concentration)
        return _tensor(theta), torch.as_tensor(ids, dtype=torch.long)


@dataclass(frozen=True)
class DriftingPopulation:
    """A population whose difficulty shifts: ``before`` until ``shift_step``, ``after`` from then on."""

    before: BetaPopulation
    after: BetaPopulation
    shift_step: int

    def at(self, step: int) -> BetaPopulation:
        return self.before if step < self.shift_step else self.after


def bernoulli_rewards(
    theta: torch.Tensor, group_size: int, rng: np.random.Generator
) -> torch.Tensor:
    """G verifiable 0/1 rewards per prompt: r[q, i] ~ Bernoulli(θ_q), shape [*θ.shape, G]."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    u = rng.random((*theta.shape, group_size))
    return _tensor(u < theta.numpy()[..., None])


def gaussian_rewards(
    theta: torch.Tensor, group_size: int, sigma2: float, rng: np.random.Generator
) -> torch.Tensor:
    """G Gaussian rewards per prompt: r[q, i] ~ N(θ_q, sigma2), shape [*θ.shape, G]."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    _check_positive(sigma2=sigma2)
    noise = rng.normal(0.0, np.sqrt(sigma2), size=(*theta.shape, group_size))
    return theta.unsqueeze(-1) + _tensor(noise)
