"""Helpers shared by the benchmarks: machine load, thread settings and median/range summaries."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence


def load_average() -> float:
    """The 1-minute load average (0.0 where the OS has none): timings taken while it exceeds the
    number of cores used are not comparable, so every benchmark prints it next to its numbers."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def set_threads(threads: int) -> None:
    """Pin torch's intra- and inter-op thread pools (set before any parallel work runs)."""
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # already set, or parallel work already started
        pass


def median_range(values: Sequence[float]) -> str:
    """``median [min, max]`` of ``values``, 3 significant decimals."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"
