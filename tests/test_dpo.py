"""DPO on the policy's own rollouts (docs/algorithms.md §4d): the preference loss against a
hand-worked example and a float64 reference, pair construction and its counts, the trainer end to
end online and offline (the CLI too), exact resume, and the refused settings."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.dpo import build_pairs, pair_roles
from rlkit.losses.dpo import DPO_METRICS, dpo_loss

F64 = torch.float64
TINY = "model.name_or_path=builtin:tiny"  # the warm-started policy: groups with mixed rewards


def test_dpo_loss_hand_example():
    """β = ½: chosen log-ratio −1 − (−2) = 1, rejected −3 − (−2) = −1, so the implicit rewards
    are ½ and −½, the margin 1 and the loss −log σ(1) = log(1 + e⁻¹)."""
    loss, chosen, rejected = dpo_loss(
        torch.tensor([-1.0], dtype=F64),
        torch.tensor([-3.0], dtype=F64),
        torch.tensor([-2.0], dtype=F64),
        torch.tensor([-2.0], dtype=F64),
        0.5,
    )
    assert chosen.item() == 0.5 and rejected.item() == -0.5
    assert loss.item() == pytest.approx(0.31326168751822286, rel=1e-15)


def test_dpo_loss_matches_float64_reference():
    """Eq. 4d.1 written out in Python floats, log(1 + exp(−z)), on random pairs; its gradient
    w.r.t. log π_θ(y_w) is −β·σ(−z), the rejected one's +β·σ(−z)."""
    g = torch.Generator().manual_seed(0)
    pw, pl, rw, rl = (torch.randn(7, generator=g, dtype=F64) * 5 for _ in range(4))
    pw.requires_grad_(True)
    pl.requires_grad_(True)
    beta = 0.3
    loss, chosen, rejected = dpo_loss(pw, pl, rw, rl, beta)
    loss.sum().backward()
    for k in range(7):
        z = beta * ((pw[k].item() - rw[k].item()) - (pl[k].item() - rl[k].item()))
        assert loss[k].item() == pytest.approx(math.log1p(math.exp(-z)), rel=1e-12)
        assert chosen[k].item() - rejected[k].item() == pytest.approx(z, rel=1e-12)
        sigma = 1.0 / (1.0 + math.exp(z))
        assert pw.grad[k].item() == pytest.approx(-beta * sigma, rel=1e-12)
        assert pl.grad[k].item() == pytest.approx(beta * sigma, rel=1e-12)


def test_pairs_hand_example():
    """G = 4, rows prompt-major. Prompt 0 (1, 0, 1, 0): (0, 3) and (2, 1); prompts 1 and 2 all
    equal: none; prompt 3 (1, 0, 0, 0): one pair (12, 15); prompt 4 (½, 1, 0, ½): sorted 17, 16,
    19, 18, so (17, 18), and ½ vs ½ is no pair."""
    rewards = torch.tensor(
        [[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0.5, 1, 0, 0.5]]
    )
    pairs = build_pairs(rewards)
    assert pairs.chosen.tolist() == [0, 2, 12, 17]
    assert pairs.rejected.tolist() == [3, 1, 15, 18]
    assert pairs.prompts_without_pair == 2
    roles = pair_roles(rewards).flatten()
    assert roles[pairs.chosen].eq(1).all() and roles[pairs.rejected].eq(-1).all()
    assert int(roles.ne(0).sum()) == 8


