"""simulations.mad_median: the two MAD medians on 0/1 groups, against hand-worked cases and an
enumeration of every G-subset of one prompt's samples."""

from __future__ import annotations

import math
from itertools import combinations

import pytest

from rlkit.null_groups import subset_success_weights
from simulations.mad_median import compare, convention_rows, format_table


def test_half_success_group_of_four_by_hand():
    # [0, 0, 1, 1]: midpoint median 0.5, |x − 0.5| = ½ everywhere, MAD = 1.4826 · ½.
    # lower median 0, |x − 0| = [0, 0, 1, 1], lower median 0: MAD = 0 → the std √(1/3).
    rows = convention_rows(4)
    assert rows["disp_midpoint"][2].item() == pytest.approx(1.4826 * 0.5, abs=1e-12)
    assert rows["disp_lower"][2].item() == pytest.approx(math.sqrt(1 / 3), abs=1e-12)
    assert not rows["fallback_midpoint"][2] and rows["fallback_lower"][2]
    # A = ±½ / dispersion for every completion
    delta = 0.5 / math.sqrt(1 / 3) - 0.5 / (1.4826 * 0.5)
    assert rows["abs_delta_advantage"][2].item() == pytest.approx(delta, abs=1e-12)
    assert rows["abs_advantage_midpoint"][2].item() == pytest.approx(0.5 / 0.7413, abs=1e-12)


def test_other_groups_of_four_agree():
    rows = convention_rows(4)
    for s in (1, 3):  # one outcome a clear majority: both MADs are 0, both fall back to std ½
        assert rows["disp_midpoint"][s].item() == rows["disp_lower"][s].item() == 0.5
        assert rows["fallback_midpoint"][s] and rows["fallback_lower"][s]
    for s in (0, 4):  # constant: dispersion 0, no fallback, advantage 0 under both
        assert rows["disp_midpoint"][s].item() == rows["disp_lower"][s].item() == 0.0
        assert not rows["fallback_midpoint"][s] and not rows["fallback_lower"][s]
    assert rows["abs_delta_advantage"].tolist() == [
        0.0,
        0.0,
        rows["abs_delta_advantage"][2],
        0.0,
        0.0,
    ]


def test_odd_group_size_never_differs():
    shares = compare([0, 1, 2, 3, 4, 5], 5, (3,))[3]
    assert shares["differ"] == 0.0 and shares["mean_abs_delta_advantage"] == 0.0
    assert math.isnan(shares["mean_abs_delta_advantage_where_differ"])


@pytest.mark.parametrize(("k", "c", "g"), [(6, 3, 4), (8, 4, 4), (8, 3, 8), (16, 7, 8)])
def test_shares_equal_the_enumeration_of_subsets(k, c, g):
    rows = convention_rows(g)
    samples = [1] * c + [0] * (k - c)
    subsets = [sum(s) for s in combinations(samples, g)]
    differ = sum(s == g / 2 for s in subsets) / len(subsets)
    lower_fallback = sum(0 < s < g for s in subsets) / len(subsets)
    delta = sum(rows["abs_delta_advantage"][s].item() for s in subsets) / len(subsets)
    shares = compare([c], k, (g,))[g]
    assert shares["differ"] == pytest.approx(differ, abs=1e-12)
    assert shares["lower_zero_fallback"] == pytest.approx(lower_fallback, abs=1e-12)
    assert shares["midpoint_zero_fallback"] == pytest.approx(lower_fallback - differ, abs=1e-12)
    assert shares["mean_abs_delta_advantage"] == pytest.approx(delta, abs=1e-12)


def test_prompts_are_averaged_and_inputs_checked():
    # two prompts, k = G = 4: one always half-success, one always constant
    shares = compare([2, 0], 4, (4,))[4]
    assert shares["differ"] == 0.5 and shares["lower_zero_fallback"] == 0.5
    assert shares["mean_abs_delta_advantage_where_differ"] == pytest.approx(
        convention_rows(4)["abs_delta_advantage"][2].item(), abs=1e-12
    )
    assert subset_success_weights([1, 3], 4, 2).sum().item() == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="group size 8"):
        subset_success_weights([1], 4, 8)
    with pytest.raises(ValueError, match=r"counts in \[0, 4\]"):
        compare([5], 4, (2,))
    assert "|  4 | 50.0% |" in format_table({4: shares})
