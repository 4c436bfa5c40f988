"""`rlkit plan`: memory arithmetic on a tiny model (checked against real tensors on the CPU) and
the 8B shapes from the shipped configs (meta device, no weights)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from rlkit.cli import main
from rlkit.config import load_config
from rlkit.models.loading import ModelSpec, load_policy
from rlkit.plan import (
    GIB,
    MemoryPlan,
    balanced,
    build_plan,
    check_fits,
    model_config,
    model_shape,
    resolve_batch_sizes,
)

# vLLM batches the rollouts itself: the preset's rollout.generation_batch_size must go
VLLM = ["rollout.engine=vllm", "rollout.generation_batch_size=0"]


def tiny_plan(model_dir, *overrides, prompt_tokens=8):
    cfg = load_config("tiny-cpu", [f"model.name_or_path={model_dir}", *overrides])
    return build_plan(cfg, prompt_tokens)


def test_tiny_shape_counts_every_linear_and_the_real_lora(tiny_model_dir):
    shape = tiny_plan(tiny_model_dir, "model.mode=lora", "model.lora_r=4").shape
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    per_layer = {  # (in, out) of each projection: hidden 32, 4 heads × 8, 2 KV heads, MLP 64
        "q": (32, 32), "k": (32, 16), "v": (32, 16), "o": (32, 32),
        "gate": (32, 64), "up": (32, 64), "down": (64, 32),
    }  # fmt: skip
    assert shape.linear_params == 2 * sum(i * o for i, o in per_layer.values())
    assert shape.linear_params + shape.other_params == sum(p.numel() for p in model.parameters())
    assert shape.lora_params == 2 * sum(4 * (i + o) for i, o in per_layer.values())
    policy = load_policy(ModelSpec(tiny_model_dir, mode="lora", lora_r=4, device="cpu"))
    assert shape.lora_params == policy.num_trainable_parameters()
    assert (shape.kv_dim, shape.q_dim, shape.vocab) == (16, 32, model.config.vocab_size)


def test_kv_cache_matches_the_cache_generate_builds(tiny_model_dir):
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    encoded = tokenizer(["1+2=", "3*4="], return_tensors="pt", padding=True)
    out = model.generate(
        **encoded, max_new_tokens=6, min_new_tokens=6, do_sample=False,
        return_dict_in_generate=True, pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    cached_tokens = out.sequences.shape[1] - 1  # the last sampled token is never fed back
    cache = out.past_key_values
    real = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    plan = tiny_plan(tiny_model_dir, "model.compute_dtype=float32")
    assert plan.kv_cache(2, cached_tokens) == real


def test_phases_grow_with_their_knob_and_chunks_bound_the_logprob_pass(tiny_model_dir):
    tiny = tiny_plan(tiny_model_dir, "rollout.max_new_tokens=64")
    plan = MemoryPlan(tiny.cfg, dataclasses.replace(tiny.shape, vocab=50_000), 8)  # head-bound
    assert plan.generation(8) > plan.generation(4) > plan.resident()
    assert plan.logprob(4, 8, False) < plan.logprob(4, 64, False) < plan.logprob(4, 64, True)
    assert plan.train(2, 16) < plan.train(4, 16)
    budget = plan.generation(5)
    assert plan.largest_fitting(budget)["rollout.generation_batch_size"] == 5


@pytest.mark.parametrize(
    "name, total, linear, lora",
    [  # published parameter counts; LoRA r = 16 on every projection
        ("Qwen/Qwen3-8B", 8_190_735_360, 36 * 192_937_984, 43_646_976),
        ("meta-llama/Llama-3.1-8B", 8_030_261_248, 32 * 218_103_808, 41_943_040),
    ],
)
def test_8b_shapes_from_the_shipped_configs(name, total, linear, lora):
    shape = model_shape(model_config(name), 16, "all-linear")
    assert shape.linear_params + shape.other_params == total
    assert shape.linear_params == linear
    assert shape.lora_params == lora


def test_8b_presets_fit_24_gib_and_the_unchunked_rollout_does_not():
    for preset in ("qwen3-8b-qlora", "llama3-8b-qlora"):
        cfg, _ = resolve_batch_sizes(load_config(preset), 24 * GIB)  # the presets' auto sizes
        plan = build_plan(cfg)
        check_fits(plan, 24 * GIB)
        assert 5 * GIB < plan.weights() < 6 * GIB  # 4-bit linears + bf16 embeddings and head
    qwen = load_config("qwen3-8b-qlora", ["rollout.generation_batch_size=0"])
    with pytest.raises(ValueError, match=r"rollout.generation_batch_size=\d+"):
        check_fits(build_plan(qwen), 24 * GIB)
    # the arithmetic: P·G = 128 rows × (512 + 2048) tokens of bf16 KV ≈ 45 GiB
    plan = build_plan(qwen)
    assert plan.kv_cache(128, 2560) / GIB == pytest.approx(45.0)


def test_plan_command_prints_every_phase_and_the_fitting_chunks(capsys):
    assert main(["plan", "--config", "qwen3-8b-qlora", "--gpu-mem", "24"]) == 0
    out = capsys.readouterr().out
    for phase in ("weights", "LoRA + optimizer", "generation (32 rows)", "log-prob pass",
                  "train micro-batch (4 rows, checkpointing)", "rollout.generation_batch_size="):  # fmt: skip
        assert phase in out, phase


def test_train_refuses_a_config_that_cannot_fit_before_loading(monkeypatch, tmp_path, capsys):
    class FakeProperties:
        total_memory = 16 * GIB

    import rlkit.trainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: FakeProperties)
    monkeypatch.setattr(rlkit.trainer, "load_policy", lambda spec: pytest.fail("loaded"))
    code = main(
        [
            "train",
            "--config",
            "qwen3-8b-qlora",
            f"output_dir={tmp_path}",
            "rollout.generation_batch_size=0",  # every row in one call: an explicit misfit
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "generation" in err and "rollout.generation_batch_size=" in err
    assert not any(tmp_path.iterdir())


def test_memory_plan_rejects_a_bad_prompt_length(tiny_model_dir):
    plan = tiny_plan(tiny_model_dir)
    with pytest.raises(ValueError, match="prompt_tokens"):
        MemoryPlan(plan.cfg, plan.shape, 0)


def test_vllm_engine_leaves_its_share_of_the_gpu():
    hf = build_plan(resolve_batch_sizes(load_config("qwen3-8b-qlora"), 24 * GIB)[0])
    vllm = build_plan(load_config("qwen3-8b-qlora", [*VLLM, "rollout.vllm_memory=0.5"]))
    assert not any(p.name.startswith("generation") for p in vllm.phases())
    assert any(p.name.startswith("eval generation") for p in vllm.phases())  # eval stays on HF
    assert vllm.usable(24 * GIB, 0.1) == pytest.approx(hf.usable(24 * GIB, 0.1) - 12 * GIB)
    check_fits(hf, 24 * GIB)
    with pytest.raises(ValueError, match=r"rollout.vllm_memory=0.5 for vLLM"):
        check_fits(vllm, 24 * GIB)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpu-mem", "0"], "--gpu-mem must be a positive number of GiB, got 0.0"),
        (["--gpu-mem", "-24"], "--gpu-mem must be a positive number of GiB, got -24.0"),
        (["--gpu-mem", "nan"], "--gpu-mem must be a positive number of GiB, got nan"),
        (["--gpu-mem", "inf"], "--gpu-mem must be a positive number of GiB, got inf"),
        (["--gpu-mem", "24", "--headroom", "1.5"], r"headroom \(--headroom\) must be in \[0, 1\)"),
        (["--gpu-mem", "24", "--headroom", "-0.1"], r"must be in \[0, 1\), got -0.1"),
        (["--gpu-mem", "24", "--headroom", "nan"], r"must be in \[0, 1\), got nan"),
        (["--headroom", "0.2"], "--headroom needs --gpu-mem"),
        (["--prompt-tokens", "0"], r"prompt_tokens \(--prompt-tokens\) must be >= 1, got 0"),
        (
            [
                "--gpu-mem",
                "24",
                "--headroom",
                "0.5",
                *VLLM,
                "rollout.vllm_memory=0.5",
            ],
            "leaves no GPU memory for training",
        ),
    ],
)
def test_plan_refuses_a_gpu_size_or_headroom_that_means_nothing(capsys, flags, message):
    assert main(["plan", "--config", "qwen3-8b-qlora", *flags]) == 2
    assert re.search(message, capsys.readouterr().err.strip().splitlines()[-1])


def test_balanced_batch_sizes_take_the_fewest_even_calls():
    assert balanced(128, 37) == (32, 4)  # not 37, 37, 37, 17
    assert balanced(128, 128) == (128, 1) and balanced(128, 500) == (128, 1)
    assert balanced(128, 57) == (43, 3)
    assert balanced(256, 100, unit=4) == (88, 3)  # whole problems of k = 4 samples per call
    assert balanced(10, 0) == (1, 10)


def test_auto_batch_sizes_follow_the_device_memory():
    """The design note's table (Qwen3-8B preset, 512 + 2048 tokens): 37 rows fit 24 GiB, so 4
    calls of 32; one call of 128 from 80 GiB on; on the CPU every row in one call."""
    cfg = load_config("qwen3-8b-qlora")
    assert cfg.rollout.generation_batch_size == "auto" and cfg.eval.batch_size == "auto"
    calls = {}
    for gib in (24, 40, 80, 141):
        sized, notes = resolve_batch_sizes(cfg, gib * GIB)
        calls[gib] = sized.rollout.generation_batch_size
        assert notes[0].startswith(f"rollout.generation_batch_size=auto -> {calls[gib]} ")
        assert "call(s) for 128 rows" in notes[0] and notes[1].startswith("eval.batch_size=auto")
        check_fits(build_plan(sized), gib * GIB)
        assert sized.eval.batch_size % cfg.eval.k == 0
    assert calls == {24: 32, 40: 64, 80: 128, 141: 128}
    assert cfg.rollout.generation_batch_size == "auto"  # the original is untouched
    cpu, notes = resolve_batch_sizes(cfg, None)
    assert cpu.rollout.generation_batch_size == 128
    assert cpu.eval.batch_size == cfg.eval.num_problems * cfg.eval.k
    assert "no device memory limit" in notes[0]
    fixed, notes = resolve_batch_sizes(load_config("tiny-cpu"), 24 * GIB)
    assert notes == [] and fixed.eval.batch_size == load_config("tiny-cpu").eval.batch_size
    with pytest.raises(ValueError, match="eval.batch_size"):
        load_config("tiny-cpu", ["eval.batch_size=some"])


def test_plan_says_when_a_setting_can_be_raised(capsys):
    overrides = ["rollout.generation_batch_size=16", "eval.batch_size=16"]
    assert main(["plan", "--config", "qwen3-8b-qlora", "--gpu-mem", "80", *overrides]) == 0
    out = capsys.readouterr().out
    assert "rollout.generation_batch_size=128   (now 16)   <- can be raised (or auto)" in out
    assert main(["plan", "--config", "qwen3-8b-qlora", "--gpu-mem", "80"]) == 0
    out = capsys.readouterr().out
    assert "rollout.generation_batch_size=auto -> 128" in out


def test_a_cpu_run_resolves_auto_to_one_call_and_keeps_auto_in_its_config(
    tmp_path, tiny_model_dir, capsys
):
    import yaml

    from rlkit.trainer import Trainer
    from tests.test_trainer import make_config

    auto = ["rollout.generation_batch_size=auto", "eval.batch_size=auto"]
    trainer = Trainer(make_config(tmp_path, tiny_model_dir, *auto))
    assert trainer.eval_batch_size == 8 * 2  # eval.num_problems × eval.k
    assert trainer.collector.cfg.generation_batch_size == 4 * 4  # P·G
    printed = capsys.readouterr()
    assert "eval.batch_size=auto -> 16 (no device memory limit" in printed.out + printed.err
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["rollout"]["generation_batch_size"] == "auto"
    assert saved["eval"]["batch_size"] == "auto"


def test_the_static_engine_plans_its_generation_phase():
    cfg = load_config("qwen3-8b-qlora", ["rollout.engine=hf_static"])
    names = [p.name for p in build_plan(resolve_batch_sizes(cfg, 80 * GIB)[0]).phases()]
    assert "generation (128 rows)" in names  # its static cache is the plan's full-length KV


def test_the_shared_prompt_forward_adds_each_rows_prompt_keys_and_values(
    tiny_model_dir, monkeypatch
):
    """The log-prob and train phases grow by the per-row prompt cache the completion pass reads,
    counted as the real `_PromptCache` the tiny model builds."""
    import rlkit.logprobs as logprobs_module
    from rlkit.logprobs import sequence_logprobs
    from rlkit.rollout import generate_rollouts

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = generate_rollouts(model, tokenizer, ["1+2=", "3*4="] * 2, torch.ones(4), 3)
    caches, for_rows = [], logprobs_module._PromptCache.for_rows
    monkeypatch.setattr(
        logprobs_module._PromptCache,
        "for_rows",
        lambda self, *args: caches.append(for_rows(self, *args)) or caches[-1],
    )
    with torch.no_grad():
        sequence_logprobs(model, batch, share_prompts=True)
    real = sum(la.keys.nbytes + la.values.nbytes for la in caches[0].layers)
    overrides = ["model.compute_dtype=float32"]
    plans = {
        share: tiny_plan(
            tiny_model_dir,
            *overrides,
            f"optim.share_prompt_forward={share}",
            prompt_tokens=batch.prompt_length,
        )
        for share in ("false", "true", "auto")
    }
    plain, shared = plans["false"], plans["true"]
    assert shared.logprob(4, 8, False) - plain.logprob(4, 8, False) == real > 0
    assert shared.train(4, 8) - plain.train(4, 8) == real
    # auto, the default, is planned as on: a bound where the policy turns out not to share
    assert plans["auto"].logprob(4, 8, False) == shared.logprob(4, 8, False)
    assert plans["auto"].train(4, 8) == shared.train(4, 8)
