"""What a run's float results depend on besides its config and seed: the machine's CPU kernels.

A seeded CPU run repeats its ``metrics.jsonl`` exactly on the same machine at the same thread
count. On another CPU the model's forward and backward kernels (PyTorch's own, MKL's and oneDNN's)
may pick another vector width and accumulate in another order, and from the first token that
flips the run is another draw of the same experiment (docs/tiny-default.md, "Across CPUs").
Importing rlkit therefore pins those kernels (:func:`pin_cpu_kernels`) to code paths that give the
same floats on any x86-64 CPU with AVX2, Intel or AMD, unless ``RLKIT_CPU_KERNELS=native``.
:func:`fingerprint` records what decides the kernels, so that a figure can be compared exactly
where the kernels match and as a statistic elsewhere.
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
# The pins that give a seeded CPU run the same floats on any x86-64 CPU with AVX2: PyTorch's own
# kernels compiled for AVX2 (the same instructions on every such CPU, and exact ones: no
# approximate reciprocals), MKL's conditional numerical reproducibility on its COMPATIBLE branch
# (SSE2 without rcpps/rsqrtps, fixed cache sizes and reduction order: the branch Intel documents
# for non-Intel CPUs too; its AVX2 branch falls back to automatic dispatch there), oneDNN at AVX2.
# bitsandbytes picks its CPU path from PyTorch's, so it follows. Cost (benchmarks/cpu_kernels.py):
# about 12 % more CPU time on the tiny default, 2.3 times on SmolLM2-135M, whose matrix products
# run on MKL's SSE2 code (docs/tiny-default.md "Across CPUs").
PORTABLE_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
KERNEL_MODES = {"portable": PORTABLE_KERNELS, "avx2": AVX2_KERNELS, "native": {}}
MODE_VARIABLE = "RLKIT_CPU_KERNELS"


def kernel_mode() -> str:
    """The mode ``RLKIT_CPU_KERNELS`` names (``portable`` when unset); a ValueError names the
    variable and the modes."""
    mode = os.environ.get(MODE_VARIABLE, "portable")
    if mode not in KERNEL_MODES:
        raise ValueError(f"{MODE_VARIABLE}={mode!r}: expected one of {sorted(KERNEL_MODES)}")
    return mode


def pin_cpu_kernels() -> str:
    """Set the kernel variables of :func:`kernel_mode` that this process has not set itself;
    the mode. The libraries read them when they first choose a kernel, so this must run before
    the first tensor operation (``import rlkit`` does it; :func:`unpinned` tells when it came too
    late)."""
    mode = kernel_mode()
    for name, value in KERNEL_MODES[mode].items():
        os.environ.setdefault(name, value)
    return mode


def unpinned() -> str | None:
    """Why this process's kernels are not the pinned mode's, or None: PyTorch chose its kernels
    (a tensor operation ran) before rlkit set the variables. MKL's and oneDNN's choice cannot be
    read back; PyTorch's is the one every CPU op passes through."""
    import torch

    wanted = KERNEL_MODES[kernel_mode()].get("ATEN_CPU_CAPABILITY")
    if wanted is None or os.environ.get("ATEN_CPU_CAPABILITY") != wanted:
        return None  # native, or the user set the variable
    chosen = torch.backends.cpu.get_cpu_capability()
    if chosen.lower() == wanted or wanted not in _cpu()[1]:
        return None  # pinned, or the CPU lacks the ISA (it runs its best, like every such CPU)
    return (
        f"PyTorch's CPU kernels are {chosen}, not the {wanted.upper()} that "
        f"{MODE_VARIABLE}={kernel_mode()} pins: a tensor operation ran before rlkit was imported. "
        "Import rlkit first (or start Python with the variables of rlkit.machine.KERNEL_MODES "
        "set) for results that repeat on other CPUs."
    )


def kernels_in_effect() -> str:
    """The mode of :data:`KERNEL_MODES` this process runs: its variables as the mode sets them
    and PyTorch's kernels the ones it pins; ``custom`` otherwise (a variable set by hand, or the
    pins set too late)."""
    mode = kernel_mode()
    pins = KERNEL_MODES[mode]
    if mode == "native":
        pins = {name: None for name in KERNEL_VARIABLES}
    if any(os.environ.get(name) != value for name, value in pins.items()) or unpinned():
        return "custom"
    return mode


def portable(machine: dict) -> bool:
    """Whether a :func:`fingerprint` describes a run whose floats any x86-64 CPU with AVX2
    repeats (given the libraries' versions and the thread count)."""
    return machine.get("kernels") == "portable" and machine.get("torch_cpu_capability") == "AVX2"


def same_kernels(a: dict, b: dict) -> bool:
    """Whether two :func:`fingerprint` records run the same kernels: equal, or both portable
    with the same libraries (the CPU model and ISA then do not matter)."""
    if portable(a) and portable(b):
        a, b = ({k: v for k, v in m.items() if k not in ("cpu", "isa")} for m in (a, b))
    return a == b


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
        "kernels": kernels_in_effect(),
        **{name: _version(name) for name in LIBRARIES},
    }
    if threads is not None:
        out["threads"] = threads
        out["kernel_variables"] = {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ}
    return out
