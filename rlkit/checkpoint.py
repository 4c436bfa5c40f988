"""Atomic, verified checkpoints that load without running code.

Layout: ``RUN_DIR/checkpoints/step_000040/{policy/, trainer_state.pt, manifest.json}`` and a
``latest`` file naming the newest complete checkpoint. A checkpoint is written into a temporary
folder and renamed into place, and ``latest`` is replaced atomically, so a crash mid-write never
leaves a checkpoint that looks complete.

- ``trainer_state.pt`` holds only tensors and plain containers (dict, list, tuple, str, numbers)
  and is read with ``torch.load(weights_only=True)``: a file holding anything else is refused.
  Policy weights are safetensors.
- ``manifest.json`` (written last) records the run id, the step and the SHA-256 of every file. A
  checkpoint whose files do not match it is damaged: loading falls back, with a warning, to the
  newest older checkpoint that verifies, or stops with an error naming the file.
- Every path read is confined to the run directory (:func:`rlkit.rundir.confined`).
- Rotation deletes only older checkpoints of the same run (same run id).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from rlkit.config import TrainConfig
from rlkit.hashing import file_sha256
from rlkit.metrics import read_metrics, row_tokens
from rlkit.rundir import (
    CHECKPOINTS,
    RUN_FILES,
    check_fresh,
    check_resume_config,
    check_run_files,
    confined,
    run_files,
    saved_config,
)

TRAINER_STATE = "trainer_state.pt"
MANIFEST = "manifest.json"
LATEST = "latest"
STEP_DIR = re.compile(r"step_(\d{6,})")


@dataclass
class Checkpoint:
    """A verified checkpoint: its folder, step, the run it belongs to and its trainer state."""

    path: Path
    step: int
    run_id: str
    state: dict


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``step_NNNNNN`` folder (symlinks aside), oldest first (by step,
    not by name)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [
        (STEP_DIR.fullmatch(p.name), p) for p in root.iterdir() if p.is_dir() and not p.is_symlink()
    ]
    return sorted((int(m.group(1)), p) for m, p in found if m)


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy,
    state: dict,
    keep: int = 2,
    run_id: str = "",
    weights: dict | None = None,
) -> Path:
    """Write ``step``'s checkpoint atomically (manifest last), point ``latest`` at it, then keep
    the ``keep`` newest checkpoints of run ``run_id`` (other runs' checkpoints are never deleted).
    ``weights``: the policy's state dict when the policy holds only a shard of it (FSDP2)."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    policy.save(tmp / "policy", weights)
    torch.save(state, tmp / TRAINER_STATE)
    files = {name: file_sha256(tmp / name) for name in _files(tmp)}
    manifest = {"run_id": run_id, "step": step, "files": files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / LATEST)
    own = [path for s, path in step_dirs(run_dir) if s < step and _run_id(path) == run_id]
    for old in own[: max(0, len(own) - (keep - 1))]:
        shutil.rmtree(old)
    return final


def _run_id(path: Path) -> str | None:
    try:
        return json.loads((path / MANIFEST).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder ``checkpoints/latest`` names (None without a pointer); a pointer naming
    anything but a checkpoint folder of this run is a ValueError."""
    pointer = checkpoint_dir(run_dir) / LATEST
    if not pointer.exists():
        return None
    name = confined(run_dir, pointer).read_text().strip()
    if not STEP_DIR.fullmatch(name):
        raise ValueError(f"{pointer} names {name!r}, which is not a checkpoint folder of this run")
    path = checkpoint_dir(run_dir) / name
    confined(run_dir, path)
    return path


def verify_checkpoint(run_dir: Path, path: Path) -> Checkpoint:
    """Check ``path`` against its manifest and load its trainer state; a ValueError names the
    file that is missing, damaged, outside the run directory or unsafe to load."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ValueError(
            f"{manifest_path} is missing (an incomplete checkpoint, or one written before "
            "rlkit checkpoints had manifests)"
        )
    try:
        manifest = json.loads(confined(run_dir, manifest_path).read_text())
        files, step, run_id = manifest["files"], int(manifest["step"]), str(manifest["run_id"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{manifest_path} is unreadable: {err}") from None
    present = _files(path)
    extra = sorted(set(present) - set(files) - {MANIFEST})
    if extra:
        raise ValueError(f"{path / extra[0]} is not listed in {manifest_path}")
    for name, digest in files.items():
        file = path / name
        if not file.is_file():
            raise ValueError(f"{file} is missing")
        if file_sha256(confined(run_dir, file)) != digest:
            raise ValueError(f"{file} is damaged (its SHA-256 differs from {MANIFEST})")
    return Checkpoint(path, step, run_id, load_trainer_state(path))


def load_trainer_state(path: Path) -> dict:
    """``trainer_state.pt`` read with ``weights_only=True``: tensors and plain containers only."""
    file = Path(path) / TRAINER_STATE
    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{file} holds objects other than tensors and plain containers; refusing to load it "
            f"(loading it could run code): {first}"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise ValueError(f"{file} is unreadable: {err}") from None


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The newest intact checkpoint: the one ``latest`` names or, when that one is damaged, the
    newest older one that verifies (with a warning). None when there is no checkpoint at all."""
    latest = latest_checkpoint(run_dir)
    if latest is None:
        return None
    newest = int(STEP_DIR.fullmatch(latest.name).group(1))
    candidates = [p for s, p in reversed(step_dirs(run_dir)) if s < newest]
    problems = []
    for path in [latest, *candidates]:
        try:
            checkpoint = verify_checkpoint(run_dir, path)
        except ValueError as err:
            problems.append(str(err))
            continue
        if problems:
            warnings.warn(
                f"checkpoint {latest.name} is unusable ({problems[0]}); "
                f"resuming from {path.name} instead",
                stacklevel=2,
            )
        return checkpoint
    raise ValueError(f"no intact checkpoint in {checkpoint_dir(run_dir)}: {problems[0]}")


def spent_at(run_dir: Path, step: int) -> float:
    """The tokens (generated and probe) run ``run_dir`` had spent by ``step``, from its
    ``metrics.jsonl`` (0 before its first step)."""
    rows = [r for r in read_metrics(run_dir) if r["step"] == step]
    return row_tokens(rows[-1]) if rows else 0


def run_progress(cfg: TrainConfig) -> str:
    """How far the run ``cfg`` describes has got in ``cfg.output_dir``: ``done`` (latest
    checkpoint at the final step: ``steps``, or the step whose tokens reached ``token_budget``),
    ``resume`` (an earlier checkpoint: a killed run) or ``fresh`` (no checkpoint: an empty
    directory, or one that this run left before its first checkpoint). A directory that holds
    another run (a saved config that differs from ``cfg`` in anything a resume may not change, a
    checkpoint past ``steps``), no config.yaml, or files no run writes, is a ValueError saying
    which."""
    run_dir = Path(cfg.output_dir)
    latest = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    files = run_files(run_dir)
    if latest is None and not files:
        return "fresh"
    unknown = sorted(set(files) - set(RUN_FILES))
    if latest is None and unknown:
        raise ValueError(f"it holds files no run writes ({', '.join(unknown)})")
    check_resume_config(saved_config(run_dir, check_paths=False), cfg)
    if latest is None:
        return "fresh"
    step = int(STEP_DIR.fullmatch(latest.name).group(1))
    if step > cfg.steps:
        raise ValueError(f"its checkpoint is at step {step}, past steps={cfg.steps}")
    budget_spent = bool(cfg.token_budget) and spent_at(run_dir, step) >= cfg.token_budget
    return "done" if step == cfg.steps or budget_spent else "resume"


def open_run(
    run_dir: Path, cfg: TrainConfig, resume: bool, overwrite: bool, read_only: bool
) -> Checkpoint | None:
    """The checks before a trainer uses ``run_dir``, and the checkpoint it resumes from (None for
    a fresh run): a resumed run needs intact files, a checkpoint and (unless only evaluating)
    the config it was saved with; a fresh one an empty directory unless ``overwrite``."""
    if resume:
        check_run_files(run_dir)
    checkpoint = load_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        raise ValueError(f"resume: no checkpoint in {run_dir / 'checkpoints'}")
    if resume and not read_only:
        check_resume_config(saved_config(run_dir), cfg)
    if not resume and not read_only:
        check_fresh(run_dir, overwrite)
    return checkpoint
