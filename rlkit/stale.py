"""Stale rollouts (``rollout.lag``, docs/algorithms.md §4e): each step trains on the batch drawn
``lag`` steps earlier, as asynchronous RL does when generation runs ahead of training.

The batch trained at step t was sampled by θ_{max(0, t − lag)}. Its π_old pass (log-probs,
the entropy an adaptive clip needs, PPO's values) is taken right after the draw, by the weights
that sampled it, so the ratio ρ = π_θ/π_old measures every update since sampling and a clip can
bind even with one mini-batch. Step 0 draws lag + 1 batches from θ_0; draws stop at the run's
last batch, so every batch drawn is trained on. The queue is saved with each checkpoint.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from rlkit.batch import CollectStats, Groups, PolicyPass


@dataclass(frozen=True)
class DrawnBatch:
    """One batch as it was drawn: at step ``step`` (its weights sampled it), its groups, how they
    were drawn, and π_old's pass at sampling time (None: the update computes it, or needs none)."""

    step: int
    groups: Groups
    stats: CollectStats
    old: PolicyPass | None


class RolloutQueue:
    """Batches drawn ahead of training. ``draw()`` → (groups, stats) from the current weights;
    ``old_pass(groups)`` → π_old's pass by those weights, or None; ``total``: batches in the run.
    With ``lag = 0`` each step draws its own batch and :meth:`next` returns it at once."""

    def __init__(
        self,
        lag: int,
        total: int,
        draw: Callable[[], tuple[Groups, CollectStats]],
        old_pass: Callable[[Groups], PolicyPass | None],
    ):
        self.lag, self.total = lag, total
        self.draw, self.old_pass = draw, old_pass
        self.queue: deque[DrawnBatch] = deque()

    def next(self, step: int) -> DrawnBatch:
        """The batch to train at ``step``: the oldest queued, after drawing with the current
        weights until ``lag`` batches wait behind it (fewer near the run's end)."""
        drawn = step + len(self.queue)  # each step trains exactly one batch
        while len(self.queue) <= self.lag and drawn < self.total:
            groups, stats = self.draw()
            self.queue.append(DrawnBatch(step, groups, stats, self.old_pass(groups)))
            drawn += 1
        return self.queue.popleft()

    def state_dict(self) -> dict:
        """The queued batches (nothing with ``lag = 0``: the queue is empty between steps)."""
        if not self.lag:
            return {}
        return {
            "rollout_queue": [
                {
                    "step": b.step,
                    "groups": b.groups.state_dict(),
                    "stats": asdict(b.stats),
                    "old": None if b.old is None else _to(asdict(b.old), "cpu"),
                }
                for b in self.queue
            ]
        }

    def load_state_dict(self, state: dict, device: torch.device | str) -> None:
        self.queue = deque(
            DrawnBatch(
                b["step"],
                Groups.from_state(b["groups"]).to(device),
                CollectStats(**b["stats"]),
                None if b["old"] is None else PolicyPass(**_to(b["old"], device)),
            )
            for b in state.get("rollout_queue", [])
        )


def _to(tensors: dict, device: torch.device | str) -> dict:
    return {k: None if v is None else v.to(device) for k, v in tensors.items()}
