"""rlkit.dapo: dynamic-sampling filter and overlong reward shaping (docs/algorithms.md §4; DAPO eq. 13)."""

import pytest
import reference as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.dapo import informative_groups, overlong_penalty


def test_informative_groups_hand_example():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.6]])
    assert informative_groups(rewards).tolist() == [False, False, True, True]
    assert informative_groups(torch.tensor([[3.0]])).tolist() == [False]  # G = 1: no signal


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=2), min_size=1))
def test_informative_groups_match_reference(groups):
    expected = [len(set(g)) > 1 for g in groups]
    assert informative_groups(torch.tensor(groups)).tolist() == expected


def test_informative_groups_bad_input():
    with pytest.raises(ValueError, match="rank 2"):
        informative_groups(torch.zeros(4))


def test_overlong_penalty_hand_example():
    # L_max 100, buffer 20 → the penalty starts after 80 and falls linearly to −1 at 100:
    # 50 → 0, 80 → 0, 90 → (80 − 90)/20 = −.5, 100 → −1, 101 → −1; factor .5 halves it.
    lengths = torch.tensor([50, 80, 90, 100, 101, 1000])
    assert overlong_penalty(lengths, 100, 20).tolist() == pytest.approx([0, 0, -0.5, -1, -1, -1])
    half = overlong_penalty(lengths, 100, 20, factor=0.5).tolist()
    assert half == pytest.approx([0, 0, -0.25, -0.5, -0.5, -0.5])


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=20),
    max_length=st.integers(1, 200),
    data=st.data(),
    factor=st.floats(0, 3),
)
def test_overlong_penalty_matches_reference(lengths, max_length, data, factor):
    buffer = data.draw(st.integers(1, max_length))
    got = overlong_penalty(torch.tensor(lengths), max_length, buffer, factor).tolist()
    expected = [ref.overlong_penalty(n, max_length, buffer, factor) for n in lengths]
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert all(-factor - 1e-6 <= v <= 0 for v in got)


@pytest.mark.parametrize(
    "max_length, buffer, factor, message",
    [(100, 0, 1.0, "buffer"), (100, 101, 1.0, "buffer"), (100, 20, -1.0, "factor")],
)
def test_overlong_penalty_bad_input(max_length, buffer, factor, message):
    with pytest.raises(ValueError, match=message):
        overlong_penalty(torch.tensor([10]), max_length, buffer, factor)
