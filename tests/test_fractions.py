"""Fraction answers (``a/b``, negative too) are read, scored and voted on as one number
(docs/algorithms.md §3 step 1, "Answer keys")."""

import math
import re

import pytest

from rlkit.answers import extract_answer, normalize_answer, numeric_value, vote_entropy
from rlkit.rewards import exact_match_reward
from rlkit.tasks.arithmetic import ArithmeticTask


@pytest.mark.parametrize(
    "text, key",
    [
        ("the answer is 3/4", "3/4"),  # was "4": the denominator alone
        ("The answer is -3/4.", "-3/4"),
        ("first 1/2, then 3/4", "3/4"),
        ("halve it: 1.5/2", "1.5/2"),
        ("x = 3/0", "3/0"),  # a zero denominator is still what the completion wrote
        ("#### 3 / 4", "3/4"),  # a delimited answer may space its slash
        (r"\boxed{ -6 / 8 }", "-6/8"),
        ("3 / 4", "4"),  # in free text a spaced slash is prose: the last number wins
        ("12/25/2024", "2024"),
        ("it costs 1,000 dollars", "1000"),  # integers and separators as before
    ],
)
def test_fraction_is_one_answer_key(text, key):
    assert extract_answer(text) == key


def test_numeric_value_of_keys():
    assert numeric_value("3/4") == numeric_value("6/8") == numeric_value("0.75") == 0.75
    assert numeric_value("-3/4") == -0.75
    assert numeric_value("1/3") == 1 / 3
    assert numeric_value("32") == 32.0
    assert numeric_value("3/0") is None  # no number: compared as text
    assert numeric_value("1" * 400 + "/1") is None  # beyond a float
    assert numeric_value("x/4") is None
    assert normalize_answer(" -3 / 4. ") == "-3/4"


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("The answer is 1/4", "4", 0.0),  # scored 1.0 when only the "4" was read
        ("The answer is 3/4", "3/4", 1.0),  # scored 0.0
        ("The answer is 6/8", "3/4", 1.0),  # numbers compare by value, as 32.0 matches 32
        ("The answer is 0.75", "3/4", 1.0),
        ("The answer is 3/4", "0.75", 1.0),
        ("The answer is -3/4", "3/4", 0.0),
        ("The answer is -3/4", "-0.75", 1.0),
        ("so \\boxed{3 / 4}", "3/4", 1.0),
        ("The answer is 1/3", "0.33", 0.0),
        ("The answer is 3/0", "0", 0.0),
        ("The answer is 3/0", "3/0", 1.0),  # textual, as for any non-number
    ],
)
def test_exact_match_on_fractions(completion, answer, expected):
    assert exact_match_reward(completion, answer) == expected


def test_vote_entropy_keeps_distinct_fractions_apart():
    groups = [
        ["the answer is 1/4", "the answer is 3/4"],  # was one key "4": entropy 0
        ["-3/4", "3/4"],
        ["3/4", "#### 3 / 4"],  # the same key
        ["3/4", "6/8"],  # keys are text, like "32" and "32.0"
    ]
    h = vote_entropy(groups).tolist()
    assert h == pytest.approx([math.log(2), math.log(2), 0.0, math.log(2)], abs=1e-6)


def authors_free_text_key(text: str) -> str:
    """The last-number branch of ``CustomAGPOTrainer._extract_vote_key`` of
    github.com/wandugu/paper_agpo at commit 11e5596 (src/llamafactory/train/agpo/trainer.py)."""
    numbers = re.findall(r"[-+]?\d*\.?\d+(?:/[1-9]\d*)?", text.strip().replace(",", ""))
    return numbers[-1].strip().lower()


def test_a_decimal_denominator_is_one_key_where_the_authors_key_its_tail():
    """docs/algorithms.md §3, "Vote keys": the authors' pattern reads "3/4.5" as "3/4" then
    ".5", so 3/4.5, 1/2.5 and 7/8.5 are one vote (".5") there; rlkit keeps three."""
    texts = ["the answer is 3/4.5", "the answer is 1/2.5", "the answer is 7/8.5"]
    assert [authors_free_text_key(t) for t in texts] == [".5", ".5", ".5"]
    assert [extract_answer(t) for t in texts] == ["3/4.5", "1/2.5", "7/8.5"]
    assert vote_entropy([texts]).tolist() == pytest.approx([math.log(3)], abs=1e-6)
    assert numeric_value("3/4.5") == pytest.approx(2 / 3)


def test_builtin_task_has_no_fractions():
    """The default task's scoring is unchanged: its completions cannot contain a slash, and
    its references are integers."""
    task = ArithmeticTask(train_size=64, eval_size=64)
    assert "/" not in task.alphabet
    for problem in task.problems("train") + task.problems("eval"):
        assert extract_answer(problem.answer) == problem.answer == str(int(problem.answer))
