"""The clip rules: each prompt's clip radii (ε_low, ε_high) for the clipped loss
(docs/algorithms.md §4), each a :class:`rlkit.losses.ClipRule` that the update calls once every
row's pre-update entropy is known when the rule reads it; a method chooses the rule
(``Method.clip_rule``):
:class:`FixedClip`, the loss's ε for every prompt, or AGPO's :class:`AdaptiveClipRule`
(§3 step 4)."""

from __future__ import annotations

import torch

from rlkit.controllers import AdaptiveClip, ProbeStats
from rlkit.dist import Collective


class FixedClip:
    """The loss's ε_low / ε_high for every prompt."""

    needs_entropy = False

    def __init__(self, eps_low: float, eps_high: float, num_prompts: int):
        self.eps_low, self.eps_high, self.num_prompts = eps_low, eps_high, num_prompts

    def __call__(self, prompt_entropy=None) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.num_prompts
        return torch.full((p,), self.eps_low), torch.full((p,), self.eps_high)


class AdaptiveClipRule:
    """docs/algorithms.md §3 step 4: each prompt's ε from its probe statistics and its mean
    pre-update token entropy, used symmetrically."""

    needs_entropy = True

    def __init__(self, ctl: AdaptiveClip, stats: ProbeStats, dist: Collective):
        self.ctl, self.stats, self.dist = ctl, stats, dist

    def __call__(self, prompt_entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # H̄_ref follows the batch mean of H over every rank's prompts
        eps = self.ctl(self.stats, self.dist.all_gather(prompt_entropy))
        eps = self.dist.my_rows(eps)
        return eps, eps
