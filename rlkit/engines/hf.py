"""``rollout.engine=hf``: HF ``generate`` on the training model (docs/algorithms.md §3 step 3)."""

from __future__ import annotations

from rlkit.engines.base import IN_PROCESS, EngineEntry, register_engine


@register_engine("hf")
class HFEngine(EngineEntry):
    """HF ``generate`` on the training model."""

    same_forward = True
    records_sampler_logp = False
    label = "HF generate"
    reads = IN_PROCESS

    @staticmethod
    def decode(model, input_ids, attention_mask, max_new_tokens, eos_ids, pad_id, options, _):
        # ids and mask alone: transformers 4.x tokenizers also return token_type_ids,
        # which generate refuses for a decoder-only model
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_ids,
            pad_token_id=pad_id,
            # each process generates alone, with whole weights (rlkit.parallel.unsharded):
            # transformers would otherwise lock-step the ranks of an FSDP model
            synced_gpus=False,
            **options,
        )
        return sequences[:, input_ids.shape[1] :], None
