"""Standard training curves of one or several runs (``rlkit plot RUN_DIR …``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rlkit.figure_style import FIGURE_DPI, STYLE  # noqa: E402
from rlkit.metrics import read_metrics  # noqa: E402
from rlkit.paths import check_link  # noqa: E402

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


@plt.rc_context(STYLE)  # the shared figure style: text readable at the saved size
def plot_runs(
    runs: Mapping[str, Path | str | list[dict]], out: Path | str, smooth: int = 5
) -> Path:
    """Plot every standard curve that at least one run logged; one line per run.

    ``runs`` maps a label to a run directory (or to already-read metric rows). Noisy per-step
    curves get a trailing moving average over ``smooth`` steps; evaluation points are drawn as is.
    """
    data = {label: read_metrics(r) if not isinstance(r, list) else r for label, r in runs.items()}
    names = [n for n in STANDARD_CURVES if any(curves(rows, n)[0] for rows in data.values())]
    if not names:
        raise ValueError("none of the runs logged a standard metric")
    cols = min(4, len(names))
    nrows = -(-len(names) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 2.8 * nrows), squeeze=False)
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
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=FIGURE_DPI)
    plt.close(fig)
    return out


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
