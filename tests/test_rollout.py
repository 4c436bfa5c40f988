"""Rollouts with per-row temperature and log-probs at the sampling temperature (rlkit.rollout)."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

import rlkit.logprobs as logprobs_module
from rlkit.config import load_config
from rlkit.logprobs import PromptSharingError, sequence_logprobs
from rlkit.methods import build_method
from rlkit.pass_plan import PassPlan
from rlkit.rollout import (
    RowTemperatureLogitsProcessor,
    _completion_layout,
    generate_in_batches,
    generate_rollouts,
)
from rlkit.rollout_batch import RolloutBatch

PROMPTS = ["1+2=", "13*2+7=", "(4-1)*12=", "9="]


def next_token_logits(model, tokenizer, prompt: str) -> torch.Tensor:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].double()


def entropy(probs: torch.Tensor) -> float:
    probs = probs[probs > 0]
    return float(-(probs * probs.log()).sum())


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return float(0.5 * (p - q).abs().sum())


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Reference top-p: keep the most probable tokens until their mass reaches top_p."""
    order = probs.argsort(descending=True)
    mass_before = probs[order].cumsum(0) - probs[order]
    keep = torch.zeros_like(probs, dtype=torch.bool)
    keep[order[mass_before < top_p]] = True
    return keep


def expected_sampling_probs(logits, temperature, top_k, top_p) -> torch.Tensor:
    """softmax(top-p(top-k(logits / T))) computed by hand, in float64."""
    scaled = logits / temperature
    kth = scaled.topk(top_k).values[-1]
    scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    keep = nucleus(scaled.softmax(-1), top_p)
    return scaled.masked_fill(~keep, float("-inf")).softmax(-1)


class MultinomialSpy:
    """Records the probability tables HF `generate` samples from."""

    def __init__(self):
        self.calls: list[torch.Tensor] = []
        self.multinomial = torch.multinomial

    def __call__(self, probs, *args, **kwargs):
        self.calls.append(probs.detach().clone())
        return self.multinomial(probs, *args, **kwargs)


def test_processor_divides_each_row_by_its_own_temperature():
    scores = torch.randn(3, 11)
    temperatures = torch.tensor([0.5, 1.0, 3.0])
    out = RowTemperatureLogitsProcessor(temperatures)(torch.zeros(3, 1, dtype=torch.long), scores)
    for row in range(3):
        assert torch.equal(out[row], scores[row] / temperatures[row])


def test_processor_rejects_bad_temperatures_and_row_mismatch():
    with pytest.raises(ValueError, match="temperatures"):
        RowTemperatureLogitsProcessor(torch.tensor([1.0, 0.0]))
    processor = RowTemperatureLogitsProcessor(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="2 temperatures"):
        processor(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 5))


