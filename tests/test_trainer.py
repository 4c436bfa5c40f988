"""End-to-end CPU runs of the trainer on a tiny random Llama (conftest) and the arithmetic task."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlkit.advantages import ESTIMATORS
from rlkit.config import load_config
from rlkit.metrics import read_metrics
from rlkit.trainer import Trainer
from rlkit.update import NonFiniteError, PolicyUpdate


def tiny_overrides(run_dir, model_dir, *overrides) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        f"output_dir={run_dir}",
        "steps=2",
        "rollout.num_prompts=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=4",
        "task.num_train=64",
        "task.num_eval=8",
        "eval.num_problems=8",
        "eval.k=2",
        "eval.every=0",
        "checkpoint_every=0",
        "tensorboard=false",
        "progress=false",
        *overrides,
    ]


def make_config(run_dir, model_dir, *overrides):
    return load_config("tiny-cpu", tiny_overrides(run_dir, model_dir, *overrides))


def without_timings(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_every_estimator_trains_end_to_end(tmp_path, tiny_model_dir, estimator):
    cfg = make_config(tmp_path, tiny_model_dir, f"algo.estimator={estimator}")
    evals = Trainer(cfg).train()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [e["step"] for e in evals] == [0, 2]
    for row in rows[1:]:
        for key in ("reward", "frac_reward_zero_std", "entropy", "advantages/std"):
            assert row[key] is not None and math.isfinite(row[key]), key
        # a gradient norm exactly where an optimizer step ran (DPO skips a step without pairs)
        stepped = row["update/optimizer_steps"] > 0
        assert stepped == (row["grad_norm"] is not None and math.isfinite(row["grad_norm"]))
        assert stepped or estimator == "dpo"
        # β = 0: no reference pass, no kl metric; PPO's reward KL (ppo.kl_coef) needs π_ref
        assert ("kl" in row) == (estimator == "ppo")
    if estimator == "ebpo":
        assert 0.0 <= rows[-1]["ebpo/shrinkage_mean"] <= 1.0
    if estimator.startswith("jspo"):  # JSPO-Official's metric names
        assert 0.0 <= rows[-1]["jspo/lambda_mean"] <= 1.0
        assert rows[-1]["jspo/v_square_mean"] >= 0.0 and rows[-1]["jspo/s_square_mean"] >= 0.0
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000002"


@pytest.mark.parametrize("probe", ["full", "previous", "reuse"])
def test_agpo_probe_modes(tmp_path, tiny_model_dir, probe):
    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        "algo.estimator=agpo",
        "agpo.enabled=true",
        f"agpo.probe={probe}",
        "steps=3",
    )
    Trainer(cfg).train()
    rows = read_metrics(tmp_path)[1:]
    for row in rows:
        assert 0.05 <= row["agpo/epsilon/min"] <= row["agpo/epsilon/max"] <= 0.4
        assert 0.5 <= row["agpo/temperature/min"] <= row["agpo/temperature/max"] <= 1.5
        assert row["agpo/kl_drift"] >= 0
    probe_tokens = rows[-1]["tokens/probe"]
    if probe == "previous":
        assert probe_tokens == 0  # no extra generation
    else:
        assert probe_tokens > 0


@pytest.mark.parametrize("adaptive_temperature", ["true", "false"])  # some / all groups reused
def test_reused_probe_tokens_are_counted_once(
    tmp_path, tiny_model_dir, monkeypatch, adaptive_temperature
):
    """Each generated token counts once: a probe group trained on (``agpo.probe=reuse``, τ_t =
    τ_base) counts as training tokens (tokens/generated), not as probe overhead (tokens/probe)."""
    from rlkit.collect import Collector

    generated, real = [], Collector.generate

    def counting(self, *args, **kwargs):
        rollouts = real(self, *args, **kwargs)
        generated.append(int(rollouts.lengths.sum()))
        return rollouts

    monkeypatch.setattr(Collector, "generate", counting)
    overrides = ("algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=reuse")
    cfg = make_config(
        tmp_path, tiny_model_dir, *overrides, f"agpo.adaptive_temperature={adaptive_temperature}"
    )
    Trainer(cfg).train()
    last = read_metrics(tmp_path)[-1]
    assert last["tokens/generated"] + last["tokens/probe"] == sum(generated)
    if adaptive_temperature == "false":  # τ_t = τ_base everywhere: every probe group is trained on
        assert last["tokens/probe"] == 0 and len(generated) == cfg.steps


class FailingScorer:
    """Every call: one success per group and one reward that raised."""

    def score(self, completions, answers):
        from rlkit.rewards import RewardBatch

        rewards = torch.zeros(len(completions))
        rewards[::4] = 1.0
        return RewardBatch(rewards, 1, 0)

    def close(self):
        pass


@pytest.mark.parametrize(
    "overrides, calls",  # scoring calls per step
    [
        ((), 1),
        (("algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=full"), 2),  # probe + train
        (("algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=reuse"), 2),  # some reused
        (("agpo.enabled=true", "agpo.probe=reuse", "agpo.adaptive_temperature=false"), 1),
    ],
)
def test_reward_failures_count_every_scoring_call_of_the_step(
    tmp_path, tiny_model_dir, overrides, calls
):
    """``rollout/reward_failures`` is the step's count of rewards that raised or timed out,
    wherever they were scored: the probe's too, whether or not its groups are trained on."""
    trainer = Trainer(make_config(tmp_path, tiny_model_dir, *overrides))
    trainer.collector.scorer.close()
    trainer.collector.scorer = FailingScorer()
    try:
        assert [trainer.step()["rollout/reward_failures"] for _ in range(2)] == [calls, calls]
    finally:
        trainer.close()


