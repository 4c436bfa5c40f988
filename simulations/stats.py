"""Monte-Carlo agreement tests; means with 95% intervals, paired differences and minimum
detectable differences come from :mod:`rlkit.intervals` and are re-exported here."""

from __future__ import annotations

import numpy as np
from scipy import stats as _scipy_stats

from rlkit.intervals import Interval, mean_ci, minimum_detectable_difference, paired_difference

__all__ = [
    "Interval",
    "mean_ci",
    "paired_difference",
    "within_standard_errors",
    "binomial_z",
    "bonferroni_z",
    "minimum_detectable_difference",
]


def within_standard_errors(estimate: Interval, target, num_se: float = 3.0) -> bool | np.ndarray:
    """|estimate − target| ≤ num_se · SE: the Monte-Carlo agreement test the notebooks assert."""
    return np.abs(np.asarray(estimate.mean) - np.asarray(target)) <= num_se * np.asarray(
        estimate.se
    )


def binomial_z(observed_fraction, probability, num_trials: int):
    """z-score of an observed fraction against a known probability, SE √(p(1 − p)/n) under the null.

    Uses the SE of the hypothesised p, so a rare event that was never observed is still testable.
    """
    p = np.asarray(probability, dtype=np.float64)
    se = np.sqrt(p * (1 - p) / num_trials)
    return (np.asarray(observed_fraction) - p) / np.where(se > 0, se, np.inf)


def bonferroni_z(num_comparisons: int, family_level: float = 0.01) -> float:
    """Two-sided z threshold keeping the chance of any false alarm among m comparisons ≤ level."""
    return float(_scipy_stats.norm.ppf(1 - family_level / (2 * num_comparisons)))
