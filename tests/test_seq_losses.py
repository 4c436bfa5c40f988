"""GSPO and CISPO (rlkit.losses.gspo / cispo, ``loss.loss_mode``; docs/algorithms.md §4f): in
float64, the loss and its gradient w.r.t. the log-probs equal TRL 1.16.0's and verl 0.9.1's on
the same inputs (neither is installed: their expressions are transcribed below from their source),
edge cases, the config's checks, and a training run with each."""

import math

import pytest
import torch

from rlkit.config import load_config
from rlkit.losses import LOSS_AGGREGATIONS, aggregate_loss, cispo, gspo

try:  # the real thing where installed; the transcriptions below otherwise
    import trl  # noqa: F401

    HAVE_TRL = True
except ImportError:
    HAVE_TRL = False

MAX_LEN = 7  # the padded completion length, and Dr. GRPO's / verl's max_len


def _masked_sum(x, mask):  # verl.utils.torch_functional.masked_sum
    return (torch.where(mask.bool(), x, 0.0) * mask).sum()


def _masked_mean(x, mask):  # verl.utils.torch_functional.masked_mean
    return _masked_sum(x, mask) / (mask.sum() + 1e-8)


# ---------------------------------------------------------------------------------------------
# verl 0.9.1, verl/trainer/ppo/core_algos.py: agg_loss, compute_policy_loss_gspo,
# compute_policy_loss_cispo (one process: dp_size = 1, global sizes from the batch)


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode == "token-mean":
        return _masked_sum(loss_mat, loss_mask) / loss_mask.sum()
    if loss_agg_mode in ["seq-mean-token-sum", "seq-mean-token-sum-norm"]:
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        loss = _masked_sum(seq_losses, seq_mask) / seq_mask.sum()
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss /= loss_mask.shape[-1]
        return loss
    assert loss_agg_mode == "seq-mean-token-mean"
    seq_mask = torch.sum(loss_mask, dim=-1)
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
    seq_mask = (seq_mask > 0).float()
    return _masked_sum(seq_losses, seq_mask) / seq_mask.sum()


def verl_gspo(old_log_prob, log_prob, advantages, response_mask, agg, clip_low, clip_high):
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = (
        log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    )
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_loss = verl_agg_loss(pg_losses, response_mask, agg)
    pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    return pg_loss, pg_clipfrac


def verl_cispo(old_log_prob, log_prob, advantages, response_mask, agg, clip_low, clip_high):
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    clipped_ratio = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_clipfrac = _masked_mean((ratio != clipped_ratio).float(), response_mask)
    return verl_agg_loss(pg_losses, response_mask, agg), pg_clipfrac


# ---------------------------------------------------------------------------------------------
# TRL 1.16.0, trl/trainer/grpo_trainer.py, GRPOTrainer._compute_loss (β = 0, one process, no
# gradient accumulation: normalizer 1, num_items_in_batch = the batch's real tokens)

TRL_LOSS_TYPE = {  # rlkit's loss.loss_agg → TRL's loss_type with the same normaliser
    "seq-mean-token-mean": "grpo",
    "token-mean": "bnpo",
    "seq-mean-token-sum-norm": "dr_grpo",
}


def trl_loss(per_token_logps, old_per_token_logps, advantages, mask, loss_type, level, eps):
    eps_low, eps_high = eps
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=eps_high).detach()
        per_token_loss = -clamped_ratios * advantages * per_token_logps
    else:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * MAX_LEN)
    assert loss_type == "cispo"  # normalizer: num_items_in_batch, the real tokens
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


# ---------------------------------------------------------------------------------------------


def batch(groups: int, group_size: int, seed: int = 0, equal_rewards=False, empty_row=None):
    """float64 log-probs [B, MAX_LEN] with ratios spread around 1 (some clipped at ε = 0.2,
    per-token and per-sequence), random lengths, Dr. GRPO advantages r − mean_group(r)."""
    g = torch.Generator().manual_seed(seed)
    b = groups * group_size
    logp = -torch.rand(b, MAX_LEN, generator=g, dtype=torch.float64) * 3 - 0.05
    old = logp + torch.randn(b, MAX_LEN, generator=g, dtype=torch.float64) * 0.3
    lengths = torch.randint(1, MAX_LEN + 1, (b,), generator=g)
    lengths[0] = MAX_LEN
    if empty_row is not None:
        lengths[empty_row] = 0
    mask = torch.arange(MAX_LEN)[None, :] < lengths[:, None]
    rewards = torch.randint(0, 2, (groups, group_size), generator=g).to(torch.float64)
    rewards = rewards + torch.rand(groups, group_size, generator=g, dtype=torch.float64)
    if equal_rewards:
        rewards = torch.ones_like(rewards)
    adv = (rewards - rewards.mean(1, keepdim=True)).reshape(-1)
    return logp, old, adv, mask