def test_ratio_temperature_option_changes_old_logprobs(tmp_path, tiny_model_dir):
    """AGPO's code used T = 1 in the ratio; rlkit defaults to each row's sampling temperature."""
    cfg = make_config(tmp_path, tiny_model_dir, "agpo.enabled=true", "loss.ratio_temperature=1.0")
    trainer = Trainer(cfg)
    groups, _ = trainer.collector.draw(trainer.sampler, trainer.method)
    groups.rollouts.temperatures[:] = 0.5
    forward = trainer.forward
    assert torch.equal(
        forward.ratio_temperatures(groups.rollouts), torch.ones(len(groups.rollouts))
    )
    forward.ratio_temperature = "sampling"
    assert torch.equal(
        forward.ratio_temperatures(groups.rollouts), torch.full((len(groups.rollouts),), 0.5)
    )


def test_seeded_run_is_deterministic(tmp_path, tiny_model_dir):
    runs = []
    for name in ("a", "b"):
        cfg = make_config(tmp_path / name, tiny_model_dir, "algo.estimator=ebpo", "steps=3")
        Trainer(cfg).train()
        runs.append(without_timings(read_metrics(tmp_path / name)))
    assert runs[0] == runs[1]
    other = make_config(tmp_path / "c", tiny_model_dir, "algo.estimator=ebpo", "steps=3", "seed=1")
    Trainer(other).train()
    assert without_timings(read_metrics(tmp_path / "c")) != runs[0]


class CrashAfter(Trainer):
    """Dies at the start of step ``crash_at`` (after ``crash_at`` − 1 completed steps)."""

    crash_at = 4

    def step(self):
        if self.step_count == self.crash_at - 1:
            raise KeyboardInterrupt
        return super().step()


SHIFT_TO_MUL = "task.shift={{step: {}, arithmetic: {{topics: [mul]}}}}"


@pytest.mark.parametrize(
    "overrides",
    [
        ("algo.estimator=ebpo",),
        ("algo.estimator=agpo", "agpo.enabled=true"),
        ("algo.estimator=agpo", "agpo.enabled=true", "agpo.ema_update=per_minibatch"),
        (SHIFT_TO_MUL.format(1),),  # checkpoint (step 2) after the shift
        (SHIFT_TO_MUL.format(2),),  # checkpoint at the shift step: saved before the shift
        (SHIFT_TO_MUL.format(3),),  # resumed run crosses the shift
    ],
)
def test_resume_continues_the_identical_run(tmp_path, tiny_model_dir, overrides):
    common = ("steps=5", "checkpoint_every=2", "rollout.order=topic", *overrides)
    straight = make_config(tmp_path / "straight", tiny_model_dir, *common)
    Trainer(straight).train()

    interrupted = make_config(tmp_path / "resumed", tiny_model_dir, *common)
    with pytest.raises(KeyboardInterrupt):
        CrashAfter(interrupted).train()
    assert (tmp_path / "resumed" / "checkpoints" / "latest").read_text() == "step_000002"
    assert [r["step"] for r in read_metrics(tmp_path / "resumed")] == [0, 1, 2, 3]
    Trainer(interrupted, resume=True).train()

    expected = without_timings(read_metrics(tmp_path / "straight"))
    assert [r["step"] for r in expected] == [0, 1, 2, 3, 4, 5]
    assert without_timings(read_metrics(tmp_path / "resumed")) == expected


