"""``rollout.engine=vllm``: vLLM in its own share of the GPU (`rlkit.vllm_engine`, an optional
extra)."""

from __future__ import annotations

from typing import Any

from rlkit.engines.base import EngineEntry, register_engine
from rlkit.settings import reads


@register_engine("vllm")
class VLLMEngineEntry(EngineEntry):
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