def test_per_row_temperature_changes_the_sampling_distribution(tiny_model, tiny_tokenizer):
    """Rows at T = 0.3 and T = 3.0, interleaved: each follows softmax(logits / its own T)."""
    rows = 4000
    temperatures = torch.tensor([0.3, 3.0]).repeat(rows // 2)
    batch = generate_rollouts(
        tiny_model, tiny_tokenizer, ["1+2="] * rows, temperatures, 1, generator_seed=0
    )
    logits = next_token_logits(tiny_model, tiny_tokenizer, "1+2=")
    vocab = logits.shape[0]
    first = batch.completion_ids[:, 0]
    empirical = {
        t: torch.bincount(first[temperatures == t], minlength=vocab).double() / (rows // 2)
        for t in (0.3, 3.0)
    }
    exact = {t: (logits / t).softmax(-1) for t in (0.3, 3.0)}

    assert entropy(empirical[3.0]) - entropy(empirical[0.3]) > 1.5
    assert total_variation(exact[0.3], exact[3.0]) > 0.4  # the two targets are far apart ...
    for t in (0.3, 3.0):  # ... and each row group matches its own temperature
        assert total_variation(empirical[t], exact[t]) < 0.1


def test_sampling_applies_temperature_before_top_k_and_top_p(
    tiny_model, tiny_tokenizer, monkeypatch
):
    """The distribution generate samples from is softmax(top-p(top-k(logits / T_b)))."""
    top_k, top_p = 12, 0.6
    temperatures = torch.tensor([0.5, 2.5])
    spy = MultinomialSpy()
    monkeypatch.setattr(torch, "multinomial", spy)
    generate_rollouts(
        tiny_model, tiny_tokenizer, ["1+2="] * 2, temperatures, 1, top_p=top_p, top_k=top_k
    )
    sampled_from = spy.calls[0].double()
    logits = next_token_logits(tiny_model, tiny_tokenizer, "1+2=")
    for row, t in enumerate(temperatures.tolist()):
        expected = expected_sampling_probs(logits, t, top_k, top_p)
        assert torch.equal(sampled_from[row] > 0, expected > 0)
        torch.testing.assert_close(sampled_from[row], expected, atol=1e-6, rtol=0)
    # Nucleus taken at T = 1 and then rescaled would keep a different support at T = 2.5.
    wrong_order = nucleus(logits.softmax(-1), top_p)
    assert not torch.equal(wrong_order, sampled_from[1] > 0)


def test_logprobs_match_the_distribution_generate_sampled_from(
    tiny_model, tiny_tokenizer, monkeypatch
):
    """sequence_logprobs at the sampling temperature reproduces generate's own probabilities."""
    temperatures = torch.tensor([0.7, 1.0, 1.6, 2.2])
    spy = MultinomialSpy()
    monkeypatch.setattr(torch, "multinomial", spy)
    batch = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, temperatures, 8)
    monkeypatch.undo()
    steps = torch.stack(spy.calls, dim=1)  # [B, Lc, V]
    sampled = steps.gather(-1, batch.completion_ids[..., None]).squeeze(-1).log()
    logp, _ = sequence_logprobs(tiny_model, batch, batch.temperatures)
    mask = batch.completion_mask
    torch.testing.assert_close(logp[mask], sampled[mask], atol=1e-5, rtol=0)


def manual_logprobs(model, batch: RolloutBatch, temperatures) -> tuple[list, list]:
    """Per sequence, without padding, in float64: log softmax(z/T)[y] and H(softmax(z))."""
    model64 = copy.deepcopy(model).double()
    logps, entropies = [], []
    for row in range(len(batch)):
        ids = batch.input_ids[row][batch.attention_mask[row].bool()]
        n_completion = int(batch.lengths[row])
        with torch.no_grad():
            logits = model64(input_ids=ids[None]).logits[0, -n_completion - 1 : -1]
        targets = ids[-n_completion:]
        logp = (logits / temperatures[row]).log_softmax(-1)
        logps.append(logp.gather(-1, targets[:, None]).squeeze(-1))
        probs = logits.softmax(-1)
        entropies.append(-(probs * probs.log()).sum(-1))
    return logps, entropies


def test_sequence_logprobs_match_a_manual_float64_computation(tiny_model, tiny_tokenizer):
    temperatures = torch.tensor([0.4, 1.0, 1.7, 2.5, 0.8, 1.3, 3.0, 1.0])
    batch = generate_rollouts(
        tiny_model, tiny_tokenizer, PROMPTS * 2, temperatures, 10, generator_seed=3
    )
    assert batch.attention_mask[:, : batch.prompt_length].eq(0).any()  # some left padding
    logp, ent = sequence_logprobs(tiny_model, batch, temperatures, compute_entropy=True)
    expected_logp, expected_ent = manual_logprobs(tiny_model, batch, temperatures)
    for row in range(len(batch)):
        n = int(batch.lengths[row])
        torch.testing.assert_close(logp[row, :n].double(), expected_logp[row], atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[row, :n].double(), expected_ent[row], atol=1e-5, rtol=0)
    assert torch.all(logp[~batch.completion_mask] == 0)


def test_default_temperature_is_one(tiny_model, tiny_tokenizer):
    batch = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, torch.ones(4), 6)
    default, _ = sequence_logprobs(tiny_model, batch, None)
    explicit, _ = sequence_logprobs(tiny_model, batch, torch.ones(4))
    hot, _ = sequence_logprobs(tiny_model, batch, torch.full((4,), 2.0))
    assert torch.equal(default, explicit)
    assert not torch.allclose(default, hot)


