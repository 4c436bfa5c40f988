"""Sampler log-probs and truncated importance sampling (rlkit.tis, docs/algorithms.md §4)."""

from __future__ import annotations

import math

import pytest
import torch

from rlkit.config import load_config
from rlkit.logprobs import sequence_logprobs
from rlkit.metrics import read_metrics
from rlkit.rollout import generate_rollouts
from rlkit.rollout_batch import concat_rollouts
from rlkit.static_decode import static_generate
from rlkit.tis import (
    DEFAULT_TIS_CAP,
    applied_cap,
    importance_weights,
    mismatch_metrics,
    resolve_tis_cap,
)
from rlkit.trainer import Trainer
from tests.test_trainer import make_config

PROMPTS = ["1+2=", "13*2+7=", "(4-1)*12=", "9="]
TIS_KEYS = [
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
    "sampling/importance_sampling_ratio/clipped_fraction",
]


def test_weights_and_metrics_hand_example():
    # π_old / π_s per token: e^0 = 1, e^{ln 2} = 2, e^{ln 4} = 4 → capped at 3, e^{-ln 2} = 0.5;
    # the last token is padding and must not count.
    old = torch.tensor(
        [[0.0, math.log(2.0), math.log(4.0)], [-math.log(2.0), 0.0, 7.0]], dtype=torch.float64
    )
    sampler = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    weights = importance_weights(old, sampler, mask, cap=3.0)
    expected = torch.tensor([[1.0, 2.0, 3.0], [0.5, 1.0, 3.0]], dtype=torch.float64)
    assert torch.allclose(weights, expected, rtol=0, atol=1e-15)
    metrics = mismatch_metrics(old, sampler, mask, cap=3.0)
    deltas = [0.0, math.log(2.0), math.log(4.0), math.log(2.0), 0.0]
    assert metrics == pytest.approx(
        {
            "sampling/sampling_logp_difference/mean": sum(deltas) / 5,
            "sampling/sampling_logp_difference/max": math.log(4.0),
            "sampling/importance_sampling_ratio/min": 0.5,
            "sampling/importance_sampling_ratio/mean": (1 + 2 + 3 + 0.5 + 1) / 5,
            "sampling/importance_sampling_ratio/max": 3.0,
            "sampling/importance_sampling_ratio/clipped_fraction": 1 / 5,
        },
        abs=1e-12,
    )
    assert list(metrics) == TIS_KEYS


def test_weights_carry_no_gradient_to_old_logprobs():
    old = torch.zeros(1, 2, requires_grad=True)
    assert not importance_weights(old, torch.zeros(1, 2), torch.ones(1, 2), cap=2.0).requires_grad


def test_tis_cap_resolution_and_validation():
    assert resolve_tis_cap("auto", "hf") is None  # HF generate is the training forward
    assert resolve_tis_cap("auto", "vllm") == DEFAULT_TIS_CAP
    assert resolve_tis_cap("off", "vllm") is None
    assert resolve_tis_cap(2.0, "hf") == 2.0
    with pytest.raises(ValueError, match="loss.tis_cap"):
        load_config("tiny-cpu", ["loss.tis_cap=sometimes"])
    with pytest.raises(ValueError, match="loss.tis_cap"):
        load_config("tiny-cpu", ["loss.tis_cap=0"])
    with pytest.raises(ValueError, match="loss.ratio_temperature=sampling"):
        load_config("tiny-cpu", ["loss.tis_cap=2", "loss.ratio_temperature=1.0"])


@pytest.mark.parametrize("top_p", [1.0, 0.7])
def test_hf_sampler_logprobs_are_the_sampling_distributions(tiny_model, tiny_tokenizer, top_p):
    """Recording draws nothing (same tokens), and with top-p off the recorded log-probs are the
    training forward's at the sampling temperature up to float noise (one step, one batch)."""
    temps = torch.tensor([0.7, 1.0, 1.3, 1.0])
    plain = generate_rollouts(
        tiny_model, tiny_tokenizer, PROMPTS, temps, 6, top_p=top_p, generator_seed=3
    )
    recorded = generate_rollouts(
        tiny_model,
        tiny_tokenizer,
        PROMPTS,
        temps,
        6,
        top_p=top_p,
        generator_seed=3,
        record_logprobs=True,
    )
    assert plain.sampler_logp is None
    assert torch.equal(plain.input_ids, recorded.input_ids)
    mask = recorded.completion_mask
    assert recorded.sampler_logp.shape == mask.shape
    assert bool((recorded.sampler_logp[~mask] == 0).all())
    assert bool(torch.isfinite(recorded.sampler_logp).all())
    trainer_logp, _ = sequence_logprobs(tiny_model, recorded, temps)
    if top_p == 1.0:
        assert torch.allclose(recorded.sampler_logp[mask], trainer_logp[mask], atol=1e-5)
    else:  # the nucleus renormalises: the sampled tokens are at least as likely as untruncated
        assert bool((recorded.sampler_logp[mask] >= trainer_logp[mask] - 1e-5).all())
    both = concat_rollouts([recorded, recorded.select([0])], tiny_tokenizer.pad_token_id)
    assert torch.equal(both.sampler_logp[:4], recorded.sampler_logp)
    with pytest.raises(ValueError, match="sampler_logp"):
        concat_rollouts([recorded, plain], tiny_tokenizer.pad_token_id)


