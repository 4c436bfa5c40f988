"""rollout.engine=vllm: the optional-extra error, and the glue to rlkit's rollout layout, checked
against a stand-in `vllm` module (vLLM itself needs CUDA; it is not installed in CI). The stand-in
refuses what the real vLLM refuses: keywords and field names not in vLLM's signatures, and values
outside its Literal choices, read from the 0.27.1 wheel (tests/data/vllm_api/extract.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from rlkit.config import load_config
from rlkit.models.loading import ModelSpec, load_policy
from rlkit.trainer import Trainer
from rlkit.vllm_engine import LORA_RANKS, SUPPORTED_VLLM, lora_rank_for_vllm

API = json.loads((Path(__file__).parent / "data/vllm_api/0.27.1.json").read_text())


def check_keywords(what: str, given, allowed) -> None:
    unknown = sorted(set(given) - set(allowed))
    assert not unknown, f"{what} has no parameter {unknown} in vLLM {API['version']}"


def validating_llm_options(options: dict) -> None:
    """What LLM(**options) → EngineArgs(**kwargs) would refuse in the real vLLM."""
    check_keywords("LLM()", options, [*API["LLM.__init__"], *API["EngineArgs"]])
    assert options["max_lora_rank"] in API["MaxLoRARanks"]
    assert options["dtype"] in API["ModelDType"]
    assert options["logprobs_mode"] in API["LogprobsMode"]


@dataclass
class FakeLogprob:
    logprob: float


@dataclass
class FakeCompletion:
    token_ids: list[int]
    finish_reason: str
    logprobs: list = field(default_factory=list)

    def __post_init__(self):
        check_keywords(
            "CompletionOutput", ["token_ids", "finish_reason", "logprobs"], API["CompletionOutput"]
        )
        # one {token: Logprob} per sampled token (SamplingParams.logprobs=0): log p = -0.1·(i+1)
        self.logprobs = [{t: FakeLogprob(-0.1 * (i + 1))} for i, t in enumerate(self.token_ids)]


@dataclass
class FakeRequestOutput:
    outputs: list[FakeCompletion]


@dataclass
class FakeLLM:
    """Records how vLLM is called; each row's completion comes from ``script`` (cycled)."""

    script: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    awake: list = field(default_factory=list)  # sleep / wake_up calls in order

    def sleep(self, level=1):
        assert "sleep" in API["LLM.methods"] and level == 1
        self.awake.append(False)

    def wake_up(self, tags=None):
        assert "wake_up" in API["LLM.methods"]
        self.awake.append(True)

    def generate(self, prompts, params, lora_request=None):
        assert self.awake[-1], "generate called while vLLM sleeps"
        for prompt in prompts:  # token-id prompts (TokensPrompt)
            check_keywords("TokensPrompt", prompt, API["TokensPrompt"])
        assert all(isinstance(p["prompt_token_ids"], list) for p in prompts)
        name, int_id, path = lora_request
        assert Path(path).is_dir(), "the adapter directory must exist while vLLM loads it"
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
        validating_llm_options(options)
        inits.append(options)
        return llm

    def sampling_params(**kw):
        check_keywords("SamplingParams", kw, API["SamplingParams"])
        return kw

    def lora_request(*args):
        assert API["LoRARequest"][: len(args)] == ["lora_name", "lora_int_id", "lora_path"]
        return args

    vllm = types.ModuleType("vllm")
    vllm.__version__ = API["version"]
    vllm.LLM = make_llm
    vllm.SamplingParams = sampling_params
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lora_request
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
    engine = VLLMEngine(policy, memory_fraction=0.25, seed=3, max_model_len=40)
    assert inits[0]["enable_lora"] and inits[0]["max_lora_rank"] == 8  # r = 4 rounded up
    assert inits[0]["gpu_memory_utilization"] == 0.25 and "quantization" not in inits[0]
    assert inits[0]["max_model_len"] == 40 and inits[0]["enable_sleep_mode"]
    assert llm.awake == [False]  # asleep until the first generation
    temps = torch.tensor([0.5, 1.0, 1.5])
    batch = engine.generate(["1+2=", "13*2+7=", "9="], temps, max_new_tokens=5, top_k=7)
    prompts, params, lora = llm.calls[-1]
    assert [p["temperature"] for p in params] == [0.5, 1.0, 1.5]
    assert all(p["top_k"] == 7 and p["top_p"] == 1.0 and p["max_tokens"] == 5 for p in params)
    assert all(p["logprobs"] == 0 for p in params)
    name, adapter_id, path = lora
    assert adapter_id == 1 and (policy.spec.name_or_path != path)
    assert not Path(path).exists()  # removed once vLLM loaded it
    assert llm.awake == [False, True, False]
    assert batch.lengths.tolist() == [4, 3, 5] and batch.truncated.tolist() == [False, False, True]
    logp = batch.sampler_logp
    assert torch.allclose(logp[0, :4], torch.tensor([-0.1, -0.2, -0.3, -0.4]))
    assert torch.allclose(logp[1, :2], torch.tensor([-0.1, -0.2])) and math.isnan(logp[1, 2])
    assert bool((logp[1, 3:] == 0).all()) and bool((logp[0, 4:] == 0).all())
    assert batch.completion_texts == ["123", "12", "12312"]
    assert batch.completion_ids[1, 2] == eos and batch.completion_mask.sum(1).tolist() == [4, 3, 5]
    expected = tokenizer(["1+2=", "13*2+7=", "9="], padding=True, padding_side="left")
    assert batch.prompt_ids.tolist() == expected["input_ids"]
    unpadded = tokenizer(["1+2=", "13*2+7=", "9="])["input_ids"]
    assert [p["prompt_token_ids"] for p in prompts] == unpadded  # the layout's ids, no padding
    engine.generate(["1+2="], torch.ones(1), max_new_tokens=5)
    assert llm.calls[-1][2][1] == 2  # a new adapter id every generation: no stale cached adapter


