"""Chat-template prompts (task.chat_template) with locally built templates (no hub access)."""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from rlkit.config import load_config
from rlkit.models.tokenizer import build_char_tokenizer
from rlkit.tasks.base import Problem
from rlkit.tasks.chat import chat_problems, render_chat_prompt
from rlkit.trainer import Trainer

# Qwen3's generation prompt, reduced to what matters here: an empty think block when
# enable_thinking is false.
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
# Llama-3's template writes the BOS token itself.
LLAMA3_LIKE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def tokenizer_with(template: str | None):
    tokenizer = build_char_tokenizer("0123456789+-*=")
    tokenizer.chat_template = template
    return tokenizer


def test_qwen3_template_turns_thinking_off():
    rendered = render_chat_prompt("1+2=", tokenizer_with(QWEN3_LIKE))
    assert rendered == (
        "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_bos_written_by_the_template_is_not_doubled():
    tokenizer = tokenizer_with(LLAMA3_LIKE)
    rendered = render_chat_prompt("1+2=", tokenizer)
    assert not rendered.startswith("<bos>") and rendered.startswith("<|start_header_id|>user")
    ids = tokenizer(rendered)["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id


def test_problems_keep_their_answers_and_a_base_tokenizer_is_a_clear_error():
    problems = [Problem("a/0", "1+2=", "3", "add", 1)]
    (chat,) = chat_problems(problems, tokenizer_with(QWEN3_LIKE))
    assert (chat.id, chat.answer, chat.topic, chat.difficulty) == ("a/0", "3", "add", 1)
    assert "1+2=" in chat.prompt and chat.prompt != "1+2="
    with pytest.raises(ValueError, match="task.chat_template=false"):
        chat_problems(problems, tokenizer_with(None))


def test_trainer_renders_train_and_eval_prompts(tmp_path, tiny_model_dir):
    model_dir = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = QWEN3_LIKE
    tokenizer.save_pretrained(model_dir)
    overrides = [f"model.name_or_path={model_dir}", f"output_dir={tmp_path / 'run'}"]
    overrides += [
        "task.num_train=8",
        "task.num_eval=4",
        "rollout.num_prompts=4",
        "tensorboard=false",
        "progress=false",
    ]
    trainer = Trainer(load_config("tiny-cpu", [*overrides, "task.chat_template=true"]))
    for problem in trainer.train_problems + trainer.eval_problems:
        assert problem.prompt.startswith("<|im_start|>user\n")
        assert problem.prompt.endswith("</think>\n\n")
