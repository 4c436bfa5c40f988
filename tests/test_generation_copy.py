"""The dequantized generation copy (``rollout.generation_copy``, rlkit.generation_copy) on the tiny
4-bit Llama (bitsandbytes NF4 on the CPU, as in tests/test_qlora.py): an exact base, the live
LoRA, the training forward untouched, TIS turned on, the memory counted, bad settings refused."""

from __future__ import annotations

import warnings

import bitsandbytes as bnb
import pytest
import torch
from bitsandbytes.functional import dequantize_4bit

from rlkit.cli import main
from rlkit.config import load_config
from rlkit.generation_copy import DequantizedLinear, GenerationCopy, check_room
from rlkit.logprobs import sequence_logprobs
from rlkit.metrics import read_metrics
from rlkit.models.loading import load_policy
from rlkit.plan import GIB, build_plan, check_fits, resolve_batch_sizes
from rlkit.rollout import generate_rollouts
from rlkit.tis import DEFAULT_TIS_CAP, applied_cap, resolve_tis_cap
from rlkit.trainer import Trainer
from tests.test_qlora import PROMPTS, nll, qlora_spec
from tests.test_tis import TIS_KEYS
from tests.test_trainer import make_config

COPY = "rollout.generation_copy=dequantized"


@pytest.fixture(params=["float32", "bfloat16"])
def policy(request, tiny_4bit_model_dir):
    spec = qlora_spec(tiny_4bit_model_dir)
    spec.compute_dtype = request.param
    torch.manual_seed(0)  # the LoRA initialisation
    return load_policy(spec)


def four_bit_layers(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def test_the_copy_holds_exactly_the_matrices_the_nf4_training_forward_multiplies(policy):
    copy = GenerationCopy(policy.model)
    assert len(copy.swaps) == len(four_bit_layers(policy.model)) == 14  # 2 layers × 7 linears
    for _, _, four_bit, dense in copy.swaps:
        dtype = four_bit.compute_dtype
        expected = dequantize_4bit(four_bit.weight.data, four_bit.weight.quant_state).to(dtype)
        assert dense.weight.dtype == policy.spec.dtype and not dense.weight.requires_grad
        assert torch.equal(dense.weight, expected)
        # and the same outputs as the 4-bit layer's training forward (dequantize, then F.linear)
        x = torch.randn(3, four_bit.in_features, dtype=dtype, requires_grad=True)
        assert torch.equal(dense(x), four_bit.train()(x))
    assert copy.nbytes == sum(d.weight.numel() * d.weight.element_size() for *_, d in copy.swaps)


def test_sampling_swaps_only_the_base_layers_and_puts_the_4bit_ones_back(policy):
    model = policy.model
    trainable = {id(p) for p in policy.trainable_parameters()}
    copy = GenerationCopy(model)
    assert four_bit_layers(model) and not any(
        isinstance(m, DequantizedLinear) for m in model.modules()
    )
    with copy.sampling():
        assert four_bit_layers(model) == []  # no bitsandbytes kernel runs while sampling
        lora = {id(p) for n, p in model.named_parameters() if "lora_" in n}
        assert lora == trainable  # the very adapter parameters, not copies
    assert len(four_bit_layers(model)) == 14
    with pytest.raises(RuntimeError, match="inside"), copy.sampling():
        raise RuntimeError("inside")
    assert len(four_bit_layers(model)) == 14  # restored on an error too


def sampled_logits(policy, copy, ids) -> torch.Tensor:
    with torch.no_grad(), copy.sampling():
        return policy.model.eval()(ids).logits.double()


def test_the_copy_samples_from_the_adapter_the_optimizer_just_updated(policy):
    """One AdamW step on the NF4 training forward moves the copy's logits, to exactly those of a
    copy built after the step: a copy that froze the adapter at build time fails here."""
    model, tokenizer = policy.model, policy.tokenizer
    copy = GenerationCopy(model)
    batch = generate_rollouts(model, tokenizer, PROMPTS, torch.ones(4), 6, generator_seed=0)
    before = sampled_logits(policy, copy, batch.input_ids)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    model.train()
    nll(policy, batch).backward()
    optimizer.step()
    after = sampled_logits(policy, copy, batch.input_ids)
    assert (after - before).abs().max() > 1e-3
    assert torch.equal(after, sampled_logits(policy, GenerationCopy(model), batch.input_ids))


def test_the_training_forward_and_its_gradients_are_untouched(policy):
    model, tokenizer = policy.model, policy.tokenizer
    batch = generate_rollouts(model, tokenizer, PROMPTS, torch.ones(4), 6, generator_seed=0)

    def loss_and_grads():
        model.zero_grad()
        loss = nll(policy, batch)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in policy.trainable_parameters()]

    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss, grads = loss_and_grads()
    copy = GenerationCopy(model)
    with copy.sampling():
        generate_rollouts(model, tokenizer, PROMPTS, torch.ones(4), 6, generator_seed=1)
    loss_after, grads_after = loss_and_grads()
    assert torch.equal(loss, loss_after)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_after, strict=True))
    after = model.state_dict()
    assert after.keys() == state.keys()  # the copy adds no state: checkpoints are unchanged
    assert all(torch.equal(state[k], after[k]) for k in state)


