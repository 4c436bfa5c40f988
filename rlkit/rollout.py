"""Rollouts with one sampling temperature per row (docs/algorithms.md §3).

AGPO samples each prompt's training group at its own temperature τ_t (docs/algorithms.md §3 step 3), and rlkit
computes the importance ratio with log-probs *at that temperature* (`ratio_temperature: sampling`,
fixing a flaw of the authors' code; the training forward is `rlkit.logprobs.sequence_logprobs`).
Two pieces here:

- `RowTemperatureLogitsProcessor` divides row b's logits by T_b inside HF `generate`;
- `generate_rollouts` samples completions and lays them out as a `RolloutBatch`;
- `InProcessEngine` is an in-process engine (``hf``, ``hf_static``) as the object the collector
  and evaluation generate with.

Order of logits processors (checked in transformers 5.24, `GenerationMixin._get_logits_processor`):
user processors passed as `logits_processor=` are merged in *after* HF's built-in processors
(repetition penalty, min length, ...) but *before* the sampling warpers HF builds from the
generation config (temperature → top-k → top-p → min-p ...). So a plain `top_p=` would already act
after our row temperature in this version, but the placement of custom processors has changed
across releases, and a model's `generation_config.json` may carry its own temperature/top-k/top-p
(Qwen3 ships T = 0.6, top-k 20, top-p 0.95). To make the sampling distribution exactly
top-p(top-k(logits / T_b)) in any version, generation here neutralises every HF warper (T = 1,
top-k 0, top-p 1, ...) and passes its own chain [row temperature, top-k, top-p], in that order.
`tests/test_rollout.py` checks the resulting scores against that formula.
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlkit.engines import get_engine, in_process_engines
from rlkit.rollout_batch import RolloutBatch, _completion_layout, _eos_token_ids, concat_rollouts
from rlkit.seeding import seeded

# Generation options that leave the model's distribution untouched. They override whatever the
# model's generation_config.json sets, so the only processors applied are the ones passed here.
NEUTRAL_PROCESSING = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0}
NEUTRAL_SAMPLING = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
}


class RowTemperatureLogitsProcessor(LogitsProcessor):
    """Divide the logits of row b by its own temperature T_b (one entry per row of the batch).

    Rows are those `generate` sees: if the caller expands prompts (repeats them, or uses
    `num_return_sequences`), it passes one temperature per expanded row, in that order.
    """

    def __init__(self, temperatures: torch.Tensor) -> None:
        temperatures = torch.as_tensor(temperatures, dtype=torch.float32)
        if temperatures.ndim != 1 or not bool((temperatures > 0).all()):
            raise ValueError(f"temperatures must be a 1-D tensor of values > 0, got {temperatures}")
        self.temperatures = temperatures

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != self.temperatures.shape[0]:
            raise ValueError(
                f"RowTemperatureLogitsProcessor has {self.temperatures.shape[0]} temperatures "
                f"but the batch has {scores.shape[0]} rows"
            )
        if self.temperatures.device != scores.device or self.temperatures.dtype != scores.dtype:
            self.temperatures = self.temperatures.to(device=scores.device, dtype=scores.dtype)
        return scores / self.temperatures[:, None]  # moved once, not at every decoding step


class NonFiniteScoresError(RuntimeError):
    """Sampling met a row of next-token scores with a NaN or +inf (or no finite score at all):
    the policy is non-finite, and ``torch.multinomial`` would fail with a bare "probability
    tensor contains either inf, nan or element < 0"."""


