"""Null-group shares: the subset formula against enumeration, and a measurement on a tiny model."""

from __future__ import annotations

from itertools import combinations

import pytest

from rlkit.config import load_config
from rlkit.null_groups import format_table, measure, null_group_shares


@pytest.mark.parametrize(("k", "c", "g"), [(6, 2, 3), (6, 0, 2), (6, 6, 4), (5, 3, 1)])
def test_shares_equal_the_fraction_of_identical_subsets(k, c, g):
    rewards = [1] * c + [0] * (k - c)
    subsets = list(combinations(rewards, g))
    fail = sum(not any(s) for s in subsets) / len(subsets)
    win = sum(all(s) for s in subsets) / len(subsets)
    share = null_group_shares([c], k, [g])[g]
    assert share["all_fail"] == pytest.approx(fail) and share["all_pass"] == pytest.approx(win)
    assert share["null"] == pytest.approx(fail + win)


def test_shares_average_over_prompts_and_check_input():
    shares = null_group_shares([0, 4], 4, [2, 4])
    assert shares[4] == {"all_fail": 0.5, "all_pass": 0.5, "null": 1.0}
    with pytest.raises(ValueError, match="group size 8"):
        null_group_shares([1], 4, [8])
    with pytest.raises(ValueError, match=r"counts in \[0, 4\]"):
        null_group_shares([5], 4, [2])


def test_measure_on_the_tiny_fixture(tmp_path, tiny_model_dir):
    cfg = load_config(
        "tiny-cpu",
        [f"model.name_or_path={tiny_model_dir}", f"output_dir={tmp_path}", "task.num_train=64"],
    )
    shares = measure(cfg, (2, 4), num_prompts=8)
    assert list(shares) == [2, 4]
    assert 0 <= shares[4]["all_fail"] <= shares[2]["all_fail"] <= 1  # fewer with larger G
    assert not any(tmp_path.iterdir())  # read-only: nothing written to the run directory
    assert "|  4 |" in format_table(shares)
