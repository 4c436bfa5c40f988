"""A run directory: what a run may read from it, who may write to it, and how a run starts there.

``RUN_DIR`` holds ``config.yaml`` (the run's full config), ``metrics.jsonl``, ``tensorboard/``,
``checkpoints/`` and ``.lock``, locked while a process trains there.

- Every path read from a run directory must resolve inside it (:func:`confined`): a symlink or a
  ``checkpoints/latest`` pointing elsewhere is refused.
- One process at a time: :class:`RunLock` takes an exclusive ``flock`` on ``.lock``. The kernel drops
  it when the process dies, so a lock left by a killed run is never in the way (:class:`DirLock`
  does the same for a whole sweep).
- A fresh run refuses a non-empty directory unless told to overwrite (:func:`check_fresh`), and
  then removes only what a run writes there (:func:`clear_run`).
- A resumed run keeps its saved config: only :data:`RESUME_OVERRIDES` may change
  (:func:`check_resume_config`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from rlkit.config import TrainConfig, config_from_dict, load_config, merge_overrides, read_yaml

CHECKPOINTS = "checkpoints"
CONFIG = "config.yaml"
LOCK = ".lock"
# What --overwrite removes, in this order: config.yaml last, so a directory whose clearing was
# interrupted still says which run it held (rlkit sweep restarts only its own runs).
RUN_FILES = (CHECKPOINTS, "metrics.jsonl", "tensorboard", CONFIG)
# Keys a resumed run may change: its length, checkpoint and eval cadence, logging, and the
# trust_remote_code flag (always taken from the command line, never from a run directory).
RESUME_OVERRIDES = (
    "steps",
    "checkpoint_every",
    "keep_checkpoints",
    "eval.every",
    "tensorboard",
    "progress",
    "model.trust_remote_code",
)

# Defaults that changed, key -> (old default, new default, date): a run saved under the old one
# and resumed (or met again by its sweep) under the new one is told how to keep its value.
CHANGED_DEFAULTS = {"optim.share_prompt_forward": (False, "auto", "2026-12-01")}


def confined(run_dir: Path, path: Path) -> Path:
    """``path`` resolved (symlinks followed); a ValueError if it lies outside ``run_dir``."""
    root, resolved = Path(run_dir).resolve(), Path(path).resolve()
    if not resolved.is_relative_to(root):
        raise ValueError(f"{path} points outside the run directory {run_dir} (to {resolved})")
    return resolved


def check_run_files(run_dir: Path) -> None:
    """Every file or folder a run keeps (:data:`RUN_FILES`) resolves inside ``run_dir``."""
    for name in RUN_FILES:
        confined(run_dir, Path(run_dir) / name)


class DirLock:
    """Exclusive lock on ``DIR/<NAME>`` (``fcntl.flock``), released by :meth:`release` or when the
    process ends, however it ends: a lock left by a killed process is never in the way. A second
    holder is refused with a ValueError naming the directory and the holding process."""

    NAME = LOCK
    KIND = "directory"
    HINT = "wait for it to finish"

    def __init__(self, directory: Path):
        self.path = Path(directory) / self.NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            owner = self._file.read().strip() or "another process"
            self._file.close()
            raise ValueError(
                f"{self.KIND} {directory} is in use by {owner} (lock {self.path}); {self.HINT}"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"process {os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        file = getattr(self, "_file", None)  # None: __init__ failed before opening it
        if file is not None and not file.closed:
            file.close()  # closing the file drops the flock

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


class RunLock(DirLock):
    """The lock of a run directory (``RUN_DIR/.lock``), held while a process trains there."""

    KIND = "run directory"
    HINT = "wait for it to finish or choose another output_dir"


def run_files(run_dir: Path) -> list[str]:
    """The names in ``run_dir`` other than its lock file, sorted (an absent directory: none)."""
    run_dir = Path(run_dir)
    return sorted(p.name for p in run_dir.iterdir() if p.name != LOCK) if run_dir.is_dir() else []


def check_fresh(run_dir: Path, overwrite: bool) -> None:
    """A fresh run needs an empty directory (its own lock file aside), unless ``overwrite``."""
    others = run_files(run_dir)
    if others and not overwrite:
        raise ValueError(
            f"output_dir {run_dir} is not empty ({', '.join(others[:4])}"
            f"{', …' if len(others) > 4 else ''}); resume it with --resume, choose another "
            "output_dir, or pass --overwrite to replace the previous run"
        )


def clear_run(run_dir: Path) -> None:
    """Remove what a previous run wrote (:data:`RUN_FILES`), nothing else. Called with the lock
    held, once the new run has loaded its model and data."""
    for name in RUN_FILES:
        path = Path(run_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)``, then ``tmp`` renamed onto ``path`` (same folder): a reader, or a crash,
    never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _flatten(cfg: TrainConfig) -> dict:
    """``section.key`` → value; option mappings such as ``algo.options`` stay whole."""
    out = {}
    for key, value in cfg.to_dict().items():
        if isinstance(value, dict):
            out |= {f"{key}.{name}": v for name, v in value.items()}
        else:
            out[key] = value
    return out


def write_config(run_dir: Path, cfg: TrainConfig) -> None:
    """The run's ``config.yaml``, replaced atomically (what ``saved_config`` reads back)."""
    config_tmp = run_dir / f".{CONFIG}.tmp"
    config_tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    config_tmp.replace(run_dir / CONFIG)


