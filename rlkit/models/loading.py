"""Load a causal LM as a trainable policy: full fine-tune, LoRA, or QLoRA (docs/algorithms.md §3, §4).

One entry point, `load_policy(ModelSpec)`, returns a `Policy` that bundles the model, its tokenizer
and the *reference* policy used by the KL term (docs/algorithms.md §4):

- `full`  — every weight trains; the reference is a frozen deep copy taken at load time.
- `lora`  — peft LoRA adapters on a frozen base; the reference is the same module with the
            adapter disabled (no second copy of the weights).
- `qlora` — as `lora`, on a base loaded in 4-bit by bitsandbytes (NF4, double quantization,
            configurable compute dtype), prepared with `peft.prepare_model_for_kbit_training`.

Disabling the adapter for the reference fixes a flaw of the AGPO authors' code (docs/algorithms.md §3, "known
flaws"): there, no reference model was created under LoRA and the KL term was silently zero.

QLoRA on CPUs with AVX512-BF16 (an upstream bug, seen in bitsandbytes 0.50.2): the first eval-mode,
no-grad forward of a `bnb.nn.Linear4bit` (e.g. inside `generate`) repacks its weight in place, for
good, for a fused inference kernel (`Linear4bit.forward` →
`functional._convert_weight_packed_for_cpu`). From then on `autograd._functions.matmul_4bit` sends
every call, training ones included, to `gemv_4bit`, an op with no autograd kernel: the gradient
stops at every 4-bit base layer (at init, with LoRA's B = 0, only the o_proj and down_proj adapters
get one; later the others get only what flows back through later adapters). The repack also computes
in bf16 with bf16 scales (sampling no longer matches the policy being trained), re-quantizes the
scales when the model is saved, and fails on layers narrower than the 64-wide quantization block.
`load_policy` therefore turns the repack off on every 4-bit layer (`support_avx512bf16_for_cpu =
False`, the switch the layer reads), then probes each layer — a gradient, an inference pass, the
gradient again — and raises `QuantizedGradientError` (the CLI prints it) rather than train part of
the adapters if any layer still loses its input gradient.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
from peft.utils import set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rlkit.models.gguf import resolve_checkpoint
from rlkit.models.hf_compat import enable_checkpointing
from rlkit.models.spec import ModelSpec

ADAPTER_WEIGHTS = "adapter_model.safetensors"
VALUE_HEAD_WEIGHTS = "value_head.safetensors"  # PPO's critic, beside the weights or adapter


class CheckpointFileError(ValueError):
    """A file of a saved policy that does not load for what it is, not for being another
    model's: unreadable, or PPO's value head missing or of another shape. The message names
    the file."""


def load_error_line(err: Exception) -> str:
    """The line of a weight-loading error that says what differs: the first "mismatch" line
    (torch puts a header line first), else the first line, without its final period."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    line = next((line for line in lines if "mismatch" in line), lines[0] if lines else "")
    return line.rstrip(".")


def _read_tensors(file: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """``file``'s tensors; a file that is not safetensors (garbled, cut short: a checkpoint whose
    manifest was rehashed over it) is a CheckpointFileError naming it."""
    try:
        return load_file(file, device=device)
    except SafetensorError as err:
        raise CheckpointFileError(f"{file} is not a readable safetensors file ({err})") from None


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run `model` in eval mode (no dropout); its train/eval mode is restored on exit."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def train_mode_changes_forward(model: torch.nn.Module) -> bool:
    """Whether `model`'s forward differs between train and eval mode: a dropout or batch-norm
    module that is active (LoRA dropout included), or a dropout probability > 0 in the model
    config (HF attention applies `config.attention_dropout` functionally, only in train mode)."""
    stochastic = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)
    for module in model.modules():
        if isinstance(module, stochastic) and getattr(module, "p", 1.0) > 0:
            return True
    config = getattr(model, "config", None)
    settings = config.to_dict() if hasattr(config, "to_dict") else {}
    return any(
        ("dropout" in name or "pdrop" in name) and isinstance(value, float) and value > 0
        for name, value in settings.items()
    )


