"""The types that flow through a training step (docs/algorithms.md §1–§5), in step order.

prompts → :class:`Groups` (P prompts × G scored completions, with :class:`CollectStats` on how
they were drawn) → advantages → :class:`TrainBatch` (rollouts, advantages, ratio temperatures,
the π_old and reference passes) → :class:`UpdateResult` (the update's statistics and π_old as
the update saw it) → :class:`StepRecord`, from which ``rlkit.step_metrics`` builds the logged row.
Rows are laid out prompt-major (B = P·G) everywhere; ``select`` indexes every per-row field at
once, as CleanRL indexes its ``b_*[mb_inds]`` buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace

import torch

from rlkit.advantages import AdvantageResult
from rlkit.controllers import ProbeStats
from rlkit.rollout_batch import RolloutBatch, concat_rollouts
from rlkit.tasks.base import Problem


def per_prompt_mean(values: torch.Tensor, mask: torch.Tensor, num_prompts: int) -> torch.Tensor:
    """Mean of a per-token quantity over the real tokens of each prompt's G completions."""
    mask = mask.to(values.dtype)
    return (values * mask).view(num_prompts, -1).sum(1) / mask.view(num_prompts, -1).sum(
        1
    ).clamp_min(1)


@dataclass
class Groups:
    """P prompts × G scored completions, rows laid out prompt-major (B = P·G)."""

    problems: list[Problem]
    rollouts: RolloutBatch
    rewards: torch.Tensor  # [P, G]
    temperatures: torch.Tensor  # [P] sampling temperature of each prompt's group
    probe_stats: ProbeStats | None = None  # AGPO: the statistics τ_t and ε were computed from

    @property
    def group_size(self) -> int:
        return self.rewards.shape[1]

    @property
    def answers(self) -> list[list[str]]:
        texts, g = self.rollouts.completion_texts, self.group_size
        return [texts[p * g : (p + 1) * g] for p in range(len(self.problems))]

    def per_prompt(self, values: torch.Tensor) -> torch.Tensor:
        """[P] mean of a per-token quantity [B, Lc] over each prompt's completion tokens."""
        return per_prompt_mean(values, self.rollouts.completion_mask, len(self.problems))

    def select(self, keep: torch.Tensor) -> Groups:
        """The prompts where ``keep`` (bool [P]) is True."""
        rows = torch.nonzero(keep).flatten()
        seq = (rows[:, None] * self.group_size + torch.arange(self.group_size)).flatten()
        return Groups(
            [self.problems[i] for i in rows.tolist()],
            self.rollouts.select(seq),
            self.rewards[rows],
            self.temperatures[rows],
            None if self.probe_stats is None else self.probe_stats.select(rows),
        )

    def to(self, device: torch.device | str) -> Groups:
        """The groups with their rollouts on ``device`` (rewards and temperatures stay on the CPU)."""
        return replace(self, rollouts=self.rollouts.to(device))

    def state_dict(self) -> dict:
        """The groups as tensors, strings and numbers (a checkpoint loads with weights_only)."""
        rollouts = {f.name: getattr(self.rollouts, f.name) for f in fields(self.rollouts)}
        stats = self.probe_stats
        return {
            "problems": [asdict(p) for p in self.problems],
            "rollouts": {k: v.cpu() if torch.is_tensor(v) else v for k, v in rollouts.items()},
            "rewards": self.rewards,
            "temperatures": self.temperatures,
            "probe_stats": None if stats is None else asdict(stats),
        }

    @staticmethod
    def from_state(state: dict) -> Groups:
        """Groups from :meth:`state_dict`, on the CPU."""
        stats = state.get("probe_stats")  # absent from checkpoints written before it was saved
        return Groups(
            [Problem(**p) for p in state["problems"]],
            RolloutBatch(**state["rollouts"]),
            state["rewards"],
            state["temperatures"],
            None if stats is None else ProbeStats(**stats),
        )

    @staticmethod
    def cat(parts: Sequence[Groups], pad_token_id: int) -> Groups:
        if len(parts) == 1:
            return parts[0]
        stats = [p.probe_stats for p in parts]
        return Groups(
            [q for p in parts for q in p.problems],
            concat_rollouts([p.rollouts for p in parts], pad_token_id),
            torch.cat([p.rewards for p in parts]),
            torch.cat([p.temperatures for p in parts]),
            None if stats[0] is None else ProbeStats.cat(stats),
        )


