"""Rollouts from vLLM (``rollout.engine: vllm``), an optional extra: ``pip install 'rlkit[vllm]'``
(vLLM 0.28-0.33 with its bitsandbytes plugin) or ``pip install 'rlkit[vllm-legacy]'`` (0.10.2-0.27).

vLLM loads the base checkpoint once (4-bit through bitsandbytes under QLoRA) and receives the
policy's current LoRA adapter at every generation as a LoRA request: the adapter is saved to a
temporary directory and sent with a fresh adapter id, never merged into the 4-bit weights
(merging is what breaks QLoRA + vLLM in other trainers). Each row gets its own sampling
parameters, so AGPO's per-prompt temperatures (docs/algorithms.md §3 step 3) reach vLLM
unchanged (temperature, then top-k, then top-p, as in `rlkit.rollout`). vLLM shares the GPU with training: it may take
``rollout.vllm_memory`` of the card for weights and KV cache. Log-probs for the loss still come
from the training model (`rlkit.logprobs.sequence_logprobs`); the completions come back in the
`RolloutBatch` layout of `rlkit.rollout.generate_rollouts`.

Against vLLM's real API (facts in tests/data/vllm_api/, read from the 0.27.1, 0.28.0 and 0.33.0
wheels and the vllm-bnb-plugin 0.0.3 wheel):

- supported: ``SUPPORTED_VLLM``. bitsandbytes left vLLM core in 0.28 (``BNB_PLUGIN_VLLM``): from
  there QLoRA needs ``vllm-bnb-plugin`` (``BNB_PLUGIN``), which registers ``quantization`` and
  ``load_format`` "bitsandbytes" back through vLLM's ``vllm.general_plugins`` entry point; rlkit
  then passes ``load_format="bitsandbytes"`` itself (older vLLM sets it from ``quantization``);
- ``max_lora_rank`` is the adapter's rank rounded up to a rank vLLM accepts (``LORA_RANKS``);
- ``max_model_len`` is the longest prompt + ``rollout.max_new_tokens`` (vLLM's default, the
  model's whole context, may not fit its memory share);
- prompts go in as token ids (the layout's own, so prompt and completion cannot misalign);
- every row returns the log-prob of its sampled token under the processed distribution
  (``logprobs_mode=processed_logprobs``: temperature, top-k, top-p applied) as
  ``RolloutBatch.sampler_logp``, for truncated importance sampling (`rlkit.tis`);
- sleep mode: vLLM sleeps (level 1: weights to CPU, KV cache freed) outside generation, so the
  training phases get the card back;
- each call's adapter directory is removed once vLLM has loaded it;
- evaluation samples through the engine too (`rlkit.evaluation.generate_and_score`), each call's
  row seeds drawn from the evaluation's seed.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch
from packaging.version import Version

from rlkit.models.loading import Policy
from rlkit.rollout_batch import RolloutBatch, _completion_layout, _eos_token_ids
from rlkit.seeding import seeded

SUPPORTED_VLLM = (Version("0.10.2"), Version("0.34"))  # [low, high): pyproject's two extras
BNB_PLUGIN_VLLM = Version("0.28")  # from this vLLM on, bitsandbytes is a plugin's
BNB_PLUGIN = "vllm-bnb-plugin>=0.0.3,<0.1"  # the plugin's pip requirement (pyproject's vllm extra)
BNB_PLUGIN_ENTRY_POINT = "bitsandbytes"  # its name in vLLM's vllm.general_plugins (VLLM_PLUGINS)
# ranks every supported vLLM accepts (0.27's MaxLoRARanks adds 1, which 0.10.2 refuses)
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_for_vllm(rank: int) -> int:
    """The smallest rank vLLM accepts that holds an adapter of rank ``rank``."""
    fits = [r for r in LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"model.lora_r={rank} is above vLLM's largest LoRA rank {LORA_RANKS[-1]}")
    return fits[0]


def _import_vllm():
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as err:
        raise ValueError(
            "rollout.engine=vllm needs vLLM, an optional extra: pip install 'rlkit[vllm]' "
            f"(import failed: {err})"
        ) from err
    low, high = SUPPORTED_VLLM
    version = Version(vllm.__version__)
    if not low <= version < high:
        raise ValueError(
            f"rollout.engine=vllm supports vLLM >= {low}, < {high}; vLLM {version} is installed "
            "(pip install 'rlkit[vllm]', or 'rlkit[vllm-legacy]' for vLLM < 0.28)"
        )
    return version, LLM, SamplingParams, LoRARequest


def _require_bnb_plugin(version: Version) -> None:
    """QLoRA on vLLM >= 0.28 needs vllm-bnb-plugin, and vLLM must be free to load it: each vLLM
    process runs the ``vllm.general_plugins`` entry points, only those named in ``VLLM_PLUGINS``
    when that is set. Without it vLLM fails deep in its start-up on an unknown quantization."""
    try:
        import vllm_bnb_plugin  # noqa: F401  (imported to check it loads against this vLLM)
    except ImportError as err:
        raise ValueError(
            f"model.mode=qlora with rollout.engine=vllm on vLLM {version} needs vLLM's "
            f"bitsandbytes plugin (bitsandbytes left vLLM core in {BNB_PLUGIN_VLLM}): "
            f"pip install '{BNB_PLUGIN}' (import failed: {err})"
        ) from err
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and BNB_PLUGIN_ENTRY_POINT not in allowed.split(","):
        raise ValueError(
            f"VLLM_PLUGINS={allowed!r} keeps vLLM from loading its bitsandbytes plugin, which "
            f"model.mode=qlora needs: add {BNB_PLUGIN_ENTRY_POINT} to it or unset it"
        )


class VLLMEngine:
    """Generates a step's rows with vLLM from the policy's current adapter (an engine object,
    `rlkit.engines.RolloutEngine`)."""

    def __init__(
        self, policy: Policy, memory_fraction: float, seed: int, max_model_len: int | None = None
    ):
        if not policy.uses_adapter:
            raise ValueError(
                "rollout.engine=vllm needs model.mode=lora or qlora: the adapter is what vLLM "
                "receives each step (full fine-tuning would need the whole model synced)"
            )
        version, LLM, self._sampling_params, self._lora_request = _import_vllm()
        spec = policy.spec
        options = {
            "model": spec.name_or_path,
            "dtype": spec.compute_dtype,
            "enable_lora": True,
            "max_lora_rank": lora_rank_for_vllm(spec.lora_r),
            "max_loras": 1,
            "gpu_memory_utilization": memory_fraction,
            "seed": seed,
            "trust_remote_code": spec.trust_remote_code,
            "logprobs_mode": "processed_logprobs",
            "enable_sleep_mode": True,
        }
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        if spec.mode == "qlora":
            options["quantization"] = "bitsandbytes"
            if version >= BNB_PLUGIN_VLLM:
                _require_bnb_plugin(version)
                options["load_format"] = "bitsandbytes"  # the plugin's loader
        self.llm = LLM(**options)
        self.llm.sleep(level=1)  # awake only while generating
        self.policy = policy
        self.adapter_dir = Path(tempfile.mkdtemp(prefix="rlkit-vllm-adapter-"))
        weakref.finalize(self, shutil.rmtree, self.adapter_dir, ignore_errors=True)
        self.adapter_id = 0

    def for_evaluation(self) -> VLLMEngine:
        """Evaluation samples through the same engine."""
        return self

    def _current_adapter(self) -> tuple[object, Path]:
        """Save the adapter as it is now; a new id makes vLLM load it instead of a cached one."""
        self.adapter_id += 1
        path = self.adapter_dir / f"step-{self.adapter_id}"
        self.policy.model.save_pretrained(path)
        return self._lora_request(f"rlkit-{self.adapter_id}", self.adapter_id, str(path)), path

    def generate(
        self,
        prompts: list[str],
        temperatures: torch.Tensor,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
    ) -> RolloutBatch:
        """One completion per prompt, row b at temperature T_b (0 = greedy), with the sampled
        tokens' log-probs (0 on padding; an EOS vLLM stopped at without returning gets NaN,
        which `rlkit.tis` reads as "no sampler log-prob": weight 1). Each row's vLLM seed is
        drawn from the global torch RNG, or (``seed``) from a CPU stream seeded so."""
        temperatures = torch.as_tensor(temperatures, dtype=torch.float32).flatten()
        if temperatures.shape[0] != len(prompts):
            raise ValueError(
                f"temperatures has {temperatures.shape[0]} entries for {len(prompts)} prompts"
            )
        with seeded(seed, torch.device("cpu")):
            seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()  # torch's CPU RNG
        params = [
            self._sampling_params(
                temperature=float(t),
                top_p=top_p,
                top_k=top_k if top_k > 0 else -1,
                max_tokens=max_new_tokens,
                seed=seed,
                logprobs=0,  # the sampled token's own log-prob only
            )
            for t, seed in zip(temperatures.tolist(), seeds)
        ]
        tokenizer = self.policy.tokenizer
        # tokenized once: vLLM gets exactly the ids the layout (and so the loss) uses
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
        token_prompts = [
            {"prompt_token_ids": ids[mask.bool()].tolist()}
            for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])
        ]
        lora_request, adapter_path = self._current_adapter()
        self.llm.wake_up()
        try:
            outputs = self.llm.generate(token_prompts, params, lora_request=lora_request)
        finally:
            self.llm.sleep(level=1)
            shutil.rmtree(adapter_path, ignore_errors=True)  # vLLM has loaded it
        eos_ids = _eos_token_ids(self.policy.model, tokenizer)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
        rows, row_logp = [], []
        for out in outputs:
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            logp = [step[token].logprob for token, step in zip(ids, sample.logprobs)]
            stopped = sample.finish_reason == "stop" and len(ids) < max_new_tokens
            if stopped and (not ids or ids[-1] not in eos_ids):
                ids.append(eos_ids[0])  # stopped at EOS without returning it: keep it in the layout
                logp.append(math.nan)
            rows.append(ids)
            row_logp.append(logp)
        width = max(1, *map(len, rows))
        completion = torch.full((len(rows), width), pad_id, dtype=torch.long)
        sampler_logp = torch.zeros((len(rows), width), dtype=torch.float32)
        for row, (ids, logp) in enumerate(zip(rows, row_logp)):
            completion[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            sampler_logp[row, : len(logp)] = torch.tensor(logp, dtype=torch.float32)
        completion, completion_mask, lengths, truncated = _completion_layout(
            completion, eos_ids, pad_id
        )
        sampler_logp = sampler_logp.masked_fill(~completion_mask, 0.0)
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
            sampler_logp=sampler_logp.to(device),
        )
