"""QLoRA on a tiny 4-bit Llama (bitsandbytes NF4 on the CPU): the real quantized code path.

The model is the 64-wide fixture, whose layer widths every bitsandbytes CPU kernel accepts, so these
tests take the same path as a real model on this CPU (with or without AVX512-BF16).
"""

from __future__ import annotations

import bitsandbytes as bnb
import pytest
import torch

from rlkit.cli import main
from rlkit.logprobs import sequence_logprobs
from rlkit.losses import kl_divergence
from rlkit.models.loading import ModelSpec, QuantizedGradientError, load_policy
from rlkit.rollout import generate_rollouts

PROMPTS = ["1+2=", "13*2+7=", "(4-1)*12=", "9="]
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def qlora_spec(path: str) -> ModelSpec:
    return ModelSpec(
        path,
        mode="qlora",
        lora_r=8,
        lora_alpha=16,
        compute_dtype="float32",
        quant_type="nf4",
        double_quant=True,
        gradient_checkpointing=True,
        device="cpu",
    )


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, including packed 4-bit weights and their quantization state."""
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    assert any("quant_state" in name for name in state)  # the 4-bit scales are in there too
    return state


def changed_tensors(before, after) -> set[str]:
    return {name for name in before if not torch.equal(before[name], after[name])}


@pytest.fixture
def policy(tiny_4bit_model_dir):
    return load_policy(qlora_spec(tiny_4bit_model_dir))


@pytest.fixture
def fixed_batch(policy):
    """Completions sampled once from the initial policy; the training targets of every step."""
    return generate_rollouts(
        policy.model, policy.tokenizer, PROMPTS * 2, torch.ones(8), 12, generator_seed=0
    )


def nll(policy, batch) -> torch.Tensor:
    logp, _ = sequence_logprobs(policy.model, batch, batch.temperatures)
    return -(logp.sum() / batch.completion_mask.sum())


def reference_kl(policy, batch) -> float:
    """Mean k3 KL(π_θ ‖ π_ref) over the completion tokens of `batch`."""
    with torch.no_grad():
        logp, _ = sequence_logprobs(policy.model, batch, batch.temperatures)
        with policy.reference() as ref:
            ref_logp, _ = sequence_logprobs(ref, batch, batch.temperatures)
    kl = kl_divergence(logp, ref_logp, estimator="k3")
    return float(kl[batch.completion_mask].mean())


def test_linear_layers_are_nf4_double_quantized(policy):
    quantized = {
        name: module
        for name, module in policy.model.named_modules()
        if isinstance(module, bnb.nn.Linear4bit)
    }
    assert len(quantized) == 2 * len(LINEAR_NAMES)  # two layers, every projection
    assert all(name.endswith("base_layer") for name in quantized)  # each wrapped by LoRA
    for module in quantized.values():
        state = module.weight.quant_state
        assert state.quant_type == "nf4" and state.nested  # nested = double quantization
        assert module.compute_dtype == torch.float32
    assert policy.num_trainable_parameters() == sum(
        p.numel() for n, p in policy.model.named_parameters() if "lora_" in n
    )


def test_every_lora_b_gets_a_gradient_in_a_step_after_generation(policy, fixed_batch):
    """Generation (an eval-mode, no-grad pass) must leave every 4-bit layer on the autograd path.

    LoRA's B starts at 0, so B's gradient is non-zero only if the loss's gradient reaches that
    layer's output; a 4-bit layer that drops its input gradient cuts every adapter before it
    (bitsandbytes 0.50 on AVX512-BF16 CPUs, see rlkit/models/loading.py).
    """
    nll(policy, fixed_batch).backward()
    lora_b = {n: p.grad for n, p in policy.model.named_parameters() if "lora_B" in n}
    assert len(lora_b) == 2 * len(LINEAR_NAMES)
    without = sorted(n for n, g in lora_b.items() if g is None or not bool(g.abs().sum() > 0))
    assert without == []


def test_a_4bit_layer_that_drops_gradients_after_inference_is_refused(
    tiny_4bit_model_dir, monkeypatch, capsys, tmp_path
):
    """The load-time probe refuses the failure mode itself, whichever machine runs the test: here
    every 4-bit layer detaches its output once it has run an eval-mode no-grad pass."""
    forward = bnb.nn.Linear4bit.forward

    def detaching_after_inference(self, x):
        if not self.training and not torch.is_grad_enabled():
            self.seen_inference = True
        out = forward(self, x)
        return out.detach() if getattr(self, "seen_inference", False) else out

    monkeypatch.setattr(bnb.nn.Linear4bit, "forward", detaching_after_inference)
    message = "q_proj stops the gradient after an inference pass"
    with pytest.raises(QuantizedGradientError, match=message):
        load_policy(qlora_spec(tiny_4bit_model_dir))
    args = [f"model.name_or_path={tiny_4bit_model_dir}", "model.mode=qlora", "progress=false"]
    assert main(["train", f"output_dir={tmp_path}", *args]) == 2
    assert message in capsys.readouterr().err


def test_training_decreases_the_loss_and_changes_only_lora_weights(policy, fixed_batch):
    before = snapshot(policy.model)
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = nll(policy, fixed_batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    final = nll(policy, fixed_batch).item()

    assert final < losses[0] - 0.05, (losses, final)
    changed = changed_tensors(before, snapshot(policy.model))
    lora = {name for name in before if "lora_A" in name or "lora_B" in name}
    assert changed == lora


def test_reference_kl_is_zero_before_the_first_update_and_positive_after(policy, fixed_batch):
    assert reference_kl(policy, fixed_batch) == 0.0
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    nll(policy, fixed_batch).backward()
    optimizer.step()
    assert reference_kl(policy, fixed_batch) > 1e-6


def test_adapter_save_and_load_reproduces_the_logprobs(
    policy, fixed_batch, tiny_4bit_model_dir, tmp_path
):
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=1e-2)
    for _ in range(2):
        nll(policy, fixed_batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    policy.save(tmp_path / "adapter")
    with torch.no_grad():
        trained, _ = sequence_logprobs(policy.model, fixed_batch, fixed_batch.temperatures)

    fresh = load_policy(qlora_spec(tiny_4bit_model_dir))
    with torch.no_grad():
        untrained, _ = sequence_logprobs(fresh.model, fixed_batch, fixed_batch.temperatures)
        fresh.load_trainable_state(tmp_path / "adapter")
        restored, _ = sequence_logprobs(fresh.model, fixed_batch, fixed_batch.temperatures)
    assert not torch.allclose(untrained, trained)
    torch.testing.assert_close(restored, trained, atol=0, rtol=0)


@pytest.fixture(scope="module")
def bf16_policy(tiny_4bit_model_dir):
    """A QLoRA policy with bf16 compute on the hidden-64 Llama (bitsandbytes' CPU 4-bit kernels
    need in_features >= their block size of 64)."""
    spec = qlora_spec(tiny_4bit_model_dir)
    spec.compute_dtype = "bfloat16"
    return load_policy(spec)


def test_qlora_frozen_weights_run_in_the_compute_dtype_and_every_lora_b_trains(bf16_policy):
    """Embeddings, norms and the head in bf16 (not prepare_model_for_kbit_training's fp32), LoRA
    in fp32, bf16 logits; in the first backward after generating, every LoRA-B matrix has a
    gradient (so gradients pass through every 4-bit base layer: LoRA-B starts at 0)."""
    model = bf16_policy.model
    for name, param in model.named_parameters():
        if "lora_" in name:
            assert param.dtype == torch.float32 and param.requires_grad, name
        elif param.is_floating_point():
            assert param.dtype == torch.bfloat16, name
    batch = generate_rollouts(model, bf16_policy.tokenizer, PROMPTS * 2, torch.ones(8), 6)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert logits.dtype == torch.bfloat16
    model.train()  # generation ran in eval mode without grad: the CPU repacking case
    logp, _ = sequence_logprobs(model, batch, batch.temperatures, chunk_size=2)
    assert logp.dtype == torch.float32
    (-logp.sum()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if "lora_B" in n}
    assert len(grads) == 2 * len(LINEAR_NAMES)
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values()), grads.keys()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_prompt_forward_gives_the_same_lora_gradients_through_4bit_layers(
    tiny_4bit_model_dir, checkpointing
):
    """`optim.share_prompt_forward` through NF4 layers, with and without gradient checkpointing:
    log-probs and every LoRA gradient equal the one-pass values up to float rounding."""
    import dataclasses

    spec = dataclasses.replace(
        qlora_spec(tiny_4bit_model_dir), gradient_checkpointing=checkpointing
    )
    policy = load_policy(spec)
    batch = generate_rollouts(
        policy.model, policy.tokenizer, PROMPTS * 2, torch.ones(8), 12, generator_seed=0
    )  # every prompt twice
    results = []
    for share in (False, True):
        policy.model.zero_grad()
        logp, _ = sequence_logprobs(policy.model, batch, batch.temperatures, share_prompts=share)
        (logp.sum() / batch.completion_mask.sum()).backward()
        lora = {n: p.grad.clone() for n, p in policy.model.named_parameters() if "lora_" in n}
        results.append((logp.detach(), lora))
    (plain, plain_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)
    assert len(plain_grads) == 4 * len(LINEAR_NAMES)
    for name, grad in plain_grads.items():
        assert bool(grad.abs().sum() > 0) or "lora_A" in name, name  # B starts at 0: A's grad is 0
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6, rtol=1e-4)
