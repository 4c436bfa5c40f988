"""The collective seam: every quantity that must agree across training processes passes here.

A step is written against :class:`Collective`. With one process (:class:`Local`, the only
implementation today) every call is the identity, so world size 1 *is* the single-process run.
A multi-process implementation (the scale-out issue) gathers in rank order: rank r's rows follow
rank r − 1's, so a gathered tensor is the global batch in the order one process would see it.
Where it is called (``rlkit.trainer.Trainer.step``, ``rlkit.update``, ``rlkit.methods.AGPO``)
marks each place a rank's local values must become global ones.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Collective(Protocol):
    rank: int
    world: int

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along dim 0, in rank order (the same on every rank)."""

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``x``."""

    def all_gather_object(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order."""

    def my_rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a gathered tensor (inverse of :meth:`all_gather`)."""


class Local:
    """One process: rank 0 of 1; every collective returns its input."""

    rank, world = 0, 1

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather_object(self, obj: Any) -> list:
        return [obj]

    def my_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x
