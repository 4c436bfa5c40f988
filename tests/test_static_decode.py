"""The static-cache decode loop (rollout.engine=hf_static, rlkit.static_decode) against HF
generate for the same seeds (one call each; float32 on the CPU, where it decodes eagerly)."""

from __future__ import annotations

import pytest
import torch

from rlkit.config import load_config
from rlkit.logprobs import sequence_logprobs
from rlkit.rollout import generate_rollouts
from rlkit.static_decode import CudaGraphStep, StaticDecoder
from rlkit.tis import applied_cap

PROMPTS = ["1+2=", "13*2+7=", "(4-1)*12=", "9="]  # different lengths: left padding


def test_greedy_tokens_equal_hf_generate(tiny_model, tiny_tokenizer):
    args = (tiny_model, tiny_tokenizer, PROMPTS, torch.zeros(4), 8)
    hf = generate_rollouts(*args)
    static = generate_rollouts(*args, engine="hf_static")
    assert torch.equal(static.input_ids, hf.input_ids)
    assert torch.equal(static.completion_mask, hf.completion_mask)
    assert static.completion_texts == hf.completion_texts
    assert static.sampler_logp is None  # greedy: evaluation, nothing to correct


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sampled_tokens_equal_hf_generate_for_the_same_seed(tiny_model, tiny_tokenizer, top_p):
    """Drawn as HF draws (multinomial of the same probabilities, same RNG stream): the same
    tokens; the recorded log-probs are HF's recorded ones up to float rounding."""
    temps = torch.tensor([0.7, 1.0, 1.3, 1.0])
    args = (tiny_model, tiny_tokenizer, PROMPTS, temps, 8)
    hf = generate_rollouts(*args, top_p=top_p, generator_seed=5, record_logprobs=True)
    static = generate_rollouts(*args, top_p=top_p, generator_seed=5, engine="hf_static")
    assert torch.equal(static.input_ids, hf.input_ids)
    mask = static.completion_mask
    assert torch.allclose(static.sampler_logp[mask], hf.sampler_logp[mask], atol=1e-5)
    assert bool((static.sampler_logp[~mask] == 0).all())
    if top_p == 1.0:  # and they are the training forward's, up to float rounding
        trainer_logp, _ = sequence_logprobs(tiny_model, static, temps)
        assert torch.allclose(static.sampler_logp[mask], trainer_logp[mask], atol=1e-5)


def test_cpu_decodes_eagerly_and_says_why(tiny_model):
    decoder = StaticDecoder(tiny_model, batch=2, prompt_width=3, max_new_tokens=4)
    assert decoder.step_graph is None and decoder.eager_reason == "no CUDA device"
    assert decoder.width == 7


def test_engine_is_a_known_choice(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="engine must be"):
        generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, torch.ones(4), 2, engine="fast")
    with pytest.raises(ValueError, match="rollout.engine"):
        load_config("tiny-cpu", ["rollout.engine=fast"])
    cfg = load_config("tiny-cpu", ["rollout.engine=hf_static"])
    assert cfg.rollout.engine == "hf_static"


def test_a_lora_policy_decodes_as_with_hf_generate(tiny_model_dir):
    from rlkit.models.loading import ModelSpec, load_policy

    policy = load_policy(ModelSpec(tiny_model_dir, mode="lora", lora_r=4, device="cpu"))
    args = (policy.model, policy.tokenizer, PROMPTS, torch.tensor([1.0, 0.8, 1.2, 1.0]), 6)
    hf = generate_rollouts(*args, generator_seed=1)
    static = generate_rollouts(*args, generator_seed=1, engine="hf_static")
    assert torch.equal(static.input_ids, hf.input_ids)


def test_a_training_run_on_the_static_engine_corrects_and_logs_the_mismatch(
    tmp_path, tiny_model_dir
):
    from rlkit.metrics import read_metrics
    from rlkit.trainer import Trainer
    from tests.test_trainer import make_config

    trainer = Trainer(make_config(tmp_path, tiny_model_dir, "rollout.engine=hf_static"))
    assert applied_cap(trainer.update.loss) == 3.0  # loss.tis_cap=auto: the sampler is not generate
    assert trainer.eval_engine.name == "hf_static"
    evals = trainer.train()
    reference = Trainer(make_config(tmp_path / "hf", tiny_model_dir)).evaluate()
    assert evals[0]["eval/greedy_accuracy"] == reference["eval/greedy_accuracy"]
    for row in read_metrics(tmp_path)[1:]:
        assert row["sampling/sampling_logp_difference/mean"] < 1e-4
        assert row["sampling/importance_sampling_ratio/clipped_fraction"] == 0.0


def test_a_failed_capture_falls_back_to_eager_with_the_reason(
    tiny_model, tiny_tokenizer, monkeypatch
):
    encoded = tiny_tokenizer(PROMPTS[:2], return_tensors="pt", padding=True, padding_side="left")
    width = encoded["input_ids"].shape[1]

    def decode(decoder):
        with torch.no_grad():
            first = decoder.prefill(encoded["input_ids"], encoded["attention_mask"])
            return decoder.step(first.argmax(-1))

    eager = decode(StaticDecoder(tiny_model, 2, width, 3))

    def no_stream():
        raise RuntimeError("no graphs here")

    monkeypatch.setattr(torch.cuda, "Stream", no_stream)
    decoder = StaticDecoder(tiny_model, 2, width, 3)
    decoder.step_graph, decoder.eager_reason = CudaGraphStep, None  # as on a CUDA device
    with pytest.warns(UserWarning, match="CUDA graph capture failed.*no graphs here.*eagerly"):
        logits = decode(decoder)
    assert decoder.graph is None and "RuntimeError" in decoder.eager_reason
    assert torch.equal(logits, eager)
