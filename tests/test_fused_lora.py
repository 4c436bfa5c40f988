"""Fused LoRA for sampling (rollout.fuse_lora, rlkit.fused_lora) against peft's own forward:
per projection in float64 (one forward), sampled tokens on the static loop, the copies after an
optimizer step, training gradients, the layers it leaves to peft, and the config knobs."""

from __future__ import annotations

import contextlib

import pytest
import torch
from peft import LoraConfig, get_peft_model

from rlkit import static_decode
from rlkit.config import load_config
from rlkit.fused_lora import FusedLoRA, fused_lora, resolve_fuse_lora
from rlkit.logprobs import sequence_logprobs
from rlkit.models.loading import ModelSpec, load_policy
from rlkit.rollout import generate_rollouts
from rlkit.static_decode import StaticDecoder
from tests.test_qlora import LINEAR_NAMES, qlora_spec

PROMPTS = ["1+2=", "13*2+7=", "(4-1)*12=", "9="]


def randomize_lora_b(model: torch.nn.Module, seed: int = 0) -> None:
    """peft starts every B at zero (LoRA adds nothing): give the adapters something to add."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.3)


def lora_model(model_dir: str, dtype: str = "float64", **spec) -> torch.nn.Module:
    policy = load_policy(ModelSpec(model_dir, mode="lora", lora_r=4, compute_dtype=dtype, **spec))
    randomize_lora_b(policy.model)
    return policy


def projection_outputs(model: torch.nn.Module, inputs: dict) -> dict[str, torch.Tensor]:
    """Each LoRA projection's output in one no-grad eval forward."""
    outputs, hooks = {}, []
    for name, module in model.named_modules():
        if name.endswith(LINEAR_NAMES) and hasattr(module, "lora_A"):
            hook = module.register_forward_hook(
                lambda m, args, out, name=name: outputs.__setitem__(name, out.clone())
            )
            hooks.append(hook)
    with torch.no_grad():
        model(**inputs)
    for hook in hooks:
        hook.remove()
    return outputs


