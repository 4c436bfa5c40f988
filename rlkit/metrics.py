"""Metrics sinks: one JSON line per step (``metrics.jsonl``) and TensorBoard event files."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlkit.metric_names import current_names

TOKEN_KEYS = ("tokens/generated", "tokens/probe")  # run totals, logged every step


def tokens_spent(generated: float, probe: float) -> float:
    """Every token a run has generated so far, the probe's included: what ``token_budget``
    counts (tokens/generated: the tokens trained on and those dynamic sampling discarded;
    tokens/probe: AGPO's probe groups, not trained on)."""
    return generated + probe


def row_tokens(row: dict) -> float:
    """:func:`tokens_spent` as a ``metrics.jsonl`` row logs it (a key it lacks counts 0)."""
    return tokens_spent(*(row.get(key) or 0 for key in TOKEN_KEYS))


def is_logged_number(value) -> bool:
    """A ``metrics.jsonl`` value that counts: a finite number (not None, a bool, NaN or inf)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _clean(value):
    value = float(value)
    return value if math.isfinite(value) else None


class MetricsLogger:
    """Appends ``{"step": n, name: value, ...}`` lines; a resumed run first drops lines after the
    checkpoint's step so the file reads as one uninterrupted run."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            self.truncate_after(resume_step)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(
                log_dir=str(Path(run_dir) / "tensorboard"), purge_step=resume_step
            )

    def truncate_after(self, step: int) -> None:
        """Keep the rows up to ``step``, their keys under today's names (a run checkpointed
        before a rename resumes into one file of one scheme); a line cut short by a crash
        mid-write is dropped too."""
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        kept = [
            json.dumps(current_names(r))
            for r in rows
            if isinstance(r, dict) and r.get("step", step + 1) <= step
        ]
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict) -> None:
        row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items() if k != "step"}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for name, value in row.items():
                if name != "step" and value is not None:
                    self.writer.add_scalar(name, value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: Path | str) -> list[dict]:
    """All rows of a ``metrics.jsonl`` file (or of ``RUN_DIR/metrics.jsonl``), keys under today's
    names (:func:`rlkit.metric_names.current_names`: a run logged before a rename reads as one
    logged after it). A line that is not
    a JSON object with an integer ``step`` (damaged, or cut short by a crash) is a ValueError
    naming the file and the line, never a row silently lost."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.exists():
        raise ValueError(f"no metrics file at {path}")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(
                f"{path} line {number} is damaged (not a JSON object with an integer step): "
                f"{line[:80]!r}"
            )
        rows.append(current_names(row))
    return rows
