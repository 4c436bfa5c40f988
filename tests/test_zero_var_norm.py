"""loss.exclude_zero_var_from_norm (docs/algorithms.md §4, Aggregation; TRL issue #6367): the
tokens (rows) of groups whose rewards are all equal leave the loss's normaliser; off by default."""

import pytest
import torch

from rlkit.config import load_config


def first_step(tmp_path, tiny_model_dir, *overrides):
    """One step on PatternScorer's rewards (half the groups all 0) over four micro-batches;
    the logged loss, and the batch and groups it trained on. One mini-batch, one epoch: the
    update runs at π_θ = π_old, so each token's loss is −A."""
    from test_entropy_mech import informative_run

    trainer = informative_run(
        tmp_path, tiny_model_dir, "steps=1", "optim.micro_batch_size=4", *overrides
    )
    seen = []
    train_batch = trainer.train_batch
    trainer.train_batch = lambda groups, *a: (
        seen.append((groups, train_batch(groups, *a))) or (seen[-1][1])
    )
    row = trainer.step()
    return row["loss"], *seen[0]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("on", [False, True])
def test_the_normaliser_counts_only_groups_whose_rewards_differ(tmp_path, tiny_model_dir, agg, on):
    loss, groups, batch = first_step(
        tmp_path,
        tiny_model_dir,
        f"loss.loss_agg={agg}",
        f"loss.exclude_zero_var_from_norm={str(on).lower()}",
    )
    g = groups.group_size
    informative = (groups.rewards.amax(1) != groups.rewards.amin(1)).repeat_interleave(g)
    assert 0 < informative.sum() < len(informative)  # both kinds of group in the batch
    assert (batch.norm_rows is not None) == on
    if on:
        assert torch.equal(batch.norm_rows.cpu(), informative)
    mask = batch.rollouts.completion_mask.cpu().double()
    adv = batch.advantages.cpu().double()
    assert not adv[~informative].any()  # GRPO: no signal in a zero-variance group
    per_token = -adv[:, None] * mask
    kept = informative if on else torch.ones_like(informative)
    if agg == "token-mean":  # Σ over the counted tokens / their number
        expected = per_token[kept].sum() / mask[kept].sum()
    else:  # Σ over the counted rows of their token means / their number
        expected = (per_token.sum(1) / mask.sum(1).clamp_min(1))[kept].sum() / kept.sum()
    assert loss == pytest.approx(float(expected), rel=1e-5, abs=1e-7)


def test_refused_with_ppo_and_named_with_dpo():
    with pytest.raises(
        ValueError, match="algo.method=ppo with loss.exclude_zero_var_from_norm=true"
    ):
        load_config("tiny-cpu", ["algo.method=ppo", "loss.exclude_zero_var_from_norm=true"])
    with pytest.raises(ValueError, match="loss.exclude_zero_var_from_norm=True has no effect"):
        load_config("tiny-cpu", ["algo.method=dpo", "loss.exclude_zero_var_from_norm=true"])
    with pytest.raises(ValueError, match="loss.exclude_zero_var_from_norm must be true or false"):
        load_config("tiny-cpu", ["loss.exclude_zero_var_from_norm=maybe"])
