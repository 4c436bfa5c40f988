"""``rollout.engine=hf_static``: rlkit's static-cache decode loop (`rlkit.static_decode`)."""

from __future__ import annotations

from rlkit.engines.base import IN_PROCESS, EngineEntry, register_engine
from rlkit.settings import equals, reads


@register_engine("hf_static")
class StaticEngine(EngineEntry):
    """rlkit's static-cache decode loop, which records the sampler's log-probs when sampling."""

    fuses_lora = True
    compiles_step = True
    label = "static decode loop"
    reads = (
        IN_PROCESS
        | reads("rollout.fuse_lora", when=equals("model.mode", "lora", "qlora"))
        | reads("rollout.compile")
    )

    @staticmethod
    def decode(
        model, input_ids, attention_mask, max_new_tokens, eos_ids, pad_id, options, compile_step
    ):
        # imported here: choosing an engine (the config's checks) must not load transformers
        from rlkit.static_decode import static_generate

        return static_generate(
            model,
            input_ids,
            attention_mask,
            max_new_tokens,
            eos_ids,
            pad_id,
            options.get("logits_processor"),
            compile_step,
        )
