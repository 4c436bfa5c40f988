"""rollout.engine=vllm: the optional-extra error, and the glue to rlkit's rollout layout, checked
against a stand-in `vllm` module (vLLM itself needs CUDA; it is not installed in CI). The stand-in
refuses what the real vLLM refuses: keywords and field names not in vLLM's signatures, values
outside its Literal choices, and a quantization or load format that neither vLLM nor its installed
bitsandbytes plugin registers, read from each wheel in tests/data/vllm_api/ (extract.py); every
test that builds the engine runs once per vLLM version there."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from rlkit.config import load_config
from rlkit.models.loading import ModelSpec, load_policy
from rlkit.tis import applied_cap
from rlkit.trainer import Trainer
from rlkit.vllm_engine import (
    BNB_PLUGIN,
    BNB_PLUGIN_ENTRY_POINT,
    BNB_PLUGIN_VLLM,
    LORA_RANKS,
    SUPPORTED_VLLM,
    VLLMEngine,
    lora_rank_for_vllm,
)

FACTS = sorted(
    (Path(__file__).parent / "data/vllm_api").glob("*.json"), key=lambda p: Version(p.stem)
)
APIS = [json.loads(path.read_text()) for path in FACTS]
PLUGIN_APIS = [api for api in APIS if "vllm_bnb_plugin" in api]  # vLLM >= 0.28


def check_keywords(api: dict, what: str, given, allowed) -> None:
    unknown = sorted(set(given) - set(allowed))
    assert not unknown, f"{what} has no parameter {unknown} in vLLM {api['version']}"


def plugin_registers(api: dict, registry: str) -> list[str]:
    """What the bitsandbytes plugin adds to vLLM's ``registry`` (its ``register_...`` function):
    nothing unless it is installed (importable) and VLLM_PLUGINS, when set, names it."""
    plugin = api.get("vllm_bnb_plugin")
    if plugin is None or sys.modules.get("vllm_bnb_plugin") is None:
        return []
    (name,) = plugin["entry_points"]["vllm.general_plugins"]
    allowed = os.environ.get("VLLM_PLUGINS")
    return (
        []
        if allowed is not None and name not in allowed.split(",")
        else [plugin["registers"][registry]]
    )


def validating_llm_options(api: dict, options: dict) -> None:
    """What LLM(**options) → EngineArgs(**kwargs) would refuse in the real vLLM."""
    engine_args = api["EngineArgs"] if api["LLM.__init__ **kwargs"] else []
    check_keywords(api, "LLM()", options, [*api["LLM.__init__"], *engine_args])
    assert options["max_lora_rank"] in api["MaxLoRARanks"]
    assert options["dtype"] in api["ModelDType"]
    assert options["logprobs_mode"] in api["LogprobsMode"]
    quantizations = [
        *api["QuantizationMethods"],
        *plugin_registers(api, "register_quantization_config"),
    ]
    assert options.get("quantization") in [None, *quantizations], (
        f"vLLM {api['version']} has no quantization {options['quantization']!r}"
    )
    load_formats = [*api["LoadFormats"], *plugin_registers(api, "register_model_loader")]
    assert options.get("load_format", "auto") in load_formats, (
        f"vLLM {api['version']} has no load_format {options['load_format']!r}"
    )


@dataclass
class FakeLogprob:
    logprob: float


@dataclass
class FakeCompletion:
    token_ids: list[int]
    finish_reason: str
    logprobs: list = field(default_factory=list)

    def __post_init__(self):
        # one {token: Logprob} per sampled token (SamplingParams.logprobs=0): log p = -0.1·(i+1)
        self.logprobs = [{t: FakeLogprob(-0.1 * (i + 1))} for i, t in enumerate(self.token_ids)]


@dataclass
class FakeRequestOutput:
    outputs: list[FakeCompletion]


@dataclass
class FakeLLM:
    """Records how vLLM ``api["version"]`` is called; each row's completion comes from
    ``script`` (cycled)."""

    api: dict
    script: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    awake: list = field(default_factory=list)  # sleep / wake_up calls in order

    def sleep(self, **kw):
        assert "sleep" in self.api["LLM.methods"] and kw == {"level": 1}
        check_keywords(self.api, "LLM.sleep", kw, self.api["LLM.sleep"])
        self.awake.append(False)

    def wake_up(self, **kw):
        assert "wake_up" in self.api["LLM.methods"]
        check_keywords(self.api, "LLM.wake_up", kw, self.api["LLM.wake_up"])
        self.awake.append(True)

    def generate(self, prompts, params, **kw):
        assert self.api["LLM.generate"][:2] == ["prompts", "sampling_params"]
        check_keywords(self.api, "LLM.generate", kw, self.api["LLM.generate"])
        lora_request = kw["lora_request"]
        assert self.awake[-1], "generate called while vLLM sleeps"
        for prompt in prompts:  # token-id prompts (TokensPrompt)
            check_keywords(self.api, "TokensPrompt", prompt, self.api["TokensPrompt"])
        assert all(isinstance(p["prompt_token_ids"], list) for p in prompts)
        name, int_id, path = lora_request
        assert Path(path).is_dir(), "the adapter directory must exist while vLLM loads it"
        self.calls.append((list(prompts), list(params), lora_request))
        used = ["token_ids", "finish_reason", "logprobs"]
        check_keywords(self.api, "CompletionOutput", used, self.api["CompletionOutput"])
        return [
            FakeRequestOutput([FakeCompletion(*self.script[i % len(self.script)])])
            for i in range(len(prompts))
        ]


@pytest.fixture(params=APIS, ids=[api["version"] for api in APIS])
def api(request) -> dict:
    """One vLLM version's facts (tests/data/vllm_api/<version>.json)."""
    return request.param