def test_a_training_step_runs_on_vllm_rollouts(tmp_path, tiny_model_dir, fake_vllm):
    llm, inits = fake_vllm
    trainer = Trainer(config(tmp_path, tiny_model_dir, "loss.kl_coef=0.1"))
    digits = trainer.policy.tokenizer.convert_tokens_to_ids(list("0123456789"))
    eos = trainer.policy.tokenizer.eos_token_id
    llm.script = [([digits[i], digits[(i * 3) % 10], eos], "stop") for i in range(10)]
    metrics = trainer.step()
    assert len(llm.calls) == 1 and len(llm.calls[0][0]) == 8
    assert metrics["completions/mean_length"] == 3.0 and metrics["optimizer_steps"] == 1
    # TIS is on by default with vLLM: the fake's log-probs are not the policy's, so it acts
    assert trainer.update.tis_cap == 3.0
    assert metrics["sampling/sampling_logp_difference/mean"] > 0
    longest = max(
        len(ids)
        for ids in trainer.policy.tokenizer([p.prompt for p in trainer.train_problems])["input_ids"]
    )
    assert inits[0]["max_model_len"] == longest + 5


def test_lora_rank_rounds_up_to_a_rank_vllm_accepts():
    assert set(LORA_RANKS) <= set(API["MaxLoRARanks"])
    assert [lora_rank_for_vllm(r) for r in (1, 4, 8, 9, 64, 300, 512)] == [
        8,
        8,
        8,
        16,
        64,
        320,
        512,
    ]
    with pytest.raises(ValueError, match="model.lora_r=600"):
        lora_rank_for_vllm(600)


def test_an_unsupported_vllm_version_is_a_clear_error(
    tmp_path, tiny_model_dir, fake_vllm, monkeypatch
):
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.33.0")
    with pytest.raises(ValueError, match=f"vLLM >= {SUPPORTED_VLLM[0]}, < {SUPPORTED_VLLM[1]}"):
        Trainer(config(tmp_path, tiny_model_dir))


def test_evaluation_samples_through_the_engine(tmp_path, tiny_model_dir, fake_vllm):
    llm, _ = fake_vllm
    trainer = Trainer(config(tmp_path, tiny_model_dir, "eval.num_problems=4", "eval.k=2"))
    eos = trainer.policy.tokenizer.eos_token_id
    llm.script = [(trainer.policy.tokenizer.convert_tokens_to_ids(list("42")) + [eos], "stop")]
    assert trainer.eval_engine is trainer.collector.engine
    before = len(llm.calls)
    result = trainer.evaluate()
    greedy, sampled = llm.calls[before:]
    assert len(greedy[0]) == 4 and all(p["temperature"] == 0.0 for p in greedy[1])
    assert len(sampled[0]) == 8 and all(p["temperature"] == 1.0 for p in sampled[1])
    assert set(result) == {"eval/greedy_accuracy", "eval/pass@1", "eval/maj@2"}
    again = Trainer(config(tmp_path / "again", tiny_model_dir, "eval.num_problems=4", "eval.k=2"))
    again.evaluate()
    seeds = [[p["seed"] for p in call[1]] for call in llm.calls[-2:]]
    assert seeds == [[p["seed"] for p in call[1]] for call in (greedy, sampled)]  # eval's seed
