"""Helpers shared by the benchmarks: machine load, thread settings and median/range summaries."""

from __future__ import annotations

import os
import statistics
import time
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


def clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process). CPU time is what a step costs the machine:
    while other processes compete for the cores it grows far less than wall time does."""
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    """Wall and CPU seconds elapsed since ``start`` (a :func:`clock` reading)."""
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]