def test_jspo_plus_plus_ema_state_is_checkpointed_and_restored(tmp_path, tiny_model_dir):
    # the tiny model's rewards are all 0, so a resumed run would match even without the state:
    # check the checkpoint holds it and a resumed trainer loads it
    from rlkit.checkpoint import load_checkpoint

    overrides = ("algo.estimator=jspo_plus_plus", "algo.options={smooth_coef: 0.99}")
    trainer = Trainer(make_config(tmp_path, tiny_model_dir, *overrides))
    trainer.train()
    saved = load_checkpoint(tmp_path).state["estimator"]
    assert saved == trainer.method.estimator.state_dict() and saved["steps"] == 2
    resumed = Trainer(make_config(tmp_path, tiny_model_dir, *overrides), resume=True)
    assert resumed.method.estimator.state_dict() == saved


def test_resume_without_checkpoint_is_a_clear_error(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="no checkpoint"):
        Trainer(make_config(tmp_path, tiny_model_dir), resume=True)


def test_nonfinite_loss_is_skipped_then_stops(tmp_path, tiny_model_dir, monkeypatch):
    from rlkit.losses import LOSSES, LossOutput

    vanilla = LOSSES["vanilla"]
    real = vanilla.fn
    calls = {"n": 0}

    def nan_on_first_call(*args):
        out = real(*args)
        calls["n"] += 1
        return LossOutput(out.loss * float("nan") if calls["n"] == 1 else out.loss, out.stats)

    monkeypatch.setattr(vanilla, "fn", nan_on_first_call)
    Trainer(make_config(tmp_path / "once", tiny_model_dir, "steps=2")).train()
    rows = read_metrics(tmp_path / "once")
    assert (rows[1]["update/nonfinite_skips"], rows[1]["update/optimizer_steps"]) == (1, 0)
    assert (rows[2]["update/nonfinite_skips"], rows[2]["update/optimizer_steps"]) == (1, 1)

    def always_nan(*args):
        out = real(*args)
        return LossOutput(out.loss * float("nan"), out.stats)

    monkeypatch.setattr(vanilla, "fn", always_nan)
    cfg = make_config(tmp_path / "always", tiny_model_dir, "steps=5", "optim.max_nonfinite_skips=2")
    with pytest.raises(NonFiniteError, match="2 consecutive"):
        Trainer(cfg).train()


