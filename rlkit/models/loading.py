"""Load a causal LM as a trainable policy: full fine-tune, LoRA, or QLoRA (spec §3, §4).

One entry point, `load_policy(ModelSpec)`, returns a `Policy` that bundles the model, its tokenizer
and the *reference* policy used by the KL term (spec §4):

- `full`  — every weight trains; the reference is a frozen deep copy taken at load time.
- `lora`  — peft LoRA adapters on a frozen base; the reference is the same module with the
            adapter disabled (no second copy of the weights).
- `qlora` — as `lora`, on a base loaded in 4-bit by bitsandbytes (NF4, double quantization,
            configurable compute dtype), prepared with `peft.prepare_model_for_kbit_training`.

Disabling the adapter for the reference fixes a flaw of the AGPO authors' code (spec §3, "known
flaws"): there, no reference model was created under LoRA and the KL term was silently zero.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
from peft.utils import set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

MODES = ("full", "lora", "qlora")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANT_TYPES = ("nf4", "fp4")
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass
class ModelSpec:
    """What to load and how to train it.

    `name_or_path` is a local directory or a Hugging Face hub id. `target_modules` is
    "all-linear" (every linear layer except the output head, peft's shorthand) or a list of
    module names. `device="auto"` picks CUDA when available, else the CPU.
    """

    name_or_path: str
    mode: str = "lora"
    lora_r: int = 16
    lora_alpha: float = 32
    lora_dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    compute_dtype: str = "float32"
    quant_type: str = "nf4"
    double_quant: bool = True
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    device: str = "auto"

    def __post_init__(self) -> None:
        if not self.name_or_path:
            raise ValueError("ModelSpec.name_or_path must be a non-empty path or hub id")
        if self.mode not in MODES:
            raise ValueError(f"ModelSpec.mode must be one of {MODES}, got {self.mode!r}")
        if not isinstance(self.lora_r, int) or self.lora_r <= 0:
            raise ValueError(f"ModelSpec.lora_r must be a positive integer, got {self.lora_r!r}")
        if self.lora_alpha <= 0:
            raise ValueError(f"ModelSpec.lora_alpha must be > 0, got {self.lora_alpha!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"ModelSpec.lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        if isinstance(self.target_modules, str):
            if self.target_modules != "all-linear":
                raise ValueError(
                    "ModelSpec.target_modules must be 'all-linear' or a list of module names, "
                    f"got {self.target_modules!r}"
                )
        elif not self.target_modules or not all(isinstance(m, str) for m in self.target_modules):
            raise ValueError(
                "ModelSpec.target_modules must be a non-empty list of module names, "
                f"got {self.target_modules!r}"
            )
        if self.compute_dtype not in DTYPES:
            raise ValueError(
                f"ModelSpec.compute_dtype must be one of {tuple(DTYPES)}, got {self.compute_dtype!r}"
            )
        if self.quant_type not in QUANT_TYPES:
            raise ValueError(
                f"ModelSpec.quant_type must be one of {QUANT_TYPES}, got {self.quant_type!r}"
            )
        _resolve_device(self.device)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.compute_dtype]

    @property
    def torch_device(self) -> torch.device:
        return _resolve_device(self.device)


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"ModelSpec.device is not a torch device: {device!r}") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"ModelSpec.device is {device!r} but CUDA is not available")
    return resolved


class Policy:
    """A trainable causal LM, its tokenizer, and access to its reference policy.

    Use `with policy.reference() as ref: ref(input_ids, ...)` for reference log-probs: the
    yielded module is the frozen copy (full) or the policy with its adapter disabled (LoRA /
    QLoRA). The reference runs in eval mode; the policy's train/eval mode is restored on exit.
    """

    def __init__(
        self,
        model: PreTrainedModel | PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        spec: ModelSpec,
        reference_model: PreTrainedModel | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.spec = spec
        self.device = spec.torch_device
        self._reference_model = reference_model

    @property
    def uses_adapter(self) -> bool:
        return self.spec.mode in ("lora", "qlora")

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def num_parameters(self) -> int:
        """Parameters of the policy module (a 4-bit weight counts its packed storage elements)."""
        return sum(p.numel() for p in self.model.parameters())

    def num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.trainable_parameters())

    @contextlib.contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """Yield the reference policy π_ref for the KL term (spec §4)."""
        if not self.uses_adapter:
            yield self._reference_model
            return
        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                yield self.model
        finally:
            self.model.train(was_training)

    def save(self, path: str | Path) -> None:
        """Write the trainable state: the adapter (LoRA/QLoRA) or all weights (full) + tokenizer."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def load_trainable_state(self, path: str | Path) -> None:
        """Load what `save` wrote back into this policy (in place; the reference is untouched)."""
        path = Path(path)
        if self.uses_adapter:
            adapter = load_file(path / ADAPTER_WEIGHTS, device=str(self.device))
            result = set_peft_model_state_dict(self.model, adapter)
            if result.unexpected_keys:
                raise ValueError(f"adapter in {path} has unexpected keys {result.unexpected_keys}")
            return
        _load_full_weights(self.model, path)


def _load_full_weights(model: PreTrainedModel, path: Path) -> None:
    """Load every `*.safetensors` shard in `path`; only tied aliases may be missing."""
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(shard))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"weights in {path} have unexpected keys {unexpected}")
    tied = _tied_parameter_names(model)
    untied_missing = [name for name in missing if name not in tied]
    if untied_missing:
        raise ValueError(f"weights in {path} are missing keys {untied_missing}")


