"""PPO's KL in the reward against the real verl 0.9.1 (`make test-verl`, .venv-verl; docs/algorithms.md
§4c): verl's ``apply_kl_penalty`` (verl/trainer/ppo/ray_trainer.py) and its
``AdaptiveKLController`` (verl/trainer/ppo/core_algos.py) on the same inputs as rlkit's
``token_rewards``, ``reward_kl_metrics`` and ``AdaptiveKLController``."""

from __future__ import annotations

import pytest
import torch
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import apply_kl_penalty

from rlkit.ppo import AdaptiveKLController, reward_kl_metrics, token_rewards

F64 = torch.float64


def batch(lengths, width=7, seed=0):
    """Rows of the given lengths (right-padded to ``width``), k1 log-probs, a score per row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    old = -torch.rand(len(lengths), width, generator=g, dtype=F64)
    ref = -torch.rand(len(lengths), width, generator=g, dtype=F64)
    scores = torch.rand(len(lengths), generator=g, dtype=F64)
    return old, ref, mask, scores


def verl_step(old, ref, mask, scores, beta, target, horizon):
    """verl's reward step: the score on the last real token (its reward managers'
    ``reward_tensor[i, valid_response_length - 1]``), then ``apply_kl_penalty`` with k1."""
    lengths = mask.sum(-1)
    token_scores = torch.zeros_like(old)
    token_scores[torch.arange(len(old)), lengths - 1] = scores
    data = DataProto.from_dict(
        tensors={
            "old_log_probs": old,
            "ref_log_prob": ref,
            "response_mask": mask.to(F64),
            "token_level_scores": token_scores,
        }
    )
    ctl = core_algos.AdaptiveKLController(init_kl_coef=beta, target_kl=target, horizon=horizon)
    data, metrics = apply_kl_penalty(data, ctl, kl_penalty="kl")
    return data.batch["token_level_rewards"], metrics, ctl.value


@pytest.mark.parametrize("lengths", [[7, 3, 1, 5], [4, 4, 4], [1]])
def test_rewards_and_reward_kl_penalty_are_verls(lengths):
    old, ref, mask, scores = batch(lengths)
    rewards, metrics, _ = verl_step(old, ref, mask, scores, beta=0.3, target=0.1, horizon=10000)
    ours = token_rewards(scores, mask, old - ref, 0.3)
    torch.testing.assert_close(ours, rewards, rtol=0, atol=1e-15)
    kl = reward_kl_metrics(old - ref, mask)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(
        float(kl["ppo/reward_kl_penalty"]), rel=1e-7
    )  # verl's row mean divides by (tokens + 1e-8)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.3
    if len(set(lengths)) > 1:  # the token mean over all tokens is another number
        assert float(kl["ppo/kl_token_mean"]) != pytest.approx(
            metrics["actor/reward_kl_penalty"], rel=1e-3
        )


def test_a_verl_kl_target_ports_times_the_completion_length():
    """verl's controller reads the per-token mean KL, rlkit's each row's summed KL: with every
    completion L tokens long, rlkit's controller at target·L moves β exactly as verl's at the
    target (n = the batch's rows in both)."""
    old, ref, mask, scores = batch([5, 5, 5, 5], seed=1)
    for target in (0.01, 0.1, 10.0):  # β rises, then falls
        _, _, verl_beta = verl_step(old, ref, mask, scores, beta=0.2, target=target, horizon=50)
        ours = AdaptiveKLController(0.2, target=target * 5, horizon=50)
        ours.update(float(reward_kl_metrics(old - ref, mask)["objective/kl"]), len(old))
        assert ours.value == pytest.approx(verl_beta, rel=1e-12)
        assert ours.value != 0.2
