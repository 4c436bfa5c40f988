"""The built-in default end to end: the warm start is mixed, and the tiny-cpu run learns.

This builds the default tiny model (about a minute on 2 cores; cached in ``$RLKIT_CACHE``) and
trains the ``tiny-cpu`` preset with GRPO, the same run as ``rlkit train`` with no arguments.
"""

from __future__ import annotations

import pytest

from rlkit.config import load_config
from rlkit.evaluation import sampled_pass_rates
from rlkit.models.loading import ModelSpec, load_policy
from rlkit.models.tiny import build_tiny_policy
from rlkit.rewards import RewardScorer
from rlkit.tasks.loader import load_problems
from rlkit.trainer import Trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default_model_dir():
    return str(build_tiny_policy(progress=False))


def test_warm_start_has_a_mixed_skill_level(default_model_dir):
    cfg = load_config("tiny-cpu")
    policy = load_policy(ModelSpec(default_model_dir, mode="full"))
    _, eval_problems = load_problems(cfg.task)
    rates = sampled_pass_rates(policy.model, policy.tokenizer, eval_problems, RewardScorer(), k=8)
    assert (rates >= 0.75).float().mean() >= 0.05  # some prompts mostly solved
    assert (rates <= 0.1).float().mean() >= 0.1  # some almost never
    assert ((rates > 0.1) & (rates < 0.75)).float().mean() >= 0.3  # many in between
    assert 0.15 <= rates.mean() <= 0.6


def test_default_grpo_run_beats_the_warm_start(tmp_path, default_model_dir):
    cfg = load_config("tiny-cpu", [f"output_dir={tmp_path}", "progress=false", "tensorboard=false"])
    evals = Trainer(cfg).train()
    start, end = evals[0]["eval/greedy_accuracy"], evals[-1]["eval/greedy_accuracy"]
    assert end >= start + 0.05, f"greedy accuracy {start:.3f} -> {end:.3f}"
