"""The unit every task yields: one prompt with a verifiable reference answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A prompt with its reference answer.

    `topic` and `difficulty` are the cluster labels that clustered sampling and difficulty
    curricula use (docs/algorithms.md §2, "Clustered sampling"); datasets without them leave the defaults.
    """

    id: str
    prompt: str
    answer: str
    topic: str = ""
    difficulty: int = 0
