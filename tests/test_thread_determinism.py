"""A seeded CPU run repeats itself bit for bit at two torch threads, as it does at one.

The shared prompt forward (``rlkit.logprobs._completion_states``) copies each prompt's keys and
values to its rows; the backward sums the rows' gradients into the prompt. Done by advanced
indexing, that sum was ``index_put_(accumulate=True)``, which on CPU with more than one thread
(float32, 32768 elements or more) adds with atomic float adds in a parallel loop: the rows of a
prompt that two threads hold were summed in an order that changed run to run, and step 2's
entropy and gradient norm differed in their last bits. ``index_select`` sums them in row order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlkit.logprobs import _take_rows

ROOT = Path(__file__).resolve().parents[1]
RUN = [
    "steps=3",
    "rollout.num_prompts=8",
    "eval.every=3",
    "eval.num_problems=32",
    "checkpoint_every=0",
    "algo.estimator=ebpo",
    "progress=false",
    "tensorboard=false",
]


@contextlib.contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def prompt_gradient(take, keys: torch.Tensor, rows: torch.Tensor, upstream: torch.Tensor):
    keys = keys.detach().requires_grad_()
    take(keys, rows).backward(upstream)
    return keys.grad


def test_prompt_rows_gradient_is_the_same_at_two_threads_as_at_one():
    """The gradient of the prompts' keys through their rows, rows in drawn (shuffled) order and
    large enough for the parallel path (98304 elements): identical over repeats at two threads,
    and bit for bit the one-thread sum of the advanced indexing it replaced (one-thread runs, and
    so the golden files, do not move)."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(8, 4, 12, 32, generator=gen)  # 8 prompts' [heads, length, head_dim]
    rows = torch.arange(8).repeat_interleave(8)[torch.randperm(64, generator=gen)]
    upstream = torch.randn(64, 4, 12, 32, generator=gen)
    with torch_threads(1):
        indexed = prompt_gradient(lambda k, r: k[r], keys, rows, upstream)
    with torch_threads(2):
        digests = {
            hashlib.sha256(prompt_gradient(_take_rows, keys, rows, upstream).numpy()).hexdigest()
            for _ in range(30)
        }
        grad = prompt_gradient(_take_rows, keys, rows, upstream)
    assert len(digests) == 1
    assert torch.equal(grad, indexed)


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def train_at_two_threads(out: Path) -> list[dict]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = os.environ | {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "PYTHONPATH": path}
    args = [sys.executable, "-m", "rlkit", "train", "--overwrite", *RUN, f"output_dir={out}"]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return metrics(out)


@pytest.mark.slow
def test_two_thread_run_repeats_its_metrics(tmp_path):
    """The 3-step EBPO run, twice at two torch threads: every metric (``time/*`` aside) alike."""
    first = train_at_two_threads(tmp_path / "a")
    second = train_at_two_threads(tmp_path / "b")
    assert len(first) == 4 and "entropy" in first[2] and "grad_norm" in first[2]
    assert first == second