@dataclass(frozen=True)
class PolicyPass:
    """One no-grad pass of a policy over the batch: per-token log-probs at the ratio temperature,
    (when asked for) full-vocabulary entropy at T = 1 and PPO's values V(s_t), all [B, Lc]."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def select(self, idx: torch.Tensor) -> PolicyPass:
        return PolicyPass(
            *(None if x is None else x[idx] for x in (self.logp, self.entropy, self.values))
        )


@dataclass(frozen=True)
class TrainBatch:
    """What the update trains on. ``advantages``: one per row [B] (broadcast over its tokens) or
    one per token [B, Lc] (PPO's GAE). ``old`` None: the update is on-policy, and π_old is the
    detached training forward itself; ``ref_logp`` None: no KL term; ``returns`` [B, Lc]: the
    value head's targets (PPO, docs/algorithms.md §4c), None: no value loss. ``norm_rows`` [B]
    bool: the rows whose tokens count in the loss's normaliser (``loss.exclude_zero_var_from_norm``:
    those of groups whose rewards differ, §4), None: every row."""

    rollouts: RolloutBatch
    advantages: torch.Tensor  # [B] or [B, Lc]
    ratio_temps: torch.Tensor  # [B] temperature of each row's importance ratio
    group_size: int
    old: PolicyPass | None = None
    ref_logp: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    norm_rows: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rollouts)

    @property
    def num_prompts(self) -> int:
        return len(self.rollouts) // self.group_size

    def per_prompt(self, values: torch.Tensor) -> torch.Tensor:
        """[P] mean of a per-token quantity [B, Lc] over each prompt's completion tokens."""
        return per_prompt_mean(values, self.rollouts.completion_mask, self.num_prompts)

    def select(self, idx: torch.Tensor) -> TrainBatch:
        """Rows ``idx`` of every per-row field (a mini- or micro-batch; prompts may be split)."""
        return TrainBatch(
            self.rollouts.select(idx),
            self.advantages[idx],
            self.ratio_temps[idx],
            self.group_size,
            None if self.old is None else self.old.select(idx),
            None if self.ref_logp is None else self.ref_logp[idx],
            None if self.returns is None else self.returns[idx],
            None if self.norm_rows is None else self.norm_rows[idx],
        )


@dataclass(frozen=True)
class UpdateResult:
    """The update's metrics (loss, clip ratios, grad norm, KL, optimizer steps; today's key
    order) and π_old as the update saw it (filled by the training forward when on-policy)."""

    stats: dict[str, float]
    old: PolicyPass


@dataclass
class CollectStats:
    """How a step's groups were drawn: generation rounds (DAPO refills), groups dropped by the
    dynamic-sampling filter, the tokens generated for AGPO's probe (not trained on), the
    rewards that raised or timed out in any scoring of the step (probe and dropped groups too),
    and the tokens generated for training that dynamic sampling then discarded (its dropped
    groups, the last round's overflow and the cut to a multiple of the world size: generated, so
    counted in ``tokens/generated``)."""

    gen_batches: int = 0
    dropped: int = 0
    probe_tokens: int = 0
    reward_failures: int = 0
    discarded_tokens: int = 0


@dataclass(frozen=True)
class BatchRows:
    """What the step's metrics read of the whole batch's rows (every rank's, in global order)."""

    lengths: torch.Tensor  # [B] completion lengths
    truncated: torch.Tensor  # [B] bool: the completion hit max_new_tokens
    entropy: torch.Tensor | None  # mean token entropy of π_old (None: not logged)


@dataclass
class StepRecord:
    """Everything one step produced, for ``rlkit.step_metrics.step_metrics``; every field is
    the whole batch's (with several processes, every rank's)."""

    rows: BatchRows
    rewards: torch.Tensor  # [P, G] of the whole batch
    advantages: AdvantageResult
    row_advantages: torch.Tensor  # [B] as trained on
    update: UpdateResult
    drawn: CollectStats
    method_metrics: dict  # the method's own signals (AGPO's), logged before the common keys
    estimator_metrics: dict  # the estimator's own (EBPO's), logged last
    learning_rate: float
    counters: dict[str, int]
    seconds: dict[str, float]