@pytest.mark.parametrize("group_size", [1, 2, 5, 8])
def test_pairs_are_disjoint_correct_incorrect_of_one_prompt(group_size):
    """0/1 rewards: min(#correct, #incorrect) disjoint pairs per prompt, each of a correct and an
    incorrect completion of the same prompt; every prompt without one is counted."""
    g = torch.Generator().manual_seed(group_size)
    rewards = (torch.rand(50, group_size, generator=g) < 0.4).float()
    pairs = build_pairs(rewards)
    flat = rewards.flatten()
    assert (flat[pairs.chosen] == 1).all() and (flat[pairs.rejected] == 0).all()
    assert torch.equal(pairs.chosen // group_size, pairs.rejected // group_size)
    rows = torch.cat([pairs.chosen, pairs.rejected])
    assert len(rows.unique()) == len(rows)
    correct = rewards.sum(1)
    expected = torch.minimum(correct, group_size - correct)
    assert len(pairs) == int(expected.sum())
    assert pairs.prompts_without_pair == int((expected == 0).sum())


def test_dpo_estimator_gives_pair_roles():
    from rlkit.advantages import get_estimator

    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    out = get_estimator("dpo")(rewards).advantages
    assert out.tolist() == [[1.0, 0.0, -1.0], [0.0, 0.0, 0.0]]


# ------------------------------------------------------------------ the trainer, end to end


def dpo_config(run_dir, model_dir, *overrides):
    from test_trainer import make_config

    return make_config(run_dir, model_dir, "algo.estimator=dpo", *overrides)


def check_pair_counts(rows, num_prompts):
    for row in rows[1:]:
        for key in DPO_METRICS:
            assert row[key] is not None and math.isfinite(row[key]), key
        assert row["dpo/pairs"] >= 1
        # the prompts without a pair are exactly the groups of equal rewards
        assert row["dpo/prompts_without_pair"] == round(row["frac_reward_zero_std"] * num_prompts)


def test_online_dpo_trains_from_the_cli(tmp_path):
    """``rlkit train algo.estimator=dpo``: the first step's loss is log 2 (π_θ = π_ref there),
    its implicit rewards 0; every step generates; the prompts without a pair are counted."""
    from rlkit.cli import main
    from rlkit.metrics import read_metrics

    overrides = [
        f"output_dir={tmp_path}",
        TINY,
        "algo.estimator=dpo",
        "dpo.beta=0.2",
        "steps=3",
        "rollout.num_prompts=8",
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "task.num_train=64",
        "task.num_eval=8",
        "eval.num_problems=8",
        "eval.k=2",
        "checkpoint_every=0",
        "tensorboard=false",
        "progress=false",
    ]
    assert main(["train", *overrides]) == 0
    rows = read_metrics(tmp_path)
    check_pair_counts(rows, 8)
    first = rows[1]
    assert first["loss"] == pytest.approx(math.log(2), rel=1e-6)
    # π_θ = π_ref at the first update: 0 up to float32 rounding (3.5e-8 at two threads under
    # the portable kernels, where the policy's and the reference's passes split their work apart)
    assert abs(first["rewards/chosen"]) < 1e-6 and abs(first["rewards/margins"]) < 1e-6
    assert all(r["dpo/beta"] == 0.2 and r["dpo/replayed"] == 0.0 for r in rows[1:])
    generated = [r["tokens/generated"] for r in rows[1:]]
    assert generated[0] < generated[1] < generated[2]


def test_offline_dpo_collects_once_from_the_starting_policy(tmp_path):
    """Offline: the first step draws ``offline_batches`` batches from the starting policy (its
    own prompts and the next ones) and counts all their tokens; later steps generate nothing and
    train on the stored batches in turn (step 3 on step 1's again, with two)."""
    from rlkit.metrics import read_metrics
    from rlkit.trainer import Trainer

    overrides = ("dpo.mode=offline", "dpo.offline_batches=2", "steps=3")
    trainer = Trainer(dpo_config(tmp_path, "unused", TINY, *overrides))
    trainer.train()
    rows = read_metrics(tmp_path)
    check_pair_counts(rows, 4)
    steps = rows[1:]
    stored = trainer.method.stored
    assert len(stored) == 2 and [g.rollouts.input_ids.device.type for g in stored] == ["cpu"] * 2
    collected = sum(int(g.rollouts.lengths.sum()) for g in stored)
    assert [r["tokens/generated"] for r in steps] == [collected] * 3
    assert [r["dpo/replayed"] for r in steps] == [0.0, 1.0, 1.0]
    for key in ("reward", "dpo/pairs", "dpo/prompts_without_pair", "completions/mean_length"):
        assert steps[2][key] == steps[0][key], key
    first = [p.id for p in stored[0].problems]
    assert first != [p.id for p in stored[1].problems]
    # π_θ = π_ref at the first update: its margins are 0 up to float32 rounding (the policy's
    # and the reference's passes run other batch shapes: 2.4e-8 under the portable kernels)
    assert abs(steps[0]["rewards/margins"]) < 1e-6 and steps[2]["rewards/margins"] > 1e-3


def test_offline_dpo_collects_one_batch_per_step_by_default(tmp_path):
    """``dpo.offline_batches=0`` (the default): one batch per training step, so the offline run
    draws the prompts an online run trains on and generates as many completions, all from the
    starting policy at the first step."""
    from rlkit.trainer import Trainer

    trainer = Trainer(dpo_config(tmp_path, "unused", TINY, "dpo.mode=offline", "steps=3"))
    trainer.step()
    assert len(trainer.method.stored) == 3


def test_lora_dpo_references_the_disabled_adapter(tmp_path):
    """LoRA: π_ref is the policy with its adapter disabled, i.e. the starting policy (B = 0):
    the first update's loss is log 2, and after it the implicit rewards β(log π_θ − log π_ref)
    are no longer 0 (a reference that followed the adapter would keep them at 0)."""
    from rlkit.metrics import read_metrics
    from rlkit.trainer import Trainer

    trainer = Trainer(dpo_config(tmp_path, "unused", TINY, "model.mode=lora", "optim.lr=1e-3"))
    assert trainer.passes.reference
    trainer.train()
    rows = read_metrics(tmp_path)
    check_pair_counts(rows, 4)
    assert rows[1]["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert rows[1]["rewards/chosen"] == 0.0
    assert rows[2]["rewards/chosen"] != 0.0 and rows[2]["rewards/rejected"] != 0.0


def test_a_step_without_pairs_logs_and_does_not_update(tmp_path, tiny_model_dir):
    """The random tiny model scores 0 everywhere: no pairs, every prompt counted, no optimizer
    step, the weights unchanged, the pair statistics NaN (logged as null)."""
    from rlkit.metrics import read_metrics
    from rlkit.trainer import Trainer

    trainer = Trainer(dpo_config(tmp_path, tiny_model_dir, "steps=1"))
    start = [p.detach().clone() for p in trainer.policy.trainable_parameters()]
    trainer.train()
    row = read_metrics(tmp_path)[1]
    assert row["dpo/pairs"] == 0 and row["dpo/prompts_without_pair"] == 4
    assert row["update/optimizer_steps"] == 0
    assert all(row[key] is None for key in ("loss", *DPO_METRICS, "grad_norm"))
    trained = trainer.policy.trainable_parameters()
    assert all(torch.equal(a, b.detach()) for a, b in zip(start, trained, strict=True))


def test_update_log_probs_are_the_completions_summed_tokens(tmp_path):
    """One step, micro-batches of one pair: logps/chosen and logps/rejected are the mean summed
    log-probs of the pairs' rows, computed apart with sequence_logprobs on the starting policy."""
    from rlkit.logprobs import sequence_logprobs
    from rlkit.trainer import Trainer

    trainer = Trainer(dpo_config(tmp_path, "unused", TINY, "optim.micro_batch_size=2"))
    seen = []
    train = trainer.method.train
    trainer.method.train = lambda update, batch, *rest: (
        seen.append(batch) or train(update, batch, *rest)
    )
    row = trainer.step()
    batch, pairs = seen[0], trainer.method.pairs
    # the update moved the weights: recompute on the reference (the starting policy)
    with torch.no_grad(), trainer.policy.reference() as ref:
        logp, _ = sequence_logprobs(ref, batch.rollouts, batch.ratio_temps)
    seq = (logp.double() * batch.rollouts.completion_mask).sum(-1)
    assert row["logps/chosen"] == pytest.approx(float(seq[pairs.chosen].mean()), rel=1e-5)
    assert row["logps/rejected"] == pytest.approx(float(seq[pairs.rejected].mean()), rel=1e-5)
    assert row["update/optimizer_steps"] == 1


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_dpo_resume_continues_the_identical_run(tmp_path, mode):
    """Interrupted after the step-2 checkpoint and resumed: the metrics equal the uninterrupted
    run's exactly; offline, the checkpoint holds the groups collected at the first step."""
    from test_trainer import CrashAfter, without_timings

    from rlkit.checkpoint import load_checkpoint
    from rlkit.metrics import read_metrics
    from rlkit.trainer import Trainer

    common = (TINY, f"dpo.mode={mode}", "steps=5", "checkpoint_every=2", "optim.update_epochs=2")
    straight = dpo_config(tmp_path / "straight", "unused", *common)
    Trainer(straight).train()
    interrupted = dpo_config(tmp_path / "resumed", "unused", *common)
    with pytest.raises(KeyboardInterrupt):
        CrashAfter(interrupted).train()
    saved = load_checkpoint(tmp_path / "resumed").state["dpo_groups"]
    assert len(saved) == (5 if mode == "offline" else 0)
    Trainer(interrupted, resume=True).train()
    expected = without_timings(read_metrics(tmp_path / "straight"))
    assert without_timings(read_metrics(tmp_path / "resumed")) == expected


def test_offline_dpo_checkpoint_without_its_collected_set_is_refused(tmp_path):
    """An offline set emptied in the checkpoint (manifest rehashed) would be collected again
    from the current policy and logged as replayed: refused on load."""
    from test_faults import tamper_state

    from rlkit.trainer import Trainer

    Trainer(dpo_config(tmp_path, "unused", TINY, "dpo.mode=offline", "steps=2")).train()
    step_dir = tamper_state(tmp_path, lambda state: state["dpo_groups"].clear())
    resumed = dpo_config(tmp_path, "unused", TINY, "dpo.mode=offline", "steps=3")
    with pytest.raises(ValueError) as err:
        Trainer(resumed, resume=True)
    assert str(err.value) == (
        f"{step_dir / 'trainer_state.pt'} is inconsistent: dpo.mode=offline collects its set at "
        "the first step and keeps it, but this checkpoint of step 2 holds 0 collected batches "
        "after 2 draws"
    )


def test_dpo_runs_no_old_pass_unless_entropy_is_logged(tmp_path, tiny_model_dir):
    """DPO's loss reads π_ref, not π_old: with two epochs π_old's pass runs only for the
    logged entropy."""
    from rlkit.methods import build_method
    from rlkit.pass_plan import PassPlan

    for log_entropy, on_policy in ((False, True), (True, False)):
        cfg = dpo_config(tmp_path, tiny_model_dir, "optim.update_epochs=2")
        cfg.log_entropy = log_entropy
        plan = PassPlan.from_config(cfg, build_method(cfg))
        assert plan.reference and plan.on_policy(16) == on_policy


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("dpo.beta=0",), "dpo.beta"),
        (("dpo.mode=replay",), "dpo.mode"),
        (("dpo.offline_batches=-1",), "dpo.offline_batches"),
        (("dpo.offline_batches=4",), "dpo.offline_batches"),  # online: nothing is collected
        (("algo.estimator=grpo", "dpo.beta=0.2"), "dpo.beta"),  # not DPO
        (("algo.estimator=grpo", "dpo.mode=offline"), "dpo.mode"),
        (("loss.eps_high=0.28",), "loss.eps_high"),
        (("loss.dual_clip=3",), "loss.dual_clip"),
        (("loss.kl_coef=0.1",), "loss.kl_coef"),
        (("loss.loss_agg=seq-mean-token-sum-norm",), "loss.loss_agg"),
        (("loss.loss_mode=clip_cov",), "loss.loss_mode"),
        (("loss.tis_cap=off",), "loss.tis_cap"),
        (("agpo.enabled=true",), "agpo.enabled"),
        (("parallel.strategy=fsdp2",), "parallel.strategy"),
        (("dpo.mode=offline", "rollout.dynamic_sampling=true"), "rollout.dynamic_sampling"),
        (("dpo.mode=offline", "task.shift={step: 1, arithmetic: {topics: [mul]}}"), "shift"),
        (("dpo.bogus=1",), "dpo.bogus"),
    ],
)
def test_dpo_config_errors_name_the_key(tmp_path, tiny_model_dir, overrides, message):
    with pytest.raises(ValueError, match=message):
        dpo_config(tmp_path, tiny_model_dir, *overrides)