class FiniteScoresCheck(LogitsProcessor):
    """The last processor of the sampling chain: scores pass unchanged, a row whose largest
    score is not finite raises :class:`NonFiniteScoresError` (top-k/top-p's -inf is fine)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not bool(torch.isfinite(scores.amax(dim=-1)).all()):  # amax propagates NaN
            raise NonFiniteScoresError(
                f"non-finite next-token scores after {input_ids.shape[1]} tokens"
            )
        return scores


class SampledLogprobs(LogitsProcessor):
    """Records log p(y_t) of each sampled token under the final sampling distribution, placed
    after every other processor. HF draws y_t from softmax(scores) right after this call, so
    the scores of step t are kept (one [B, V] tensor, not one per step) and read at y_t when
    step t + 1 sees it in ``input_ids``; :meth:`finish` reads the last step's."""

    def __init__(self) -> None:
        self.logp: list[torch.Tensor] = []
        self._last: torch.Tensor | None = None

    def _take(self, tokens: torch.Tensor) -> None:
        self.logp.append(self._last.gather(-1, tokens[:, None]).squeeze(-1))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._last is not None:
            self._take(input_ids[:, -1])
        self._last = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """[B, Lc] log-probs of ``completion_ids`` (the generated tokens, Lc = steps taken)."""
        if self._last is not None:
            self._take(completion_ids[:, -1])
            self._last = None
        if len(self.logp) != completion_ids.shape[1]:
            raise RuntimeError(
                f"recorded {len(self.logp)} sampling steps for {completion_ids.shape[1]} tokens"
            )
        return torch.stack(self.logp, dim=1)


