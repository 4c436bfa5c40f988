"""Plot helpers for the notebooks: mean curves with 95% bands over seeds, and saving figures.

Importing this module sets matplotlib's defaults to rlkit's shared figure style
(:mod:`rlkit.figure_style`), so every notebook figure, inline and saved, has readable text.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from rlkit.figure_style import FIGURE_DPI, STYLE
from simulations.scale import output_dir
from simulations.stats import mean_ci

FIGURE_DIR = Path("figures")  # relative to the working directory: the notebook's own folder
plt.rcParams.update(STYLE)


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


def figure_path(name: str) -> Path:
    """figures/<name>.png next to the running notebook (Jupyter, nbval and nbclient start the
    kernel in the notebook's directory); at ``RLKIT_NB_SCALE=ci`` a temporary folder's instead
    (:func:`simulations.scale.output_dir`), so a test run never overwrites a committed figure.
    Every figure a notebook writes takes its path from here (``rlkit.plotting.plot_runs`` too)."""
    folder = output_dir(FIGURE_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.png"


def save(fig, name: str) -> None:
    """Save ``fig`` at :func:`figure_path` (``name``). Returns nothing, so a cell ending in
    ``save(...)`` shows only the figure."""
    fig.tight_layout()
    fig.savefig(figure_path(name), dpi=FIGURE_DPI)