def value_and_grad(fn, logp, *args):
    logp = logp.clone().requires_grad_(True)
    out = fn(logp, *args)
    loss = out[0] if isinstance(out, tuple) else out
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def rlkit_loss(loss_fn, agg):
    def run(logp, old, adv, mask, eps_low, eps_high):
        tok, stats = loss_fn(logp, old, adv, eps_low, eps_high, mask)
        return aggregate_loss(tok, mask, agg, MAX_LEN), stats

    return run


CASES = {  # name: (groups, group size, batch kwargs)
    "G=4": (3, 4, {}),
    "G=2": (4, 2, {}),
    "G=1": (5, 1, {}),
    "all equal rewards": (2, 4, {"equal_rewards": True}),
    "a fully masked row": (3, 4, {"empty_row": 5}),
}


def assert_close(a, b, atol=1e-14):
    assert torch.allclose(a, b, rtol=1e-12, atol=atol), (a - b).abs().max()


def verl_atol(agg):
    """verl's seq-mean-token-mean divides each row's sum by its length + 1e-8: a relative 1e-8
    of each row's mean (|mean| < 3 here; measured up to 1.1e-9), which the total's
    cancellation does not shrink. Exact otherwise (measured up to 2e-17)."""
    return 1e-8 if agg == "seq-mean-token-mean" else 1e-14