def sampling_processors(
    temperatures: torch.Tensor, top_p: float = 1.0, top_k: int = 0
) -> LogitsProcessorList:
    """The sampling chain: per-row temperature, then top-k, then top-p (nucleus on logits / T),
    then the finiteness check."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")
    processors = LogitsProcessorList([RowTemperatureLogitsProcessor(temperatures)])
    if top_k > 0:
        processors.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=top_p))
    processors.append(FiniteScoresCheck())
    return processors


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def generate_rollouts(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    temperatures: torch.Tensor,
    max_new_tokens: int,
    top_p: float = 1.0,
    top_k: int = 0,
    generator_seed: int | None = None,
    record_logprobs: bool = False,
    engine: str = "hf",
    compile_step: bool = False,
) -> RolloutBatch:
    """Sample one completion per prompt, row b at temperature T_b (docs/algorithms.md §3 step 3).

    `prompts` are already repeated G times per group by the caller. If every temperature is 0 the
    completions are greedy (evaluation); otherwise all must be > 0. The model runs in eval mode
    (its mode is restored after). Deterministic given the global torch seed, or `generator_seed`
    (which leaves the global RNG untouched). `record_logprobs` (sampling only) fills
    `sampler_logp` from the sampling scores; it draws nothing, so the tokens are unchanged.
    `engine`: ``hf`` (HF ``generate``) or ``hf_static`` (`rlkit.static_decode`, which always
    records the sampler's log-probs when sampling); ``compile_step``: ``hf_static`` only, its
    decode step through ``torch.compile``.
    """
    in_process = in_process_engines()
    if engine not in in_process:
        choices = " or ".join(map(repr, in_process))
        raise ValueError(f"engine must be {choices}, got {engine!r}")
    spec = get_engine(engine)
    if compile_step and not spec.compiles_step:
        compiling = " or ".join(repr(n) for n in in_process if get_engine(n).compiles_step)
        raise ValueError(f"compile_step=True needs engine={compiling}, got {engine!r}")
    if not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    temperatures = torch.as_tensor(temperatures, dtype=torch.float32).flatten()
    if temperatures.numel() == 1:
        temperatures = temperatures.expand(len(prompts)).clone()
    if temperatures.shape[0] != len(prompts):
        raise ValueError(
            f"temperatures has {temperatures.shape[0]} entries for {len(prompts)} prompts"
        )
    greedy = bool((temperatures == 0).all())
    if not greedy and not bool((temperatures > 0).all()):
        raise ValueError(f"temperatures must be all > 0 (or all 0 for greedy), got {temperatures}")

    device = model_device(model)
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left").to(device)
    eos_ids = _eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    options = {**NEUTRAL_PROCESSING, "do_sample": not greedy}
    recorder = (
        SampledLogprobs()
        if record_logprobs and not greedy and not spec.records_sampler_logp
        else None
    )
    if not greedy:
        options.update(NEUTRAL_SAMPLING)
        options["logits_processor"] = sampling_processors(temperatures, top_p, top_k)
        if recorder is not None:
            options["logits_processor"].append(recorder)

    was_training = model.training
    model.eval()
    sampler_logp = None
    try:
        with seeded(generator_seed, device):
            generated, sampler_logp = spec.decode(
                model,
                encoded["input_ids"],
                encoded["attention_mask"],
                max_new_tokens,
                eos_ids,
                pad_id,
                options,
                compile_step,
            )
    finally:
        model.train(was_training)

    prompt_length = encoded["input_ids"].shape[1]
    completion_ids, completion_mask, lengths, truncated = _completion_layout(
        generated, eos_ids, pad_id
    )
    if recorder is not None:
        sampler_logp = recorder.finish(generated)
    if sampler_logp is not None:
        sampler_logp = sampler_logp.masked_fill(~completion_mask, 0.0)
    return RolloutBatch(
        input_ids=torch.cat([encoded["input_ids"], completion_ids], dim=1),
        attention_mask=torch.cat([encoded["attention_mask"], completion_mask.long()], dim=1),
        completion_mask=completion_mask,
        prompt_length=prompt_length,
        completion_texts=tokenizer.batch_decode(completion_ids, skip_special_tokens=True),
        lengths=lengths,
        truncated=truncated,
        temperatures=temperatures.to(device),
        sampler_logp=sampler_logp,
    )


def generate_in_batches(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    temperatures: torch.Tensor,
    max_new_tokens: int,
    batch_size: int | None = None,
    **options,
) -> RolloutBatch:
    """`generate_rollouts` over ``batch_size`` rows at a time (None: one call), concatenated.

    The KV cache of one call grows with its rows, so this bounds generation memory. Rows keep
    their order; each call draws from the global RNG in turn.
    """
    if batch_size is None or batch_size >= len(prompts):
        return generate_rollouts(model, tokenizer, prompts, temperatures, max_new_tokens, **options)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (or None), got {batch_size}")
    temperatures = torch.as_tensor(temperatures, dtype=torch.float32).flatten()
    if temperatures.numel() == 1:
        temperatures = temperatures.expand(len(prompts))
    parts = [
        generate_rollouts(
            model,
            tokenizer,
            prompts[start : start + batch_size],
            temperatures[start : start + batch_size],
            max_new_tokens,
            **options,
        )
        for start in range(0, len(prompts), batch_size)
    ]
    return concat_rollouts(parts, padding_id(model, tokenizer))


class InProcessEngine:
    """An in-process rollout engine (`rlkit.engines`: ``hf``, ``hf_static``) on the training
    ``model``, as an engine object (`rlkit.engines.RolloutEngine`): `generate_in_batches` with
    its own settings, ``batch_size`` rows per call (None: one call), the sampler's log-probs
    recorded on request and the static loop's step compiled on request."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        engine: str = "hf",
        batch_size: int | None = None,
        record_logprobs: bool = False,
        compile_step: bool = False,
    ):
        self.model, self.tokenizer, self.name = model, tokenizer, engine
        self.batch_size, self.record_logprobs, self.compile_step = (
            batch_size,
            record_logprobs,
            compile_step,
        )

    def generate(
        self,
        prompts: list[str],
        temperatures: torch.Tensor,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
    ) -> RolloutBatch:
        """One completion per row of ``prompts`` at ``temperatures``, drawing from the global
        RNG, or (``seed``) from a stream seeded so, which leaves the global RNG untouched."""
        with seeded(seed, model_device(self.model)):
            return generate_in_batches(
                self.model,
                self.tokenizer,
                prompts,
                temperatures,
                max_new_tokens,
                self.batch_size,
                top_p=top_p,
                top_k=top_k,
                record_logprobs=self.record_logprobs,
                engine=self.name,
                compile_step=self.compile_step,
            )

    def for_evaluation(self) -> InProcessEngine:
        """The same engine without the rollouts' settings (one call per batch, nothing recorded,
        no compiled step): what evaluation samples with."""
        return InProcessEngine(self.model, self.tokenizer, self.name)


def padding_id(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> int:
    """The token that pads rollouts: the tokenizer's pad token, else the first EOS."""
    pad_id = tokenizer.pad_token_id
    return pad_id if pad_id is not None else _eos_token_ids(model, tokenizer)[0]
