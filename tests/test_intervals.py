"""Means with 95% t-intervals over seeds, plain and paired."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from rlkit.intervals import format_interval, mean_ci, paired_difference


def test_mean_ci_matches_scipy_t_interval():
    x = [0.31, 0.42, 0.38, 0.29, 0.40]
    ci = mean_ci(x)
    ref = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert ci.mean == pytest.approx(np.mean(x))
    assert (ci.low, ci.high) == pytest.approx(ref)
    assert ci.contains(np.mean(x)) and not ci.contains(1.0)


def test_mean_ci_along_an_axis():
    x = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])  # 3 seeds × 2 quantities
    ci = mean_ci(x, axis=0)
    assert ci.mean == pytest.approx([2.0, 20.0])
    assert ci.se == pytest.approx([1 / np.sqrt(3), 10 / np.sqrt(3)])


def test_paired_difference_uses_per_seed_differences():
    a, b = [0.5, 0.6, 0.7], [0.4, 0.5, 0.6]  # a constant +0.1 per seed: zero-width interval
    ci = paired_difference(a, b)
    assert (ci.mean, ci.low, ci.high) == pytest.approx((0.1, 0.1, 0.1))


def test_too_few_samples_and_formatting():
    with pytest.raises(ValueError, match="at least 2 samples"):
        mean_ci([0.25])
    assert format_interval(mean_ci([0.4, 0.6]), scale=100).startswith("50.0 [")
