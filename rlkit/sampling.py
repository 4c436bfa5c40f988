"""Prompt order for training: shuffled, topic-clustered, or a difficulty curriculum (docs/algorithms.md §2).

A :class:`PromptSampler` walks an epoch order with a cursor, so its whole state is
``(epoch, position)`` and a resumed run draws exactly the prompts the uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlkit.tasks.base import Problem

ORDERS = ("shuffle", "topic", "difficulty")


def epoch_order(
    order: str,
    topics: Sequence,
    pass_rates: torch.Tensor | None,
    generator: torch.Generator,
) -> torch.Tensor:
    """One epoch's permutation of the problems whose topics are ``topics`` (one per problem).

    ``shuffle``: a random permutation; ``topic``: topic blocks in random order, each block
    shuffled; ``difficulty``: easy → hard by ``pass_rates`` (stable: ties keep the problems'
    order; ``generator`` unused). The trainer's :class:`PromptSampler` and the bandit streams of
    simulations/experiments.py both order their prompts here.
    """
    if order == "difficulty":
        return torch.argsort(-torch.as_tensor(pass_rates, dtype=torch.float64), stable=True)
    perm = torch.randperm(len(topics), generator=generator)
    if order == "shuffle":
        return perm
    names = sorted(set(topics))
    topic_order = [names[i] for i in torch.randperm(len(names), generator=generator).tolist()]
    rank = {t: r for r, t in enumerate(topic_order)}
    blocks = [rank[topics[i]] for i in perm.tolist()]
    return perm[torch.argsort(torch.tensor(blocks), stable=True)]


class PromptSampler:
    """Batches of problems in one of three orders (:func:`epoch_order`).

    - ``shuffle``: a fresh random permutation every epoch;
    - ``topic``: every epoch, problems grouped by topic (topic blocks in random order, each block
      shuffled), so consecutive batches come from one cluster;
    - ``difficulty``: a curriculum ranked easy → hard by ``pass_rates`` (the starting policy's
      pass rate over k samples at T = 1), one pass without shuffling; later passes repeat it.
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        order: str = "shuffle",
        seed: int = 0,
        pass_rates: torch.Tensor | None = None,
    ):
        if order not in ORDERS:
            raise ValueError(f"unknown prompt order {order!r}; known: {list(ORDERS)}")
        if not problems:
            raise ValueError("PromptSampler needs at least one problem")
        if order == "difficulty" and (pass_rates is None or len(pass_rates) != len(problems)):
            raise ValueError("order 'difficulty' needs one pass rate per problem")
        self.problems, self.order, self.seed = list(problems), order, seed
        self.topics = [p.topic for p in self.problems]
        self.pass_rates = pass_rates
        self.epoch, self.position = 0, 0
        self._epoch_order = self.epoch_order(0)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return epoch_order(self.order, self.topics, self.pass_rates, gen)

    def next_batch(self, size: int) -> list[Problem]:
        batch = []
        while len(batch) < size:
            if self.position == len(self._epoch_order):
                self.epoch, self.position = self.epoch + 1, 0
                self._epoch_order = self.epoch_order(self.epoch)
            take = self._epoch_order[self.position : self.position + size - len(batch)]
            batch += [self.problems[i] for i in take.tolist()]
            self.position += len(take)
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        """A saved place in the prompt stream: epoch ≥ 0 and 0 ≤ position ≤ the number of
        problems (else a ValueError: the checkpoint is not of this training split)."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self.problems):
            raise ValueError(
                f"the prompt sampler's saved place (epoch {epoch}, position {position}) is not "
                f"in an epoch of this training split ({len(self.problems)} problems)"
            )
        self.epoch, self.position = epoch, position
        self._epoch_order = self.epoch_order(self.epoch)