@pytest.mark.parametrize("engine", ["hf", "hf_static"])
def test_the_copy_samples_the_policy_the_trainer_scores(policy, engine):
    """The sampler's recorded log-probs under the copy are the NF4 training forward's up to
    kernel rounding (one call, compared once)."""
    model, tokenizer = policy.model, policy.tokenizer
    with GenerationCopy(model).sampling():
        batch = generate_rollouts(
            model, tokenizer, PROMPTS, torch.ones(4), 6, generator_seed=0,
            record_logprobs=True, engine=engine,
        )  # fmt: skip
    trainer_logp, _ = sequence_logprobs(model, batch, batch.temperatures)
    mask = batch.completion_mask
    atol = 1e-4 if policy.spec.dtype == torch.float32 else 0.1
    assert torch.allclose(batch.sampler_logp[mask], trainer_logp[mask].float(), atol=atol)


def test_the_unmerged_copy_keeps_a_small_update_that_merging_into_bf16_loses(policy):
    """Design note §3(c): W + ΔW rounded to bf16 loses most of ΔW at ‖ΔW‖/‖W‖ = 1e-3. The copy
    keeps W exactly and runs the trainer's own adapter beside it: its ΔW is s·BA itself."""
    if policy.spec.dtype != torch.bfloat16:
        pytest.skip("the rounding loss is bf16's")
    lora_layer, _, four_bit, dense = GenerationCopy(policy.model).swaps[0]
    w = dense.weight.double()
    delta = torch.randn_like(w)
    delta *= 1e-3 * w.norm() / delta.norm()
    merged = (w + delta).to(torch.bfloat16).double() - w
    assert (merged - delta).norm() / delta.norm() > 0.5  # most of the update is gone
    with GenerationCopy(policy.model).sampling():
        assert lora_layer.base_layer.weight.dtype == torch.bfloat16
        assert lora_layer.lora_A["default"].weight.dtype == torch.float32  # the live fp32 adapter
    trained = {id(p) for p in policy.trainable_parameters()}
    assert {id(p) for p in lora_layer.parameters() if p.requires_grad} <= trained


def test_tis_turns_on_with_the_copy():
    assert resolve_tis_cap("auto", "hf") is None
    assert resolve_tis_cap("auto", "hf", "none") is None
    assert resolve_tis_cap("auto", "hf", "dequantized") == DEFAULT_TIS_CAP
    assert resolve_tis_cap("auto", "hf_static", "dequantized") == DEFAULT_TIS_CAP
    assert resolve_tis_cap("off", "hf", "dequantized") is None


@pytest.mark.parametrize("engine", ["hf", "hf_static"])
def test_a_run_with_the_copy_records_sampler_logprobs_and_corrects_them(
    tmp_path, tiny_4bit_model_dir, engine, monkeypatch
):
    """Every sampling call of a run, rollouts and evaluation, runs over the copy; TIS is on."""
    cfg = make_config(
        tmp_path, tiny_4bit_model_dir, "model.mode=qlora", COPY, f"rollout.engine={engine}"
    )
    trainer = Trainer(cfg)
    assert (
        applied_cap(trainer.update.loss) == DEFAULT_TIS_CAP
        and trainer.collector.engine.record_logprobs
    )
    assert trainer.collector.generation_copy is not None
    over_4bit = []

    def recording(model, *args, **kwargs):
        over_4bit.append(bool(four_bit_layers(model)))
        return generate_rollouts(model, *args, **kwargs)

    # the rollouts' and evaluation's engine object alike (rlkit.rollout.InProcessEngine)
    monkeypatch.setattr("rlkit.rollout.generate_rollouts", recording)
    trainer.train()
    # evaluation at the start and the end (greedy + sampled) and one call per step
    assert over_4bit == [False] * (2 * 2 + cfg.steps)
    assert four_bit_layers(trainer.policy.model)  # training ran NF4 and ends NF4
    rows = read_metrics(tmp_path)[1:]
    for row in rows:
        assert all(k in row for k in TIS_KEYS)
        assert row["sampling/sampling_logp_difference/mean"] < 1e-3  # float32: kernel noise


