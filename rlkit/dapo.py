"""DAPO pieces as plain functions (docs/algorithms.md §4; DAPO, arXiv 2503.14476)."""

from __future__ import annotations

import torch


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Dynamic-sampling filter: True for the groups of a ``[P, G]`` batch whose rewards are not
    all equal (a group of identical rewards gives GRPO no gradient and is dropped)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have rank 2 [P, G], got shape {tuple(rewards.shape)}")
    return rewards.amax(dim=1) != rewards.amin(dim=1)


def overlong_penalty(
    lengths: torch.Tensor, max_length: int, buffer: int, factor: float = 1.0
) -> torch.Tensor:
    """Soft overlong punishment added to the reward (DAPO eq. 13)::

    0                                  if L ≤ L_max − L_buffer
    factor · ((L_max − L_buffer) − L) / L_buffer    if L_max − L_buffer < L ≤ L_max
    −factor                            if L > L_max
    """
    if not 0 < buffer <= max_length:
        raise ValueError(f"buffer must be in (0, max_length={max_length}], got {buffer}")
    if factor < 0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    lengths = lengths.to(torch.float32)
    start = max_length - buffer
    inside = factor * (start - lengths) / buffer
    penalty = torch.where(lengths <= start, torch.zeros_like(lengths), inside)
    return torch.where(lengths > max_length, torch.full_like(lengths, -factor), penalty)
