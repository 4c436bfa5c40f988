"""The sampled completions as every later stage reads them: :class:`RolloutBatch`'s padded layout
(prompt left-padded, completion right-padded, the masks, lengths and sampling temperatures of each
row) and :func:`concat_rollouts`, which joins batches of different widths. Torch alone: the
engines that fill it (``rlkit.rollout``, ``rlkit.vllm_engine``) and the bandit simulations'
step types (``rlkit.batch``) share it without the generation stack; and the completion layout both engine paths apply
(:func:`_completion_layout`, :func:`_eos_token_ids`)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class RolloutBatch:
    """Sampled completions, laid out for the loss.

    `input_ids` / `attention_mask` are [B, L] with L = prompt_length + Lc: the prompt left-padded
    to `prompt_length`, then the completion right-padded to Lc. `completion_mask` [B, Lc] marks
    the real completion tokens, EOS included, padding after it excluded. `truncated` rows hit
    `max_new_tokens` without an EOS. `temperatures` [B] are the sampling temperatures (0 =
    greedy). `sampler_logp` [B, Lc], when the engine recorded it, is the log-prob of each sampled
    token under the distribution it was drawn from (temperature, top-k, top-p applied; 0 on
    padding), for truncated importance sampling (`rlkit.tis`); None: not recorded.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_length: int
    completion_texts: list[str]
    lengths: torch.Tensor
    truncated: torch.Tensor
    temperatures: torch.Tensor
    sampler_logp: torch.Tensor | None = None

    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.input_ids[:, : self.prompt_length]

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_length :]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> RolloutBatch:
        return self._map(lambda t: t.to(device), lambda texts: texts)

    def select(self, index: torch.Tensor | list[int] | slice) -> RolloutBatch:
        """The rows `index` (a mini-batch), keeping the padded layout (same prompt_length)."""
        if isinstance(index, slice):
            index = range(len(self))[index]
        index = torch.as_tensor(index, dtype=torch.long)
        return self._map(
            lambda t: t[index.to(t.device)], lambda texts: [texts[i] for i in index.tolist()]
        )

    def _map(self, on_tensor, on_texts) -> RolloutBatch:
        changed = {
            f.name: on_tensor(getattr(self, f.name))
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, completion_texts=on_texts(self.completion_texts), **changed)


def concat_rollouts(batches: list[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Stack rollout batches of different widths into one, keeping the layout: prompts are
    left-padded to the widest prompt, completions right-padded to the longest completion."""
    if not batches:
        raise ValueError("concat_rollouts needs at least one batch")
    prompt_width = max(b.prompt_length for b in batches)
    completion_width = max(b.input_ids.shape[1] - b.prompt_length for b in batches)

    def widen(t: torch.Tensor, left: int, right: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (left, right), value=value)

    parts = []
    for b in batches:
        left = prompt_width - b.prompt_length
        right = completion_width - (b.input_ids.shape[1] - b.prompt_length)
        parts.append(
            (
                widen(b.input_ids, left, right, pad_token_id),
                widen(b.attention_mask, left, right, 0),
                widen(b.completion_mask, 0, right, False),
                None if b.sampler_logp is None else widen(b.sampler_logp, 0, right, 0.0),
            )
        )
    recorded = [p[3] for p in parts]
    if any(r is None for r in recorded) and not all(r is None for r in recorded):
        raise ValueError("concat_rollouts: some batches have sampler_logp and some do not")
    return RolloutBatch(
        input_ids=torch.cat([p[0] for p in parts]),
        attention_mask=torch.cat([p[1] for p in parts]),
        completion_mask=torch.cat([p[2] for p in parts]),
        prompt_length=prompt_width,
        completion_texts=[t for b in batches for t in b.completion_texts],
        lengths=torch.cat([b.lengths for b in batches]),
        truncated=torch.cat([b.truncated for b in batches]),
        temperatures=torch.cat([b.temperatures for b in batches]),
        sampler_logp=None if recorded[0] is None else torch.cat(recorded),
    )


def _eos_token_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (e.g. Llama-3's <|eot_id|>)."""
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(config_eos if isinstance(config_eos, list) else [config_eos])
    ids.discard(None)
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config has an EOS token")
    return sorted(ids)


def _completion_layout(
    completion_ids: torch.Tensor, eos_ids: list[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask up to and including the first EOS; re-pad after it.

    Returns (completion_ids, completion_mask, lengths, truncated). Works when pad == EOS.
    """
    width = completion_ids.shape[1]
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    truncated = ~is_eos.any(dim=1)
    first_eos = is_eos.int().argmax(dim=1)
    lengths = torch.where(truncated, torch.full_like(first_eos, width), first_eos + 1)
    positions = torch.arange(width, device=completion_ids.device)
    completion_mask = positions[None, :] < lengths[:, None]
    return completion_ids.masked_fill(~completion_mask, pad_id), completion_mask, lengths, truncated