def test_default_hf_path_records_nothing_and_logs_no_tis(tmp_path, tiny_model_dir):
    cfg = make_config(tmp_path, tiny_model_dir)
    assert cfg.loss.tis_cap == "auto"
    trainer = Trainer(cfg)
    assert applied_cap(trainer.update.loss) is None and not trainer.collector.engine.record_logprobs
    trainer.train()
    assert not any(k.startswith("sampling/") for r in read_metrics(tmp_path) for k in r)


def test_tis_on_the_hf_path_weights_one_and_logs_the_mismatch(tmp_path, tiny_model_dir):
    """Forced on where the sampler is the training forward: the mismatch is float noise, no
    token is clipped, and the metrics use TRL's names."""
    Trainer(make_config(tmp_path, tiny_model_dir, "loss.tis_cap=2.0")).train()
    rows = read_metrics(tmp_path)[1:]
    for row in rows:
        assert row["sampling/sampling_logp_difference/mean"] < 1e-4
        assert row["sampling/importance_sampling_ratio/clipped_fraction"] == 0.0
        assert abs(row["sampling/importance_sampling_ratio/mean"] - 1.0) < 1e-4
        assert all(k in row for k in TIS_KEYS)


def test_a_token_without_sampler_logprob_weighs_one_and_counts_as_trl_counts_it():
    """A NaN sampler log-prob (vLLM returned none) trains with weight 1 and, as in TRL 1.16's
    ``GRPOTrainer._generate_and_score_completions`` (token modes), is left out of
    ``sampling_logp_difference/*`` but counted with ratio 1 in ``importance_sampling_ratio/*``
    (docs/algorithms.md §4, truncated importance sampling)."""
    old = torch.tensor([[math.log(2.0), -1.0, math.log(8.0), 5.0]], dtype=torch.float64)
    sampler = torch.tensor([[0.0, math.nan, 0.0, math.nan]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])  # the last token is padding
    assert importance_weights(old, sampler, mask, cap=3.0).tolist() == [[2.0, 1.0, 3.0, 1.0]]
    metrics = mismatch_metrics(old, sampler, mask, cap=3.0)
    assert metrics == pytest.approx(
        {
            "sampling/sampling_logp_difference/mean": (math.log(2.0) + math.log(8.0)) / 2,
            "sampling/sampling_logp_difference/max": math.log(8.0),
            "sampling/importance_sampling_ratio/min": 1.0,
            "sampling/importance_sampling_ratio/mean": (2.0 + 1.0 + 3.0) / 3,
            "sampling/importance_sampling_ratio/max": 3.0,
            "sampling/importance_sampling_ratio/clipped_fraction": 1 / 3,
        },
        abs=1e-12,
    )
    # every real token without a sampler log-prob: no difference to report, every weight 1
    none = mismatch_metrics(old[:, :2], torch.full((1, 2), math.nan), mask[:, :2], cap=3.0)
    assert none["sampling/sampling_logp_difference/max"] == 0.0
    assert none["sampling/importance_sampling_ratio/mean"] == 1.0