@pytest.fixture
def fake_vllm(monkeypatch, api):
    """A stand-in vLLM ``api["version"]``, with its bitsandbytes plugin installed where the facts
    have one (vLLM >= 0.28)."""
    llm = FakeLLM(api)
    inits = []

    def make_llm(**options):
        validating_llm_options(api, options)
        inits.append(options)
        return llm

    def sampling_params(**kw):
        check_keywords(api, "SamplingParams", kw, api["SamplingParams"])
        return kw

    def lora_request(*args):
        assert api["LoRARequest"][: len(args)] == ["lora_name", "lora_int_id", "lora_path"]
        return args

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    if "vllm_bnb_plugin" in api:
        monkeypatch.setitem(sys.modules, "vllm_bnb_plugin", types.ModuleType("vllm_bnb_plugin"))
    vllm = types.ModuleType("vllm")
    vllm.__version__ = api["version"]
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
    # the fake's log-probs are not the policy's, by nats: the tripwire would stop the run
    # (tests/test_tis.py), so it is off here
    overrides = ("loss.kl_coef=0.1", "loss.tis_tripwire=off")
    trainer = Trainer(config(tmp_path, tiny_model_dir, *overrides))
    digits = trainer.policy.tokenizer.convert_tokens_to_ids(list("0123456789"))
    eos = trainer.policy.tokenizer.eos_token_id
    llm.script = [([digits[i], digits[(i * 3) % 10], eos], "stop") for i in range(10)]
    metrics = trainer.step()
    assert len(llm.calls) == 1 and len(llm.calls[0][0]) == 8
    assert metrics["completions/mean_length"] == 3.0 and metrics["update/optimizer_steps"] == 1
    # TIS is on by default with vLLM: the fake's log-probs are not the policy's, so it acts
    assert applied_cap(trainer.update.loss) == 3.0
    assert metrics["sampling/sampling_logp_difference/mean"] > 0
    longest = max(
        len(ids)
        for ids in trainer.policy.tokenizer([p.prompt for p in trainer.train_problems])["input_ids"]
    )
    assert inits[0]["max_model_len"] == longest + 5


def test_lora_rank_rounds_up_to_a_rank_vllm_accepts(api):
    assert set(LORA_RANKS) <= set(api["MaxLoRARanks"])
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


