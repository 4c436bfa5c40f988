"""EntropyMech's Clip-Cov and KL-Cov (rlkit.losses, docs/algorithms.md §4b): hand-worked examples,
the float64 reference, verl's functions' results (tests/data/entropy_mech_verl.json, computed
once) and the trainer's loss.loss_mode."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import reference as ref
import torch

from rlkit.config import load_config
from rlkit.losses import clip_cov, clipped_surrogate, kl_cov, token_covariance

VERL = json.loads((Path(__file__).parent / "data" / "entropy_mech_verl.json").read_text())


def hand_batch():
    """Two rows of two tokens: A = +1, −1 (mean 0); log π = [−1, −5], [−3, −3] (mean −3), so
    cov = [2, −2], [0, 0]: only token (0, 0) lies in (1, 5)."""
    logp = torch.tensor([[-1.0, -5.0], [-3.0, -3.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    return logp, adv, torch.ones(2, 2, dtype=torch.bool)


def test_token_covariance_hand_example():
    logp, adv, mask = hand_batch()
    cov = token_covariance(adv, logp, mask)
    assert cov.tolist() == [[2.0, -2.0], [0.0, 0.0]]
    mask[1, 1] = False  # padding: −inf, and the means move to the three real tokens
    cov = token_covariance(adv, logp, mask)
    a_bar, l_bar = 1 / 3, -3.0
    assert cov[0, 0].item() == pytest.approx((1 - a_bar) * (-1 - l_bar))
    assert cov[1, 1].item() == -math.inf


def test_clip_cov_hand_example():
    logp, adv, mask = hand_batch()
    loss, stats = clipped_surrogate(logp, logp, adv, 0.2, 0.2, mask)  # ρ = 1: −A
    out, frac = clip_cov(loss, logp, logp, adv, 0.2, 0.2, mask, ratio=2e-4)
    assert out.tolist() == [[0.0, -1.0], [1.0, 1.0]]  # the one candidate's PG term is zeroed
    assert frac.item() == 0.25
    # a token the ratio clip already clipped is not a candidate (verl's clip_by_origin)
    old = logp.clone()
    old[0, 0] -= 1.0  # ρ = e > 1 + ε_high with A > 0
    loss, _ = clipped_surrogate(logp, old, adv, 0.2, 0.2, mask)
    out, frac = clip_cov(loss, logp, old, adv, 0.2, 0.2, mask, ratio=2e-4)
    assert torch.equal(out, loss) and frac.item() == 0.0


def test_kl_cov_hand_example():
    logp, adv, mask = hand_batch()
    old = logp - 0.1  # ρ = e^0.1 everywhere, |log π − log π_old| = 0.1
    out, kl = kl_cov(logp, old, adv, mask, ratio=2e-3, coef=1.0)
    rho = math.exp(0.1)
    expected = [[-rho + 0.1, -rho], [rho, rho]]  # the top-cov token (0, 0) is penalised
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)
    assert kl.item() == pytest.approx(0.1)


def random_tokens(seed: int, rows: int = 5, width: int = 30):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=g)
    mask = torch.arange(width)[None] < lengths[:, None]
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 6
    logp = old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(rows, generator=g, dtype=torch.float64) * 1.5
    return logp, old, adv, mask


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ratio, lb, ub", [(2e-4, 1.0, 5.0), (0.05, 1.0, 5.0), (0.5, 0.2, 3.0)])
def test_clip_cov_matches_reference(seed, ratio, lb, ub):
    logp, old, adv, mask = random_tokens(seed)
    loss, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28, mask)
    torch.manual_seed(seed)
    out, frac = clip_cov(loss, logp, old, adv, 0.2, 0.28, mask, ratio, lb, ub)
    cands = ref.clip_cov_candidates(logp, old, adv, mask, 0.2, 0.28, lb, ub)
    count = max(1, int(ratio * int(mask.sum())))
    torch.manual_seed(seed)  # the same draw: a uniform choice, torch's RNG as verl
    chosen = {cands[i] for i in torch.randperm(len(cands))[:count].tolist()} if cands else set()
    assert len(chosen) == min(count, len(cands))
    for b in range(len(logp)):
        for t in range(logp.shape[1]):
            base = ref.clipped_surrogate_token(
                float(logp[b, t]), float(old[b, t]), float(adv[b]), 0.2, 0.28
            )
            expected = 0.0 if (b, t) in chosen else base
            assert out[b, t].item() == pytest.approx(expected, rel=1e-12, abs=1e-12), (b, t)
    assert frac.item() == pytest.approx(len(chosen) / int(mask.sum()))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ratio, coef", [(2e-3, 1.0), (0.1, 0.5), (1.0, 2.0)])
def test_kl_cov_matches_reference(seed, ratio, coef):
    logp, old, adv, mask = random_tokens(seed)
    out, kl = kl_cov(logp, old, adv, mask, ratio, coef)
    expected = ref.kl_cov_tokens(logp, old, adv, mask, ratio, coef)
    real = mask.numpy()
    np.testing.assert_allclose(out.numpy()[real], expected[real], rtol=1e-12, atol=1e-12)
    d = (logp - old).abs()[mask]
    assert kl.item() == pytest.approx(d.mean().item(), rel=1e-12)


@pytest.mark.parametrize("case", VERL["cases"], ids=lambda c: f"{c['mode']}-{c['options']}")
def test_matches_verl(case):
    logp, old = (torch.tensor(case[k], dtype=torch.float64) for k in ("logp", "old_logp"))
    adv = torch.tensor(case["advantages"], dtype=torch.float64)
    mask = torch.tensor(case["mask"]) > 0
    opts = case["options"]
    if case["mode"] == "clip_cov":
        loss, _ = clipped_surrogate(logp, old, adv, case["eps_low"], case["eps_high"], mask)
        torch.manual_seed(case["torch_seed"])
        out, frac = clip_cov(
            loss, logp, old, adv, case["eps_low"], case["eps_high"], mask,
            opts["clip_cov_ratio"], opts["clip_cov_lb"], opts["clip_cov_ub"],
        )  # fmt: skip
        assert frac.item() == pytest.approx(case["metrics"]["actor/pg_clipfrac"], rel=1e-12)
    else:
        out, kl = kl_cov(logp, old, adv, mask, opts["kl_cov_ratio"], opts["ppo_kl_coef"])
        assert kl.item() == pytest.approx(case["metrics"]["actor/ppo_kl"], rel=1e-12)
    theirs = np.array(case["loss_tokens"])
    real = mask.numpy()
    np.testing.assert_allclose(out.numpy()[real], theirs[real], rtol=1e-12, atol=1e-12)
    token_mean = (out * mask).sum() / mask.sum()
    assert token_mean.item() == pytest.approx(case["loss"], rel=1e-12)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["loss.loss_mode=entropy"], "loss.loss_mode must be one of"),
        (
            ["loss.loss_mode=clip_cov", "loss.clip_cov_ratio=0"],
            r"loss.clip_cov_ratio must be in \(0, 1\]",
        ),
        (
            ["loss.loss_mode=kl_cov", "loss.kl_cov_ratio=2"],
            r"loss.kl_cov_ratio must be in \(0, 1\]",
        ),
        (
            ["loss.loss_mode=clip_cov", "loss.clip_cov_lb=5"],
            "loss.clip_cov_lb .* must be < loss.clip_cov_ub",
        ),
        (["loss.loss_mode=kl_cov", "loss.ppo_kl_coef=-1"], "loss.ppo_kl_coef must be >= 0"),
        (
            ["loss.clip_cov_ratio=0.01"],
            r"loss.clip_cov_ratio=0.01 is read only by the loss clip_cov .*this config's loss is "
            "vanilla",
        ),
        (
            ["loss.loss_mode=clip_cov", "loss.ppo_kl_coef=0.1"],
            "loss.ppo_kl_coef=0.1 is read only by the loss kl_cov",
        ),
        (
            ["loss.loss_mode=kl_cov", "loss.eps_high=0.28"],
            "loss.eps_high=0.28 is read only by the losses vanilla .*this config's loss is kl_cov",
        ),
        (
            ["loss.loss_mode=kl_cov", "algo.estimator=agpo", "agpo.enabled=true"],
            "set agpo.adaptive_clip=false",
        ),
    ],
)
def test_bad_entropy_mech_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny-cpu", overrides)


# ---------------------------------------------------------------------------------------------
# end to end


def informative_run(tmp_path, tiny_model_dir, *overrides, trainer_cls=None, resume=False):
    from test_trainer import PatternScorer, make_config

    from rlkit.trainer import Trainer

    cfg = make_config(tmp_path, tiny_model_dir, *overrides)
    trainer = (trainer_cls or Trainer)(cfg, resume=resume)
    trainer.collector.scorer = PatternScorer()  # groups with a success: A ≠ 0, so cov ≠ 0
    return trainer


@pytest.mark.parametrize(
    "overrides, metric",
    [
        (
            ("loss.loss_mode=clip_cov", "loss.clip_cov_ratio=0.5", "loss.clip_cov_lb=0.0"),
            "clip_cov/pg_clipfrac",
        ),
        (
            ("loss.loss_mode=kl_cov", "loss.kl_cov_ratio=0.1", "optim.update_epochs=2"),
            "kl_cov/ppo_kl",
        ),
    ],
)
def test_loss_modes_train_end_to_end(tmp_path, tiny_model_dir, overrides, metric):
    from rlkit.metrics import read_metrics

    informative_run(tmp_path, tiny_model_dir, *overrides).train()
    rows = read_metrics(tmp_path)[1:]
    assert len(rows) == 2
    for row in rows:
        assert math.isfinite(row["loss"]) and math.isfinite(row[metric])
        assert row[metric] > 0  # tokens were zeroed / the policy moved under the penalty


def test_clip_cov_resume_continues_the_identical_run(tmp_path, tiny_model_dir):
    # Clip-Cov draws from the torch RNG during the update: the checkpoint's RNG state must carry it
    from test_trainer import CrashAfter, without_timings

    from rlkit.metrics import read_metrics

    common = (
        "steps=5",
        "checkpoint_every=2",
        "loss.loss_mode=clip_cov",
        "loss.clip_cov_ratio=0.5",
        "loss.clip_cov_lb=0.0",
    )
    informative_run(tmp_path / "straight", tiny_model_dir, *common).train()
    with pytest.raises(KeyboardInterrupt):
        informative_run(
            tmp_path / "resumed", tiny_model_dir, *common, trainer_cls=CrashAfter
        ).train()
    informative_run(tmp_path / "resumed", tiny_model_dir, *common, resume=True).train()
    expected = without_timings(read_metrics(tmp_path / "straight"))
    assert [r["step"] for r in expected] == [0, 1, 2, 3, 4, 5]
    assert expected[-1]["clip_cov/pg_clipfrac"] > 0
    assert without_timings(read_metrics(tmp_path / "resumed")) == expected
