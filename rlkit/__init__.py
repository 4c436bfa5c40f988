"""rlkit: reinforcement learning of language models with verifiable rewards.

GRPO and its relatives, EBPO (empirical-Bayes shrinkage baseline, arXiv 2602.05165) and AGPO
(adaptive clipping and adaptive sampling temperature, arXiv 2605.20722; not the unrelated AGPO of
arXiv 2503.15952). The formulas follow
``docs/algorithms.md``; each function's docstring names the section it implements.

Importing rlkit silences two notices of its dependencies that do not apply to it and that every
``rlkit`` command and notebook printed (with this machine's paths):

- tqdm's "IProgress not found. Please update jupyter and ipywidgets" (a ``TqdmWarning``), raised
  when transformers or rlkit imports ``tqdm.auto`` in a Jupyter kernel without ipywidgets: tqdm
  then draws its text bars, which rlkit's notebooks turn off anyway (``TQDM_DISABLE``).
- bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community … pip install
  kernels", logged on CPUs with AVX512-BF16 when peft imports it. That optional kernel would only
  speed up the CPU ``gemv_4bit`` op on weights repacked for inference, a repack
  :func:`rlkit.models.loading.load_policy` turns off on every 4-bit layer (see
  :mod:`rlkit.models.loading`); bitsandbytes falls back to its own kernel without it.

Every other warning and log message of both passes through.

Importing rlkit also pins the CPU kernels of PyTorch, MKL and oneDNN to code paths that give a
seeded run the same floats on any x86-64 CPU with AVX2 (:func:`rlkit.machine.pin_cpu_kernels`;
``RLKIT_CPU_KERNELS=native`` keeps each library's own choice): import it before running any
tensor operation.
"""

import logging
import warnings

from rlkit.machine import pin_cpu_kernels

__version__ = "0.1.0"

TQDM_WIDGET_NOTICE = "IProgress not found"
BNB_KERNEL_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"
# peft reads transformers' deprecated `model.is_gradient_checkpointing` once per wrapped model:
# nothing a user can change, and it printed once per pool worker into notebook 11's outputs
PEFT_CHECKPOINTING_NOTICE = "`is_gradient_checkpointing` is deprecated"


def _not_the_kernel_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(BNB_KERNEL_NOTICE)


warnings.filterwarnings("ignore", message=TQDM_WIDGET_NOTICE, module="tqdm")
warnings.filterwarnings("ignore", message=PEFT_CHECKPOINTING_NOTICE, category=FutureWarning)
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_not_the_kernel_notice)
pin_cpu_kernels()


def show_warnings_plainly() -> None:
    """Format warnings as ``warning: <category>: <message>``, without the source file and line
    (which name this machine's install path): for the ``rlkit`` commands and their worker
    processes, not for library use, where Python's format stays. Only the text changes, so
    filters and recording (``warnings.catch_warnings(record=True)``) work as before."""
    warnings.formatwarning = lambda message, category, *args, **kwargs: (
        f"warning: {category.__name__}: {message}\n"
    )
