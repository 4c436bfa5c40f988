"""Shared test fixtures: a tiny random Llama and a character-level tokenizer, saved to disk.

Everything is built offline and deterministically (no hub access), small enough that a forward
pass takes milliseconds on a laptop CPU: hidden size 32, 2 layers, a ~40-token vocabulary.
"""

from __future__ import annotations

import string

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rlkit.models.tokenizer import build_char_tokenizer

CHARACTERS = string.digits + "+-*/=() ?abcdefghijklmnopqrstuvwxyz"


def build_tiny_llama(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A random 2-layer Llama (hidden 32); weights scaled up so sampling is far from uniform."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
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
    return LlamaForCausalLM(config).eval()


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


@pytest.fixture
def tiny_model(tiny_model_dir) -> LlamaForCausalLM:
    """A fresh (function-scoped) copy of the saved tiny Llama, float32, eval mode."""
    return LlamaForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
