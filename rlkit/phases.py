"""Named phases of a training step, timed for the logged ``time/*`` metrics and open to hooks.

The trainer and its stages enter a phase around each piece of work: ``generate`` (the whole
draw, scoring included) with ``score`` inside it, then ``update`` (advantages to the end of the
step) with ``old``, ``reference`` (the no-grad log-prob passes), ``train`` (the optimizer loop,
with ``check_finite`` after each optimizer step) and ``step_kl`` (AGPO's post-update pass)
inside it. A hook — a callable taking the phase name and returning a context manager — wraps
every phase, so a benchmark or profiler measures phases without replacing trainer methods
(benchmarks/gpu_qlora_8b.py, benchmarks/profile_step.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

Hook = Callable[[str], contextlib.AbstractContextManager]


class Phases:
    """Seconds spent in each named phase since the last :meth:`take`, and the hooks around them."""

    def __init__(self) -> None:
        self.hooks: list[Hook] = []
        self.seconds: dict[str, float] = {}

    def add_hook(self, hook: Hook) -> None:
        self.hooks.append(hook)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook(name))
            start = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def take(self) -> dict[str, float]:
        """The seconds per phase so far, and a fresh count for the next step."""
        seconds, self.seconds = self.seconds, {}
        return seconds