class Policy:
    """A trainable causal LM, its tokenizer, and access to its reference policy.

    Use `with policy.reference() as ref: ref(input_ids, ...)` for reference log-probs: the
    yielded module is the frozen copy (full) or the policy with its adapter disabled (LoRA /
    QLoRA). The reference runs in eval mode; the policy's train/eval mode is restored on exit.
    ``value_head``: PPO's critic on the shared backbone (docs/algorithms.md §4c), trained with the
    policy and saved beside its weights or adapter.
    """

    def __init__(
        self,
        model: PreTrainedModel | PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        spec: ModelSpec,
        reference_model: PreTrainedModel | None = None,
        value_head: torch.nn.Linear | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.spec = spec
        self.device = spec.torch_device
        self._reference_model = reference_model
        self.value_head = value_head

    @property
    def uses_adapter(self) -> bool:
        return self.spec.mode in ("lora", "qlora")

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        head = [] if self.value_head is None else list(self.value_head.parameters())
        return [p for p in self.model.parameters() if p.requires_grad] + head

    def num_parameters(self) -> int:
        """Parameters of the policy module (a 4-bit weight counts its packed storage elements)."""
        return sum(p.numel() for p in self.model.parameters())

    def num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.trainable_parameters())

    @contextlib.contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """Yield the reference policy π_ref for the KL term (docs/algorithms.md §4)."""
        if not self.uses_adapter:
            if self._reference_model is None:
                raise ValueError(
                    "this policy was loaded with keep_reference=False (mode=full): "
                    "it has no reference copy"
                )
            yield self._reference_model
            return
        with eval_mode(self.model), self.model.disable_adapter():
            yield self.model

    def save(self, path: str | Path, state_dict: dict | None = None) -> None:
        """Write the trainable state: the adapter (LoRA/QLoRA) or all weights (full) + tokenizer;
        ``state_dict``: the model's whole state gathered elsewhere (FSDP2's shards)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, **({"state_dict": state_dict} if state_dict else {}))
        self.tokenizer.save_pretrained(path)
        if self.value_head is not None:
            head = {k: v.detach().contiguous() for k, v in self.value_head.state_dict().items()}
            save_file(head, path / VALUE_HEAD_WEIGHTS)

    def load_trainable_state(self, path: str | Path) -> None:
        """Load what `save` wrote back into this policy (in place; the reference is untouched):
        the weights or adapter, then PPO's value head."""
        path = Path(path)
        if self.uses_adapter:
            adapter = _read_tensors(path / ADAPTER_WEIGHTS, device=str(self.device))
            result = set_peft_model_state_dict(self.model, adapter)
            if result.unexpected_keys:
                raise ValueError(f"adapter in {path} has unexpected keys {result.unexpected_keys}")
        else:
            _load_full_weights(self.model, path)
        if self.value_head is not None:
            self._load_value_head(path / VALUE_HEAD_WEIGHTS)

    def _load_value_head(self, file: Path) -> None:
        """PPO's value head from ``file``; a missing file, or one of another shape, is a
        CheckpointFileError naming it."""
        if not file.is_file():
            raise CheckpointFileError(
                f"PPO's value head {file} is missing (a checkpoint of a run without "
                "algo.estimator=ppo?)"
            )
        try:
            self.value_head.load_state_dict(_read_tensors(file, str(self.device)))
        except RuntimeError as err:
            raise CheckpointFileError(
                f"PPO's value head {file} does not fit the policy's: {load_error_line(err)} "
                "(a damaged checkpoint, or one of another model)"
            ) from None


def _load_full_weights(model: PreTrainedModel, path: Path) -> None:
    """Load every `*.safetensors` shard in `path`; only tied aliases may be missing."""
    shards = sorted(p for p in path.glob("*.safetensors") if p.name != VALUE_HEAD_WEIGHTS)
    if not shards:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(_read_tensors(shard))
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


class QuantizedGradientError(ValueError):
    """A 4-bit layer does not pass gradients after an inference pass: QLoRA would train only part
    of its adapters on this machine."""