def test_dpo_refuses_several_processes(tmp_path, tiny_model_dir):
    from rlkit.methods import build_method

    class TwoRanks:
        world = 2

    cfg = dpo_config(tmp_path, tiny_model_dir)
    with pytest.raises(ValueError, match="algo.method=dpo with 2 processes"):
        build_method(cfg, TwoRanks())


def test_one_row_micro_batches_still_take_one_pair_per_forward(tmp_path):
    """optim.micro_batch_size=1 (a memory bound) gives one pair per forward, not the whole
    mini-batch in one (1 // 2 is 0, which means "unset")."""
    from rlkit.trainer import Trainer

    trainer = Trainer(dpo_config(tmp_path, "unused", TINY, "optim.micro_batch_size=1"))
    sizes = []
    train = trainer.forward.train
    trainer.forward.train = lambda rollouts, *rest: (
        sizes.append(rollouts.input_ids.shape[0]) or train(rollouts, *rest)
    )
    row = trainer.step()
    assert row["dpo/pairs"] > 1 and set(sizes) == {2}  # each forward: one chosen, one rejected


def test_dpo_on_a_sampler_that_is_not_the_training_forward_needs_no_tis(tmp_path):
    """DPO's sequence loss takes no per-token weight: with rollout.engine=hf_static (where
    loss.tis_cap=auto would turn TIS on) at loss.ratio_temperature=1.0 the config loads, and
    neither the update nor the collector records or applies importance weights."""
    from rlkit.config import load_config, run_tis_cap

    cfg = load_config(
        "tiny-cpu",
        ["algo.estimator=dpo", "rollout.engine=hf_static", "loss.ratio_temperature=1.0"],
    )
    assert run_tis_cap(cfg) is None
    grpo = load_config("tiny-cpu", ["rollout.engine=hf_static"])
    assert run_tis_cap(grpo) == 3.0