class PatternScorer:
    """Half of each batch's groups (alternating with every call) get one success out of G = 4,
    the other half all zeros."""

    def __init__(self):
        self.calls = 0

    def score(self, completions, answers):
        from rlkit.rewards import RewardBatch

        self.calls += 1
        g = 4
        rewards = torch.zeros(len(completions))
        for p in range(len(completions) // g):
            if (p + self.calls) % 2:
                rewards[p * g] = 1.0  # one success: informative group
        return RewardBatch(rewards, 0, 0)

    def close(self):
        pass


def test_dynamic_sampling_keeps_only_informative_groups(tmp_path, tiny_model_dir):
    cfg = make_config(
        tmp_path, tiny_model_dir, "rollout.dynamic_sampling=true", "rollout.max_gen_batches=3"
    )
    trainer = Trainer(cfg)
    trainer.collector.scorer = PatternScorer()
    groups, info = trainer.collector.draw(trainer.sampler, trainer.method)
    # 4 prompts per batch, 2 informative each time: two generation batches fill the step
    assert (info.gen_batches, info.dropped) == (2, 4)
    assert len(groups.problems) == 4
    assert (groups.rewards.amax(1) != groups.rewards.amin(1)).all()
    assert groups.rollouts.input_ids.shape[0] == 4 * cfg.rollout.group_size


class OverflowScorer(PatternScorer):
    """Half of the first batch's groups informative, then every group: the second round fills
    the step with groups to spare (its overflow)."""

    def score(self, completions, answers):
        from rlkit.rewards import RewardBatch

        scored = super().score(completions, answers)
        if self.calls == 1:
            return scored
        rewards = torch.zeros(len(completions))
        rewards[::4] = 1.0  # one success in every group of G = 4
        return RewardBatch(rewards, 0, 0)


@pytest.mark.parametrize(
    ("scorer", "dropped"), [(PatternScorer, 4), (OverflowScorer, 2)], ids=["dropped", "overflow"]
)
def test_dynamic_sampling_counts_the_tokens_it_discards(tmp_path, tiny_model_dir, scorer, dropped):
    """``tokens/generated`` counts every token generated for training, the dropped groups' and
    the last round's overflow too: DAPO's extra generation is its cost, and the
    accuracy-per-token figures read it."""
    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        "rollout.dynamic_sampling=true",
        "rollout.max_gen_batches=3",
        "steps=1",
        "eval.at_start=false",  # the scorer's first call is the step's first round
    )
    trainer = Trainer(cfg)
    trainer.collector.scorer = scorer()
    generated, draws = [], []
    method_groups, collector_draw = trainer.method.groups, trainer.collector.draw

    def groups(problems, collector):  # every generation round's groups, before the filter
        drawn = method_groups(problems, collector)
        generated.append(int(drawn.rollouts.lengths.sum()))
        return drawn

    def draw(sampler, method, batch):
        draws.append(collector_draw(sampler, method, batch))
        return draws[-1]

    trainer.method.groups, trainer.collector.draw = groups, draw
    trainer.train()
    [(kept, info)], tokens = draws, read_metrics(tmp_path)[-1]["tokens/generated"]
    trained = int(kept.rollouts.lengths.sum())
    assert (info.gen_batches, info.dropped, len(generated)) == (2, dropped, 2)
    assert len(kept.problems) == cfg.rollout.num_prompts
    assert info.discarded_tokens == sum(generated) - trained > 0
    assert tokens == sum(generated)  # trained on + discarded


def test_config_snapshot_written(tmp_path, tiny_model_dir):
    cfg = make_config(tmp_path, tiny_model_dir, "steps=1")
    Trainer(cfg).train()
    text = (tmp_path / "config.yaml").read_text()
    assert "estimator: grpo" in text
    assert json.loads(json.dumps(read_metrics(tmp_path)[-1]))["step"] == 1


def test_qlora_run_uses_the_adapter_free_base_as_reference(tmp_path, tiny_4bit_model_dir):
    """QLoRA through the same trainer: KL to the reference is 0 before the first update (LoRA's B
    starts at 0) and > 0 after it, so the reference is the base with the adapter disabled. The
    first step, which follows generation, moves every LoRA B matrix off zero (all adapters train)."""
    cfg = make_config(
        tmp_path,
        tiny_4bit_model_dir,
        "model.mode=qlora",
        "model.lora_r=4",
        "optim.lr=0.05",
        "loss.kl_coef=0.1",
        "steps=2",
    )
    trainer = Trainer(cfg)
    trainer.collector.scorer = PatternScorer()
    base = {k: v.clone() for k, v in trainer.policy.model.state_dict().items() if "lora_" not in k}
    first = trainer.step()
    unmoved = [
        n for n, p in trainer.policy.model.named_parameters() if "lora_B" in n and not p.any()
    ]
    assert unmoved == []
    second = trainer.step()
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)
    assert second["kl"] > 1e-6
    after = {k: v for k, v in trainer.policy.model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base[k], after[k]) for k in base)


