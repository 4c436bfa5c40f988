"""Monte-Carlo agreement tests; means with 95% intervals, paired differences and minimum
detectable differences come from :mod:`rlkit.intervals` and are re-exported here; pre-registered
paired tests on per-seed simulation values go through ``rlkit report``'s own
(:func:`judge_paired`)."""

from __future__ import annotations

import numpy as np
from scipy import stats as _scipy_stats

from rlkit.claims import Claim, judge_claims
from rlkit.intervals import Interval, mean_ci, minimum_detectable_difference, paired_difference

__all__ = [
    "Interval",
    "mean_ci",
    "paired_difference",
    "within_standard_errors",
    "binomial_z",
    "bonferroni_z",
    "minimum_detectable_difference",
    "judge_paired",
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


def judge_paired(values: dict, comparisons, family: str) -> list[dict]:
    """Pre-registered superiority tests of paired per-seed values, by ``rlkit report``'s rule
    (:func:`rlkit.claims.judge_claims`), so a notebook's verdicts and a sweep's mean the same.

    ``values``: {arm: {measure: per-seed values [S]}}, seed s of every arm paired (same seed).
    ``comparisons``: (arm, vs, measure, direction, margin) tuples, d_s = arm − vs, direction +1
    (the arm is claimed higher) or −1 (lower), margin the equivalence margin that lets a
    superiority claim read "not reproduced". All of them form one Holm ``family``. Each result
    has ``difference`` (mean and 95% interval), ``mdd``, ``p_t`` and ``p_exact`` (one-sided, in
    the claimed direction; sign flips exact up to 20 seeds), ``p_holm`` and ``verdict``:
    reproduced, contradicted, not reproduced (equivalent within the margin) or inconclusive.
    A compared value that is not finite (a level never reached) is a ValueError naming arm and
    measure; arms and measures no comparison names are not read.
    """
    compared = dict.fromkeys(
        (name, measure) for arm, vs, measure, _, _ in comparisons for name in (arm, vs)
    )
    for name, measure in compared:
        if measure not in values.get(name, {}):
            raise ValueError(f"no per-seed values of {measure!r} for arm {name!r}")
    rows = []
    for arm, measure in compared:
        x = np.asarray(values[arm][measure], dtype=np.float64)
        if not np.isfinite(x).all():
            bad = np.flatnonzero(~np.isfinite(x)).tolist()
            raise ValueError(f"{arm}, {measure}: seeds at {bad} have no finite value")
        by_seed = {str(s): float(v) for s, v in enumerate(x)}
        rows.append({"arm": arm, "metric": measure, "group_size": None, "end_by_seed": by_seed})
    claims = [
        Claim(
            name=f"{arm} − {vs}, {measure}",
            arm=arm,
            vs=vs,
            metric=measure,
            test="superiority",
            direction=direction,
            margin=margin,
            family=family,
        )
        for arm, vs, measure, direction, margin in comparisons
    ]
    return judge_claims({"name": family, "rows": rows}, claims)
