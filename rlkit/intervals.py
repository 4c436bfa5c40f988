"""Mean and 95% confidence interval over seeds (Student t), plain and paired."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t interval of the mean; a single value gives a zero-width one."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return mean, mean - half, mean + half


def paired_difference_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95):
    """Interval of mean(a − b) over paired seeds (same seed, same index)."""
    if len(a) != len(b):
        raise ValueError(f"paired samples must have equal length, got {len(a)} and {len(b)}")
    return mean_ci(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64), level)


def format_ci(mean: float, low: float, high: float, scale: float = 1.0, digits: int = 1) -> str:
    return f"{mean * scale:.{digits}f} [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"
