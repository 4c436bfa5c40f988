"""Advantage estimators' interface, registry and shared helpers (docs/algorithms.md §1, §2).

Every estimator maps a ``[P, G]`` reward tensor (P prompts, G completions each) to ``[P, G]``
advantages plus a diagnostics dict. Estimators are pure functions of the whole batch's rewards and
of their own state, so every rank of a distributed trainer that gathers the rewards computes the
same advantages. Arithmetic is done in float64 and the result is returned in the rewards' dtype
(how to call one: :mod:`rlkit.advantages`).

This module holds the registry (:data:`ESTIMATORS`, :func:`register`, :func:`get_estimator`), the
base class :class:`AdvantageEstimator`, the input checks and the baselines and whitening the
built-in estimators share; each family of estimators is a module of its own beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rlkit.registry import Registry
from rlkit.settings import When
from rlkit.stats import group_std

ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry("advantage estimator", sort_known=True)
# Largest |reward| accepted: squares and sums over a batch stay far inside float64 (max ~1.8e308).
MAX_ABS_REWARD = 1e150


def register(name: str):
    """Class decorator adding an estimator to :data:`ESTIMATORS` under ``name``; a name
    registered twice is a ValueError naming both classes."""

    def add(cls):
        ESTIMATORS.add(name, cls)
        cls.name = name
        return cls

    return add


def get_estimator(name: str, **options) -> AdvantageEstimator:
    """Build the estimator registered as ``name`` with its ``options``; an unknown name is a
    ValueError listing the known ones."""
    return ESTIMATORS.get(name)(**options)


@dataclass
class AdvantageResult:
    advantages: torch.Tensor  # [P, G]
    diagnostics: dict[str, torch.Tensor] = field(default_factory=dict)


class AdvantageEstimator:
    """Base class: validates input, computes in float64, adds shared diagnostics.

    Subclasses implement :meth:`compute` on float64 rewards. Stateless estimators inherit the
    empty ``state_dict``/``load_state_dict``/``reset``.
    """

    name = "base"
    min_group_size = 2  # G = 1 leaves no group baseline: every advantage would be 0
    uses_clusters = False  # reads ``cluster_ids`` (EBPO's per-cluster priors)
    # options set by another config section's key, {option: "section.key"} (AGPO's advantage
    # shares the probe's dispersion, §1); ``algo.options`` may not set them otherwise
    shared_settings: dict[str, str] = {}
    reads: dict[str, When | None] = {}  # the config settings it reads (`rlkit.settings`)
    # the estimator keeps state per prompt: __call__ needs each prompt's ``prompt_ids`` (SPO)
    needs_prompt_ids = False

    def __call__(
        self,
        rewards: torch.Tensor,
        cluster_ids: torch.Tensor | None = None,
        prompt_ids: Sequence[str] | None = None,
    ) -> AdvantageResult:
        rewards = check_rewards(rewards)
        cluster_ids = check_cluster_ids(cluster_ids, rewards.shape[0])
        r = rewards.to(torch.float64)
        keyed = {}
        if self.needs_prompt_ids:
            keyed["prompt_ids"] = check_prompt_ids(prompt_ids, rewards.shape[0], self.name)
        advantages, diagnostics = self.compute(r, cluster_ids, **keyed)
        diagnostics["frac_reward_zero_std"] = zero_variance_groups(r).to(torch.float64).mean()
        out_dtype = rewards.dtype
        big = torch.finfo(out_dtype).max
        return AdvantageResult(
            advantages.clamp(-big, big).to(out_dtype),
            {k: v.to(torch.float32) for k, v in diagnostics.items()},
        )

    def compute(
        self, rewards: torch.Tensor, cluster_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def metrics(self, result: AdvantageResult) -> dict:
        """The estimator's own logged signals (after the common keys; docs/algorithms.md §5)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def reset(self) -> None:
        pass


