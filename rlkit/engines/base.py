"""The rollout-engine registry (``rollout.engine``; docs/algorithms.md §3 step 3).

An engine is a class registered under its ``rollout.engine`` name with :func:`register_engine`.
It declares what it can do as attributes (:class:`Engine`, defaults in :class:`EngineEntry`), and
the rest of rlkit reads those declarations instead of comparing engine names: the config's
cross-checks, the memory plan, the collector, the truncated-IS default and the LoRA fusion
default.

The collector builds the run's engine object once (:class:`RolloutEngine`,
`rlkit.collect.build_engine`), and it and evaluation ask that object for rollouts: an in-process
entry (``decode`` set) becomes a `rlkit.rollout.InProcessEngine` over the training model, which
generates through `rlkit.rollout.generate_rollouts` with the entry's ``decode``; an entry with a
``build`` makes its own object (vLLM's `rlkit.vllm_engine.VLLMEngine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from rlkit.registry import Registry
from rlkit.settings import When, equals, reads

if TYPE_CHECKING:
    from rlkit.rollout_batch import RolloutBatch

ENGINES: Registry[type] = Registry("rollout engine")  # rollout.engine name → Engine entry


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


class RolloutEngine(Protocol):
    """A run's engine object: what the collector and evaluation generate with (what it is
    capable of is its entry's, :class:`Engine`)."""

    def generate(
        self,
        prompts: list[str],
        temperatures: torch.Tensor,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
    ) -> RolloutBatch:
        """One completion per prompt, row b at temperature T_b (0: greedy), with top-k then
        top-p; randomness from the global RNG, or from ``seed`` leaving the global RNG alone."""
        ...

    def for_evaluation(self) -> RolloutEngine:
        """The engine evaluation samples with (the same, less settings only rollouts use)."""
        ...


def register_engine(name: str):
    """Class decorator adding an engine to :data:`ENGINES` under ``name`` (its ``name``); a
    name registered twice is a ValueError naming both classes."""

    def add(cls):
        ENGINES.add(name, cls)
        cls.name = name
        return cls

    return add


get_engine = ENGINES.get  # the entry registered as a name; an unknown one lists the known ones
engine_names = ENGINES.names  # every registered engine's name, in registration order


def in_process_engines() -> tuple[str, ...]:
    """The engines that generate with the training model (`rlkit.rollout.generate_rollouts`)."""
    return tuple(name for name, cls in ENGINES.items() if cls.decode is not None)


# what an engine generating with the training model reads: its rows per generate call, and the
# 4-bit base's dequantized copy (vLLM batches the rows itself and samples its own weights)
IN_PROCESS = reads("rollout.generation_batch_size") | reads(
    "rollout.generation_copy", when=equals("model.mode", "qlora")
)


class EngineEntry:
    """A registered engine's defaults (:class:`Engine`): an entry subclasses it and sets what
    differs, with either ``decode`` (in-process) or ``build`` (an object of its own)."""

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
