"""The built-in default policy: a tiny Llama warm-started on the arithmetic task.

`build_tiny_policy` creates a small `LlamaForCausalLM` with a character tokenizer, trains it by
supervised fine-tuning on the task's train split (loss on completion tokens only) for a
deliberately short schedule, and caches the result on disk. The schedule is tuned so the warm
start sits at a *mixed* skill level — easy cells mostly solved, hard cells almost never, many in
between — which is where RL with group baselines has signal to learn from.

The default run never builds: the weights it starts from are shipped in the package
(`SHIPPED_DIR`, under a megabyte of safetensors) and identified by `weights_digest`, so every machine
starts from the same bits. `build_tiny_policy` is how they were produced (``rlkit build-tiny``
regenerates them; see `SHIPPED_DIR/build_info.json` for the settings, the machine and the digest).

A build runs SFT on one torch thread whatever the caller's setting: float reductions then happen in
one order, so the same configs give bit-identical weights at any thread count on the same CPU
kernels. Another CPU (e.g. one with AVX512-BF16, which takes other oneDNN kernels) may still round
differently, which is why the default is shipped rather than rebuilt. The cache key is a hash of
the task and model configs, so a build is reused only for identical settings; it is built in a
temporary directory and renamed when complete, so an interrupted build never looks finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from tqdm.auto import tqdm
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from rlkit.cache import default_cache_dir
from rlkit.models.tokenizer import build_char_tokenizer
from rlkit.tasks.arithmetic import ArithmeticTask

BUILD_FORMAT = 2  # bump when the build procedure changes, to invalidate old caches
BUILD_INFO = "build_info.json"  # written last: its presence marks a finished build
IGNORE_INDEX = -100
SHIPPED_DIR = Path(__file__).with_name("builtin_tiny")  # the default run's warm start


@dataclass(frozen=True)
class TinyModelConfig:
    """Architecture and warm-start schedule of the built-in policy.

    `sft_difficulty_weights` gives the sampling weight of each of the task's difficulties (in the
    task's order) during SFT; together with `sft_steps` it sets the warm start's skill mix.
    """

    hidden_size: int = 64
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 256
    max_positions: int = 128
    sft_steps: int = 400
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    sft_difficulty_weights: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)
    seed: int = 0

    def __post_init__(self):
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.sft_steps < 0 or self.warmup_steps < 0:
            raise ValueError("sft_steps and warmup_steps must be >= 0")
        if any(w < 0 for w in self.sft_difficulty_weights) or not sum(self.sft_difficulty_weights):
            raise ValueError(
                f"sft_difficulty_weights must be >= 0 and not all 0, "
                f"got {self.sft_difficulty_weights}"
            )


def build_key(task: ArithmeticTask, config: TinyModelConfig) -> str:
    """Short hash of everything that determines the built weights."""
    payload = {
        "format": BUILD_FORMAT,
        "task": dataclasses.asdict(task),
        "model": dataclasses.asdict(config),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def build_tiny_policy(
    task: ArithmeticTask | None = None,
    config: TinyModelConfig | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    out_dir: str | Path | None = None,
) -> Path:
    """Directory holding the warm-started tiny policy (model + tokenizer + build_info.json).

    The directory is ``out_dir`` if given, else ``cache_dir/tiny-<key>``. A finished build there
    is reused; otherwise it is built in a temporary directory beside it and renamed into place.
    """
    task = task or ArithmeticTask()
    config = config or TinyModelConfig()
    if len(config.sft_difficulty_weights) != len(task.difficulties):
        raise ValueError(
            f"sft_difficulty_weights has {len(config.sft_difficulty_weights)} entries but the "
            f"task has {len(task.difficulties)} difficulties"
        )
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = Path(out_dir) if out_dir else cache_dir / f"tiny-{build_key(task, config)}"
    if (target / BUILD_INFO).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        start = time.perf_counter()
        tokenizer = build_char_tokenizer(task.alphabet)
        with torch.random.fork_rng(devices=[]), one_torch_thread():
            torch.manual_seed(config.seed)
            model = new_tiny_llama(config, tokenizer)
            losses = supervised_warm_start(model, tokenizer, task, config, progress)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        info = {
            "key": build_key(task, config),
            "task": dataclasses.asdict(task),
            "model": dataclasses.asdict(config),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "sft_loss": losses,
            "build_seconds": time.perf_counter() - start,
            "weights_sha256": weights_digest(model.state_dict()),
            "built_with": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "threads": 1,
                "machine": platform.machine(),
            },
        }
        (staging / BUILD_INFO).write_text(json.dumps(info, indent=1))
        if (target / BUILD_INFO).exists():  # a concurrent build finished first
            return target
        shutil.rmtree(target, ignore_errors=True)  # a directory without BUILD_INFO is unfinished
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def shipped_tiny_policy() -> Path:
    """Directory of the warm-started tiny policy shipped with rlkit (what ``builtin:tiny`` means)."""
    if not (SHIPPED_DIR / BUILD_INFO).exists():
        raise FileNotFoundError(
            f"the built-in tiny policy is missing from {SHIPPED_DIR}: reinstall rlkit, or "
            "regenerate it with `rlkit build-tiny --out " + str(SHIPPED_DIR) + "`"
        )
    return SHIPPED_DIR


def weights_digest(state: dict[str, torch.Tensor] | str | Path) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of every tensor, in name order.

    Takes a state dict or a model directory (its ``model.safetensors``); the two agree, so the
    digest of a loaded model can be checked against the file it came from.
    """
    if not isinstance(state, dict):
        state = load_file(Path(state) / "model.safetensors")
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@contextlib.contextmanager
def one_torch_thread():
    """Run on one intra-op thread (restored after): a thread-count-independent reduction order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def new_tiny_llama(config: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A randomly initialised Llama sized by `config` (uses the global torch RNG)."""
    llama_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(llama_config)


def sft_batch(
    examples: list[tuple[str, str]], tokenizer: PreTrainedTokenizerBase
) -> dict[str, torch.Tensor]:
    """Right-padded ``prompt + completion + EOS`` sequences; labels only on completion + EOS."""
    rows, label_rows = [], []
    for prompt, completion in examples:
        prompt_ids = tokenizer(prompt)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        completion_ids = [*completion_ids, tokenizer.eos_token_id]
        rows.append(prompt_ids + completion_ids)
        label_rows.append([IGNORE_INDEX] * len(prompt_ids) + completion_ids)
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), IGNORE_INDEX)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, label_row) in enumerate(zip(rows, label_rows)):
        input_ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(row)] = torch.tensor(label_row)
        attention_mask[i, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def supervised_warm_start(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    task: ArithmeticTask,
    config: TinyModelConfig,
    progress: bool = True,
) -> list[float]:
    """AdamW with linear warm-up and cosine decay on the train split; returns the loss per step.

    Problems are drawn by difficulty with `config.sft_difficulty_weights`, then uniformly
    within that difficulty.
    """
    by_difficulty = {d: [] for d in task.difficulties}
    for problem in task.problems("train"):
        by_difficulty[problem.difficulty].append(problem)
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _lr_factor(step, config.warmup_steps, config.sft_steps)
    )
    model.train()
    losses = []
    bar = tqdm(range(config.sft_steps), desc="tiny policy SFT", disable=not progress)
    for _ in bar:
        difficulties = rng.choices(
            task.difficulties, weights=config.sft_difficulty_weights, k=config.batch_size
        )
        examples = [task.sft_example(rng.choice(by_difficulty[d])) for d in difficulties]
        loss = model(**sft_batch(examples, tokenizer)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    model.eval()
    return losses


def _lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
