"""Means with 95% t-intervals over seeds, plain and paired, and their summary.json form."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from rlkit.intervals import (
    Interval,
    format_interval,
    mean_ci,
    minimum_detectable_difference,
    paired_difference,
    seed_interval,
)


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


@pytest.mark.parametrize("n", [5, 10, 30])
def test_minimum_detectable_difference_has_power_08_under_the_exact_noncentral_t(n):
    se = 0.02
    mdd = minimum_detectable_difference(Interval(0.0, se, 0.0, 0.0), n)
    crit, df = stats.t.ppf(0.975, n - 1), n - 1
    power = stats.nct.sf(crit, df, mdd / se) + stats.nct.cdf(-crit, df, mdd / se)
    assert power == pytest.approx(0.8, abs=0.01)


def test_minimum_detectable_difference_tends_to_2_8_standard_errors():
    # the textbook large-sample value z_0.975 + z_0.8 = 1.960 + 0.842
    mdd = minimum_detectable_difference(Interval(0.0, 1.0, 0.0, 0.0), 100_000)
    assert mdd == pytest.approx(2.8016, abs=1e-3)
    assert minimum_detectable_difference(Interval(0.0, 1.0, 0.0, 0.0), 5) == pytest.approx(
        2.7764 + 0.9410, abs=1e-3
    )
    with pytest.raises(ValueError, match="at least 2"):
        minimum_detectable_difference(Interval(0.0, 1.0, 0.0, 0.0), 1)


def test_seed_interval_writes_the_summary_form_and_reads_it_back():
    """A summary keeps {"mean", "low", "high"} in this order, floats or None, and no se."""
    ci = seed_interval([0.4, 0.6, 0.5])
    got = ci.to_json()
    assert list(got) == ["mean", "low", "high"] and all(type(v) is float for v in got.values())
    assert (got["mean"], got["low"], got["high"]) == (float(ci.mean), ci.low, ci.high)
    assert Interval.from_json(got) == Interval(ci.mean, None, ci.low, ci.high)
    assert Interval.from_json(got | {"mdd": 0.1, "p": 0.5}) == Interval.from_json(got)
    assert seed_interval([0.3]).to_json() == {"mean": 0.3, "low": None, "high": None}
    assert seed_interval([0.3, 0.3]).to_json() == {"mean": 0.3, "low": 0.3, "high": 0.3}
    bounds = mean_ci([0.1, 0.3]).to_json(("low", "high"))  # a claim's ci90
    assert list(bounds) == ["low", "high"] and Interval.from_json(bounds).mean is None
    with pytest.raises(ValueError, match="an interval needs 'high', got keys \\['low', 'mean'\\]"):
        Interval.from_json({"mean": 0.1, "low": 0.0})


@pytest.mark.parametrize(
    "ci, points, difference",
    [
        (Interval(0.05, None, 0.01, 0.09), "5.0 [1.0, 9.0]", "+5.0 [+1.0, +9.0]"),
        (Interval(-0.05), "-5.0 [n/a]", "-5.0 [n/a]"),
        (Interval(0.05, 0.0, 0.05, 0.05), "5.0", "+5.0 [+5.0, +5.0]"),
    ],
)
def test_an_interval_in_points(ci, points, difference):
    assert ci.points() == points and ci.difference_points() == difference


def test_within_a_margin_is_strict():
    assert Interval(0.0, None, -0.01, 0.02).within(0.03)
    assert not Interval(0.0, None, -0.01, 0.03).within(0.03)
    assert not Interval(0.0, None, -0.03, 0.01).within(0.03)