def trained_model(run_dir: Path) -> str:
    """``name_or_path (mode)`` of the model a run directory's ``config.yaml`` names, for
    messages ("unknown" when the file does not say)."""
    try:
        model = read_yaml(str(confined(run_dir, run_dir / CONFIG)))["model"]
        return f"{model['name_or_path']} ({model.get('mode', 'full')})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "unknown"


def saved_config(
    run_dir: Path, overrides: Iterable[str] = (), check_paths: bool = True
) -> TrainConfig:
    """The config a run directory was trained with (its ``config.yaml``) plus ``overrides``.
    ``output_dir`` is that directory; ``model.trust_remote_code`` is off unless an override turns
    it on: it is never taken from a file in a run directory. ``check_paths=False`` validates the
    values but not the filesystem (model and dataset paths, a writable ``output_dir``): what
    reading a finished run's results needs, also after its model moved."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise ValueError(f"{run_dir} has no {CONFIG}: not an rlkit run directory")
    confined(run_dir, path)
    overrides = ["model.trust_remote_code=false", *overrides, f"output_dir={run_dir}"]
    if check_paths:
        return load_config(str(path), overrides)
    return config_from_dict(merge_overrides(read_yaml(str(path)), overrides))


def check_resume_config(saved: TrainConfig, wanted: TrainConfig) -> None:
    """A resumed run's config may differ from the saved one only in :data:`RESUME_OVERRIDES`
    (and ``output_dir``, the directory it was found in); anything else is a ValueError naming
    the key."""
    old, new = _flatten(saved), _flatten(wanted)
    for key in sorted(old.keys() | new.keys()):
        if key in (*RESUME_OVERRIDES, "output_dir") or old.get(key) == new.get(key):
            continue
        hint = ""
        if key in CHANGED_DEFAULTS and CHANGED_DEFAULTS[key][:2] == (old.get(key), new.get(key)):
            before, now, date = CHANGED_DEFAULTS[key]
            hint = (
                f"; the default of {key} changed from {before!r} to {now!r} on {date}: "
                f"set {key}={str(before).lower()} to continue this run as it was saved"
            )
        raise ValueError(
            f"resume: {key}={new.get(key)!r} differs from the run's saved config "
            f"({old.get(key)!r}); a resumed run keeps its config.yaml, only "
            f"{', '.join(RESUME_OVERRIDES)} may change{hint}"
        )
