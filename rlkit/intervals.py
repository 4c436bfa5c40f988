"""Means with 95% Student-t intervals over seeds or Monte-Carlo replicates, plain and paired, and
the minimum difference a paired comparison can detect."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats


@dataclass(frozen=True)
class Interval:
    """A mean with its standard error and a two-sided t confidence interval."""

    mean: float | np.ndarray
    se: float | np.ndarray
    low: float | np.ndarray
    high: float | np.ndarray

    def __str__(self) -> str:
        return f"{self.mean:.4g} [{self.low:.4g}, {self.high:.4g}]"

    def contains(self, value) -> bool | np.ndarray:
        return (self.low <= value) & (value <= self.high)


def mean_ci(samples, axis: int = 0, level: float = 0.95) -> Interval:
    """Mean over ``axis`` (seeds, replicates) with a Student-t interval at ``level``."""
    x = np.asarray(samples, dtype=np.float64)
    n = x.shape[axis]
    if n < 2:
        raise ValueError(f"need at least 2 samples along axis {axis} for an interval, got {n}")
    mean = x.mean(axis=axis)
    se = x.std(axis=axis, ddof=1) / np.sqrt(n)
    half = _scipy_stats.t.ppf(0.5 + level / 2, df=n - 1) * se
    return Interval(mean, se, mean - half, mean + half)


def paired_difference(a, b, axis: int = 0, level: float = 0.95) -> Interval:
    """Mean of a − b over paired seeds (same seed, same initial state and random stream)."""
    return mean_ci(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64), axis, level)


def format_interval(interval: Interval, scale: float = 1.0, digits: int = 1) -> str:
    """``mean [low, high]`` of a scalar interval, values multiplied by ``scale``."""
    return (
        f"{interval.mean * scale:.{digits}f} "
        f"[{interval.low * scale:.{digits}f}, {interval.high * scale:.{digits}f}]"
    )


def minimum_detectable_difference(
    interval: Interval, num_samples: int, level: float = 0.95, power: float = 0.8
) -> float:
    """Smallest true mean difference a two-sided t-test at ``level`` would detect with ``power``,
    given the standard error of ``interval`` over ``num_samples`` paired seeds:
    (t_{(1+level)/2} + t_{power})·SE, both quantiles at n − 1 degrees of freedom (the usual
    approximation to the noncentral-t power; at large n it tends to (1.960 + 0.842)·SE = 2.80·SE).
    """
    if num_samples < 2:
        raise ValueError(f"need at least 2 paired samples, got {num_samples}")
    df = num_samples - 1
    t = _scipy_stats.t.ppf((1 + level) / 2, df) + _scipy_stats.t.ppf(power, df)
    return float(t * np.asarray(interval.se))
