"""Skipped passes (issue 12): no reference pass when β = 0, no separate π_old pass when the update is
on-policy. Each skipped pass must leave the losses, gradients and logged metrics (timings aside)
those of the full path (`optim.skip_redundant_passes=false`), up to float rounding.

The paths are compared over one step of a float64 model: over several float32 steps their rounding
differences grow past any fixed tolerance on some CPU or thread count."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_trainer import PatternScorer, make_config

import rlkit.logprobs as logprobs_module
from rlkit.trainer import Trainer

# The model runs in float64, but HF's RMSNorm computes in float32: two paths that feed it
# differently rounded inputs part at float32 precision, far below this after one step.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def run_steps(run_dir, model_dir, overrides, skip: bool, steps: int = 1, monkeypatch=None):
    """``steps`` trainer steps; returns (metrics per step, gradients per optimizer step, trainer,
    number of log-prob passes)."""
    cfg = make_config(
        run_dir,
        model_dir,
        "optim.lr=0.05",
        "model.compute_dtype=float64",
        f"optim.skip_redundant_passes={str(skip).lower()}",
        *overrides,
    )
    trainer = Trainer(cfg)
    trainer.collector.scorer.close()
    trainer.collector.scorer = PatternScorer()
    grads = []
    trainer.update.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append(
            [p.grad.clone() for p in trainer.policy.trainable_parameters()]
        )
    )
    passes = []
    counted = logprobs_module.sequence_logprobs

    def counting(*args, **kwargs):
        passes.append(1)
        return counted(*args, **kwargs)

    monkeypatch.setattr(logprobs_module, "sequence_logprobs", counting)
    try:
        rows = [trainer.step() for _ in range(steps)]
    finally:
        monkeypatch.setattr(logprobs_module, "sequence_logprobs", counted)
        trainer.close()
    return rows, grads, trainer, len(passes)


def assert_same_metrics(full: dict, fast: dict, drop_kl: bool) -> None:
    keys = {k for k in full if not k.startswith("time/")} - ({"kl"} if drop_kl else set())
    assert keys == {k for k in fast if not k.startswith("time/")}
    for key in sorted(keys):
        a, b = float(full[key]), float(fast[key])
        assert math.isclose(a, b, rel_tol=TOLERANCE["rtol"], abs_tol=TOLERANCE["atol"]), (key, a, b)


CASES = {
    # overrides, passes saved per step (each step also has the training forward and the
    # post-step finiteness check; AGPO adds its step-KL pass)
    "grpo-full-weights": ([], 2),
    "agpo-adaptive-clip": (["algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=previous"], 2),
    "micro-batched": (["optim.micro_batch_size=4"], 2),
    "lora": (["model.mode=lora", "model.lora_r=4"], 2),
    "dapo-seq-mean": (["loss.eps_high=0.28", "loss.loss_agg=seq-mean-token-mean"], 2),
    "kl-kept": (["loss.kl_coef=0.05"], 1),  # β > 0: only π_old's pass is skipped
    # AGPO's ε needs every row's entropy before the loss: micro-batches keep π_old's pass
    "agpo-micro-batched": (
        ["algo.estimator=agpo", "agpo.enabled=true", "optim.micro_batch_size=4"],
        1,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_skipped_passes_give_the_full_path_results(tmp_path, tiny_model_dir, monkeypatch, case):
    overrides, saved = CASES[case]
    full_rows, full_grads, _, full_passes = run_steps(
        tmp_path / "full", tiny_model_dir, overrides, skip=False, monkeypatch=monkeypatch
    )
    fast_rows, fast_grads, fast, fast_passes = run_steps(
        tmp_path / "fast", tiny_model_dir, overrides, skip=True, monkeypatch=monkeypatch
    )
    assert full_passes - fast_passes == saved * len(full_rows)
    assert len(full_grads) == len(fast_grads) == len(full_rows)
    for full_step, fast_step in zip(full_grads, fast_grads):
        assert any(g.abs().sum() > 0 for g in full_step)  # the comparison is not vacuous
        for a, b in zip(full_step, fast_step):
            torch.testing.assert_close(b, a, **TOLERANCE)
    for full, row in zip(full_rows, fast_rows):
        assert_same_metrics(full, row, drop_kl=fast.cfg.loss.kl_coef == 0)
    if fast.cfg.loss.kl_coef == 0:
        assert "kl" in full_rows[0] and "kl" not in fast_rows[0]


def test_full_weights_keep_no_reference_copy_when_beta_is_zero(tmp_path, tiny_model_dir):
    without = Trainer(make_config(tmp_path / "a", tiny_model_dir))
    with_kl = Trainer(make_config(tmp_path / "b", tiny_model_dir, "loss.kl_coef=0.1"))
    try:
        assert without.policy._reference_model is None
        with pytest.raises(ValueError, match="no reference copy"):
            with without.policy.reference():
                pass
        assert with_kl.policy._reference_model is not None
    finally:
        without.close()
        with_kl.close()


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim.update_epochs=2"],
        ["optim.mini_batch_size=8"],  # 16 rows: two optimizer steps
        ["model.mode=lora", "model.lora_r=4", "model.lora_dropout=0.1"],  # train ≠ eval forward
        ["optim.skip_redundant_passes=false"],
    ],
)
def test_off_policy_updates_keep_the_old_logprob_pass(tmp_path, tiny_model_dir, overrides):
    trainer = Trainer(make_config(tmp_path, tiny_model_dir, *overrides))
    try:
        assert not trainer.passes.on_policy(16)
    finally:
        trainer.close()


def test_one_epoch_one_mini_batch_is_on_policy(tmp_path, tiny_model_dir):
    trainer = Trainer(make_config(tmp_path, tiny_model_dir, "optim.mini_batch_size=16"))
    try:
        assert trainer.passes.on_policy(16) and not trainer.passes.on_policy(17)
    finally:
        trainer.close()


SHARED_PROMPT_CASES = {
    "grpo-full-weights": [],
    "agpo-adaptive-clip": ["algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=previous"],
    "lora": ["model.mode=lora", "model.lora_r=4"],
    "micro-batched": ["optim.micro_batch_size=4"],  # shuffled rows: groups split across passes
    "every-pass-with-kl": ["optim.skip_redundant_passes=false", "loss.kl_coef=0.05"],
    # checkpointed layers read the prompt from a cache their replay cannot rewrite
    "checkpointed": ["model.gradient_checkpointing=true"],
    "checkpointed-lora": ["model.mode=lora", "model.lora_r=4", "model.gradient_checkpointing=true"],
    "ppo-value-head": ["algo.estimator=ppo"],  # V(s_t) from the shared states
    "dpo-pairs": ["algo.estimator=dpo"],
}


@pytest.mark.parametrize("case", sorted(SHARED_PROMPT_CASES))
def test_shared_prompt_forward_gives_the_unshared_results(
    tmp_path, tiny_model_dir, monkeypatch, case
):
    """`optim.share_prompt_forward` changes how the forward is computed, not what: losses,
    gradients and metrics of a step equal the unshared run's up to float rounding."""
    overrides = SHARED_PROMPT_CASES[case]
    plain_rows, plain_grads, _, plain_passes = run_steps(
        tmp_path / "plain",
        tiny_model_dir,
        [*overrides, "optim.share_prompt_forward=false"],
        skip=True,
        monkeypatch=monkeypatch,
    )
    shared_rows, shared_grads, _, shared_passes = run_steps(
        tmp_path / "shared",
        tiny_model_dir,
        [*overrides, "optim.share_prompt_forward=true"],
        skip=True,
        monkeypatch=monkeypatch,
    )
    assert shared_passes == plain_passes and len(shared_grads) == len(plain_grads) > 0
    for plain_step, shared_step in zip(plain_grads, shared_grads):
        assert any(g.abs().sum() > 0 for g in plain_step)
        for a, b in zip(plain_step, shared_step):
            torch.testing.assert_close(b, a, **TOLERANCE)
    for plain, shared in zip(plain_rows, shared_rows):
        assert_same_metrics(plain, shared, drop_kl=False)