def test_left_padding_gives_the_same_logprobs_as_the_unpadded_sequence(tiny_model, tiny_tokenizer):
    temperatures = torch.tensor([0.9, 1.4, 1.0, 2.0])
    batch = generate_rollouts(
        tiny_model, tiny_tokenizer, PROMPTS, temperatures, 10, generator_seed=1
    )
    padded, _ = sequence_logprobs(tiny_model, batch, temperatures)
    for row in range(len(batch)):
        real = batch.attention_mask[row].bool()
        n = int(batch.lengths[row])
        prompt_length = int(real[: batch.prompt_length].sum())
        single = RolloutBatch(
            input_ids=batch.input_ids[row][real][None],
            attention_mask=torch.ones(1, int(real.sum()), dtype=torch.long),
            completion_mask=torch.ones(1, n, dtype=torch.bool),
            prompt_length=prompt_length,
            completion_texts=[batch.completion_texts[row]],
            lengths=batch.lengths[row : row + 1],
            truncated=batch.truncated[row : row + 1],
            temperatures=temperatures[row : row + 1],
        )
        alone, _ = sequence_logprobs(tiny_model, single, temperatures[row : row + 1])
        torch.testing.assert_close(padded[row, :n], alone[0], atol=1e-5, rtol=0)


def test_micro_batches_and_row_selection_agree_with_the_full_batch(tiny_model, tiny_tokenizer):
    """In float64: in float32 the matrix products of other batch shapes round differently (MKL's
    portable branch moved one log-prob by 1.4e-6), which is not what this checks."""
    temperatures = torch.linspace(0.5, 2.0, 8)
    batch = generate_rollouts(
        tiny_model, tiny_tokenizer, PROMPTS * 2, temperatures, 7, generator_seed=2
    )
    tiny_model.double()
    full, full_ent = sequence_logprobs(tiny_model, batch, temperatures, compute_entropy=True)
    micro, micro_ent = sequence_logprobs(
        tiny_model, batch, temperatures, compute_entropy=True, micro_batch_size=3
    )
    torch.testing.assert_close(micro, full, atol=1e-6, rtol=0)
    torch.testing.assert_close(micro_ent, full_ent, atol=1e-6, rtol=0)
    index = torch.tensor([6, 1, 3])
    part = batch.select(index)
    assert part.completion_texts == [batch.completion_texts[i] for i in index]
    assert torch.equal(part.temperatures, temperatures[index])
    selected, _ = sequence_logprobs(tiny_model, part, part.temperatures)
    torch.testing.assert_close(selected, full[index], atol=1e-6, rtol=0)


def test_logprobs_carry_gradients(tiny_model, tiny_tokenizer):
    batch = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, torch.ones(4), 5)
    tiny_model.train()
    logp, entropy_ = sequence_logprobs(tiny_model, batch, torch.ones(4), compute_entropy=True)
    assert logp.requires_grad and not entropy_.requires_grad
    logp.sum().backward()
    grad = tiny_model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_completion_mask_covers_the_completion_through_eos(tiny_model, tiny_tokenizer):
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    batch = generate_rollouts(
        tiny_model, tiny_tokenizer, PROMPTS * 8, torch.full((32,), 1.5), 40, generator_seed=0
    )
    assert batch.truncated.any() and (~batch.truncated).any()  # both cases occur
    width = batch.completion_ids.shape[1]
    prompt_mask = tiny_tokenizer(PROMPTS * 8, return_tensors="pt", padding=True).attention_mask
    assert torch.equal(batch.attention_mask[:, : batch.prompt_length], prompt_mask)
    assert torch.equal(batch.attention_mask[:, batch.prompt_length :].bool(), batch.completion_mask)
    for row in range(len(batch)):
        ids, n = batch.completion_ids[row], int(batch.lengths[row])
        assert int(batch.completion_mask[row].sum()) == n
        assert not (ids[: n - 1] == eos).any()
        assert (ids[n:] == pad).all()
        if batch.truncated[row]:
            assert n == width and ids[-1] != eos
        else:
            assert ids[n - 1] == eos
        visible = [t for t in ids[:n].tolist() if t not in tiny_tokenizer.all_special_ids]
        assert batch.completion_texts[row] == "".join(tiny_tokenizer.convert_ids_to_tokens(visible))


