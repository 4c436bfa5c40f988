"""Standard training curves of one or several runs (``rlkit plot RUN_DIR …``), and the two
helpers every figure rlkit saves is drawn with (:func:`new_figure`, :func:`save_figure`).

No pyplot and no ``matplotlib.use``: a figure here is a plain :class:`matplotlib.figure.Figure`,
which saves to PNG through the Agg canvas without touching the global backend, so importing rlkit
never switches a notebook's plotting backend off (a notebook that imported pyplot first keeps
showing its figures inline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from rlkit.figure_style import FIGURE_DPI, STYLE
from rlkit.metric_names import current_names
from rlkit.metrics import read_metrics
from rlkit.paths import check_link
from rlkit.rundir import write_atomically

STANDARD_CURVES = {
    "reward": "train reward",
    "eval/greedy_accuracy": "held-out greedy accuracy",
    "entropy": "policy entropy (nats/token)",
    "grad_norm": "grad norm",
    "kl": "KL to the reference (k3)",
    "frac_reward_zero_std": "frac. groups with zero reward std",
    "agpo/epsilon/mean": "AGPO clip ε (mean)",
    "agpo/temperature/mean": "AGPO temperature τ (mean)",
    "ebpo/shrinkage_mean": "EBPO shrinkage S (mean)",
}


def curves(rows: list[dict], name: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[name]) for r in rows if r.get(name) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def trailing_mean(values: list[float], window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    x = np.asarray(values, dtype=np.float64)
    csum = np.concatenate([[0.0], np.cumsum(x)])
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)


def new_figure(nrows: int, ncols: int, panel: tuple[float, float]) -> tuple[Figure, np.ndarray]:
    """A figure of ``nrows`` x ``ncols`` panels of ``panel`` inches (width, height) each, in the
    shared style (:data:`rlkit.figure_style.STYLE`), and its axes as a 2-D array. The constrained
    layout keeps a suptitle, titles and tick labels off each other at any number of rows."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def save_figure(fig: Figure, out: Path | str) -> Path:
    """Write ``fig`` to ``out`` as a PNG at :data:`FIGURE_DPI` (whole or not at all; its folder
    made), in the shared style; returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context(STYLE):
        write_atomically(out, lambda tmp: fig.savefig(tmp, dpi=FIGURE_DPI, format="png"))
    return out


def plot_runs(
    runs: Mapping[str, Path | str | list[dict]], out: Path | str, smooth: int = 5
) -> Path:
    """Plot every standard curve that at least one run logged; one line per run.

    ``runs`` maps a label to a run directory (or to already-read metric rows; either may use
    metric names from before a rename, :mod:`rlkit.metric_names`). Noisy per-step
    curves get a trailing moving average over ``smooth`` steps; evaluation points are drawn as is.
    """
    data = {
        label: [current_names(row) for row in r] if isinstance(r, list) else read_metrics(r)
        for label, r in runs.items()
    }
    names = [n for n in STANDARD_CURVES if any(curves(rows, n)[0] for rows in data.values())]
    if not names:
        raise ValueError("none of the runs logged a standard metric")
    cols = min(4, len(names))
    fig, axes = new_figure(-(-len(names) // cols), cols, (3.6, 2.8))
    with matplotlib.rc_context(STYLE):
        for ax, name in zip(axes.flat, names):
            for i, (label, rows) in enumerate(data.items()):  # one colour per run in every panel
                steps, values = curves(rows, name)
                if not steps:
                    continue
                if name.startswith("eval/"):
                    ax.plot(steps, values, marker="o", label=label, color=f"C{i}")
                else:
                    ax.plot(steps, trailing_mean(values, smooth), label=label, color=f"C{i}")
            ax.set_title(STANDARD_CURVES[name])
            ax.set_xlabel("step")
        for ax in list(axes.flat)[len(names) :]:
            ax.axis("off")
        axes.flat[0].legend()
    return save_figure(fig, out)


def unique_labels(run_dirs: Sequence[Path | str]) -> dict[str, Path]:
    """{label: run directory}, each run labelled by the shortest end of its path that no other
    run's path ends with: every sweep's runs end in ``…/G4/seed0``, so ``seed0`` alone would
    draw several runs as one. A directory given twice, or behind a broken symlink, is a
    ValueError."""
    paths = [Path(d) for d in run_dirs]
    for path in paths:
        check_link("run directory", path)
    seen = {}
    for given, path in zip(run_dirs, paths):
        if path.resolve() in seen:
            raise ValueError(
                f"run directory {given} is given twice (also as {seen[path.resolve()]})"
            )
        seen[path.resolve()] = given
    labels = {}
    for path in paths:
        others = [p.parts for p in paths if p is not path]
        k = next(
            (
                k
                for k in range(1, len(path.parts))
                if all(o[-k:] != path.parts[-k:] for o in others)
            ),
            len(path.parts),
        )
        labels[str(Path(*path.parts[-k:]))] = path
    return labels
