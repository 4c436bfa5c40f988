"""rollout.engine=vllm: the optional-extra error, and the glue to rlkit's rollout layout, checked
against a stand-in `vllm` module (vLLM itself needs CUDA; it is not installed in CI)."""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from rlkit.config import load_config
from rlkit.models.loading import ModelSpec, load_policy
from rlkit.trainer import Trainer


@dataclass
class FakeCompletion:
    token_ids: list[int]
    finish_reason: str


@dataclass
class FakeRequestOutput:
    outputs: list[FakeCompletion]


@dataclass
class FakeLLM:
    """Records how vLLM is called; each row's completion comes from ``script`` (cycled)."""

    script: list = field(default_factory=list)
    calls: list = field(default_factory=list)

    def generate(self, prompts, params, lora_request=None):
        self.calls.append((list(prompts), list(params), lora_request))
        return [
            FakeRequestOutput([FakeCompletion(*self.script[i % len(self.script)])])
            for i in range(len(prompts))
        ]


@pytest.fixture
def fake_vllm(monkeypatch):
    llm = FakeLLM()
    inits = []

    def make_llm(**options):
        inits.append(options)
        return llm

    vllm = types.ModuleType("vllm")
    vllm.LLM = make_llm
    vllm.SamplingParams = lambda **kw: kw
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, int_id, path: (name, int_id, path)
    for name, module in {"vllm": vllm, "vllm.lora": lora, "vllm.lora.request": request}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return llm, inits


def config(tmp_path, model_dir, *overrides):
    return load_config(
        "tiny-cpu",
        [
            f"model.name_or_path={model_dir}",
            f"output_dir={tmp_path}",
            "model.mode=lora",
            "model.lora_r=4",
            "rollout.engine=vllm",
            "rollout.num_prompts=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=5",
            "task.num_train=16",
            "task.num_eval=4",
            "tensorboard=false",
            "progress=false",
            *overrides,
        ],
    )


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_missing_vllm_is_a_clear_error(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match=r"pip install 'rlkit\[vllm\]'"):
        Trainer(config(tmp_path, tiny_model_dir))


def test_full_fine_tuning_is_refused(tmp_path, tiny_model_dir, fake_vllm):
    with pytest.raises(ValueError, match="model.mode=lora or qlora"):
        Trainer(config(tmp_path, tiny_model_dir, "model.mode=full"))


def test_rows_get_their_temperature_and_the_current_adapter(tiny_model_dir, fake_vllm):
    from rlkit.vllm_engine import VLLMEngine

    llm, inits = fake_vllm
    policy = load_policy(ModelSpec(tiny_model_dir, mode="lora", lora_r=4, device="cpu"))
    tokenizer = policy.tokenizer
    digits = tokenizer.convert_tokens_to_ids(list("123"))
    eos = tokenizer.eos_token_id
    llm.script = [
        (digits + [eos], "stop"),  # EOS returned
        (digits[:2], "stop"),  # stopped at EOS, EOS not returned
        (digits + digits[:2], "length"),  # hit max_new_tokens
    ]
    engine = VLLMEngine(policy, memory_fraction=0.25, seed=3)
    assert inits[0]["enable_lora"] and inits[0]["max_lora_rank"] == 4
    assert inits[0]["gpu_memory_utilization"] == 0.25 and "quantization" not in inits[0]
    temps = torch.tensor([0.5, 1.0, 1.5])
    batch = engine.generate(["1+2=", "13*2+7=", "9="], temps, max_new_tokens=5, top_k=7)
    prompts, params, lora = llm.calls[-1]
    assert [p["temperature"] for p in params] == [0.5, 1.0, 1.5]
    assert all(p["top_k"] == 7 and p["top_p"] == 1.0 and p["max_tokens"] == 5 for p in params)
    name, adapter_id, path = lora
    assert adapter_id == 1 and (policy.spec.name_or_path != path)
    assert (Path(path) / "adapter_model.safetensors").exists()
    assert batch.lengths.tolist() == [4, 3, 5] and batch.truncated.tolist() == [False, False, True]
    assert batch.completion_texts == ["123", "12", "12312"]
    assert batch.completion_ids[1, 2] == eos and batch.completion_mask.sum(1).tolist() == [4, 3, 5]
    expected = tokenizer(["1+2=", "13*2+7=", "9="], padding=True, padding_side="left")
    assert batch.prompt_ids.tolist() == expected["input_ids"]
    engine.generate(["1+2="], torch.ones(1), max_new_tokens=5)
    assert llm.calls[-1][2][1] == 2  # a new adapter id every generation: no stale cached adapter


def test_a_training_step_runs_on_vllm_rollouts(tmp_path, tiny_model_dir, fake_vllm):
    llm, _ = fake_vllm
    trainer = Trainer(config(tmp_path, tiny_model_dir, "loss.kl_coef=0.1"))
    digits = trainer.policy.tokenizer.convert_tokens_to_ids(list("0123456789"))
    eos = trainer.policy.tokenizer.eos_token_id
    llm.script = [([digits[i], digits[(i * 3) % 10], eos], "stop") for i in range(10)]
    metrics = trainer.step()
    assert len(llm.calls) == 1 and len(llm.calls[0][0]) == 8
    assert metrics["completions/mean_length"] == 3.0 and metrics["optimizer_steps"] == 1