def test_completion_layout_stops_at_the_first_eos_even_when_pad_is_eos():
    eos = 2
    ids = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 8, 2], [5, 6, 7, 8, 9]])
    out, mask, lengths, truncated = _completion_layout(ids, [eos], pad_id=eos)
    assert lengths.tolist() == [3, 2, 5]
    assert truncated.tolist() == [False, False, True]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert out[1].tolist() == [5, 2, 2, 2, 2]


def test_generation_is_deterministic_under_a_seed(tiny_model, tiny_tokenizer):
    temperatures = torch.full((8,), 1.2)

    def rollout(seed):
        return generate_rollouts(
            tiny_model, tiny_tokenizer, PROMPTS * 2, temperatures, 12, generator_seed=seed
        )

    torch.manual_seed(123)
    first = rollout(7)
    global_draw = torch.rand(3)
    torch.manual_seed(123)
    second = rollout(7)
    assert torch.equal(torch.rand(3), global_draw)  # the seeded call leaves the global RNG alone
    assert torch.equal(first.input_ids, second.input_ids)
    assert first.completion_texts == second.completion_texts
    assert not torch.equal(rollout(8).input_ids, first.input_ids)

    torch.manual_seed(5)
    unseeded = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, temperatures[:4], 12)
    torch.manual_seed(5)
    again = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, temperatures[:4], 12)
    assert torch.equal(unseeded.input_ids, again.input_ids)


def test_all_zero_temperatures_decode_greedily(tiny_model, tiny_tokenizer):
    batch = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS[:1], torch.zeros(1), 5)
    ids = tiny_tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    for step in range(5):
        with torch.no_grad():
            token = tiny_model(input_ids=ids).logits[0, -1].argmax()
        assert batch.completion_ids[0, step] == token
        if token == tiny_tokenizer.eos_token_id:
            break
        ids = torch.cat([ids, token.view(1, 1)], dim=1)


def test_generation_restores_training_mode_and_validates_input(tiny_model, tiny_tokenizer):
    tiny_model.train()
    generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, torch.ones(4), 3)
    assert tiny_model.training
    with pytest.raises(ValueError, match="temperatures"):
        generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, torch.ones(3), 3)
    with pytest.raises(ValueError, match="temperatures"):
        generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, torch.tensor([1.0, 0.0, 1, 1]), 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, torch.ones(4), 0)
    with pytest.raises(ValueError, match="top_p"):
        generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS, torch.ones(4), 3, top_p=0.0)


def grads_of(model, batch, temperatures, **options):
    """Log-probs, entropies and parameter gradients of one weighted sum of the log-probs."""
    model.zero_grad()
    logp, ent = sequence_logprobs(model, batch, temperatures, compute_entropy=True, **options)
    weights = torch.linspace(-1, 1, logp.shape[1], dtype=logp.dtype)
    (logp * weights).sum().backward()
    return logp.detach(), ent, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("chunk_size", [1, 3, 7])