def test_agpo_lora_run_has_a_reference_kl(tmp_path, tiny_model_dir):
    """docs/algorithms.md §3: under LoRA, AGPO's KL to the reference acts (the authors' code at
    11e5596 made it 0): the reference pass disables the adapter, so the KL is 0 while LoRA's B
    is still 0 (the first step) and > 0 once the adapter has moved, with β > 0 in the loss."""
    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        "model.mode=lora",
        "model.lora_r=4",
        "optim.lr=0.05",
        "loss.kl_coef=0.1",
        "algo.estimator=agpo",
        "agpo.enabled=true",
        "agpo.ema_update=per_minibatch",
        "steps=2",
    )
    trainer = Trainer(cfg)
    trainer.collector.scorer = PatternScorer()
    first, second = trainer.step(), trainer.step()
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)
    assert second["kl"] > 1e-6


def test_concat_rollouts_keeps_logprobs_of_every_row(tiny_model, tiny_tokenizer):
    """Batches of different prompt and completion widths stack without changing any row."""
    from rlkit.logprobs import sequence_logprobs
    from rlkit.rollout import generate_rollouts
    from rlkit.rollout_batch import concat_rollouts

    short = generate_rollouts(
        tiny_model, tiny_tokenizer, ["1+2="] * 2, torch.ones(2), 3, generator_seed=0
    )
    long = generate_rollouts(
        tiny_model, tiny_tokenizer, ["12+34*5="] * 3, torch.full((3,), 2.0), 6, generator_seed=1
    )
    merged = concat_rollouts([short, long], tiny_tokenizer.pad_token_id)
    assert merged.prompt_length == long.prompt_length and len(merged) == 5
    assert merged.completion_texts == short.completion_texts + long.completion_texts
    with torch.no_grad():
        parts = [sequence_logprobs(tiny_model, b, b.temperatures)[0] for b in (short, long)]
        both = sequence_logprobs(tiny_model, merged, merged.temperatures)[0]
    assert torch.allclose(both[:2, : parts[0].shape[1]], parts[0], atol=1e-5)
    assert torch.allclose(both[2:, : parts[1].shape[1]], parts[1], atol=1e-5)
    assert merged.completion_mask.sum() == short.completion_mask.sum() + long.completion_mask.sum()


class EvenAnswerScorer:
    """Reward 1 exactly when the reference answer is even, whatever the completion."""

    def __init__(self, *args, **kwargs):
        pass

    def score(self, completions, answers):
        from rlkit.rewards import RewardBatch

        return RewardBatch(torch.tensor([float(int(a) % 2 == 0) for a in answers]), 0, 0)

    def close(self):
        pass


def test_difficulty_curriculum_starts_with_what_the_starting_policy_solves(
    tmp_path, tiny_model_dir, monkeypatch
):
    import rlkit.collect as collect_module

    monkeypatch.setattr(collect_module, "RewardScorer", EvenAnswerScorer)
    cfg = make_config(tmp_path, tiny_model_dir, "rollout.order=difficulty", "checkpoint_every=1")
    trainer = Trainer(cfg)
    solved = (trainer.curriculum_pass_rates == 1).sum()
    assert 0 < solved < len(trainer.train_problems)
    first = trainer.sampler.next_batch(int(solved))
    assert all(int(p.answer) % 2 == 0 for p in first)  # easy (pass rate 1) before hard
    trainer.close()  # release the run directory for the run below
    Trainer(cfg, overwrite=True).train()
    resumed = Trainer(
        make_config(tmp_path, tiny_model_dir, "rollout.order=difficulty", "steps=3"), resume=True
    )
    assert torch.equal(resumed.curriculum_pass_rates, trainer.curriculum_pass_rates)


