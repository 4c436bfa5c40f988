"""Plot helpers for the notebooks: mean curves with 95% bands over seeds, and saving figures."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from simulations.stats import mean_ci

FIGURE_DIR = Path("figures")  # relative to the working directory: the notebook's own folder
FIGURE_DPI = 80


def band(ax, x, samples, label: str | None = None, **line_kwargs):
    """Plot the mean over seeds (axis 0 of ``samples`` [S, T]) and its 95% t-interval."""
    ci = mean_ci(samples, axis=0)
    (line,) = ax.plot(x, ci.mean, label=label, **line_kwargs)
    ax.fill_between(x, ci.low, ci.high, color=line.get_color(), alpha=0.2, linewidth=0)
    return line


def figure(ncols: int = 1, nrows: int = 1, width: float = 4.0, height: float = 3.0):
    """A small figure (inline images stay small in the committed notebooks)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), dpi=FIGURE_DPI)
    return fig, np.atleast_1d(axes)


def save(fig, name: str) -> Path:
    """Save ``fig`` as figures/<name>.png next to the running notebook and return the path
    (Jupyter, nbval and nbclient start the kernel in the notebook's directory).

    At ``RLKIT_NB_SCALE=ci`` the figure goes to a temporary folder instead, so a test run never
    overwrites the committed full-scale figures.
    """
    folder = FIGURE_DIR
    if os.environ.get("RLKIT_NB_SCALE") == "ci":
        folder = Path(tempfile.gettempdir()) / "rlkit-ci-figures"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=FIGURE_DPI)
    return path