def test_position_chunks_agree_with_one_pass_in_float64(tiny_model, tiny_tokenizer, chunk_size):
    """Log-probs, entropies and gradients over chunks of positions equal the one-pass values."""
    temperatures = torch.linspace(0.5, 2.0, 8, dtype=torch.float64)
    batch = generate_rollouts(
        tiny_model, tiny_tokenizer, PROMPTS * 2, temperatures, 8, generator_seed=4
    )
    model = tiny_model.double().train()
    full, full_ent, full_grads = grads_of(model, batch, temperatures)
    chunked, chunked_ent, chunked_grads = grads_of(
        model, batch, temperatures, chunk_size=chunk_size
    )
    assert full.dtype == torch.float64
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=0)
    torch.testing.assert_close(chunked_ent, full_ent, atol=1e-6, rtol=0)
    for a, b in zip(chunked_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_output_head_never_sees_more_than_a_chunk(tiny_model, tiny_tokenizer):
    batch = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS * 2, torch.ones(8), 9)
    widths = []
    hook = tiny_model.lm_head.register_forward_hook(lambda m, i, out: widths.append(out.shape))
    sequence_logprobs(tiny_model, batch, compute_entropy=True, micro_batch_size=3, chunk_size=4)
    hook.remove()
    assert widths and max(w[0] for w in widths) == 3 and max(w[1] for w in widths) == 4
    completion_width = batch.input_ids.shape[1] - batch.prompt_length
    assert len(widths) == 3 * math.ceil(completion_width / 4)  # 3 micro-batches × the chunks
    with pytest.raises(ValueError, match="chunk_size"):
        sequence_logprobs(tiny_model, batch, chunk_size=0)


