"""Policy loading: spec validation, full fine-tune with a frozen reference, LoRA reference."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.models.loading import ModelSpec, load_policy

TEXT = ["1+2=3</s>", "13*2+7=33</s>"]


def nll(model, tokenizer) -> torch.Tensor:
    """Mean next-token NLL of TEXT (a fixed batch, left-padded)."""
    enc = tokenizer(TEXT, return_tensors="pt", padding=True)
    labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
    return model(**enc, labels=labels).loss


def logits_of(model, tokenizer) -> torch.Tensor:
    enc = tokenizer(TEXT, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**enc).logits


def sgd_step(policy, lr=0.05) -> None:
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=lr)
    nll(policy.model, policy.tokenizer).backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize(
    "field, value",
    [
        ("mode", "int8"),
        ("lora_r", 0),
        ("lora_alpha", -1),
        ("lora_dropout", 1.5),
        ("target_modules", "q_proj"),
        ("target_modules", []),
        ("compute_dtype", "float8"),
        ("quant_type", "int3"),
        ("device", "cuda:7" if not torch.cuda.is_available() else "not-a-device"),
    ],
)
def test_model_spec_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"ModelSpec\.{field}\b"):
        ModelSpec("some/model", **{field: value})


def test_model_spec_defaults_are_valid():
    spec = ModelSpec("some/model")
    assert spec.mode == "lora" and spec.dtype == torch.float32
    assert spec.torch_device.type in ("cpu", "cuda")


def test_full_mode_trains_everything_against_a_frozen_reference(tiny_model_dir):
    policy = load_policy(ModelSpec(tiny_model_dir, mode="full", device="cpu"))
    assert policy.num_trainable_parameters() == policy.num_parameters() > 0
    assert policy.tokenizer.padding_side == "left" and policy.tokenizer.pad_token is not None
    before = logits_of(policy.model, policy.tokenizer)
    with policy.reference() as ref:
        assert ref is not policy.model and not ref.training
        assert all(not p.requires_grad for p in ref.parameters())
        torch.testing.assert_close(logits_of(ref, policy.tokenizer), before, atol=0, rtol=0)

    sgd_step(policy)

    assert not torch.allclose(logits_of(policy.model, policy.tokenizer), before)
    with policy.reference() as ref:
        torch.testing.assert_close(logits_of(ref, policy.tokenizer), before, atol=0, rtol=0)


def test_lora_reference_is_the_base_model_with_the_adapter_disabled(tiny_model_dir):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    policy = load_policy(ModelSpec(tiny_model_dir, mode="lora", lora_r=4, device="cpu"))
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert policy.num_trainable_parameters() < policy.num_parameters()
    base_logits = logits_of(base, policy.tokenizer)

    sgd_step(policy)

    assert policy.model.training
    with policy.reference() as ref:
        assert not ref.training
        torch.testing.assert_close(logits_of(ref, policy.tokenizer), base_logits, atol=0, rtol=0)
    assert policy.model.training  # restored after the reference pass
    assert not torch.allclose(logits_of(policy.model, policy.tokenizer), base_logits)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_save_and_load_trainable_state_round_trip(tiny_model_dir, tmp_path, mode):
    policy = load_policy(ModelSpec(tiny_model_dir, mode=mode, lora_r=4, device="cpu"))
    sgd_step(policy)
    saved = logits_of(policy.model, policy.tokenizer)
    policy.save(tmp_path / "ckpt")
    sgd_step(policy)
    assert not torch.allclose(logits_of(policy.model, policy.tokenizer), saved)

    fresh = load_policy(ModelSpec(tiny_model_dir, mode=mode, lora_r=4, device="cpu"))
    fresh.load_trainable_state(tmp_path / "ckpt")
    torch.testing.assert_close(logits_of(fresh.model, fresh.tokenizer), saved, atol=0, rtol=0)
    if mode == "lora":
        assert not (tmp_path / "ckpt" / "model.safetensors").exists()  # adapter only


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    grads = []
    for checkpointing in (False, True):
        spec = ModelSpec(
            tiny_model_dir,
            mode="lora",
            lora_r=4,
            gradient_checkpointing=checkpointing,
            device="cpu",
        )
        policy = load_policy(spec)
        torch.manual_seed(0)
        for param in policy.trainable_parameters():  # LoRA B starts at 0: give both runs the
            torch.nn.init.normal_(param, std=0.1)  # same non-trivial adapter
        nll(policy.model, policy.tokenizer).backward()
        grads.append([p.grad.clone() for p in policy.trainable_parameters()])
        assert policy.model.is_activation_checkpointing == checkpointing
    for plain, checkpointed in zip(*grads):
        torch.testing.assert_close(checkpointed, plain, atol=1e-6, rtol=1e-5)
