"""Every rollout engine and sampling option decodes the same tokens as HF ``generate``.

The engines and options a config can select for HF sampling (the vLLM engine needs CUDA:
tests/test_vllm_engine.py), each on the model kinds it serves:

- ``hf``: HF ``generate``; with a QLoRA model, with or without ``rollout.generation_copy``;
- ``hf_static`` eager (the CPU's path) and ``hf_static`` graph: the CUDA-graph path's exact
  sequence run on the CPU (`rlkit.static_decode.ReplayedStep`: a warm-up forward that executes,
  then a replay of the captured step per token), with or without ``rollout.fuse_lora`` (LoRA and
  QLoRA) and ``rollout.generation_copy`` (QLoRA), composed as the trainer composes them
  (`Collector.sampling_weights`);

on the tests' tiny Llama (full weights, LoRA with non-zero adapters, and its 4-bit QLoRA twin in
float32 compute) and a tiny Qwen3 (the 8B presets' architecture: q/k norms). Checked against HF
``generate`` on the training weights: greedy tokens identical; sampled tokens identical for the
same generator seed (every engine draws ``multinomial(softmax(scores))`` from the same RNG
stream); and the sampler's recorded log-probs within ``LOGP_TOL`` (``FUSED_LOGP_TOL`` with fused
LoRA) of the training forward's (`rlkit.logprobs.sequence_logprobs`), float32 throughout.

This module runs in CI at both ends of the transformers range pyproject.toml states (Makefile:
``test-engines-oldest``), since the static loop's cache is what changes between releases.
"""

from __future__ import annotations

import itertools
import re
import types
import warnings
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from rlkit import static_decode
from rlkit.collect import Collector
from rlkit.generation_copy import GenerationCopy
from rlkit.logprobs import sequence_logprobs
from rlkit.models.loading import ModelSpec, Policy, load_policy
from rlkit.rollout import generate_rollouts
from tests.conftest import tiny_architecture
from tests.test_fused_lora import randomize_lora_b
from tests.test_qlora import qlora_spec

# different lengths (left padding), twice: rows of one prompt sample apart
PROMPTS = ["1+2=", "13*2+7=", "(4-1)*12=", "9="] * 2
NEW_TOKENS = 12
TEMPERATURES = torch.tensor([0.7, 1.0, 1.3, 1.0, 1.0, 0.9, 1.1, 1.0])
SEED = 5
LOGP_TOL = 1e-5  # float32 forwards over differently shaped (masked, static) key ranges
# fused LoRA samples from the merged weight W + s·B·A, one more float32 rounding per weight than
# the training forward's W·x + s·B·(A·x): up to 1.03e-5 on the tiny LoRA model under the
# portable CPU kernels (rlkit.machine), below 1e-5 under an AVX-512 machine's own
FUSED_LOGP_TOL = 3e-5


@pytest.fixture(scope="module")
def policies(tiny_model_dir, tiny_4bit_model_dir, tiny_tokenizer) -> dict:
    """The model kinds, each loaded once for the module (sampling options restore their
    changes on exit)."""
    full = load_policy(ModelSpec(tiny_model_dir, mode="full", device="cpu"), keep_reference=False)
    lora = load_policy(ModelSpec(tiny_model_dir, mode="lora", lora_r=4, device="cpu"))
    randomize_lora_b(lora.model)
    torch.manual_seed(0)
    qlora = load_policy(qlora_spec(tiny_4bit_model_dir))
    randomize_lora_b(qlora.model, seed=1)
    # a bare model and tokenizer: all that sampling reads of a policy
    qwen3 = types.SimpleNamespace(model=tiny_qwen3(len(tiny_tokenizer)), tokenizer=tiny_tokenizer)
    return {"full": full, "lora": lora, "qlora": qlora, "qwen3": qwen3}


def tiny_qwen3(vocab_size: int) -> Qwen3ForCausalLM:
    """The tests' tiny Llama's shape as a Qwen3 (q/k norms; head_dim given, as Qwen3 asks)."""
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**tiny_architecture(vocab_size), head_dim=8)).eval()


def cases() -> list[tuple[str, str, bool, bool]]:
    """(model, engine, fuse_lora, generation_copy) for every combination a config allows:
    fused LoRA needs hf_static and an adapter, the copy a 4-bit model (`rlkit.config`)."""
    engines = ("hf", "hf_static", "hf_static_graph")
    out = []
    for model, engine, fuse, copy in itertools.product(
        ("full", "qwen3", "lora", "qlora"), engines, (False, True), (False, True)
    ):
        if fuse and (engine == "hf" or model in ("full", "qwen3")):
            continue
        if copy and model != "qlora":
            continue
        out.append((model, engine, fuse, copy))
    return out


def case_id(case: tuple[str, str, bool, bool]) -> str:
    model, engine, fuse, copy = case
    return "-".join([model, engine] + ["fuse_lora"] * fuse + ["generation_copy"] * copy)


def replay_the_capture(monkeypatch) -> None:
    """From here to the test's end, ``hf_static`` captures its decode step as on CUDA, by
    `ReplayedStep` (the CPU has no CUDA graph)."""
    monkeypatch.setattr(static_decode, "step_graph_for", lambda device: static_decode.ReplayedStep)


