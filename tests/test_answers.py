"""rlkit.answers: answer-key extraction and vote entropy (docs/algorithms.md §3 step 1)."""

import math
import random

import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.answers import extract_answer, last_boxed, normalize_answer, vote_entropy


@pytest.mark.parametrize(
    "text, key",
    [
        # 1. the last \boxed{…} wins over everything else, nested braces kept intact
        (r"so \boxed{\frac{1}{2}}. #### 7 and 9", r"\frac{1}{2}"),
        (r"first \boxed{3}, then \boxed{ 4 }", "4"),
        (r"\boxed{\sqrt{2}^{3}}", r"\sqrt{2}^{3}"),
        (r"\boxed{ X  Y }", "x y"),
        # 2. else the text after the last ####
        ("3 apples #### 5", "5"),
        ("#### 1 #### 1,234", "1234"),
        ("#### Paris.", "paris"),
        # 3. else the last number (signs, decimals, thousands separators)
        ("so x = 3 and y = 4.5", "4.5"),
        ("It costs 1,000 dollars, not 20.", "20"),
        ("the result is -3.", "-3"),
        ("a total of 12,345", "12345"),
        # an unbalanced \boxed{ is no boxed answer: fall through to the last number
        (r"\boxed{12", "12"),
        # 4. else the normalised whole text
        ("  Forty   Two. ", "forty two"),
        ("", ""),
    ],
)
def test_extract_answer_precedence(text, key):
    assert extract_answer(text) == key


def test_last_boxed_and_normalize():
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{a{b}c}") == "a{b}c"
    assert normalize_answer(" 1,234. ") == "1234"
    assert normalize_answer("A,B") == "a,b"  # commas are only dropped from numbers


def test_vote_entropy_hand_examples():
    groups = [
        ["1", "1", "1", "1"],  # one answer → 0
        ["1", "2", "3", "4"],  # all different → ln 4
        ["1", "1", "2", "2"],  # two halves → ln 2
        ["1", "1", "1", "2"],  # −(.75 ln .75 + .25 ln .25)
        [r"\boxed{2}", "#### 2", "the answer is 2", "2."],  # same key after extraction → 0
    ]
    expected = [0.0, math.log(4), math.log(2), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]
    assert vote_entropy(groups).tolist() == pytest.approx(expected + [0.0], abs=1e-6)


def test_vote_entropy_matches_reference_on_random_groups():
    rng = random.Random(0)
    groups = [
        [str(rng.randint(0, rng.choice([1, 3, 10]))) for _ in range(rng.choice([1, 2, 8, 16]))]
        for _ in range(200)
    ]
    expected = [ref.vote_entropy(g) for g in groups]
    assert vote_entropy(groups).tolist() == pytest.approx(expected, abs=1e-6)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(["1", "2", "x", "#### 2", "7.5"]), min_size=1, max_size=8))
)
def test_vote_entropy_is_between_zero_and_log_g(groups):
    h = vote_entropy(groups)
    assert h.shape == (len(groups),)
    for value, group in zip(h.tolist(), groups):
        assert -1e-6 <= value <= math.log(len(group)) + 1e-6
