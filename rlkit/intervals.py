"""Means with 95% Student-t intervals over seeds or Monte-Carlo replicates, plain and paired, the
minimum difference a paired comparison can detect, and the one-sided p-values and multiplicity
correction of the pre-registered tests (:mod:`rlkit.claims`).

One type, :class:`Interval`, holds them all: computed (:func:`mean_ci`, arrays allowed), over a
summary's seeds (:func:`seed_interval`: low = high = None without an interval), or read back from
a summary (``rlkit report``'s ``summary.json``), whose JSON form ``{"mean", "low", "high"}`` it
writes (:meth:`Interval.to_json`) and reads (:meth:`Interval.from_json`) and prints in points
(:meth:`Interval.points`, :meth:`Interval.difference_points`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

JSON_KEYS = ("mean", "low", "high")  # an interval in a summary.json, in this order
BOUNDS = ("low", "high")  # a claim's 90% interval (its mean is the difference's)


@dataclass(frozen=True)
class Interval:
    """A mean with its standard error and a two-sided t confidence interval, scalars or arrays
    (one interval per element). Without an interval (fewer than 2 values) low = high = None;
    read back from a summary it has no standard error (None), and a claim's 90% interval, stored
    as its bounds alone, no mean."""

    mean: float | np.ndarray | None
    se: float | np.ndarray | None = None
    low: float | np.ndarray | None = None
    high: float | np.ndarray | None = None

    def __str__(self) -> str:
        return f"{self.mean:.4g} [{self.low:.4g}, {self.high:.4g}]"

    def contains(self, value) -> bool | np.ndarray:
        return (self.low <= value) & (value <= self.high)

    def within(self, margin: float) -> bool:
        """The interval strictly inside ±margin (TOST's reading of a 90% interval)."""
        return -margin < self.low and self.high < margin

    def to_json(self, keys: tuple[str, ...] = JSON_KEYS) -> dict:
        """The summary.json form of a scalar interval: ``keys`` as floats, None where there is no
        interval (a summary keeps no standard error)."""
        return {
            key: None if getattr(self, key) is None else float(getattr(self, key)) for key in keys
        }

    @classmethod
    def from_json(cls, data: dict) -> Interval:
        """An interval of a summary.json (:meth:`to_json`'s form; other keys, such as a paired
        difference's mdd and p, are left out); a ValueError names a missing bound."""
        missing = [key for key in BOUNDS if key not in data]
        if missing:
            raise ValueError(f"an interval needs {missing[0]!r}, got keys {sorted(data)}")
        return cls(data.get("mean"), None, data["low"], data["high"])

    def points(self, scale: float = 100.0) -> str:
        """``mean [low, high]`` in points (``mean [n/a]`` without an interval, the mean alone for
        identical values)."""
        if self.low is None:
            return f"{self.mean * scale:.1f} [n/a]"
        if self.low == self.high:
            return f"{self.mean * scale:.1f}"
        return f"{self.mean * scale:.1f} [{self.low * scale:.1f}, {self.high * scale:.1f}]"

    def bounds_points(self, scale: float = 100.0) -> str:
        """``[low, high]`` of a difference, signed, in points (``[n/a]`` without an interval)."""
        if self.low is None:
            return "[n/a]"
        return f"[{self.low * scale:+.1f}, {self.high * scale:+.1f}]"

    def difference_points(self, scale: float = 100.0) -> str:
        """``mean [low, high]`` of a difference, signed, in points."""
        return f"{self.mean * scale:+.1f} {self.bounds_points(scale)}"


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


EXACT_FLIPS_MAX_N = 20  # 2^20 sign flips enumerated exactly; above, a seeded Monte-Carlo
MONTE_CARLO_FLIPS = 100_000


def t_p_greater(samples) -> float:
    """One-sided one-sample t-test p of H0: mean ≤ 0 against mean > 0 (identical values, where
    the t statistic is undefined: 0 if they are positive, else 1)."""
    x = np.asarray(samples, dtype=np.float64)
    if np.all(x == x[0]):
        return 0.0 if x[0] > 0 else 1.0
    return float(_scipy_stats.ttest_1samp(x, 0.0, alternative="greater").pvalue)


def sign_flip_p_greater(samples, seed: int = 0) -> tuple[float, str]:
    """One-sided paired permutation p of H0: the values are symmetric about 0, against a mean
    above 0: the share of sign flips ε ∈ {±1}^n whose Σ ε_s·d_s reaches the observed Σ d_s.

    Exact (all 2^n flips, the observed one included) for n ≤ 20; above, a Monte-Carlo of 100 000
    flips from ``seed``, p = (1 + hits) / (1 + flips). Sums within 1e-12 (relative) of the
    observed one count as reaching it (the same sum in another order of additions). Returns p
    and how it was computed. With 8 seeds the smallest exact p is 1/256, whatever the t-test says.
    """
    d = np.asarray(samples, dtype=np.float64)
    n = d.size
    observed = d.sum()
    tol = 1e-12 * max(1.0, float(np.abs(d).sum()))
    if n <= EXACT_FLIPS_MAX_N:
        sums = np.zeros(1)
        for value in d:  # every flip's sum, doubling once per value: 2^n sums, no 2^n × n table
            sums = np.concatenate([sums + value, sums - value])
        return float(np.mean(sums >= observed - tol)), f"exact, all 2^{n} sign flips"
    rng = np.random.default_rng(seed)
    hits = sum(
        int(np.sum(rng.choice([-1.0, 1.0], size=(chunk, n)) @ d >= observed - tol))
        for chunk in [10_000] * (MONTE_CARLO_FLIPS // 10_000)
    )
    method = f"Monte-Carlo, {MONTE_CARLO_FLIPS} sign flips (seed {seed})"
    return (1 + hits) / (1 + MONTE_CARLO_FLIPS), method


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control, in the input order):
    the i-th smallest of m p-values becomes max over j ≤ i of min(1, (m − j + 1)·p_(j))."""
    m = len(pvalues)
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def seed_interval(values: list[float]) -> Interval:
    """The 95% interval over seeds that a summary keeps: low = high = None under 2 seeds (no
    interval), low = high = mean for identical values."""
    if len(values) < 2:
        return Interval(float(np.mean(values)))
    if len(set(values)) < 2:
        mean = float(np.mean(values))
        return Interval(mean, 0.0, mean, mean)
    ci = mean_ci(values)
    return Interval(float(ci.mean), float(ci.se), float(ci.low), float(ci.high))


def format_points(value: float | None) -> str:
    """An accuracy (or MDD) in points, ``—`` when there is none."""
    return "—" if value is None else f"{value * 100:.1f}"


def paired_mdd(differences: list[float]) -> float | None:
    """Minimum detectable difference (95%, power 0.8) of a paired comparison with the spread of
    these per-seed differences and as many seeds (None under 2 seeds)."""
    if len(differences) < 2:
        return None
    return minimum_detectable_difference(paired_difference(differences, 0.0), len(differences))


def paired_stats(differences: list[float]) -> dict:
    """Per-seed paired differences → the JSON form of their 95% interval (:func:`seed_interval`)
    with the MDD and the two-sided p-value of a one-sample t-test against 0 (identical
    differences: 1 if they are all 0, else 0; a single seed: None, like the interval)."""
    if len(differences) < 2:
        p = None
    elif len(set(differences)) > 1:
        p = float(_scipy_stats.ttest_1samp(differences, 0.0).pvalue)
    else:
        p = 1.0 if differences[0] == 0 else 0.0
    return seed_interval(differences).to_json() | {"mdd": paired_mdd(differences), "p": p}


def pooled_mdd(groups: list[list[float]], num_seeds: int) -> float | None:
    """MDD for ``num_seeds`` paired seeds from the pooled seed-to-seed SD of several comparisons'
    per-seed differences (each centred on its own mean)."""
    usable = [g for g in groups if len(g) >= 2]
    if not usable or num_seeds < 2:
        return None
    dof = sum(len(g) - 1 for g in usable)
    sd = math.sqrt(sum(float(np.var(g, ddof=1)) * (len(g) - 1) for g in usable) / dof)
    se = sd / math.sqrt(num_seeds)
    return minimum_detectable_difference(Interval(0.0, se, 0.0, 0.0), num_seeds)