def encoded(tokenizer) -> dict:
    return dict(tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left"))


def assert_fused_equals_peft(model, tokenizer, tol: float) -> FusedLoRA:
    """Each projection's output within ``tol`` of peft's, relative to its largest entry."""
    model.eval()
    peft_out = projection_outputs(model, encoded(tokenizer))
    with fused_lora(model) as fused:
        fused_out = projection_outputs(model, encoded(tokenizer))
    assert set(fused_out) == set(peft_out) and len(peft_out) == 2 * len(LINEAR_NAMES)
    for name, out in peft_out.items():
        assert (fused_out[name] - out).abs().max() <= tol * out.abs().max(), name
    return fused


def test_fused_projections_equal_peft_in_float64(tiny_model_dir):
    policy = lora_model(tiny_model_dir)
    model = policy.model
    fused = assert_fused_equals_peft(model, policy.tokenizer, tol=1e-12)
    # q/k/v and gate/up share one x @ cat(A)^T per decoder layer; o and down are alone
    leaves = [[layer.base_layer for layer, _ in group.layers] for group in fused.groups]
    layer0 = model.base_model.model.model.layers[0]
    attention, mlp = layer0.self_attn, layer0.mlp
    assert [
        attention.q_proj.base_layer,
        attention.k_proj.base_layer,
        attention.v_proj.base_layer,
    ] in leaves
    assert [mlp.gate_proj.base_layer, mlp.up_proj.base_layer] in leaves
    assert [attention.o_proj.base_layer] in leaves and [mlp.down_proj.base_layer] in leaves
    assert len(fused.groups) == 4 * 2 and not fused.skipped
    assert fused.groups[0].a.dtype == torch.float64
    # a nested entry changes nothing, and the context leaves peft's forward behind
    lora_layers = [m for m in model.modules() if hasattr(m, "lora_A")]
    with fused_lora(model) as outer:
        with fused_lora(model):
            model(**encoded(policy.tokenizer))  # with gradients: peft's forward, as outside
        swapped = [
            (layer, g.forwards[i]) for g in outer.groups for i, (layer, _) in enumerate(g.layers)
        ]
        assert all(layer.forward is forward for layer, forward in swapped)
    assert not any("forward" in m.__dict__ for m in lora_layers)


def test_a_qwen3_shaped_model_fuses_exactly(tiny_tokenizer):
    """Qwen3's attention (q/k norms, an explicit head_dim) reads q/k/v from one input too."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tiny_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        pad_token_id=0,
    )
    base = Qwen3ForCausalLM(config).double()
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear"))
    randomize_lora_b(model)
    fused = assert_fused_equals_peft(model, tiny_tokenizer, tol=1e-12)
    assert sorted(len(g.layers) for g in fused.groups) == [1, 1, 1, 1, 2, 2, 3, 3]


def test_fusion_dispatches_fewer_ops_per_decode_step(tiny_4bit_model_dir, tiny_tokenizer):
    """The launch count a decode step pays (CPU ATen ops, as CUDA kernels on a GPU): at least
    four fewer per 4-bit LoRA projection than peft's forward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    policy = load_policy(qlora_spec(tiny_4bit_model_dir))
    model = policy.model.eval()
    inputs = encoded(tiny_tokenizer)

    def step_ops(fuse: bool) -> int:
        decoder = StaticDecoder(model, len(PROMPTS), inputs["input_ids"].shape[1], 3)
        with torch.no_grad(), fused_lora(model) if fuse else contextlib.nullcontext():
            logits = decoder.prefill(inputs["input_ids"], inputs["attention_mask"])
            with CountOps() as ops:
                decoder.step(logits.argmax(-1))
        return ops.count

    projections = 2 * len(LINEAR_NAMES)
    assert step_ops(False) - step_ops(True) >= 4 * projections


def test_the_fused_path_is_what_runs_inside_the_context(tiny_model_dir):
    policy = lora_model(tiny_model_dir)
    model = policy.model.eval()
    peft_out = projection_outputs(model, encoded(policy.tokenizer))
    with fused_lora(model) as fused:
        group = next(g for g in fused.groups if len(g.layers) == 3)
        group.b[1].zero_()  # k's B, in the copy only
        fused_out = projection_outputs(model, encoded(policy.tokenizer))
    qkv = [f"base_model.model.model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    error = [float((fused_out[name] - peft_out[name]).abs().max()) for name in qkv]
    assert error[0] < 1e-12 and error[1] > 0.1 and error[2] < 1e-12  # (all after k changes too)


def test_qlora_fused_projections_equal_peft(tiny_4bit_model_dir):
    policy = load_policy(qlora_spec(tiny_4bit_model_dir))
    randomize_lora_b(policy.model)
    fused = assert_fused_equals_peft(policy.model, policy.tokenizer, tol=1e-5)
    assert len(fused.groups) == 4 * 2 and not fused.skipped


def test_fusion_composes_with_the_dequantized_generation_copy(tiny_4bit_model_dir):
    """Inside the copy's swap the fused layers call the copy's dense base: per projection, the
    copy's outputs (float32 rounding of the LoRA terms apart)."""
    from rlkit.generation_copy import GenerationCopy

    policy = load_policy(qlora_spec(tiny_4bit_model_dir))
    randomize_lora_b(policy.model)
    with GenerationCopy(policy.model).sampling():
        fused = assert_fused_equals_peft(policy.model, policy.tokenizer, tol=1e-5)
        assert len(fused.groups) == 4 * 2


def test_static_loop_samples_the_same_tokens_with_fusion(tiny_model_dir):
    policy = lora_model(tiny_model_dir)
    args = (policy.model, policy.tokenizer, PROMPTS, torch.tensor([0.7, 1.0, 1.3, 1.0]), 8)
    plain = generate_rollouts(*args, generator_seed=3, engine="hf_static")
    with fused_lora(policy.model):
        fused = generate_rollouts(*args, generator_seed=3, engine="hf_static")
    assert torch.equal(fused.input_ids, plain.input_ids)
    assert torch.allclose(fused.sampler_logp, plain.sampler_logp, rtol=0, atol=1e-12)


def test_the_copies_follow_an_optimizer_step(tiny_model_dir):
    """The copies are built once per model and refreshed on every entry: after a step they hold
    the new adapter weights (a stale copy would sample the old policy)."""
    policy = lora_model(tiny_model_dir)
    model, tokenizer = policy.model, policy.tokenizer
    first = assert_fused_equals_peft(model, tokenizer, tol=1e-12)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=0.05)
    batch = generate_rollouts(model, tokenizer, PROMPTS, torch.ones(4), 4, generator_seed=0)
    logp, _ = sequence_logprobs(model.train(), batch, batch.temperatures)
    logp[batch.completion_mask].sum().neg().backward()
    optimizer.step()
    assert_fused_equals_peft(model, tokenizer, tol=1e-12)
    with fused_lora(model) as again:
        assert again is first  # the same copies, refreshed in place


def test_training_forward_and_gradients_are_peft_s_inside_the_context(tiny_model_dir):
    policy = lora_model(tiny_model_dir)
    model, tokenizer = policy.model, policy.tokenizer
    batch = generate_rollouts(model, tokenizer, PROMPTS, torch.ones(4), 4, generator_seed=0)

    def gradients():
        model.zero_grad()
        logp, _ = sequence_logprobs(model.train(), batch, batch.temperatures)
        logp[batch.completion_mask].sum().backward()
        return logp.detach(), [p.grad.clone() for p in policy.trainable_parameters()]

    logp, grads = gradients()
    with fused_lora(model):
        fused_logp, fused_grads = gradients()
    assert torch.equal(fused_logp, logp)
    assert all(torch.equal(a, b) for a, b in zip(fused_grads, grads, strict=True))


def test_ranks_and_alphas_that_differ_per_projection_fuse_exactly(tiny_model, tiny_tokenizer):
    """cat(A) takes each layer's rank as its slice, and each B its own scaling."""
    config = LoraConfig(
        r=4, target_modules="all-linear", rank_pattern={"k_proj": 2}, alpha_pattern={"v_proj": 3}
    )
    model = get_peft_model(tiny_model.double(), config)
    randomize_lora_b(model)
    fused = assert_fused_equals_peft(model, tiny_tokenizer, tol=1e-12)
    qkv = next(g for g in fused.groups if len(g.layers) == 3)
    assert [s.stop - s.start for s in qkv.slices] == [4, 2, 4]
    assert qkv.scaling == [8 / 4, 8 / 2, 3 / 4]


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("dora", r"4 LoRA layer\(s\) keep peft's forward.*is a DoraLinearVariant"),
        ("merged", r"4 LoRA layer\(s\) keep peft's forward.*merged into the base weights"),
    ],
)
def test_an_adapter_fusion_would_get_wrong_keeps_peft_s_forward_and_says_why(
    tiny_model, setup, reason
):
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], use_dora=setup == "dora")
    model = get_peft_model(tiny_model.double(), config).eval()
    randomize_lora_b(model)
    if setup == "merged":
        model.merge_adapter()
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8]])}
    with torch.no_grad():
        expected = model(**inputs).logits
    with pytest.warns(UserWarning, match=reason), fused_lora(model) as fused, torch.no_grad():
        assert not fused.groups
        assert torch.equal(model(**inputs).logits, expected)