def test_generation_in_row_batches_matches_one_call(tiny_model, tiny_tokenizer):
    """Greedy decoding in batches of 3 rows gives the rows of one call, and each generate call
    sees at most 3 rows."""
    prompts = PROMPTS * 2
    whole = generate_rollouts(tiny_model, tiny_tokenizer, prompts, torch.zeros(8), 6)
    calls = []
    original = tiny_model.generate

    def counting_generate(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    tiny_model.generate = counting_generate
    parts = generate_in_batches(
        tiny_model, tiny_tokenizer, prompts, torch.zeros(8), 6, batch_size=3
    )
    assert calls == [3, 3, 2]
    assert parts.completion_texts == whole.completion_texts
    assert torch.equal(parts.lengths, whole.lengths)
    torch.testing.assert_close(
        sequence_logprobs(tiny_model, parts)[0], sequence_logprobs(tiny_model, whole)[0]
    )


@pytest.mark.parametrize("options", [{}, {"micro_batch_size": 5, "chunk_size": 3}])
def test_shared_prompt_forward_equals_one_pass_in_float64(tiny_model, tiny_tokenizer, options):
    """Groups of 3 rows per prompt, prompts of different lengths (left padding), one temperature
    per row: sharing each prompt's forward gives the one-pass log-probs, entropies and gradients."""
    prompts = [p for p in PROMPTS for _ in range(3)]
    temperatures = torch.linspace(0.5, 2.0, len(prompts), dtype=torch.float64)
    batch = generate_rollouts(
        tiny_model, tiny_tokenizer, prompts, temperatures, 8, generator_seed=5
    )
    model = tiny_model.double().train()
    calls = []
    hook = model.model.register_forward_hook(
        lambda m, i, kw, out: calls.append(1), with_kwargs=True
    )
    one_pass = grads_of(model, batch, temperatures, **options)
    before = len(calls)
    shared = grads_of(model, batch, temperatures, share_prompts=True, **options)
    hook.remove()
    assert len(calls) - before == 2 * before  # a prompt pass and a completion pass per micro-batch
    assert any(g.abs().sum() > 0 for g in one_pass[2])  # the comparison is not vacuous
    torch.testing.assert_close(shared[0], one_pass[0], atol=1e-8, rtol=0)
    torch.testing.assert_close(shared[1], one_pass[1], atol=1e-8, rtol=0)
    # HF's RMSNorm runs in float32 even in a float64 model, so the two paths' gradients part at
    # float32 precision; a missing gradient path (e.g. through the copied prompt keys) would not.
    for a, b in zip(shared[2], one_pass[2]):
        torch.testing.assert_close(a, b, atol=1e-6 * float(b.abs().max()), rtol=0)


def test_shared_prompt_forward_runs_each_distinct_prompt_once(tiny_model, tiny_tokenizer):
    """The prompt pass sees one row per distinct prompt; without repeated prompts there is one pass,
    bit for bit the unshared one."""
    prompts = [p for p in PROMPTS for _ in range(4)]
    batch = generate_rollouts(tiny_model, tiny_tokenizer, prompts, torch.ones(16), 6)
    shapes = []
    hook = tiny_model.model.register_forward_hook(
        lambda m, i, kw, out: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    with torch.no_grad():
        sequence_logprobs(tiny_model, batch, share_prompts=True)
        distinct = batch.select(torch.arange(0, 16, 4))
        alone = sequence_logprobs(tiny_model, distinct, share_prompts=True)[0]
        plain = sequence_logprobs(tiny_model, distinct)[0]
    hook.remove()
    completion_width = batch.input_ids.shape[1] - batch.prompt_length
    assert shapes[:2] == [(4, batch.prompt_length), (16, completion_width)]
    assert shapes[2] == tuple(distinct.input_ids.shape)  # no repeats: the one-pass forward
    assert torch.equal(alone, plain)


def checkpointed(model: torch.nn.Module, reentrant: bool = False) -> torch.nn.Module:
    """``model`` in train mode with every decoder layer checkpointed."""
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": reentrant}
    )
    return model.train()


@pytest.mark.parametrize("options", [{}, {"micro_batch_size": 5, "chunk_size": 3}])
def test_shared_prompt_forward_under_gradient_checkpointing_equals_one_pass_in_float64(
    tiny_model, tiny_tokenizer, monkeypatch, options
):
    """Checkpointed layers keep the read-only prompt cache: shared log-probs, entropies and
    gradients equal the checkpointed one-pass values, and each completion layer's replay in
    backward reads the prompt keys the forward read (a cache it could append to would give the
    replay other keys, and the comparison or the backward would fail)."""
    prompts = [p for p in PROMPTS for _ in range(3)]
    temperatures = torch.linspace(0.5, 2.0, len(prompts), dtype=torch.float64)
    batch = generate_rollouts(
        tiny_model, tiny_tokenizer, prompts, temperatures, 8, generator_seed=5
    )
    model = checkpointed(tiny_model.double())
    reads, update = [], logprobs_module._ReadOnlyPrompt.update

    def reading(layer, keys, values, *args, **kwargs):
        reads.append((id(layer), layer.keys, keys.shape))
        return update(layer, keys, values, *args, **kwargs)

    monkeypatch.setattr(logprobs_module._ReadOnlyPrompt, "update", reading)
    one_pass = grads_of(model, batch, temperatures, **options)
    assert not reads
    shared = grads_of(model, batch, temperatures, share_prompts=True, **options)
    micro_batches = -(-len(batch) // options.get("micro_batch_size", len(batch)))
    assert (
        len(reads) == 2 * model.config.num_hidden_layers * micro_batches
    )  # the forward and the replay of each layer
    for layer in {r[0] for r in reads}:
        (_, first, shape), (_, again, replayed) = [r for r in reads if r[0] == layer]
        assert again is first and replayed == shape
    assert any(g.abs().sum() > 0 for g in one_pass[2])
    torch.testing.assert_close(shared[0], one_pass[0], atol=1e-8, rtol=0)
    torch.testing.assert_close(shared[1], one_pass[1], atol=1e-8, rtol=0)
    for a, b in zip(shared[2], one_pass[2]):  # float32 RMSNorm: see the test above
        torch.testing.assert_close(a, b, atol=1e-6 * float(b.abs().max()), rtol=0)


def test_a_prompt_cache_the_replay_appends_to_fails_the_backward(
    tiny_model, tiny_tokenizer, monkeypatch
):
    """What the read-only cache prevents: with HF's growing cache layer in its place, the
    checkpoint replay of a completion layer attends to the completion's keys twice, and the
    backward fails (the forward itself runs)."""
    batch = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS * 2, torch.ones(8), 4)
    model = checkpointed(tiny_model)
    monkeypatch.setattr(
        logprobs_module._ReadOnlyPrompt, "update", logprobs_module.DynamicLayer.update
    )
    logp, _ = sequence_logprobs(model, batch, share_prompts=True)
    with pytest.raises(RuntimeError, match="size of tensor"):
        logp.sum().backward()


def test_shared_prompt_forward_refuses_reentrant_checkpointing(tiny_model, tiny_tokenizer):
    """A reentrant checkpoint runs the layers without grad, so the prompt keys the completion
    reads would carry no gradient: refused, not trained on."""
    batch = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS * 2, torch.ones(8), 4)
    model = checkpointed(tiny_model, reentrant=True)
    with pytest.raises(RuntimeError, match="non-reentrant"):
        sequence_logprobs(model, batch, share_prompts=True)
    with torch.no_grad():  # nothing is checkpointed without grad
        sequence_logprobs(model, batch, share_prompts=True)


