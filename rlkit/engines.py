"""The rollout engines and their registry (``rollout.engine``; docs/algorithms.md §3 step 3).

An engine is a class registered under its ``rollout.engine`` name with :func:`register_engine`.
It declares what it can do as attributes (:class:`Engine`), and the rest of rlkit reads those
declarations instead of comparing engine names: the config's cross-checks, the memory plan, the
collector, the truncated-IS default and the LoRA fusion default. The built-in entries:

- ``hf``: HF ``generate`` on the training model (:class:`HFEngine`);
- ``hf_static``: rlkit's static-cache decode loop (`rlkit.static_decode`, :class:`StaticEngine`);
- ``vllm``: vLLM in its own share of the GPU (`rlkit.vllm_engine`, an optional extra,
  :class:`VLLMEngineEntry`).

An in-process engine (``decode`` set) generates through `rlkit.rollout.generate_rollouts` with
the training model; an engine with a ``build`` is an object the collector makes once and asks
for rollouts (``generate(prompts, temperatures, max_new_tokens, top_p, top_k)``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import torch

from rlkit.settings import When, equals, reads

ENGINES: dict[str, type] = {}  # rollout.engine name → Engine entry


class Engine(Protocol):
    """What a rollout engine declares."""

    name: ClassVar[str]
    # sampling runs the training model's own forward (HF generate): truncated IS needs no
    # correction (`rlkit.tis.resolve_tis_cap`, ``loss.tis_cap=auto``)
    same_forward: ClassVar[bool]
    # fills the sampler's log-probs itself when sampling; False: the HF path records them with a
    # logits processor, on request
    records_sampler_logp: ClassVar[bool]
    fuses_lora: ClassVar[bool]  # ``rollout.fuse_lora`` can act (and ``auto`` fuses LoRA/QLoRA)
    compiles_step: ClassVar[bool]  # ``rollout.compile`` can act
    # schedules and batches the rows itself: ``rollout.generation_batch_size`` and the memory
    # plan's generation phase do not apply, and a group cannot draw from its own stream
    # (``rollout.sampling_stream=prompt``)
    batches_rows_itself: ClassVar[bool]
    own_weights: ClassVar[bool]  # samples with its own copy of the weights (not a generation copy)
    # the rollout setting holding the engine's share of the GPU, which the memory plan keeps
    # out of training's budget (None: it shares training's)
    gpu_share: ClassVar[str | None]
    label: ClassVar[str]  # how the memory plan names the engine
    reads: ClassVar[dict[str, When | None]]  # the config settings it reads (`rlkit.settings`)

    @staticmethod
    def decode(
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_new_tokens: int,
        eos_ids: list[int],
        pad_id: int,
        options: dict[str, Any],
        compile_step: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Generated ids [B, steps] and the sampler's log-probs (None: not recorded)."""
        ...


def register_engine(name: str):
    """Class decorator adding an engine to :data:`ENGINES` under ``name``; a name registered
    twice is a ValueError naming both classes."""

    def add(cls):
        if name in ENGINES:
            raise ValueError(
                f"engine {name!r} is already registered (by {ENGINES[name].__qualname__}); "
                f"{cls.__qualname__} needs a name of its own"
            )
        cls.name = name
        ENGINES[name] = cls
        return cls

    return add


def get_engine(name: str) -> type:
    """The engine registered as ``name``; an unknown name is a ValueError listing the known
    ones."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; known: {list(ENGINES)}")
    return ENGINES[name]


def engine_names() -> tuple[str, ...]:
    """Every registered engine's name, in registration order."""
    return tuple(ENGINES)


def in_process_engines() -> tuple[str, ...]:
    """The engines that generate with the training model (`rlkit.rollout.generate_rollouts`)."""
    return tuple(name for name, cls in ENGINES.items() if cls.decode is not None)


# what an engine generating with the training model reads: its rows per generate call, and the
# 4-bit base's dequantized copy (vLLM batches the rows itself and samples its own weights)
IN_PROCESS = reads("rollout.generation_batch_size") | reads(
    "rollout.generation_copy", when=equals("model.mode", "qlora")
)


class _Base:
    name: ClassVar[str] = ""
    same_forward: ClassVar[bool] = False
    records_sampler_logp: ClassVar[bool] = True
    fuses_lora: ClassVar[bool] = False
    compiles_step: ClassVar[bool] = False
    batches_rows_itself: ClassVar[bool] = False
    own_weights: ClassVar[bool] = False
    gpu_share: ClassVar[str | None] = None
    label: ClassVar[str] = ""
    reads: ClassVar[dict[str, When | None]] = {}
    decode = None
    build = None


@register_engine("hf")
class HFEngine(_Base):
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


@register_engine("hf_static")
class StaticEngine(_Base):
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


@register_engine("vllm")
class VLLMEngineEntry(_Base):
    """vLLM, in its own ``rollout.vllm_memory`` share of the GPU (an optional extra)."""

    batches_rows_itself = True
    own_weights = True
    gpu_share = "vllm_memory"
    label = "vLLM"
    reads = reads("rollout.vllm_memory")

    @staticmethod
    def build(cfg: Any, policy: Any, max_model_len: int | None) -> Any:
        """The run's `rlkit.vllm_engine.VLLMEngine` (imported here: vLLM is optional)."""
        from rlkit.vllm_engine import VLLMEngine

        return VLLMEngine(policy, cfg.rollout.vllm_memory, cfg.seed, max_model_len)