def _keep_4bit_layers_differentiable(model: PreTrainedModel) -> None:
    """Turn off bitsandbytes' CPU inference repack (see the module docstring) on every 4-bit layer.

    The switch is the attribute `Linear4bit.forward` reads; versions without it never repack.
    """
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def check_4bit_gradients(model: torch.nn.Module) -> None:
    """Refuse a 4-bit base whose layers lose their input gradient after an inference pass.

    Per 4-bit layer, on a 2-row input of ones (the global RNG is untouched): the input gradient
    of a training-mode forward, then an eval-mode no-grad forward (what `generate` does), then the
    gradient again; both must be non-zero and equal. Each layer's train/eval mode is restored.
    """
    import bitsandbytes as bnb

    for name, layer in model.named_modules():
        if not isinstance(layer, bnb.nn.Linear4bit):
            continue
        was_training = layer.training
        dtype = layer.compute_dtype or torch.float32
        x = torch.ones(2, layer.in_features, dtype=dtype, device=layer.weight.device)
        problem = None
        try:
            before = _input_gradient(layer.train(), x)
            with torch.no_grad():
                layer.eval()(x)
            after = _input_gradient(layer.train(), x)
        except RuntimeError as err:
            problem = f"fails: {err}"
        else:
            if before is None or not bool(before.abs().sum() > 0):
                problem = "passes no gradient to its input"
            elif after is None or not torch.allclose(before, after):
                problem = "stops the gradient after an inference pass"
        finally:
            layer.train(was_training)
        if problem:
            raise QuantizedGradientError(
                f"4-bit layer {name} {problem} (bitsandbytes {bnb.__version__} on "
                f"{layer.weight.device.type}): model.mode=qlora would not train every adapter. "
                "Use model.mode=lora, or the bitsandbytes version pyproject.toml names"
            )


def _input_gradient(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    x = x.detach().requires_grad_(True)
    y = layer(x)
    if not y.requires_grad:
        return None
    return torch.autograd.grad(y.sum(), x, allow_unused=True)[0]


def value_head(model: torch.nn.Module, spec: ModelSpec) -> torch.nn.Linear:
    """V(s_t) = w·h_t + b on the final hidden state (docs/algorithms.md §4c; TRL's ``ValueHead``),
    in at least float32, with torch's default Linear initialisation (TRL's default)."""
    config = model.config
    dtype = torch.promote_types(spec.dtype, torch.float32)
    return torch.nn.Linear(config.hidden_size, 1, dtype=dtype, device=spec.torch_device)


def load_policy(
    spec: ModelSpec, keep_reference: bool = True, with_value_head: bool = False
) -> Policy:
    """Load `spec.name_or_path` and make it trainable as `spec.mode` says.

    `keep_reference=False` (nothing will ask for π_ref, e.g. β = 0): mode=full keeps no frozen
    copy of the weights; LoRA/QLoRA's reference costs no memory either way. A GGUF checkpoint
    loads from its cached float32 conversion (`rlkit.models.gguf`), which the policy's spec
    names from then on. ``with_value_head``: add PPO's value head (:func:`value_head`)."""
    spec = dataclasses.replace(spec, name_or_path=resolve_checkpoint(spec.name_or_path))
    tokenizer = load_tokenizer(spec)
    model = _load_base_model(spec)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    reference_model = None
    if spec.mode == "full" and keep_reference:
        reference_model = copy.deepcopy(model).eval().requires_grad_(False)
    elif spec.mode == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        _keep_4bit_layers_differentiable(model)
        check_4bit_gradients(model)
    if spec.gradient_checkpointing:
        enable_checkpointing(model)
    if spec.mode != "full":
        model = get_peft_model(model, _lora_config(spec))
    if spec.mode == "qlora":
        _cast_frozen_to_compute_dtype(model, spec.dtype)
    model.train()
    head = value_head(model, spec) if with_value_head else None
    return Policy(model, tokenizer, spec, reference_model, head)
