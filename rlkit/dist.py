"""The collective seam: every quantity that must agree across training processes passes here.

A step is written against :class:`Collective`. With one process (:class:`Local`) every call is
the identity, so world size 1 *is* the single-process run. With several (:class:`TorchCollective`,
started by ``torchrun`` or ``accelerate launch``) every rank draws the same global prompt batch
and keeps a contiguous share (:meth:`Collective.shard`), so a group never spans ranks; gathers
run in rank order, so rank r's rows follow rank r − 1's and a gathered tensor is the global batch
in the order one process would see it. Where it is called (``rlkit.trainer``, ``rlkit.collect``,
``rlkit.update``, ``rlkit.methods``) marks each place a rank's local values become global ones.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

if TYPE_CHECKING:
    from rlkit.config.schema import TrainConfig

T = TypeVar("T")


class Collective(Protocol):
    rank: int
    world: int

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` (the same shape on every rank) concatenated along dim 0, in rank
        order (the same on every rank)."""

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``x``."""

    def all_gather_object(self, obj: Any) -> list:
        """Every rank's ``obj`` (picklable; CPU tensors), in rank order."""

    def my_rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a gathered tensor (inverse of :meth:`all_gather`)."""

    def shard(self, items: Sequence[T], even: bool = True) -> list[T]:
        """This rank's contiguous share of a global list; ``even``: the length must divide
        by the world size (training prompts), else the first ranks take one more."""

    def share(self, n: int, block: int = 1) -> range:
        """This rank's contiguous share of ``n`` items in whole blocks of ``block`` (the last
        may be short), the first ranks taking one block more (evaluation's generation batches)."""

    def barrier(self) -> None:
        """Wait until every rank gets here."""

    def close(self) -> None:
        """Leave the process group if this object started it (nothing with one process)."""


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

    def shard(self, items: Sequence[T], even: bool = True) -> list[T]:
        return list(items)

    def share(self, n: int, block: int = 1) -> range:
        return range(n)

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


def share_bounds(
    n: int, rank: int, world: int, even: bool = True, block: int = 1
) -> tuple[int, int]:
    """Start and end of rank ``rank``'s contiguous share of ``n`` items, in whole blocks."""
    if even and n % world:
        raise ValueError(
            f"{n} rows cannot be split evenly over {world} processes: choose sizes that "
            f"divide by the world size ({world})"
        )
    base, extra = divmod(-(-n // block), world)
    start = rank * base + min(rank, extra)
    return min(n, start * block), min(n, (start + base + (rank < extra)) * block)


class TorchCollective:
    """Several processes over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

    Tensors travel on :attr:`device` (NCCL needs CUDA tensors) and come back where they were."""

    def __init__(self, backend: str, device: torch.device):
        import torch.distributed as dist

        self.dist, self.device = dist, device
        self.owns_group = not dist.is_initialized()  # else the caller's, left to the caller
        if self.owns_group:
            dist.init_process_group(backend, timeout=timedelta(minutes=30))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x, device=self.device) for _ in range(self.world)]
        self.dist.all_gather(parts, x.to(self.device).contiguous())
        return torch.cat(parts).to(x.device)

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        y = x.detach().to(self.device).clone()
        self.dist.all_reduce(y)
        return y.to(x.device)

    def all_gather_object(self, obj: Any) -> list:
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def my_rows(self, x: torch.Tensor) -> torch.Tensor:
        start, end = share_bounds(x.shape[0], self.rank, self.world)
        return x[start:end]

    def shard(self, items: Sequence[T], even: bool = True) -> list[T]:
        start, end = share_bounds(len(items), self.rank, self.world, even)
        return list(items[start:end])

    def share(self, n: int, block: int = 1) -> range:
        return range(*share_bounds(n, self.rank, self.world, even=False, block=block))

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        if self.owns_group and self.dist.is_initialized():
            self.dist.destroy_process_group()


def launched_world() -> int:
    """The number of processes a launcher (torchrun, ``accelerate launch``) started: its
    ``WORLD_SIZE``, 1 without one."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank_device(device: torch.device) -> torch.device:
    """This process's device: on CUDA, the GPU of its local rank (``cuda`` → ``cuda:LOCAL_RANK``)."""
    if device.type == "cuda" and device.index is None and launched_world() > 1:
        return torch.device("cuda", local_rank())
    return device


def collective(device: torch.device) -> Local | TorchCollective:
    """:class:`Local` for one process, else the launcher's process group over NCCL (CUDA) or
    gloo (CPU)."""
    if launched_world() == 1:
        return Local()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        return TorchCollective("nccl", device)
    return TorchCollective("gloo", torch.device("cpu"))


def rank_seed(seed: int, rank: int) -> int:
    """Rank ``rank``'s generation seed: rank 0 keeps ``seed`` (one process's stream); the others
    draw apart from every other run's rank 0 as well."""
    return seed if rank == 0 else (seed + 1_000_003 * rank) % 2**32


def check_world(cfg: TrainConfig, world: int) -> None:
    """Each of ``world`` processes trains an equal share of every batch and mini-batch: the
    sizes must divide by the world size (a ValueError names the key)."""
    if world == 1:
        return
    for key, value in {
        "rollout.num_prompts": cfg.rollout.num_prompts,
        "optim.mini_batch_size": cfg.optim.mini_batch_size,
    }.items():
        if value % world:
            raise ValueError(
                f"{key}={value} does not divide by the {world} processes: each trains an equal "
                f"share (choose a multiple of {world})"
            )
