"""Atomic checkpoints: policy weights (or adapter) plus every piece of trainer state.

Layout: ``RUN_DIR/checkpoints/step_000040/{policy/, trainer_state.pt}`` and a ``latest`` file
naming the newest complete checkpoint. A checkpoint is written into a temporary folder and renamed
into place, and ``latest`` is replaced atomically, so a crash mid-write never leaves a checkpoint
that looks complete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

TRAINER_STATE = "trainer_state.pt"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, policy, state: dict, keep: int = 2) -> Path:
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    policy.save(tmp / "policy")
    torch.save(state, tmp / TRAINER_STATE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = checkpoint_dir(run_dir) / "latest"
    if not pointer.exists():
        return None
    path = checkpoint_dir(run_dir) / pointer.read_text().strip()
    return path if (path / TRAINER_STATE).exists() else None


def load_trainer_state(path: Path) -> dict:
    return torch.load(Path(path) / TRAINER_STATE, weights_only=False)
