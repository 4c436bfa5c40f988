"""Stale rollouts (``rollout.lag``, docs/algorithms.md §4e): each step trains on the batch drawn
``lag`` steps earlier, as asynchronous RL does when generation runs ahead of training.

The batch trained at step t was sampled by θ_{max(0, t − lag)}. Its π_old pass (log-probs,
the entropy an adaptive clip needs, PPO's values) is taken right after the draw, by the weights
that sampled it, so the ratio ρ = π_θ/π_old measures every update since sampling and a clip can
bind even with one mini-batch. Step 0 draws lag + 1 batches from θ_0; draws stop at the run's
last batch, so every batch drawn is trained on. The queue is saved with each checkpoint, with the
run's length: a loaded queue must be the one a run of that length holds at that step, and a run
resumed with more steps is warned that its queue refills as at a run's start (its last run drew
nothing beyond its old end).
"""

from __future__ import annotations

import warnings
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
    """Batches drawn ahead of training. ``draw(t)`` → (groups, stats) of the batch step ``t``
    trains on, from the current weights; ``old_pass(groups)`` → π_old's pass by those weights,
    or None; ``total``: batches in the run. With ``lag = 0`` each step draws its own batch and :meth:`next` returns it at once."""

    def __init__(
        self,
        lag: int,
        total: int,
        draw: Callable[[int], tuple[Groups, CollectStats]],
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
            groups, stats = self.draw(drawn)
            self.queue.append(DrawnBatch(step, groups, stats, self.old_pass(groups)))
            drawn += 1
        return self.queue.popleft()

    def state_dict(self) -> dict:
        """The queued batches and the run's length (nothing with ``lag = 0``: the queue is empty
        between steps)."""
        if not self.lag:
            return {}
        return {
            "rollout_total": self.total,
            "rollout_queue": [
                {
                    "step": b.step,
                    "groups": b.groups.state_dict(),
                    "stats": asdict(b.stats),
                    "old": None if b.old is None else _to(asdict(b.old), "cpu"),
                }
                for b in self.queue
            ],
        }

    def load_state_dict(self, state: dict, device: torch.device | str, step: int) -> None:
        """The queue a checkpoint of ``step`` saved, checked by :meth:`check_saved` first."""
        batches = state.get("rollout_queue", [])
        # (a checkpoint written before the length was saved: the length its queue implies)
        self.check_saved(batches, state.get("rollout_total", step + len(batches)), step)
        self.queue = deque(
            DrawnBatch(
                b["step"],
                Groups.from_state(b["groups"]).to(device),
                CollectStats(**b["stats"]),
                None if b["old"] is None else PolicyPass(**_to(b["old"], device)),
            )
            for b in batches
        )

    def check_saved(self, batches: list[dict], saved_total: int, step: int) -> None:
        """The queued ``batches`` a run of ``saved_total`` steps saved at ``step`` are the ones
        it holds there: min(lag, saved_total − step) batches, the i-th drawn at step
        max(0, step + i − lag); a ValueError names the first difference. A run resumed with
        more steps than it was saved with is warned: its queue ran out at its old end."""
        expected = min(self.lag, saved_total - step)
        if len(batches) != expected:
            raise ValueError(
                f"its rollout queue holds {len(batches)} batches drawn ahead; at step {step} of "
                f"steps={saved_total} with rollout.lag={self.lag} a run holds {expected}"
            )
        for i, batch in enumerate(batches):
            drawn = max(0, step + i - self.lag)
            if batch["step"] != drawn:
                raise ValueError(
                    f"batch {i + 1} of its queue was drawn at step {batch['step']}; at step "
                    f"{step} with rollout.lag={self.lag} it is the one drawn at step {drawn}"
                )
        if saved_total < self.total and expected < self.lag:
            warnings.warn(
                f"resume with steps={self.total}: this run was saved with steps={saved_total} "
                f"and drew no batch to train after step {saved_total}; rollout.lag={self.lag}'s "
                f"queue refills at step {step} as at a run's start, so the steps after step "
                f"{saved_total} train on fresher batches than a run started with "
                f"steps={self.total} would",
                stacklevel=2,
            )


def _to(tensors: dict, device: torch.device | str) -> dict:
    return {k: None if v is None else v.to(device) for k, v in tensors.items()}