def test_the_default_runs_each_prompt_once_in_training(tmp_path, tiny_model_dir):
    """optim.share_prompt_forward=auto, the default, shares the prompts of a policy that can."""
    trainer = Trainer(make_config(tmp_path, tiny_model_dir))
    assert trainer.cfg.optim.share_prompt_forward == "auto"
    assert trainer.passes.share_prompts is True and trainer.forward.share_prompts is True
    rows_seen = []
    decoder = trainer.policy.model.get_decoder()
    hook = decoder.register_forward_hook(
        lambda m, i, kw, out: rows_seen.append(len(kw["input_ids"])), with_kwargs=True
    )
    try:
        trainer.step()
    finally:
        hook.remove()
        trainer.close()
    prompts, group = trainer.cfg.rollout.num_prompts, trainer.cfg.rollout.group_size
    # after generation: the training forward as a prompt pass over the distinct prompts and a
    # completion pass over every row, then the one-row finiteness check (nothing to share)
    assert rows_seen[-3:] == [prompts, prompts * group, 1]


def test_shared_prompt_forward_gives_each_micro_batch_whole_groups(
    tmp_path, tiny_model_dir, monkeypatch
):
    """Micro-batches of G rows, split from the mini-batch in prompt order: each is one group, so
    each training forward is a one-row prompt pass and a G-row completion pass (drawn in random
    order, a micro-batch would rarely repeat a prompt)."""
    overrides = ("optim.share_prompt_forward=true", "optim.micro_batch_size=4")
    trainer = Trainer(make_config(tmp_path, tiny_model_dir, *overrides))
    group = trainer.cfg.rollout.group_size
    assert group == 4
    calls = []
    decoder = trainer.policy.model.get_decoder()
    hook = decoder.register_forward_hook(
        lambda m, i, kw, out: calls.append(len(kw["input_ids"])), with_kwargs=True
    )
    train = trainer.update.forward.train

    def marked(*args, **kwargs):
        calls.append("micro-batch")
        return train(*args, **kwargs)

    monkeypatch.setattr(trainer.update.forward, "train", marked)
    try:
        trainer.step()
    finally:
        hook.remove()
        trainer.close()
    passes = [calls[i + 1 : i + 3] for i, c in enumerate(calls) if c == "micro-batch"]
    assert len(passes) == trainer.cfg.rollout.num_prompts
    assert all(rows == [1, group] for rows in passes), calls


def test_a_clip_that_cannot_act_is_warned_about(tmp_path, tiny_model_dir):
    """4 prompts × 4 = 16 rows in one mini-batch: clip-higher is named; in 2 mini-batches it acts."""
    with pytest.warns(UserWarning, match=r"loss.eps_high=0.28 \(loss.eps_low=0.2\) cannot act"):
        Trainer(make_config(tmp_path / "one", tiny_model_dir, "loss.eps_high=0.28")).close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        overrides = ("loss.eps_high=0.28", "optim.mini_batch_size=8")
        Trainer(make_config(tmp_path / "two", tiny_model_dir, *overrides)).close()
    assert not [w for w in caught if "cannot act" in str(w.message)]
