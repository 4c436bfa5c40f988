"""What policy to load and how to train it: a pure, validated description (no torch at import).

`ModelSpec` lives apart from `rlkit.models.loading` so that validating a run's config
(`rlkit.config`) never imports transformers or peft. torch is imported only to resolve an
explicit device or a dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("full", "lora", "qlora")
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")
QUANT_TYPES = ("nf4", "fp4")


@dataclass
class ModelSpec:
    """What to load and how to train it.

    `name_or_path` is a local directory, a Hugging Face hub id or a GGUF checkpoint (a ``.gguf``
    path or ``builtin:smollm2-135m-instruct``, see `rlkit.models.gguf`). `target_modules` is
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
        if self.compute_dtype not in DTYPE_NAMES:
            raise ValueError(
                f"ModelSpec.compute_dtype must be one of {DTYPE_NAMES}, got {self.compute_dtype!r}"
            )
        if self.quant_type not in QUANT_TYPES:
            raise ValueError(
                f"ModelSpec.quant_type must be one of {QUANT_TYPES}, got {self.quant_type!r}"
            )
        if self.device != "auto":  # "auto" always resolves; only an explicit device can be wrong
            resolve_device(self.device)

    @property
    def dtype(self):
        """The torch dtype named by `compute_dtype`."""
        import torch

        return getattr(torch, self.compute_dtype)

    @property
    def torch_device(self):
        return resolve_device(self.device)


def resolve_device(device: str):
    """``auto`` → CUDA when available, else CPU; anything else must name an available device."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"ModelSpec.device is not a torch device: {device!r}") from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"ModelSpec.device is {device!r} but CUDA is not available")
    return resolved