def test_a_sampler_that_draws_from_another_policy_stops_the_run_keeping_the_last_checkpoint(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """loss.tis_tripwire (auto: 0.5 nats): from the second step on the static loop's recorded
    log-probs are made 1 nat off, as a sampler drawing from another policy's; the run stops at
    step 2 naming the mismatch, before step 2 is logged or checkpointed."""
    import rlkit.static_decode
    from rlkit.cli import main
    from tests.test_trainer import tiny_overrides

    calls = []

    def broken_after_the_first_step(*args, **kwargs):
        tokens, logp = static_generate(*args, **kwargs)
        calls.append(logp is not None)  # sampling calls (evaluation decodes greedily)
        return tokens, (logp if logp is None or sum(calls) == 1 else logp - 1.0)

    monkeypatch.setattr(rlkit.static_decode, "static_generate", broken_after_the_first_step)
    overrides = ["rollout.engine=hf_static", "steps=3", "checkpoint_every=1", "eval.at_start=false"]
    assert main(["train", *tiny_overrides(tmp_path, tiny_model_dir, *overrides)]) == 2
    err = capsys.readouterr().err
    assert (
        "step 2: the sampler's log-probs of its own tokens differ from the trainer's by 1 nats"
        in err
    )
    assert "loss.tis_tripwire=0.5" in err and "Traceback" not in err
    assert [row["step"] for row in read_metrics(tmp_path)] == [1]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001"]


def test_the_tripwire_can_be_set_or_switched_off_and_is_refused_where_nothing_is_recorded(
    tmp_path, tiny_model_dir
):
    from rlkit.config import run_tis_tripwire

    static = ("rollout.engine=hf_static",)
    assert run_tis_tripwire(make_config(tmp_path, tiny_model_dir, *static)) == 0.5
    assert run_tis_tripwire(make_config(tmp_path, tiny_model_dir)) is None  # hf: nothing recorded
    set_to = make_config(tmp_path, tiny_model_dir, *static, "loss.tis_tripwire=0.1")
    assert run_tis_tripwire(set_to) == 0.1
    off = make_config(tmp_path, tiny_model_dir, *static, "loss.tis_tripwire=off")
    assert run_tis_tripwire(off) is None
    for bad, message in (("-1", "must be"), ("never", "loss.tis_tripwire")):
        with pytest.raises(ValueError, match=message):
            make_config(tmp_path, tiny_model_dir, f"loss.tis_tripwire={bad}")
    with pytest.raises(
        ValueError, match="loss.tis_tripwire.*read only with sampler log-probs recorded"
    ):
        make_config(tmp_path, tiny_model_dir, "loss.tis_tripwire=0.1")


def test_the_four_modes_weigh_as_trl_1_16_does():
    """TRL 1.16's ``vllm_importance_sampling_mode`` with clip_max C = 3 and no clip_min
    (``GRPOTrainer._generate_and_score_completions``): token modes weigh each token by its own
    ratio, sequence modes every token of a row by exp(Σ masked log-ratios); ``truncate`` caps at
    C, ``mask`` zeroes what is above C. Row 0's tokens: ratios 1, 2, 4 (sequence 8); row 1's:
    0.5, 1 and padding (sequence 0.5); row 2's: 2, 1.25 (sequence 2.5), its NaN counting 0."""
    ln = math.log
    old = torch.tensor(
        [[0.0, ln(2.0), ln(4.0)], [-ln(2.0), 0.0, 7.0], [ln(2.0), ln(1.25), 3.0]],
        dtype=torch.float64,
    )
    sampler = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, math.nan]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    expected = {
        "token_truncate": [[1, 2, 3], [0.5, 1, 3], [2, 1.25, 1]],
        "token_mask": [[1, 2, 0], [0.5, 1, 0], [2, 1.25, 1]],
        "sequence_truncate": [[3] * 3, [0.5] * 3, [2.5] * 3],
        "sequence_mask": [[0] * 3, [0.5] * 3, [2.5] * 3],
    }
    for mode, want in expected.items():
        got = importance_weights(old, sampler, mask, 3.0, mode).expand(3, 3)
        assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-12), mode


@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate", "sequence_mask"])
def test_a_run_trains_in_every_mode_and_a_mode_is_refused_where_nothing_is_weighed(
    tmp_path, tiny_model_dir, mode
):
    overrides = ("rollout.engine=hf_static", f"loss.tis_mode={mode}")
    Trainer(make_config(tmp_path, tiny_model_dir, *overrides)).train()
    row = read_metrics(tmp_path)[-1]
    assert row["sampling/sampling_logp_difference/mean"] < 1e-4  # float32 rounding
    with pytest.raises(
        ValueError, match="loss.tis_mode.*read only with sampler log-probs recorded"
    ):
        make_config(tmp_path / "hf", tiny_model_dir, f"loss.tis_mode={mode}")
    with pytest.raises(ValueError, match="loss.tis_mode"):
        make_config(tmp_path / "bad", tiny_model_dir, "loss.tis_mode=sequence")
