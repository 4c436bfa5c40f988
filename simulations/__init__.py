"""Synthetic Bernoulli bandits for checking the EBPO and AGPO theory before any language model.

- :mod:`simulations.population`  prompt populations (Beta, Gaussian, clustered, drifting) and rewards
- :mod:`simulations.bandit`      a softmax-over-K-answers policy trained with rlkit's estimators/loss
- :mod:`simulations.closed_forms` the closed forms the notebooks set beside the simulations
- :mod:`simulations.experiments` the vectorized experiment drivers the notebooks call
- :mod:`simulations.stats`, :mod:`simulations.plotting` intervals over seeds, figures
- :mod:`simulations.scale`       the notebooks' full and CI scales; where a CI-scale run writes
- :mod:`simulations.poke`        one run of one sweep arm, by hand (notebooks 08 and 09)
- :mod:`simulations.mad_median`  the AGPO authors' lower MAD median against rlkit's midpoint, on the
  warm start's 0/1 rewards (docs/algorithms.md §1)
"""

from simulations import closed_forms, experiments, plotting, population, scale, stats
from simulations.bandit import SoftmaxBandit, StepResult
from simulations.population import (
    BetaPopulation,
    ClusteredPopulation,
    DriftingPopulation,
    GaussianPopulation,
    bernoulli_rewards,
    gaussian_rewards,
)

__all__ = [
    "BetaPopulation",
    "ClusteredPopulation",
    "DriftingPopulation",
    "GaussianPopulation",
    "SoftmaxBandit",
    "StepResult",
    "bernoulli_rewards",
    "closed_forms",
    "experiments",
    "gaussian_rewards",
    "plotting",
    "population",
    "scale",
    "stats",
]