def zero_variance_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[P] bool: the groups of ``rewards`` [P, G] whose G rewards are all equal."""
    return rewards.amax(1) == rewards.amin(1)


def check_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """A finite, floating ``[P, G]`` tensor with P, G ≥ 1 and |r| ≤ :data:`MAX_ABS_REWARD`, or a
    ValueError saying what is wrong."""
    if not isinstance(rewards, torch.Tensor):
        raise ValueError(
            f"rewards must be a torch.Tensor of shape [P, G], got {type(rewards).__name__}"
        )
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have rank 2 [P, G], got shape {tuple(rewards.shape)}")
    if rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(
            f"rewards must have P >= 1 prompts and G >= 1 completions, got {tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    largest = float(rewards.abs().max())
    if largest > MAX_ABS_REWARD:
        raise ValueError(
            f"rewards must satisfy |r| <= {MAX_ABS_REWARD:g} (got {largest:g}): their squares "
            "(variances) would overflow float64; rescale the reward"
        )
    return rewards


def check_cluster_ids(cluster_ids: torch.Tensor | None, num_prompts: int) -> torch.Tensor | None:
    """None, or a non-negative integer tensor with one id per prompt."""
    if cluster_ids is None:
        return None
    cluster_ids = torch.as_tensor(cluster_ids)
    if cluster_ids.is_floating_point() or cluster_ids.dtype == torch.bool:
        raise ValueError(f"cluster_ids must be integers, got dtype {cluster_ids.dtype}")
    if cluster_ids.shape != (num_prompts,):
        raise ValueError(
            f"cluster_ids must have shape [P] = [{num_prompts}], got {tuple(cluster_ids.shape)}"
        )
    if (cluster_ids < 0).any():
        raise ValueError("cluster_ids must be non-negative")
    return cluster_ids.to(torch.long)


def check_prompt_ids(prompt_ids: Sequence[str] | None, num_prompts: int, name: str) -> list[str]:
    """One id per prompt (row of the rewards), as strings, or a ValueError naming the estimator."""
    if prompt_ids is None:
        raise ValueError(
            f"advantage estimator {name!r} keeps state per prompt: pass prompt_ids, one per "
            "row of the rewards (rlkit.methods.Method passes each Problem's id)"
        )
    if isinstance(prompt_ids, (str, bytes)) or len(prompt_ids) != num_prompts:
        got = "a string" if isinstance(prompt_ids, (str, bytes)) else f"{len(prompt_ids)} ids"
        raise ValueError(f"prompt_ids must hold one id per prompt ({num_prompts}), got {got}")
    return [str(i) for i in prompt_ids]


def centered(rewards: torch.Tensor) -> torch.Tensor:
    """r − mean_p: the group-mean baseline shared by GRPO, Dr. GRPO and AGPO."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def loo_group_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """mean_{j'≠j} r_ij' (RLOO's baseline), [P, G]; G ≥ 2."""
    g = rewards.shape[1]
    return (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)


WHITENINGS = ("whiten", "center", "none")


def check_whitening(owner: str, mode: str) -> None:
    """ValueError naming an unknown batch ``whitening`` mode of estimator ``owner``."""
    if mode not in WHITENINGS:
        raise ValueError(
            f"unknown {owner} whitening {mode!r}; known: {', '.join(map(repr, WHITENINGS))}"
        )


def whiten(raw: torch.Tensor, mode: str = "whiten", eps: float = 1e-6) -> torch.Tensor:
    """EBPO's batch normalisation over all P·G entries (docs/algorithms.md §2): ``whiten`` →
    (x − mean) / (std + eps) with the ddof = 1 std (as verl), ``center`` → x − mean, ``none``."""
    check_whitening("EBPO", mode)
    if mode == "none":
        return raw
    out = raw - raw.mean()
    if mode == "whiten":
        out = out / (group_std(raw.reshape(-1), dim=0, ddof=1) + eps)
    return out
