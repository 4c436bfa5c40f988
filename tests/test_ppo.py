"""PPO with a value head (docs/algorithms.md §4c): GAE, whitening, the clipped value loss and the
KL controllers against hand-worked examples and float64 references; the trainer end to end."""

from __future__ import annotations

import pytest
import torch

from rlkit.ppo import (
    AdaptiveKLController,
    FixedKLController,
    clipped_value_loss,
    gae,
    reward_kl_metrics,
    token_rewards,
    whiten,
)

F64 = torch.float64


def test_token_rewards_hand_example():
    """−β·KL on every real token, the verifiable reward added on the last one (eq. 4c.1)."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]], dtype=F64)
    out = token_rewards(torch.tensor([1.0, 0.5]), mask, kl, 0.1)
    expected = torch.tensor([[-0.01, -0.02, 0.97], [-0.04, 0.45, 0.0]], dtype=F64)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-15)
    no_kl = token_rewards(torch.tensor([1.0, 0.5]), mask)
    assert no_kl.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]]


def test_reward_kl_metrics_hand_example():
    """Rows of 3 and 1 tokens and an empty row: verl's mean of row means, TRL's mean of row sums
    (the adaptive controller's input) and the token mean are three numbers (§4c, "Logged")."""
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.6, 9.0, 9.0], [9.0, 9.0, 9.0]], dtype=F64)
    out = reward_kl_metrics(kl, mask)
    assert list(out) == ["ppo/reward_kl_penalty", "objective/kl", "ppo/kl_token_mean"]
    assert float(out["ppo/reward_kl_penalty"]) == pytest.approx((0.2 + 0.6 + 0.0) / 3)
    assert float(out["objective/kl"]) == pytest.approx((0.6 + 0.6 + 0.0) / 3)
    assert float(out["ppo/kl_token_mean"]) == pytest.approx(1.2 / 4)
    # equal lengths L: the row-sum mean is L times the row-mean mean (§4c: porting a KL target)
    even = reward_kl_metrics(kl[:1].expand(4, 3), mask[:1].expand(4, 3))
    assert float(even["objective/kl"]) == pytest.approx(3 * float(even["ppo/reward_kl_penalty"]))
    assert float(even["ppo/kl_token_mean"]) == pytest.approx(float(even["ppo/reward_kl_penalty"]))


def test_gae_hand_example():
    """γ = 1, λ = ½. Row 0: δ = (0.1, 0.1, 0.3), A = (0.225, 0.25, 0.3). Row 1 ends at t = 1
    (V = 0 after it, whatever the padding holds): δ = (0, 1), A = (0.5, 1)."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 1.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    torch.testing.assert_close(
        adv, torch.tensor([[0.225, 0.25, 0.3], [0.5, 1.0, 0.0]], dtype=F64), rtol=0, atol=1e-15
    )
    torch.testing.assert_close(
        ret, torch.tensor([[0.725, 0.85, 1.0], [1.5, 2.0, 0.0]], dtype=F64), rtol=0, atol=1e-15
    )


def reference_gae(rewards, values, lengths, gamma, lam):
    """A_t = Σ_l (γλ)^l δ_{t+l} written as the sum, in Python floats (not the recursion)."""
    adv = [[0.0] * len(r) for r in rewards]
    for b, n in enumerate(lengths):
        v = [float(x) for x in values[b][:n]] + [0.0]
        delta = [float(rewards[b][t]) + gamma * v[t + 1] - v[t] for t in range(n)]
        for t in range(n):
            adv[b][t] = sum((gamma * lam) ** k * delta[t + k] for k in range(n - t))
    return torch.tensor(adv, dtype=F64)


def test_gae_matches_float64_reference():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(5, 7, generator=g, dtype=F64)
    values = torch.randn(5, 7, generator=g, dtype=F64)
    lengths = [7, 1, 4, 6, 3]
    mask = torch.arange(7)[None, :] < torch.tensor(lengths)[:, None]
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    expected = reference_gae(rewards.tolist(), values.tolist(), lengths, 0.9, 0.8)
    torch.testing.assert_close(adv, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, (expected + values) * mask, rtol=1e-12, atol=1e-12)


def test_whiten_uses_real_tokens_only():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, -50.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    real = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    expected = (real - real.mean()) / torch.sqrt(real.var() + 1e-8)  # unbiased, as TRL
    out = whiten(x, mask)
    torch.testing.assert_close(out[mask], expected, rtol=0, atol=1e-12)
    assert out[~mask].tolist() == [0.0, 0.0]


def test_clipped_value_loss_hand_example():
    """c = 0.2. Token 0: clip(1.0) = 0.7, max((1−2)², (0.7−2)²) = 1.69 → 0.845, clipped. Token 1:
    clip(0.0) = 0.3, max((0−0.4)², (0.3−0.4)²) = 0.16 → 0.08, not clipped."""
    values = torch.tensor([1.0, 0.0], dtype=F64)
    old = torch.tensor([0.5, 0.5], dtype=F64)
    returns = torch.tensor([2.0, 0.4], dtype=F64)
    loss, clipped = clipped_value_loss(values, old, returns, 0.2)
    torch.testing.assert_close(loss, torch.tensor([0.845, 0.08], dtype=F64), rtol=0, atol=1e-15)
    assert clipped.tolist() == [True, False]


def test_adaptive_kl_hand_example():
    """TRL's AdaptiveKLController: e = clip(KL/6 − 1, ±0.2), β ← β·(1 + e·n/10000)."""
    ctl = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    ctl.update(9.0, 256)  # e = 0.5 → 0.2
    assert ctl.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000), rel=1e-15)
    ctl.update(5.4, 100)  # e = −0.1
    assert ctl.value == pytest.approx(0.201024 * (1 - 0.1 * 100 / 10000), rel=1e-15)
    restored = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value
    fixed = FixedKLController(0.05)
    fixed.update(100.0, 256)
    assert fixed.value == 0.05


