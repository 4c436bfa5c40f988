"""Policies: the built-in tiny Llama and its character tokenizer.

Importing this package (every policy import goes through it) silences one notice of bitsandbytes:
on CPUs with AVX512-BF16 it logs "Failed to load CPU gemm_4bit_forward from kernels-community …
pip install kernels" when peft imports it. That optional kernel would only speed up the CPU
``gemv_4bit`` op on weights repacked for inference, a repack that
:func:`rlkit.models.loading.load_policy` turns off on every 4-bit layer (see
:mod:`rlkit.models.loading`), and bitsandbytes falls back to its own kernel without it: the missing
package changes nothing here, yet every ``rlkit`` command and notebook printed the notice. Other
bitsandbytes messages pass through.
"""

import logging

BNB_KERNEL_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"


def _not_the_kernel_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(BNB_KERNEL_NOTICE)


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_not_the_kernel_notice)
