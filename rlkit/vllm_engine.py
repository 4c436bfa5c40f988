"""Rollouts from vLLM (``rollout.engine: vllm``), an optional extra: ``pip install 'rlkit[vllm]'``.

vLLM loads the base checkpoint once (4-bit through bitsandbytes under QLoRA) and receives the
policy's current LoRA adapter at every generation as a LoRA request: the adapter is saved to a
temporary directory and sent with a fresh adapter id, never merged into the 4-bit weights
(merging is what breaks QLoRA + vLLM in other trainers). Each row gets its own sampling
parameters, so AGPO's per-prompt temperatures (docs/algorithms.md §3 step 3) reach vLLM
unchanged (temperature, then top-k, then top-p, as in `rlkit.rollout`). vLLM shares the GPU with training: it may take
``rollout.vllm_memory`` of the card for weights and KV cache. Log-probs for the loss still come
from the training model (`rlkit.logprobs.sequence_logprobs`); the completions come back in the
`RolloutBatch` layout of `rlkit.rollout.generate_rollouts`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from rlkit.models.loading import Policy
from rlkit.rollout import RolloutBatch, _completion_layout, _eos_token_ids


def _import_vllm():
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as err:
        raise ValueError(
            "rollout.engine=vllm needs vLLM, an optional extra: pip install 'rlkit[vllm]' "
            f"(import failed: {err})"
        ) from err
    return LLM, SamplingParams, LoRARequest


class VLLMEngine:
    """Generates a step's rows with vLLM from the policy's current adapter."""

    def __init__(self, policy: Policy, memory_fraction: float, seed: int):
        if not policy.uses_adapter:
            raise ValueError(
                "rollout.engine=vllm needs model.mode=lora or qlora: the adapter is what vLLM "
                "receives each step (full fine-tuning would need the whole model synced)"
            )
        LLM, self._sampling_params, self._lora_request = _import_vllm()
        spec = policy.spec
        options = {
            "model": spec.name_or_path,
            "dtype": spec.compute_dtype,
            "enable_lora": True,
            "max_lora_rank": spec.lora_r,
            "max_loras": 1,
            "gpu_memory_utilization": memory_fraction,
            "seed": seed,
            "trust_remote_code": spec.trust_remote_code,
        }
        if spec.mode == "qlora":
            options["quantization"] = "bitsandbytes"
        self.llm = LLM(**options)
        self.policy = policy
        self.adapter_dir = Path(tempfile.mkdtemp(prefix="rlkit-vllm-adapter-"))
        self.adapter_id = 0

    def _current_adapter(self):
        """Save the adapter as it is now; a new id makes vLLM load it instead of a cached one."""
        self.adapter_id += 1
        path = self.adapter_dir / f"step-{self.adapter_id}"
        self.policy.model.save_pretrained(path)
        return self._lora_request(f"rlkit-{self.adapter_id}", self.adapter_id, str(path))

    def generate(
        self,
        prompts: list[str],
        temperatures: torch.Tensor,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> RolloutBatch:
        """One completion per prompt, row b at temperature T_b (0 = greedy)."""
        temperatures = torch.as_tensor(temperatures, dtype=torch.float32).flatten()
        if temperatures.shape[0] != len(prompts):
            raise ValueError(
                f"temperatures has {temperatures.shape[0]} entries for {len(prompts)} prompts"
            )
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()  # the global torch RNG
        params = [
            self._sampling_params(
                temperature=float(t),
                top_p=top_p,
                top_k=top_k if top_k > 0 else -1,
                max_tokens=max_new_tokens,
                seed=seed,
            )
            for t, seed in zip(temperatures.tolist(), seeds)
        ]
        outputs = self.llm.generate(prompts, params, lora_request=self._current_adapter())
        tokenizer = self.policy.tokenizer
        model = self.policy.model
        eos_ids = _eos_token_ids(model, tokenizer)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
        rows = []
        for out in outputs:
            ids = list(out.outputs[0].token_ids)
            stopped = out.outputs[0].finish_reason == "stop" and len(ids) < max_new_tokens
            if stopped and (not ids or ids[-1] not in eos_ids):
                ids.append(eos_ids[0])  # stopped at EOS without returning it: keep it in the layout
            rows.append(ids)
        completion = torch.full((len(rows), max(1, *map(len, rows))), pad_id, dtype=torch.long)
        for row, ids in enumerate(rows):
            completion[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        completion, completion_mask, lengths, truncated = _completion_layout(
            completion, eos_ids, pad_id
        )
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
        device = self.policy.device
        return RolloutBatch(
            input_ids=torch.cat([encoded["input_ids"], completion], dim=1).to(device),
            attention_mask=torch.cat([encoded["attention_mask"], completion_mask.long()], dim=1).to(
                device
            ),
            completion_mask=completion_mask.to(device),
            prompt_length=encoded["input_ids"].shape[1],
            completion_texts=tokenizer.batch_decode(completion, skip_special_tokens=True),
            lengths=lengths.to(device),
            truncated=truncated.to(device),
            temperatures=temperatures.to(device),
        )
