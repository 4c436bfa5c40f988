"""Prompt order for training: shuffled, topic-clustered, or a difficulty curriculum (docs/algorithms.md §2).

A :class:`PromptSampler` walks an epoch order with a cursor, so its whole state is
``(epoch, position)`` and a resumed run draws exactly the prompts the uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlkit.tasks.base import Problem

ORDERS = ("shuffle", "topic", "difficulty")


class PromptSampler:
    """Batches of problems in one of three orders.

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
        if order == "difficulty":
            if pass_rates is None or len(pass_rates) != len(problems):
                raise ValueError("order 'difficulty' needs one pass rate per problem")
            self.curriculum = torch.argsort(
                -torch.as_tensor(pass_rates, dtype=torch.float64), stable=True
            )
        self.problems, self.order, self.seed = list(problems), order, seed
        self.epoch, self.position = 0, 0
        self._epoch_order = self.epoch_order(0)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        if self.order == "difficulty":
            return self.curriculum
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        perm = torch.randperm(len(self.problems), generator=gen)
        if self.order == "shuffle":
            return perm
        topics = sorted({p.topic for p in self.problems})
        topic_order = [topics[i] for i in torch.randperm(len(topics), generator=gen).tolist()]
        rank = {t: r for r, t in enumerate(topic_order)}
        blocks = [rank[self.problems[i].topic] for i in perm.tolist()]
        return perm[torch.argsort(torch.tensor(blocks), stable=True)]

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
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._epoch_order = self.epoch_order(self.epoch)