def _tied_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that share storage with another parameter (e.g. tied lm_head)."""
    names_by_storage: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_storage.setdefault(param.data_ptr(), []).append(name)
    return {name for names in names_by_storage.values() if len(names) > 1 for name in names}


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The model's tokenizer with a pad token (EOS if it has none) and left padding."""
    tokenizer = AutoTokenizer.from_pretrained(
        spec.name_or_path, trust_remote_code=spec.trust_remote_code
    )
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer of {spec.name_or_path!r} has neither a pad nor an EOS token"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _quantization_config(spec: ModelSpec) -> BitsAndBytesConfig:
    """QLoRA's 4-bit base: NF4 (or FP4) blocks, optional double quantization of the scales."""
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=spec.quant_type,
        bnb_4bit_use_double_quant=spec.double_quant,
        bnb_4bit_compute_dtype=spec.dtype,
    )


def _load_base_model(spec: ModelSpec) -> PreTrainedModel:
    """The pretrained weights in the compute dtype (4-bit for QLoRA), loaded onto the device."""
    quantization = _quantization_config(spec) if spec.mode == "qlora" else None
    return AutoModelForCausalLM.from_pretrained(
        spec.name_or_path,
        dtype=spec.dtype,
        quantization_config=quantization,
        device_map={"": str(spec.torch_device)},
        trust_remote_code=spec.trust_remote_code,
    )


def _lora_config(spec: ModelSpec) -> LoraConfig:
    return LoraConfig(
        r=spec.lora_r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        target_modules=spec.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )


def _enable_checkpointing(model: PreTrainedModel) -> None:
    """Recompute activations in backward (non-reentrant: no input-grad hooks needed under LoRA)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _cast_frozen_to_compute_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Undo `prepare_model_for_kbit_training`'s fp32 upcast of the frozen, non-4-bit weights.

    It leaves embeddings, norms and the output head in fp32, and a fp32 residual stream makes
    the KV cache, attention and logits fp32 too (twice the memory, no fast kernels). The 4-bit
    weights (packed in uint8, not floating point) are left alone and the LoRA matrices stay
    fp32 (they are trainable).
    """
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point():
            param.data = param.data.to(dtype)


def _keep_cpu_4bit_trainable(model: torch.nn.Module) -> None:
    """Stop bitsandbytes repacking 4-bit weights for its CPU inference kernel.

    On the CPU (bitsandbytes 0.50), the first no-grad eval-mode forward of a `Linear4bit` (a
    generation) repacks its weight in place for an AVX512-BF16 kernel that has no autograd: every
    later forward, training included, returns no gradient to the layer's input, so only the
    LoRA matrices next to the residual stream (o_proj, down_proj) still train. The repacking also
    fails for layers narrower than a quantization block (64). Without it the CPU uses the
    ordinary dequantize-and-matmul path; CUDA is unaffected.
    """
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def load_policy(spec: ModelSpec) -> Policy:
    """Load `spec.name_or_path` and make it trainable as `spec.mode` says."""
    tokenizer = load_tokenizer(spec)
    model = _load_base_model(spec)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    reference_model = None
    if spec.mode == "full":
        reference_model = copy.deepcopy(model).eval().requires_grad_(False)
    elif spec.mode == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if spec.gradient_checkpointing:
        _enable_checkpointing(model)
    if spec.mode != "full":
        model = get_peft_model(model, _lora_config(spec))
    if spec.mode == "qlora":
        _cast_frozen_to_compute_dtype(model, spec.dtype)
        _keep_cpu_4bit_trainable(model)
    model.train()
    return Policy(model, tokenizer, spec, reference_model)