def test_memory_knobs_keep_the_metrics(tmp_path, tiny_model_dir, monkeypatch):
    """The log-prob knobs (micro-batch, position chunks) leave every metric of a step as it was,
    up to float rounding: compared over one step of a float64 model, since over several float32
    steps the rounding differences cross any fixed tolerance on some CPU or thread count.
    (Row-batched generation draws the random stream in another order, so it is checked on its own
    in test_rollout.) The eval and entropy switches drop the step-0 eval and the entropy metric."""
    base = [
        "algo.estimator=ebpo",
        "loss.kl_coef=0.1",
        "optim.micro_batch_size=8",
        "model.compute_dtype=float64",
        "steps=1",
    ]
    Trainer(make_config(tmp_path / "a", tiny_model_dir, *base)).train()
    knobs = ["optim.logprob_micro_batch_size=3", "optim.logprob_chunk_size=2"]
    Trainer(make_config(tmp_path / "b", tiny_model_dir, *base, *knobs)).train()
    plain, chunked = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert len(plain) == len(chunked) == 2  # step 0 and the compared step
    for a, b in zip(without_timings(plain), without_timings(chunked)):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), key
    import rlkit.rollout
    import rlkit.trainer

    calls, phase = {"train": [], "eval": []}, ["train"]  # eval: inside score_problems
    generate, score = rlkit.rollout.generate_rollouts, rlkit.trainer.score_problems

    def counted(model, tokenizer, prompts, *args, **kwargs):
        calls[phase[0]].append(len(prompts))
        return generate(model, tokenizer, prompts, *args, **kwargs)

    def scoring(*args, **kwargs):
        phase[0] = "eval"
        try:
            return score(*args, **kwargs)
        finally:
            phase[0] = "train"

    monkeypatch.setattr(rlkit.rollout, "generate_rollouts", counted)
    monkeypatch.setattr(rlkit.trainer, "score_problems", scoring)
    off = ["eval.at_start=false", "log_entropy=false", "rollout.generation_batch_size=5"]
    evals = Trainer(make_config(tmp_path / "c", tiny_model_dir, *off, "eval.batch_size=3")).train()
    assert calls["train"] == [5, 5, 5, 1] * 2  # P·G = 16 rows in calls of at most 5, two steps
    assert calls["eval"] and max(calls["eval"]) <= 3  # k = 2 samples of one problem per call
    rows = read_metrics(tmp_path / "c")
    assert [e["step"] for e in evals] == [2]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("entropy" not in r for r in rows) and "reward" in rows[-1]


def test_old_logprobs_and_step_kl_run_without_dropout(tmp_path, tiny_model_dir, monkeypatch):
    """π_old is the sampling policy: with LoRA dropout, old log-probs (and AGPO's step-KL pass)
    must be computed in eval mode, so the ratio starts at exactly 1 and the drift before any
    update is 0. Checked at step 2, once B ≠ 0 (at step 1 the LoRA branch is 0 with or without
    dropout)."""
    from rlkit.logprobs import sequence_logprobs

    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        "model.mode=lora",
        "model.lora_r=4",
        "model.lora_dropout=0.3",
        "optim.lr=0.05",
        "algo.estimator=agpo",
        "agpo.enabled=true",
    )
    trainer = Trainer(cfg)
    trainer.collector.scorer = PatternScorer()
    seen = []
    update = PolicyUpdate.__call__

    def checking_update(self, batch, clip, step):
        old_logp = batch.old.logp  # dropout is active: π_old has its own eval-mode pass
        drift = self.drift(batch, batch.old, step)
        trainer.policy.model.eval()
        with torch.no_grad():
            eval_logp, _ = sequence_logprobs(
                trainer.policy.model, batch.rollouts, batch.ratio_temps
            )
        trainer.policy.model.train()
        seen.append((old_logp, eval_logp, drift))
        return update(self, batch, clip, step)

    monkeypatch.setattr(PolicyUpdate, "__call__", checking_update)
    trainer.step()
    trainer.step()
    old_logp, eval_logp, drift = seen[-1]
    assert any(p.any() for n, p in trainer.policy.model.named_parameters() if "lora_B" in n)
    torch.testing.assert_close(old_logp, eval_logp)
    torch.testing.assert_close(drift, torch.zeros_like(drift))


def test_logged_learning_rate_is_the_one_this_step_used(tmp_path, tiny_model_dir):
    """Linear warm-up over 4 steps: steps 1 and 2 update with lr/4 and 2·lr/4, and log that."""
    cfg = make_config(tmp_path, tiny_model_dir, "optim.lr=0.01", "optim.warmup_steps=4")
    Trainer(cfg).train()
    rows = read_metrics(tmp_path)
    assert [r["learning_rate"] for r in rows[1:]] == pytest.approx([0.0025, 0.005])