def test_fuse_lora_resolves_and_refuses_where_it_cannot_act():
    assert resolve_fuse_lora("auto", "hf_static", "qlora")
    assert not resolve_fuse_lora("auto", "hf_static", "full")
    assert not resolve_fuse_lora("auto", "hf", "lora")
    assert not resolve_fuse_lora(False, "hf_static", "lora")
    lora = ["model.mode=lora", "model.name_or_path=/tmp"]
    with pytest.raises(
        ValueError,
        match=r"^rollout\.fuse_lora=True is read only by the engine hf_static .*engine is hf:",
    ):
        load_config("tiny-cpu", [*lora, "rollout.fuse_lora=true"])
    with pytest.raises(
        ValueError,
        match=r"^rollout\.compile=True is read only by the engine hf_static .*engine is vllm:",
    ):
        load_config("tiny-cpu", [*lora, "rollout.engine=vllm", "rollout.compile=true"])
    with pytest.raises(
        ValueError,
        match=r"^rollout\.fuse_lora=False is read only with model\.mode=lora or qlora .*"
        r"this config has model\.mode=full",
    ):
        load_config("tiny-cpu", ["rollout.engine=hf_static", "rollout.fuse_lora=false"])
    with pytest.raises(ValueError, match=r"rollout\.fuse_lora must be one of \['auto'\]"):
        load_config("tiny-cpu", ["rollout.fuse_lora=always"])
    cfg = load_config("tiny-cpu", [*lora, "rollout.engine=hf_static", "rollout.compile=true"])
    assert cfg.rollout.fuse_lora == "auto" and cfg.rollout.compile is True


def test_compile_on_the_cpu_decodes_eagerly_and_says_why(tiny_model, tiny_tokenizer):
    args = (tiny_model, tiny_tokenizer, PROMPTS, torch.ones(4), 6)
    eager = generate_rollouts(*args, generator_seed=2, engine="hf_static")
    with pytest.warns(UserWarning, match="rollout.compile: .*needs CUDA.*no CUDA device.*eagerly"):
        compiled = generate_rollouts(*args, generator_seed=2, engine="hf_static", compile_step=True)
    assert torch.equal(compiled.input_ids, eager.input_ids)  # over a cache rounded up to 128
    with pytest.warns(UserWarning, match="rollout.compile"):
        assert StaticDecoder(tiny_model, 2, 9, 8, compile_step=True).width == 128
    with pytest.raises(ValueError, match="compile_step=True needs engine='hf_static'"):
        generate_rollouts(*args, compile_step=True)


