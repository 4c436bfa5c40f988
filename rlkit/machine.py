"""What a run's float results depend on besides its config and seed: the machine.

A seeded CPU run repeats its ``metrics.jsonl`` exactly on the same machine at the same thread
count. On another CPU the model's forward and backward kernels (PyTorch's own, MKL's and oneDNN's)
may pick another vector width and accumulate in another order, and from the first token that
flips the run is another draw of the same experiment (docs/tiny-default.md, "Across CPUs").
:func:`fingerprint` records what decides those kernels, so that a figure can be compared exactly
where the fingerprint matches and as a statistic elsewhere.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
from pathlib import Path

ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq")
ISA_FLAGS += ("avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "amx_tile")
LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "numpy")
# The variables that limit or fix the CPU kernels' code paths, read when each library starts:
# PyTorch's own kernels, MKL's conditional numerical reproducibility and instruction set, oneDNN's.
KERNEL_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
)
# The pins under which, on an Intel Xeon with AVX-512 and AMX, the committed sweeps' greedy
# curves come back (measured in docs/tiny-default.md): every kernel limited to AVX2.
AVX2_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def _cpu() -> tuple[str, set[str]]:
    """The CPU's model name and ISA flags (``/proc/cpuinfo``; the platform's name elsewhere)."""
    cpu, flags = platform.processor(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    return cpu, flags


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def fingerprint(threads: int | None = None) -> dict:
    """The CPU (model and vector ISA), the kernel path PyTorch chose, the libraries' versions and,
    with ``threads``, the torch thread count and the kernel variables set in this process."""
    import torch

    cpu, flags = _cpu()
    out = {
        "cpu": cpu,
        "isa": [f for f in ISA_FLAGS if f in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **{name: _version(name) for name in LIBRARIES},
    }
    if threads is not None:
        out["threads"] = threads
        out["kernel_variables"] = {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ}
    return out