# ------------------------------------------------------------------ the trainer, end to end

PPO_KEYS = (
    "loss/value_avg",
    "val/clipfrac_avg",
    "ppo/values_mean",
    "ppo/returns_mean",
    "ppo/advantages_mean",
    "ppo/reward_kl_penalty",
    "objective/kl_coef",
    "objective/kl",
    "ppo/kl_token_mean",
)


def ppo_config(run_dir, model_dir, *overrides):
    from test_trainer import make_config

    return make_config(run_dir, model_dir, "algo.estimator=ppo", *overrides)


def check_ppo_run(run_dir):
    import math

    from rlkit.checkpoint import load_checkpoint
    from rlkit.metrics import read_metrics

    rows = read_metrics(run_dir)
    for row in rows[1:]:
        for key in PPO_KEYS:
            assert row[key] is not None and math.isfinite(row[key]), key
    checkpoint = load_checkpoint(run_dir)
    assert "policy/value_head.safetensors" in json_manifest(checkpoint.path)
    return rows, checkpoint


def json_manifest(path):
    import json

    return json.loads((path / "manifest.json").read_text())["files"]


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_ppo_trains_end_to_end(tmp_path, tiny_model_dir, mode):
    """A few steps with a value head on the backbone: the head trains, is saved beside the
    weights or adapter (in the manifest) and loads back on resume."""
    from rlkit.trainer import Trainer

    cfg = ppo_config(tmp_path, tiny_model_dir, f"model.mode={mode}", "optim.update_epochs=2")
    trainer = Trainer(cfg)
    start = trainer.policy.value_head.weight.detach().clone()
    trainer.train()
    trained = trainer.policy.value_head.weight.detach()
    assert not torch.equal(start, trained)
    check_ppo_run(tmp_path)
    resumed = Trainer(cfg, resume=True)
    assert torch.equal(resumed.policy.value_head.weight.detach(), trained)


def test_qlora_ppo_trains_end_to_end(tmp_path, tiny_4bit_model_dir):
    from rlkit.trainer import Trainer

    cfg = ppo_config(tmp_path, tiny_4bit_model_dir, "model.mode=qlora", "model.lora_r=4")
    trainer = Trainer(cfg)
    trainer.train()
    _, checkpoint = check_ppo_run(tmp_path)
    resumed = Trainer(cfg, resume=True)
    head = trainer.policy.value_head.weight.detach()
    assert torch.equal(resumed.policy.value_head.weight.detach(), head)