def test_the_plan_counts_the_copy_and_says_when_it_fits(capsys):
    cfg = load_config("qwen3-8b-qlora", ["rollout.generation_batch_size=16", "eval.batch_size=16"])
    without = build_plan(cfg)
    with_copy = build_plan(load_config("qwen3-8b-qlora", [COPY, "rollout.generation_batch_size=16",
                                                          "eval.batch_size=16"]))  # fmt: skip
    linears = without.shape.linear_params * 2  # bf16
    assert with_copy.generation_copy() == linears and without.generation_copy() == 0
    assert 12.5 * GIB < linears < 13.5 * GIB  # the design note's +12.9 GiB
    assert with_copy.resident() - without.resident() == linears
    assert "weights + dequantized generation copy" in [p.name for p in with_copy.phases()]
    # no per-layer dequantization left in generation, so the phase grows by less than the copy
    assert with_copy.generation(16) - without.generation(16) < linears
    check_fits(with_copy, 40 * GIB)
    with pytest.raises(ValueError, match="generation copy phase .* rollout.generation_copy=none"):
        check_fits(with_copy, 20 * GIB)  # 18 GiB for training: NF4 + the copy is 18.6
    # auto sizes shrink to leave room for it
    auto = load_config("qwen3-8b-qlora", [COPY])
    sized, _ = resolve_batch_sizes(auto, 40 * GIB)
    plain, _ = resolve_batch_sizes(load_config("qwen3-8b-qlora"), 40 * GIB)
    assert sized.rollout.generation_batch_size < plain.rollout.generation_batch_size
    for gib, verdict in [("24", "does not fit 24 GiB"), ("80", "fits 80 GiB at these settings")]:
        assert main(["plan", "--config", "qwen3-8b-qlora", "--gpu-mem", gib]) == 0
        out = capsys.readouterr().out
        assert f"rollout.generation_copy=dequantized (off; +12.9 GiB resident): {verdict}" in out
        assert "model.mode=lora (better wherever it fits" in out


def test_the_plan_counts_what_the_copy_allocates(tiny_4bit_model_dir):
    spec = qlora_spec(tiny_4bit_model_dir)
    spec.compute_dtype = "bfloat16"
    copy = GenerationCopy(load_policy(spec).model)
    cfg = load_config(
        "tiny-cpu",
        [f"model.name_or_path={tiny_4bit_model_dir}", "model.mode=qlora",
         "model.compute_dtype=bfloat16", COPY],
    )  # fmt: skip
    assert build_plan(cfg, 8).generation_copy() == copy.nbytes


def test_a_device_without_room_for_the_copy_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * GIB, 24 * GIB))
    with pytest.raises(ValueError, match=r"needs 12\.9 GiB .* only 2\.0 of the 24\.0 GiB"):
        check_room(int(12.9 * GIB), torch.device("cuda", 0))
    check_room(int(1.9 * GIB), torch.device("cuda", 0))
    check_room(10**15, torch.device("cpu"))  # no known limit


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.mode=lora", COPY], r"rollout.generation_copy='dequantized' is read only with "
                                    r"model.mode=qlora .*this config has model.mode=lora"),
        (["model.mode=full", COPY], "model.mode=qlora .*this config has model.mode=full"),
        (["model.mode=qlora", COPY, "rollout.engine=vllm"],
         "rollout.generation_copy='dequantized' is read only by the engines hf .*engine is vllm"),
        (["model.mode=qlora", COPY, "loss.ratio_temperature=1.0"],
         "rollout.generation_copy=dequantized.*needs loss.ratio_temperature=sampling"),
        (["rollout.generation_copy=bf16"], "rollout.generation_copy must be one of"),
    ],
)  # fmt: skip
def test_a_copy_that_cannot_act_is_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny-cpu", ["model.name_or_path=some/model", *overrides])


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the CUDA graph and free memory need CUDA"
)
def test_on_cuda_the_copy_decodes_in_a_cuda_graph_and_checks_free_memory(tiny_4bit_model_dir):
    """The device check (not run on the CPU): bf16 on CUDA, the static loop captures its decode
    step over the copy's linears (no eager fallback), and the sampler is the trainer's policy up
    to bf16 kernel rounding."""
    spec = qlora_spec(tiny_4bit_model_dir)
    spec.compute_dtype, spec.device = "bfloat16", "cuda"
    policy = load_policy(spec)
    copy = GenerationCopy(policy.model)  # check_room against torch.cuda.mem_get_info
    assert all(d.weight.is_cuda for *_, d in copy.swaps)
    with warnings.catch_warnings(record=True) as caught, copy.sampling():
        warnings.simplefilter("always")
        batch = generate_rollouts(
            policy.model, policy.tokenizer, PROMPTS, torch.ones(4), 6, generator_seed=0,
            engine="hf_static",
        )  # fmt: skip
    assert not [w for w in caught if "capture failed" in str(w.message)]
    assert len(four_bit_layers(policy.model)) == 14
    trainer_logp, _ = sequence_logprobs(policy.model, batch, batch.temperatures)
    mask = batch.completion_mask
    assert torch.allclose(batch.sampler_logp[mask], trainer_logp[mask].float(), atol=0.1)