@pytest.mark.parametrize("agg", LOSS_AGGREGATIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_gspo_equals_trl_and_verl(case, agg):
    groups, size, kw = CASES[case]
    logp, old, adv, mask = batch(groups, size, **kw)
    eps = (0.2, 0.28)
    mine, grad = value_and_grad(rlkit_loss(gspo, agg), logp, old, adv, mask, *eps)
    trl_value, trl_grad = value_and_grad(
        lambda lp: trl_loss(lp, old, adv, mask, TRL_LOSS_TYPE[agg], "sequence", eps), logp
    )
    verl_value, verl_grad = value_and_grad(
        lambda lp: verl_gspo(old, lp, adv[:, None], mask.double(), agg, *eps), logp
    )
    assert_close(mine, trl_value)
    assert_close(grad, trl_grad)
    # verl's seq-mean modes average over the rows with a real token, rlkit's and TRL's over all
    rows = mask.any(-1).double().mean() if agg != "token-mean" else 1.0
    assert_close(mine, verl_value * rows, verl_atol(agg))
    assert_close(grad, verl_grad * rows, verl_atol(agg))
    if case in ("G=1", "all equal rewards"):  # A = 0 everywhere: no loss, no gradient
        assert mine == 0 and not grad.any()
    else:
        assert grad.any()


@pytest.mark.parametrize("case", sorted(CASES))
def test_gspo_clips_the_sequence_ratio(case):
    groups, size, kw = CASES[case]
    logp, old, adv, mask = batch(groups, size, **kw)
    _, stats = gspo(logp, old, adv, 0.05, 0.05, mask)
    m = mask.double()
    s = torch.exp(((logp - old) * m).sum(-1) / m.sum(-1).clamp_min(1))  # one ratio a row
    low = ((s < 0.95) & (adv < 0)).double()
    high = ((s > 1.05) & (adv > 0)).double()
    tokens = m.sum(-1)
    assert stats.low.item() == pytest.approx(float((low * tokens).sum() / tokens.sum()))
    assert stats.high.item() == pytest.approx(float((high * tokens).sum() / tokens.sum()))
    _, verl_clipfrac = verl_gspo(old, logp, adv[:, None], m, "token-mean", 0.05, 0.05)
    assert stats.region.item() == pytest.approx(verl_clipfrac.item())
    assert stats.dual == 0
    if case == "G=4":
        assert stats.low > 0 and stats.high > 0  # the inputs exercise both clips


@pytest.mark.parametrize("case", sorted(CASES))
def test_gspo_is_the_sequence_objective(case):
    """The paper's sequence-level objective: J = mean_i min(s_i·A_i, clip(s_i)·A_i), one term a
    sequence."""
    groups, size, kw = CASES[case]
    logp, old, adv, mask = batch(groups, size, **kw)
    m = mask.double()

    def sequence_objective(lp):
        s = torch.exp(((lp - old) * m).sum(-1) / m.sum(-1).clamp_min(1))
        return -torch.minimum(s * adv, s.clamp(0.8, 1.28) * adv).mean()

    mine, grad = value_and_grad(
        rlkit_loss(gspo, "seq-mean-token-mean"), logp, old, adv, mask, 0.2, 0.28
    )
    want, want_grad = value_and_grad(sequence_objective, logp)
    if case == "a fully masked row":  # the empty row's s = 1 counts in J's mean, not here
        want = want + adv[5] / len(adv)
    assert_close(mine, want)
    assert_close(grad, want_grad)


@pytest.mark.parametrize("agg", LOSS_AGGREGATIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_cispo_equals_trl_and_verl(case, agg):
    groups, size, kw = CASES[case]
    logp, old, adv, mask = batch(groups, size, **kw)
    eps_low, eps_high = 0.1, 0.15
    mine, grad = value_and_grad(rlkit_loss(cispo, agg), logp, old, adv, mask, eps_low, eps_high)
    verl_value, verl_grad = value_and_grad(
        lambda lp: verl_cispo(old, lp, adv[:, None], mask.double(), agg, eps_low, eps_high), logp
    )
    rows = mask.any(-1).double().mean() if agg != "token-mean" else 1.0
    assert_close(mine, verl_value * rows, verl_atol(agg))
    assert_close(grad, verl_grad * rows, verl_atol(agg))
    if case in ("G=1", "all equal rewards"):
        assert mine == 0 and not grad.any()
    else:
        assert grad.any()


@pytest.mark.parametrize("case", sorted(CASES))
def test_cispo_equals_trl(case):
    """TRL's cispo clamps the weight above only, at its epsilon_high (ε_max, 5 recommended):
    rlkit's ε_low = 1, ε_high = ε_max − 1; TRL normalises by the real tokens (token-mean)."""
    groups, size, kw = CASES[case]
    logp, old, adv, mask = batch(groups, size, **kw)
    old = old + 0.25  # ratios as low as e^-1.2: a lower clip at 1 − ε_low < 0.3 would bind
    eps_max = 1.2
    mine, grad = value_and_grad(
        rlkit_loss(cispo, "token-mean"), logp, old, adv, mask, 1.0, eps_max - 1
    )
    want, want_grad = value_and_grad(
        lambda lp: trl_loss(lp, old, adv, mask, "cispo", "token", (None, eps_max)), logp
    )
    assert_close(mine, want)
    assert_close(grad, want_grad)
    _, stats = cispo(logp, old, adv, 1.0, eps_max - 1, mask)
    ratio = torch.exp(logp - old)
    assert stats.low == 0
    assert stats.high.item() == pytest.approx(float(ratio[mask].gt(eps_max).double().mean()))


def test_cispo_gradient_is_the_clipped_weight_times_the_advantage():
    """Every token keeps a gradient (no branch switches it off, unlike the PPO clip): with
    token-sum aggregation, ∂L/∂log π_t = −clip(ρ_t)·A."""
    logp, old, adv, mask = batch(3, 4)
    logp = logp.clone().requires_grad_(True)
    tok, stats = cispo(logp, old, adv, 0.2, 0.28, mask)
    (tok * mask).sum().backward()
    weight = torch.exp(logp.detach() - old).clamp(0.8, 1.28)
    assert_close(logp.grad, torch.where(mask, -weight * adv[:, None], 0.0))
    ratio = torch.exp(logp.detach() - old)[mask]
    assert stats.low.item() == pytest.approx(float((ratio < 0.8).double().mean()))
    assert stats.region.item() == pytest.approx(
        float(((ratio < 0.8) | (ratio > 1.28)).double().mean())
    )


@pytest.mark.skipif(not HAVE_TRL, reason="TRL is not installed; the transcription above stands in")
def test_trl_is_the_version_transcribed():
    assert trl.__version__ == "1.16.0"


# ---------------------------------------------------------------------------------------------
# config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["loss.loss_mode=gspo", "loss.dual_clip=3"],
            "loss.dual_clip=3.* this config's loss is gspo",
        ),
        (["loss.loss_mode=cispo", "loss.dual_clip=3"], "loss.dual_clip=3.* config's loss is cispo"),
        (["loss.loss_mode=gspo", "loss.eps_low=1"], "loss.eps_low must be < 1"),
        (["loss.loss_mode=cispo", "loss.eps_low=1.5"], "loss.eps_low must be < 1"),
        (["loss.loss_mode=cispo", "loss.eps_low=-0.1"], "loss.eps_low must be >= 0"),
        (["loss.loss_mode=sequence"], "loss.loss_mode must be one of"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny-cpu", overrides)


def test_cispo_takes_no_lower_bound():
    cfg = load_config("tiny-cpu", ["loss.loss_mode=cispo", "loss.eps_low=1", "loss.eps_high=4"])
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (1.0, 4.0)


# ---------------------------------------------------------------------------------------------
# end to end


@pytest.mark.parametrize("mode", ["gspo", "cispo"])
def test_trains_end_to_end_and_logs_its_clip_metrics(tmp_path, tiny_model_dir, mode):
    from test_entropy_mech import informative_run

    from rlkit.metrics import read_metrics

    # a second epoch moves π_θ off π_old, and a radius this small then clips
    informative_run(
        tmp_path,
        tiny_model_dir,
        f"loss.loss_mode={mode}",
        "optim.update_epochs=2",
        "loss.eps_low=0.001",
        "loss.eps_high=0.001",
    ).train()
    rows = read_metrics(tmp_path)[1:]
    assert len(rows) == 2
    for row in rows:
        assert math.isfinite(row["loss"]) and row["update/optimizer_steps"] == 2
        for key in ("low", "high", "region"):
            assert 0 <= row[f"clip_ratio/{key}_mean"] <= 1
        assert row["clip_ratio/region_mean"] > 0