def sample(policy: Policy, engine: str, greedy: bool, **options):
    temperatures = torch.zeros(len(PROMPTS)) if greedy else TEMPERATURES
    return generate_rollouts(
        policy.model,
        policy.tokenizer,
        PROMPTS,
        temperatures,
        NEW_TOKENS,
        generator_seed=SEED,
        record_logprobs=not greedy,
        engine=engine,
        **options,
    )


@pytest.fixture(scope="module")
def references(policies) -> dict[tuple[str, bool], object]:
    """HF ``generate`` on each model's training weights: (model, greedy) → its batch."""
    return {
        (name, greedy): sample(policy, "hf", greedy)
        for name, policy in policies.items()
        for greedy in (True, False)
    }


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_every_engine_decodes_hf_generates_tokens(case, policies, references, monkeypatch):
    model, engine, fuse, copy = case
    policy = policies[model]
    collector = Collector(
        policy,
        None,
        None,
        None,
        generation_copy=GenerationCopy(policy.model) if copy else None,
        fuse_lora=fuse,
    )
    if engine == "hf_static_graph":
        replay_the_capture(monkeypatch)
    with collector.sampling_weights():
        greedy = sample(policy, engine.removesuffix("_graph"), greedy=True)
        sampled = sample(policy, engine.removesuffix("_graph"), greedy=False)
    for batch, reference in (
        (greedy, references[model, True]),
        (sampled, references[model, False]),
    ):
        assert batch.completion_texts == reference.completion_texts
        assert torch.equal(batch.input_ids, reference.input_ids)
        assert torch.equal(batch.completion_mask, reference.completion_mask)
    assert greedy.sampler_logp is None
    # the sampler's log-probs are the training forward's (training weights, no sampling options)
    trainer_logp, _ = sequence_logprobs(policy.model, sampled, TEMPERATURES)
    mask = sampled.completion_mask
    assert mask.sum() > len(PROMPTS)  # more than one token a row: the cache is read
    gap = (sampled.sampler_logp - trainer_logp)[mask].abs().max().item()
    tolerance = FUSED_LOGP_TOL if fuse else LOGP_TOL
    assert gap < tolerance, f"sampler vs trainer log-probs differ by {gap:.2e}"


class CountingKV(static_decode.StaticKV):
    """A cache that writes where a counter of its own says, advanced by every forward, whatever
    position the decoder gives: transformers' ``StaticCache`` from 5.9 on (its layers'
    ``cumulative_length``), which the static loop used until it owned its cache."""

    def __init__(self, width: int):
        super().__init__(width)
        self.counters: list[torch.Tensor] = []

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx == len(self.counters):
            self.counters.append(torch.zeros((), dtype=torch.long))
        new = key_states.shape[2]
        self.write_at = self.counters[layer_idx] + torch.arange(new)
        self.counters[layer_idx].add_(new)
        return super().update(key_states, value_states, layer_idx)


def test_the_replayed_capture_catches_a_cache_that_counts_its_own_writes(
    policies, references, monkeypatch
):
    """The harness fails the bug it was built for: the capture's warm-up forward advances such a
    cache's counter, so every replay writes token t's keys one column late (the mask opens column
    t) and the rows diverge from HF's from the second decoded token on; eager decoding, which
    runs each step once, is right with the same cache."""
    monkeypatch.setattr(static_decode, "StaticKV", CountingKV)
    policy, reference = policies["full"], references["full", True]
    assert torch.equal(sample(policy, "hf_static", greedy=True).input_ids, reference.input_ids)
    replay_the_capture(monkeypatch)
    replayed = sample(policy, "hf_static", greedy=True)
    completion = slice(reference.prompt_length, None)
    differs = replayed.input_ids[:, completion] != reference.input_ids[:, completion]
    assert bool(differs.any(dim=1).all())  # every row decodes wrong tokens


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA graph needs CUDA")
@pytest.mark.parametrize("model", ["full", "qwen3"])
def test_on_cuda_the_captured_graph_decodes_the_eager_loops_tokens(policies, model, monkeypatch):
    """The device check (not run on the CPU): the real capture (`CudaGraphStep`) replays the
    same kernels as the eager loop, so the tokens and the recorded log-probs are the same."""
    policy = types.SimpleNamespace(
        model=policies[model].model.to("cuda"), tokenizer=policies[model].tokenizer
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a failed capture warns and decodes eagerly
            graph = sample(policy, "hf_static", greedy=False)
        monkeypatch.setattr(static_decode, "step_graph_for", lambda device: None)
        eager = sample(policy, "hf_static", greedy=False)
    finally:
        policies[model].model.to("cpu")
    assert torch.equal(graph.input_ids, eager.input_ids)
    assert torch.equal(graph.sampler_logp, eager.sampler_logp)


def test_ci_tests_the_lowest_transformers_pyproject_allows():
    """The Makefile's oldest environment pins the lower bound pyproject.toml states."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = Path(__file__).resolve().parents[1]
    dependencies = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in dependencies if d.startswith("transformers")]
    lowest = re.search(r">=([\d.]+)", spec).group(1)
    assert re.search(rf"^TF_OLDEST := {re.escape(lowest)}$", (root / "Makefile").read_text(), re.M)