def test_adaptive_kl_ppo_resume_continues_the_identical_run(tmp_path, tiny_model_dir):
    """Interrupted after the step-2 checkpoint and resumed: the metrics equal the uninterrupted
    run's, β (logged and checkpointed) included."""
    from test_trainer import CrashAfter, without_timings

    from rlkit.checkpoint import load_checkpoint
    from rlkit.metrics import read_metrics
    from rlkit.trainer import Trainer

    common = (
        "steps=5",
        "checkpoint_every=2",
        "ppo.adaptive_kl=true",
        "ppo.kl_target=0.001",
        "ppo.kl_horizon=20",
        "ppo.kl_coef=0.5",
        "optim.update_epochs=2",
    )
    straight = ppo_config(tmp_path / "straight", tiny_model_dir, *common)
    Trainer(straight).train()
    interrupted = ppo_config(tmp_path / "resumed", tiny_model_dir, *common)
    with pytest.raises(KeyboardInterrupt):
        CrashAfter(interrupted).train()
    saved = load_checkpoint(tmp_path / "resumed").state["kl_ctl"]
    Trainer(interrupted, resume=True).train()
    expected = without_timings(read_metrics(tmp_path / "straight"))
    assert without_timings(read_metrics(tmp_path / "resumed")) == expected
    betas = [r["objective/kl_coef"] for r in expected[1:]]
    assert betas[0] == 0.5 and len(set(betas)) == len(betas)  # β moved every step
    assert saved["value"] == betas[2]  # the β step 3 used, saved after step 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("ppo.gamma=1.5",), "ppo.gamma"),
        (("ppo.vf_coef=0",), "ppo.vf_coef"),
        (("ppo.cliprange_value=-1",), "ppo.cliprange_value"),
        (("ppo.kl_target=3",), "ppo.kl_target"),  # adaptive_kl off: no target
        (("algo.estimator=grpo", "ppo.lam=0.9"), "ppo.lam"),  # not PPO
        (("agpo.enabled=true",), "agpo.enabled"),
        (("parallel.strategy=fsdp2",), "parallel.strategy"),
        (("ppo.bogus=1",), "ppo.bogus"),
    ],
)
def test_ppo_config_errors_name_the_key(tmp_path, tiny_model_dir, overrides, message):
    with pytest.raises(ValueError, match=message):
        ppo_config(tmp_path, tiny_model_dir, *overrides)


def test_ppo_estimator_passes_each_reward_through():
    """PPO's per-row input is the verifiable reward itself (no group baseline), G = 1 allowed."""
    from rlkit.advantages import get_estimator

    rewards = torch.tensor([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
    assert torch.equal(get_estimator("ppo")(rewards).advantages, rewards)
    assert torch.equal(get_estimator("ppo")(rewards[:, :1]).advantages, rewards[:, :1])


def test_per_token_advantages_broadcast_a_per_row_advantage_exactly():
    """A [B] advantage and the same values repeated over the tokens [B, T] give the same loss."""
    from rlkit.losses import clipped_surrogate

    g = torch.Generator().manual_seed(1)
    logp, old = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    adv = torch.randn(3, generator=g)
    per_row, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    per_token, _ = clipped_surrogate(logp, old, adv[:, None].expand(3, 5), 0.2, 0.28)
    assert torch.equal(per_row, per_token)


def test_value_loss_is_a_token_mean_over_the_mini_batch(tmp_path, tiny_model_dir):
    """Four micro-batches of one mini-batch: their shares of the logged value loss add up to the
    token mean of eq. 4c.4 over the whole batch (at the first forward V = V_old: no clipping)."""
    from rlkit.losses import masked_mean
    from rlkit.trainer import Trainer

    cfg = ppo_config(tmp_path, tiny_model_dir, "optim.micro_batch_size=4", "steps=1")
    trainer = Trainer(cfg)
    seen = []
    token_advantages = trainer.method.token_advantages
    trainer.method.token_advantages = lambda batch: seen.append(token_advantages(batch)) or seen[0]
    row = trainer.step()
    batch = seen[0]
    mask = batch.rollouts.completion_mask
    expected = masked_mean(0.5 * (batch.old.values - batch.returns) ** 2, mask)
    assert row["loss/value_avg"] == pytest.approx(float(expected), rel=1e-5)
    assert row["val/clipfrac_avg"] == 0.0
    assert batch.advantages.shape == mask.shape
