"""Prompts for chat checkpoints: each problem's text as one user turn of the tokenizer's chat
template, ending with the assistant header (``task.chat_template``).

Qwen3's template gets ``enable_thinking=False`` (no ``<think>`` block; other templates ignore the
flag). A template that writes the BOS token itself would get a second one from the tokenizer,
so a leading BOS is dropped when the tokenizer adds it anyway.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlkit.tasks.base import Problem

if TYPE_CHECKING:  # annotations only: checking a config must not load transformers
    from transformers import PreTrainedTokenizerBase


def render_chat_prompt(text: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """``text`` as a user message, rendered with the chat template up to the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"task.chat_template is true but the tokenizer {tokenizer.name_or_path!r} has no chat "
            "template (a base checkpoint: set task.chat_template=false)"
        )
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    bos = tokenizer.bos_token
    if bos and rendered.startswith(bos) and _adds_bos(tokenizer):
        rendered = rendered[len(bos) :]
    return rendered


def _adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    ids = tokenizer("x")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def chat_problems(problems: list[Problem], tokenizer: PreTrainedTokenizerBase) -> list[Problem]:
    return [
        dataclasses.replace(p, prompt=render_chat_prompt(p.prompt, tokenizer)) for p in problems
    ]