def test_agpo_dispersion_drives_the_agpo_estimator(tmp_path, tiny_model_dir):
    from rlkit.advantages import get_estimator

    cfg = make_config(tmp_path, tiny_model_dir, "algo.estimator=agpo", "agpo.dispersion=mad")
    estimator = Trainer(cfg).method.estimator
    rewards = torch.tensor([[0.0, 0.0, 1.0, 3.0], [1.0, 2.0, 2.0, 7.0]])
    expected = get_estimator("agpo", dispersion="mad")(rewards).advantages
    assert not torch.allclose(expected, get_estimator("agpo")(rewards).advantages)
    torch.testing.assert_close(estimator(rewards).advantages, expected)


def test_task_shift_switches_the_training_prompts_at_its_step(tmp_path, tiny_model_dir):
    cfg = make_config(tmp_path, tiny_model_dir, "steps=4", SHIFT_TO_MUL.format(2))
    trainer = Trainer(cfg)
    drawn = []
    original = trainer.collector.draw

    def recording(prompts, method, batch):
        groups, stats = original(prompts, method, batch)
        drawn.append({p.topic for p in groups.problems})
        return groups, stats

    trainer.collector.draw = recording
    eval_ids = [p.id for p in trainer.eval_problems]
    trainer.train()
    assert all(topics <= {"add", "sub"} for topics in drawn[:2])
    assert all(topics == {"mul"} for topics in drawn[2:]) and len(drawn) == 4
    assert [p.id for p in trainer.eval_problems] == eval_ids  # evaluation keeps its problems


def test_a_smaller_evaluation_samples_every_cell_not_a_prefix(tmp_path, tiny_model_dir):
    # the eval split is ordered topic by topic: a prefix of 16 would hold only `add` problems
    cfg = make_config(tmp_path, tiny_model_dir, "task.num_eval=1024", "eval.num_problems=16")
    topics = {p.topic for p in Trainer(cfg).eval_problems}
    assert topics == {"add", "sub"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rollout.num_prompts=65"],
            r"rollout.num_prompts=65 is more than the 64 training problems of "
            r"task.name=arithmetic \(task.num_train=64\): every batch would repeat prompts; "
            r"set rollout.num_prompts=64 or lower",
        ),
        (
            ["steps=4", SHIFT_TO_MUL.format(2)[:-2] + ", train_size: 3}}"],
            r"rollout.num_prompts=4 is more than the 3 training problems of "
            r"task.shift.arithmetic \(from step 2\)",
        ),
        (
            ["task.num_eval=1024", "eval.num_problems=900"],
            r"eval.num_problems=900 \(task.num_eval=1024\) asks for more problems than the eval "
            r"split of task.name=arithmetic holds \(812\): set eval.num_problems=812 or lower",
        ),
        (
            ["task.arithmetic={eval_size: 0}"],
            "the eval split of task.name=arithmetic is empty with task.arithmetic.eval_size=0: "
            "evaluation needs problems",
        ),
    ],
    ids=["num_prompts", "shift", "num_problems", "empty-eval"],
)
def test_sizes_beyond_the_data_fail_before_the_model_loads(
    tmp_path, tiny_model_dir, monkeypatch, overrides, message
):
    import rlkit.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "load_policy", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(ValueError, match=message):
        Trainer(make_config(tmp_path, tiny_model_dir, *overrides))
    assert not (tmp_path / "config.yaml").exists()


def test_the_task_num_eval_cap_below_eval_num_problems_is_not_a_shortfall(tmp_path, tiny_model_dir):
    cfg = make_config(tmp_path, tiny_model_dir, "task.num_eval=8", "eval.num_problems=200")
    assert len(Trainer(cfg, read_only=True).eval_problems) == 8


def test_a_run_started_before_the_size_checks_still_resumes(tmp_path, tiny_model_dir, monkeypatch):
    import rlkit.trainer as trainer_module

    class CrashAtTwo(CrashAfter):
        crash_at = 2

    cfg = make_config(tmp_path, tiny_model_dir, "eval.num_problems=900", "task.num_eval=1024")
    cfg.checkpoint_every = 1
    with monkeypatch.context() as patch:  # as a run started before the check existed
        patch.setattr(trainer_module, "check_sizes", lambda *args: None)
        with pytest.raises(KeyboardInterrupt):
            CrashAtTwo(cfg).train()
    Trainer(cfg, resume=True).train()  # it continues with the config it started with
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"eval.num_problems=900 \(task.num_eval=1024\)"):
        Trainer(cfg, resume=True, read_only=True)  # evaluating it asks for what is there


