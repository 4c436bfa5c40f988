"""Reward functions and the fault-tolerant batch scorer."""

import logging
import sys
import time
import types

import numpy as np
import pytest
import torch

import rlkit.rewards as rewards_module
from rlkit.rewards import (
    RewardScorer,
    exact_match_reward,
    get_reward_fn,
    math_verify_reward,
)


def flaky_reward(completion: str, answer: str) -> float:
    """Module level so worker processes can unpickle it; misbehaves on command."""
    if completion == "hang":
        time.sleep(60)
    if completion == "boom":
        raise ZeroDivisionError("boom")
    if completion == "nan":
        return float("nan")
    return exact_match_reward(completion, answer)


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("32", "32", 1.0),
        ("31", "32", 0.0),
        ("  32 \n", "32", 1.0),
        ("32.0", "32", 1.0),
        ("32", "32.0", 1.0),
        ("32.5", "32", 0.0),
        ("-7", "-7", 1.0),
        ("7", "-7", 0.0),
        ("so the total is \\boxed{1,000}.", "1000", 1.0),
        ("3 + 4 = 7, then \\boxed{12} and later 99", "12", 1.0),
        ("work... #### 72", "72", 1.0),
        ("first 5 then 8", "8", 1.0),
        ("first 5 then 8", "5", 0.0),
        ("\\boxed{\\frac{1}{2}}", "\\boxed{\\frac{1}{2}}", 1.0),
        ("\\boxed{x+1}", "x + 1", 0.0),  # exact match is textual for non-numbers
        ("", "0", 0.0),
    ],
)
def test_exact_match_edge_cases(completion, answer, expected):
    assert exact_match_reward(completion, answer) == expected


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("The answer is \\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("The answer is \\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
        ("So $\\boxed{1+x^2}$", "x^2 + 1", 1.0),
        ("\\boxed{72}", "72", 1.0),
        ("no answer here", "72", 0.0),
    ],
)
def test_math_verify_reward(completion, answer, expected):
    assert math_verify_reward(completion, answer) == expected


def test_unknown_reward_name_lists_known_ones():
    assert get_reward_fn("exact_match") is exact_match_reward
    with pytest.raises(ValueError, match="exact_match"):
        get_reward_fn("nope")


def test_in_process_scoring_counts_errors_and_keeps_alignment(caplog):
    scorer = RewardScorer(flaky_reward)
    completions = ["1", "boom", "2", "nan", "9"]
    answers = ["1", "1", "3", "1", "9"]
    with caplog.at_level(logging.WARNING, logger="rlkit.rewards"):
        batch = scorer.score(completions, answers)
    assert batch.rewards.dtype == torch.float32
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert (batch.num_errors, batch.num_timeouts) == (2, 0)
    assert "2 of 5 rewards failed" in caplog.text and "ZeroDivisionError" in caplog.text


def test_clean_batch_logs_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="rlkit.rewards"):
        batch = RewardScorer(flaky_reward).score(["4", "5"], ["4", "4"])
    assert batch.rewards.tolist() == [1.0, 0.0] and batch.num_errors == 0
    assert caplog.text == ""


def test_raise_mode_raises():
    with pytest.raises(RuntimeError, match="1 of 2 rewards failed"):
        RewardScorer(flaky_reward, on_error="raise").score(["1", "boom"], ["1", "1"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="on_error"):
        RewardScorer(on_error="ignore")
    with pytest.raises(ValueError, match="length"):
        RewardScorer().score(["1"], [])


def test_workers_time_out_hung_rewards_and_recover(caplog):
    completions = ["1", "hang", "boom", "2", "3", "4"]
    answers = ["1", "1", "1", "2", "0", "4"]
    with RewardScorer(flaky_reward, num_workers=2, timeout_s=1.0) as scorer:
        with caplog.at_level(logging.WARNING, logger="rlkit.rewards"):
            batch = scorer.score(completions, answers)
        assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
        assert (batch.num_errors, batch.num_timeouts) == (1, 1)
        assert "1 timeouts" in caplog.text
        # the hung worker was replaced: the pool still scores
        again = scorer.score(["5", "6", "7"], ["5", "0", "7"])
        assert again.rewards.tolist() == [1.0, 0.0, 1.0] and again.num_timeouts == 0


def test_workers_raise_mode_on_timeout():
    with RewardScorer(flaky_reward, num_workers=1, timeout_s=0.5, on_error="raise") as scorer:
        with pytest.raises(RuntimeError, match="timeout"):
            scorer.score(["hang"], ["1"])


@pytest.mark.parametrize("noticed", [True, False], ids=["seen-dead", "found-at-send"])
def test_a_worker_that_died_between_batches_is_replaced(monkeypatch, noticed):
    if not noticed:  # it dies after the liveness check: the send finds the broken pipe
        monkeypatch.setattr(rewards_module._Worker, "alive", property(lambda self: True))
    with RewardScorer(flaky_reward, num_workers=2, timeout_s=5.0) as scorer:
        assert scorer.score(["1", "2"], ["1", "2"]).rewards.tolist() == [1.0, 1.0]
        for worker in scorer._workers:  # e.g. both killed by the OS while idle
            worker.process.kill()
            worker.process.join()
        batch = scorer.score(["1", "2", "3"], ["1", "0", "3"])
        assert batch.rewards.tolist() == [1.0, 0.0, 1.0] and batch.num_errors == 0


def test_a_reward_the_workers_cannot_import_is_a_clear_error(monkeypatch):
    # a function defined in a notebook: picklable by name here, unknown to a fresh process
    module = types.ModuleType("notebook_cell_module")
    exec("def my_reward(completion, answer):\n    return 1.0", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with RewardScorer(module.my_reward, num_workers=1) as scorer:
        with pytest.raises(
            RuntimeError,
            match=r"cannot import the reward function notebook_cell_module\.my_reward "
            r"\(ModuleNotFoundError: No module named 'notebook_cell_module'\)",
        ):
            scorer.score(["1"], ["1"])


def test_a_reward_workers_cannot_receive_is_refused_up_front():
    with pytest.raises(ValueError, match="cannot be sent to reward worker processes"):
        RewardScorer(lambda completion, answer: 1.0, num_workers=1)


@pytest.mark.parametrize(
    "value",
    [True, np.bool_(True), torch.tensor(True), np.array(True), torch.tensor([True])],
    ids=["bool", "numpy-bool", "tensor", "array", "tensor-1"],
)
def test_a_bool_of_any_kind_is_a_failure_not_a_score(value):
    batch = RewardScorer(lambda completion, answer: value).score(["1"], ["1"])
    assert batch.rewards.tolist() == [0.0] and batch.num_errors == 1


@pytest.mark.parametrize(
    "value", [np.float64(0.5), torch.tensor(0.5), np.array(0.5)], ids=["numpy", "tensor", "array"]
)
def test_a_number_in_a_tensor_or_array_is_a_score(value):
    assert RewardScorer(lambda completion, answer: value).score(["1"], ["1"]).rewards.tolist() == [
        0.5
    ]