def test_shared_prompt_forward_needs_every_layers_keys_and_values(
    tiny_model, tiny_tokenizer, monkeypatch
):
    """A decoder layer that does not pass its keys and values through the cache (another
    attention, or one that drops the cache) cannot share its prompt: a clear error."""
    batch = generate_rollouts(tiny_model, tiny_tokenizer, PROMPTS * 2, torch.ones(8), 4)
    drop_cache(tiny_model, monkeypatch)
    with pytest.raises(RuntimeError, match="LlamaModel passed 1 of 2 layers"):
        sequence_logprobs(tiny_model, batch, share_prompts=True)


def drop_cache(model: torch.nn.Module, monkeypatch) -> None:
    """``model``'s second decoder layer no longer passes its keys and values through the cache."""
    attention = model.model.layers[1].self_attn
    forward = attention.forward
    monkeypatch.setattr(attention, "forward", lambda *a, cache=None, **kw: forward(*a, **kw))


def sharing_plan(share: str) -> PassPlan:
    cfg = load_config("tiny-cpu", [f"optim.share_prompt_forward={share}"])
    return PassPlan.from_config(cfg, build_method(cfg))


def test_auto_shares_prompts_where_the_policy_can(tiny_model):
    """The default, auto, shares on a policy that can, quietly; false never shares."""
    assert load_config("tiny-cpu").optim.share_prompt_forward == "auto"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sharing_plan("auto").for_model(tiny_model).share_prompts is True
        assert sharing_plan("auto").for_model(checkpointed(tiny_model)).share_prompts is True
        assert sharing_plan("false").for_model(tiny_model).share_prompts is False


def refuse_cache(model: torch.nn.Module, monkeypatch) -> None:
    """``model``'s decoder fails on any cache it is given (as a decoder might that does not take
    rlkit's `_PromptCache`), with an error that is not rlkit's."""
    decoder = model.model
    forward = decoder.forward

    def no_cache(*args, past_key_values=None, **kwargs):
        if past_key_values is not None:
            raise TypeError("this decoder takes no cache")
        return forward(*args, **kwargs)

    monkeypatch.setattr(decoder, "forward", no_cache)


@pytest.mark.parametrize(
    "policy", ["drops-a-layers-cache", "refuses-the-cache", "reentrant-checkpointing", "no-decoder"]
)
def test_a_policy_that_cannot_share_runs_the_plain_forward_under_auto_and_fails_under_true(
    tiny_model, monkeypatch, policy
):
    """A user who left the default gets the plain forward and a warning saying why; one who set
    optim.share_prompt_forward=true gets the reason as an error before training starts."""
    model, reason = tiny_model, "LlamaModel passed 1 of 2 layers"
    if policy == "drops-a-layers-cache":
        drop_cache(tiny_model, monkeypatch)
    elif policy == "refuses-the-cache":
        refuse_cache(tiny_model, monkeypatch)
        reason = "probe \\(TypeError: this decoder takes no cache\\)"
    elif policy == "reentrant-checkpointing":
        model, reason = checkpointed(tiny_model, reentrant=True), "non-reentrant"
    else:
        model, reason = torch.nn.Linear(2, 2), "needs an HF causal LM, got Linear"
    with pytest.warns(UserWarning, match=f"auto runs the plain forward: .*{reason}"):
        assert sharing_plan("auto").for_model(model).share_prompts is False
    with pytest.raises(PromptSharingError, match=f"{reason}.*set optim.share_prompt_forward=false"):
        sharing_plan("true").for_model(model)