def test_the_fused_decode_step_traces_whole_and_compiles_once(tiny_model_dir):
    """What ``rollout.compile`` does on CUDA, with a CPU backend: dynamo traces the fused
    forwards without a graph break, the compiled step gives the eager logits, and a later call
    (a new cache, refreshed copies) reuses the compiled graph."""
    import torch._dynamo

    policy = lora_model(tiny_model_dir, dtype="float32")
    model = policy.model.eval()
    inputs = encoded(policy.tokenizer)
    compiled = torch.compile(static_decode._decode_forward, backend="aot_eager", dynamic=False)

    def decode(forward):
        decoder = StaticDecoder(model, len(PROMPTS), inputs["input_ids"].shape[1], 3)
        decoder.decode_forward = forward
        with torch.no_grad(), fused_lora(model):
            logits, steps = decoder.prefill(inputs["input_ids"], inputs["attention_mask"]), []
            for _ in range(2):
                logits = decoder.step(logits.argmax(-1))
                steps.append(logits)
            return torch.stack(steps)

    torch._dynamo.reset()
    eager = decode(static_decode._decode_forward)
    assert torch.allclose(decode(compiled), eager, rtol=0, atol=1e-4)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert torch.allclose(decode(compiled), eager, rtol=0, atol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs == 1
    assert not torch._dynamo.utils.counters["graph_break"]


def test_a_float64_run_samples_with_fresh_copies_after_every_step(tmp_path, tiny_model_dir):
    """The trainer's sampler reads the adapters each step's update wrote: in float64 its
    log-probs are the training forward's to rounding (of the float32 sampling scores, as HF's),
    at a learning rate that moves them: a stale copy samples the previous step's policy."""
    from rlkit.metrics import read_metrics
    from rlkit.trainer import Trainer
    from tests.test_trainer import make_config

    cfg = make_config(
        tmp_path,
        tiny_model_dir,
        "model.mode=lora",
        "model.compute_dtype=float64",
        "rollout.engine=hf_static",
        "optim.lr=0.05",
        "loss.kl_coef=0.5",  # a gradient even when every group's rewards tie
        "steps=3",
    )
    trainer = Trainer(cfg)
    assert trainer.collector.fuse_lora  # rollout.fuse_lora=auto: on for hf_static with LoRA
    lora_layers = [m for m in trainer.policy.model.modules() if hasattr(m, "lora_A")]
    with trainer.collector.sampling_weights():  # what rollouts and evaluation sample under
        assert all("forward" in m.__dict__ for m in lora_layers)
    randomize_lora_b(trainer.policy.model)
    before = [p.detach().clone() for p in trainer.policy.trainable_parameters()]
    trainer.train()
    after = trainer.policy.trainable_parameters()
    assert not all(torch.equal(a, b) for a, b in zip(after, before, strict=True))  # it learnt
    rows = [r for r in read_metrics(tmp_path) if "sampling/sampling_logp_difference/mean" in r]
    assert len(rows) == 3
    for row in rows:
        assert row["sampling/sampling_logp_difference/mean"] < 1e-6  # stale: about 1.7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph needs CUDA")
@pytest.mark.parametrize("compile_step", [False, True])
@pytest.mark.parametrize("mode", ["lora", "qlora"])
def test_on_cuda_the_fused_decode_step_is_captured_in_a_cuda_graph(
    tiny_4bit_model_dir, mode, compile_step
):
    """The device check (not run on the CPU): bf16 LoRA and QLoRA on CUDA, the static loop
    captures its decode step over the fused layers (compiled or not; no eager fallback), and
    samples the trainer's policy up to bf16 rounding."""
    import dataclasses
    import warnings

    spec = dataclasses.replace(qlora_spec(tiny_4bit_model_dir), mode=mode)
    spec.compute_dtype, spec.device = "bfloat16", "cuda"
    policy = load_policy(spec)
    randomize_lora_b(policy.model)
    with warnings.catch_warnings(record=True) as caught, fused_lora(policy.model) as fused:
        warnings.simplefilter("always")
        batch = generate_rollouts(
            policy.model, policy.tokenizer, PROMPTS, torch.ones(4), 6, generator_seed=0,
            engine="hf_static", compile_step=compile_step,
        )  # fmt: skip
    assert fused.groups[0].a.dtype == torch.bfloat16 and fused.groups[0].a.is_cuda
    assert not [w for w in caught if "capture failed" in str(w.message)]
    trainer_logp, _ = sequence_logprobs(policy.model, batch, batch.temperatures)
    mask = batch.completion_mask
    assert torch.allclose(batch.sampler_logp[mask], trainer_logp[mask].float(), atol=0.1)