def test_a_pool_job_returns_the_last_evaluation_problem_by_problem(tmp_path):
    """rlkit.pool.train_and_score (notebook 11's runs side by side), in a spawned worker: the
    per-problem scores are the ones the last step's logged evaluation averages, each greedy score
    is its own text's reward, and ``train=False`` scores the starting policy as the run's step-0
    evaluation does. The shipped warm start solves some held-out problems and not others, so a
    score or a text out of place would show."""
    from rlkit.pool import run_pool, train_and_score
    from rlkit.rewards import get_reward_fn
    from rlkit.tasks.loader import load_problems, subset

    overrides = tiny_overrides(
        tmp_path / "run",
        "builtin:tiny",
        "rollout.max_new_tokens=8",
        "eval.num_problems=16",
        "task.num_eval=64",
        "eval.at_start=true",
    )
    cfg = load_config("tiny-cpu", overrides)
    jobs = {"start": ("tiny-cpu", overrides, 1, False), "trained": ("tiny-cpu", overrides, 1)}
    scores = run_pool(train_and_score, jobs, 1, progress=False)  # one worker: in this order
    rows = {row["step"]: row for row in read_metrics(tmp_path / "run" / "metrics.jsonl")}
    for name, step in (("start", 0), ("trained", 2)):
        logged = {k: v for k, v in rows[step].items() if k.startswith("eval/")}
        assert scores[name].summary() == logged
    problems = subset(load_problems(cfg.task)[1], cfg.eval.num_problems)
    reward = get_reward_fn(cfg.task.reward)
    greedy, texts = scores["trained"].greedy[:, 0].tolist(), scores["trained"].greedy_texts
    assert len(texts) == len(problems) == 16 and 0 < sum(greedy) < 16
    assert [reward(t, p.answer) for t, p in zip(texts, problems)] == greedy


@pytest.mark.parametrize("mode", ["full", "lora"])  # notebook 11 trains LoRA adapters
def test_a_pool_job_continues_the_run_its_directory_holds(tmp_path, mode):
    """rlkit.pool.train_and_score on a directory that already holds its run (a notebook 11 re-run
    after a crash or after it finished): a killed run resumes from its checkpoint as the same run
    (its run id kept, its metrics those of an uninterrupted run), a finished run is scored from
    its last checkpoint without training again, and another run's directory is replaced. The
    shipped warm start's scores move in 3 steps, so scoring the starting policy would show."""
    from rlkit.checkpoint import load_checkpoint
    from rlkit.pool import train_and_score

    class CrashAtThree(CrashAfter):
        crash_at = 3  # after 2 of the 3 steps, each checkpointed

    def same(a, b):
        return a.summary() == b.summary() and a.greedy_texts == b.greedy_texts

    def run(path, *extra):
        return tiny_overrides(
            path,
            "builtin:tiny",
            "steps=3",
            "checkpoint_every=1",
            "optim.lr=1e-3",
            "rollout.max_new_tokens=8",
            "eval.num_problems=16",
            "task.num_eval=64",
            f"model.mode={mode}",
            *extra,
        )

    start = train_and_score("tiny-cpu", run(tmp_path / "straight"), 1, False)
    straight = train_and_score("tiny-cpu", run(tmp_path / "straight"), 1)
    assert not same(straight, start)
    overrides, run_dir = run(tmp_path / "run"), tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        CrashAtThree(load_config("tiny-cpu", overrides)).train()
    run_id = load_checkpoint(run_dir).run_id
    assert same(train_and_score("tiny-cpu", overrides, 1), straight)  # resumed
    assert load_checkpoint(run_dir).run_id == run_id
    expected = without_timings(read_metrics(tmp_path / "straight"))
    assert without_timings(read_metrics(run_dir)) == expected
    logged = (run_dir / "metrics.jsonl").read_bytes()
    assert same(train_and_score("tiny-cpu", overrides, 1), straight)  # finished: scored
    assert (run_dir / "metrics.jsonl").read_bytes() == logged
    train_and_score("tiny-cpu", run(run_dir, "optim.lr=5e-4"), 1)  # another run: replaced
    assert load_checkpoint(run_dir).run_id != run_id
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2, 3]