@pytest.mark.parametrize("version", ["0.10.1", "0.34.0"])
def test_an_unsupported_vllm_version_is_a_clear_error(
    tmp_path, tiny_model_dir, fake_vllm, monkeypatch, version
):
    monkeypatch.setattr(sys.modules["vllm"], "__version__", version)
    with pytest.raises(ValueError, match=f"vLLM >= {SUPPORTED_VLLM[0]}, < {SUPPORTED_VLLM[1]}"):
        Trainer(config(tmp_path, tiny_model_dir))


def test_every_vllm_with_facts_is_supported_and_bitsandbytes_is_where_the_engine_expects(api):
    """vLLM < 0.28 has bitsandbytes itself; from 0.28 only its plugin registers it, through the
    entry point rlkit checks for, and every vLLM name the plugin imports exists in that vLLM."""
    version = Version(api["version"])
    assert SUPPORTED_VLLM[0] <= version < SUPPORTED_VLLM[1]
    in_core = "bitsandbytes" in api["QuantizationMethods"]
    assert in_core == ("bitsandbytes" in api["LoadFormats"]) == (version < BNB_PLUGIN_VLLM)
    if in_core:
        return
    plugin = api["vllm_bnb_plugin"]
    assert Requirement(BNB_PLUGIN).specifier.contains(plugin["version"])
    assert plugin["entry_points"]["vllm.general_plugins"] == {
        BNB_PLUGIN_ENTRY_POINT: "vllm_bnb_plugin:register"
    }
    assert plugin["registers"] == {
        "register_quantization_config": "bitsandbytes",
        "register_model_loader": "bitsandbytes",
    }
    assert plugin["missing_vllm_imports"] == []


def test_the_vllm_extras_are_the_supported_ranges():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    low, high = SUPPORTED_VLLM
    assert extras["vllm"] == [f"vllm>={BNB_PLUGIN_VLLM},<{high}", BNB_PLUGIN]
    assert extras["vllm-legacy"] == [f"vllm>={low},<{BNB_PLUGIN_VLLM}"]


def qlora_engine(tiny_4bit_model_dir) -> VLLMEngine:
    policy = load_policy(ModelSpec(tiny_4bit_model_dir, mode="qlora", lora_r=4, device="cpu"))
    return VLLMEngine(policy, memory_fraction=0.25, seed=3)


def test_qlora_loads_through_bitsandbytes_in_vllm_or_its_plugin(
    tiny_4bit_model_dir, fake_vllm, api
):
    _, inits = fake_vllm
    qlora_engine(tiny_4bit_model_dir)
    assert inits[0]["quantization"] == "bitsandbytes"
    plugin = Version(api["version"]) >= BNB_PLUGIN_VLLM
    assert inits[0].get("load_format") == ("bitsandbytes" if plugin else None)


@pytest.mark.parametrize("api", PLUGIN_APIS, ids=[a["version"] for a in PLUGIN_APIS], indirect=True)
def test_qlora_on_vllm_without_its_plugin_is_a_clear_error(
    tiny_4bit_model_dir, fake_vllm, api, monkeypatch
):
    monkeypatch.setitem(sys.modules, "vllm_bnb_plugin", None)  # not installed: import fails
    with pytest.raises(
        ValueError, match=rf"bitsandbytes plugin.*pip install '{re.escape(BNB_PLUGIN)}'"
    ):
        qlora_engine(tiny_4bit_model_dir)
    monkeypatch.setitem(sys.modules, "vllm_bnb_plugin", types.ModuleType("vllm_bnb_plugin"))
    monkeypatch.setenv("VLLM_PLUGINS", "other")  # installed, but vLLM would not load it
    with pytest.raises(ValueError, match=r"VLLM_PLUGINS='other'.*add bitsandbytes"):
        qlora_engine(tiny_4bit_model_dir)
    monkeypatch.setenv("VLLM_PLUGINS", f"other,{BNB_PLUGIN_ENTRY_POINT}")
    qlora_engine(tiny_4bit_model_dir)


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
