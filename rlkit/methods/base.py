"""What differs between methods, behind one small interface (docs/algorithms.md §1–§4).

A :class:`Method` answers, for one step: how its groups are drawn (``groups``, given the
sampler), the advantages (``advantages``, the registry's estimator), the clip rule (``clip_rule``),
the update it runs (``train``), the tokens it generated (``generated_tokens``), what happens after
the update (``after_update``), its own logged signals (``metrics``) and its state
(``state_dict``, under the checkpoint's keys). GRPO, Dr. GRPO, RLOO and EBPO differ only in
their estimator, so they are this one class, registered as ``grpo``; AGPO
(:mod:`rlkit.methods.agpo`), PPO (:mod:`rlkit.methods.ppo`) and DPO (:mod:`rlkit.methods.dpo`)
subclass it. Each method is built from the run's config by its ``from_config`` and chosen by
its registered name in ``algo.method`` (:mod:`rlkit.methods.registry`). A sampler is any
callable ``sample(problems, temperatures, stats=None, probe=False)`` returning scored
:class:`~rlkit.batch.Groups` (:class:`Sampler`): the trainer's ``rlkit.collect.Collector`` or the
bandit of simulations/experiments.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from rlkit.advantages import AdvantageEstimator, AdvantageResult, get_estimator
from rlkit.batch import Groups, PolicyPass, TrainBatch, UpdateResult
from rlkit.clip_rules import FixedClip
from rlkit.config.schema import TrainConfig, estimator_options
from rlkit.controllers import ProbeStats
from rlkit.dist import Collective
from rlkit.losses import ClipRule, KLPenalty, Loss, MiniBatchShare, get_loss
from rlkit.methods.registry import DEFAULT_METHOD, register_method
from rlkit.settings import Refuses, Replaces, When, equals, positive, reads
from rlkit.tasks.base import Problem
from rlkit.tis import TruncatedIS, resolve_tis_cap, resolve_tis_tripwire

# the update (rlkit.update.PolicyUpdate): (batch, clip rule, step, units=None) -> UpdateResult
Update = Callable[..., UpdateResult]


def sampler_tis_cap(cfg: TrainConfig) -> float | None:
    """C of truncated IS for ``cfg``'s loss and sampler (`rlkit.tis.resolve_tis_cap`), for a
    method whose loss takes per-token weights."""
    return resolve_tis_cap(cfg.loss.tis_cap, cfg.rollout.engine, cfg.rollout.generation_copy)


# the sampler's log-probs are recorded, so truncated IS weighs the tokens (rlkit.tis)
SAMPLER_LOGP = When(
    "sampler log-probs recorded (loss.tis_cap a number, or auto with a sampler other than the "
    "training forward)",
    lambda cfg: sampler_tis_cap(cfg) is not None,
    ("loss.tis_cap", "rollout.engine", "rollout.generation_copy"),
)


def configured_estimator(cfg: TrainConfig) -> AdvantageEstimator:
    """``algo.estimator`` with its options (``rlkit.config.estimator_options``)."""
    return get_estimator(cfg.algo.estimator, **estimator_options(cfg))


class Sampler(Protocol):
    def __call__(
        self,
        problems: Sequence[Problem],
        temperatures: torch.Tensor,
        stats: ProbeStats | None = None,
        probe: bool = False,
    ) -> Groups: ...

    # for probe ``reuse`` only: the probe groups trained on, and joining groups
    def trained_probe(self, groups: Groups) -> Groups: ...

    def cat(self, parts: Sequence[Groups]) -> Groups: ...

    # for offline DPO only: this rank's share of the next batch of prompts in the run's order
    def next_problems(self) -> list[Problem]: ...


@register_method(DEFAULT_METHOD)
class Method:
    """GRPO, Dr. GRPO, RLOO, EBPO: groups at τ_base, the estimator's advantages (with per-cluster
    priors when ``cluster_key`` is set), the loss's fixed clip, nothing after the update
    (docs/algorithms.md §1–§2, §4)."""

    # the estimator it trains on alone (algo.estimator is set to it, another is refused: PPO's
    # and DPO's, `rlkit.config.aliases`); None: any estimator
    own_estimator: str | None = None

    needs_entropy = False  # π_old's entropy is needed beyond the log (AGPO's signals)
    clip_needs_entropy = False  # the clip rule reads the pre-update entropy
    needs_step_kl = False  # after_update reads the post-update drift
    needs_values = False  # a value head, and V_old from π_old's pass (PPO)
    needs_reference = False  # the reference pass, whatever loss.kl_coef is (PPO's reward KL)
    needs_old = True  # the loss reads π_old (DPO's does not)
    min_group_size = 1  # completions a group needs beyond the estimator's (AGPO's probe: 2)
    # the config settings it reads (`rlkit.settings`): the wrappers around loss.loss_mode's
    # entry (the KL term, truncated IS, the aggregation)
    reads: dict[str, When | None] = (
        reads(
            "loss.loss_mode",
            "loss.kl_coef",
            "loss.loss_agg",
            "loss.exclude_zero_var_from_norm",
            "loss.tis_cap",
        )
        # the KL term, or its metric, runs where the reference pass does (rlkit.pass_plan)
        | reads(
            "loss.kl_estimator",
            when=positive("loss.kl_coef") | equals("optim.skip_redundant_passes", False),
        )
        | reads("loss.tis_mode", "loss.tis_tripwire", when=SAMPLER_LOGP)
    )
    replaces: tuple[Replaces, ...] = ()  # settings its mechanism takes the place of
    refuses: tuple[Refuses, ...] = ()  # combinations it cannot run

    def __init__(
        self,
        estimator: AdvantageEstimator,
        cluster_key: str | None = None,
        eps: tuple[float, float] = (0.2, 0.2),
        tau_base: float = 1.0,
    ):
        self.estimator, self.cluster_key = estimator, cluster_key
        self.eps, self.tau_base = eps, tau_base
        self.cluster_index: dict[str, int] = {}  # cluster label → id, in first-seen order

    @classmethod
    def from_config(cls, cfg: TrainConfig, dist: Collective | None = None) -> Method:
        """The method of ``cfg``; ``dist`` is the run's collective (None: one process)."""
        eps = (cfg.loss.eps_low, cfg.loss.eps_high)
        return cls(configured_estimator(cfg), cfg.algo.cluster_key, eps, cfg.rollout.temperature)

    @classmethod
    def mechanisms(cls, cfg: TrainConfig) -> set[str]:
        """The mechanisms ``cfg`` switches on, by name (``rlkit.methods.registry.method_switches``):
        the estimator's."""
        return {cfg.algo.estimator}

    @property
    def name(self) -> str:
        """The estimator's registry name (the progress bar's label)."""
        return self.estimator.name

    def base_temperatures(self, num_prompts: int) -> torch.Tensor:
        return torch.full((num_prompts,), self.tau_base)

    def groups(self, problems: list[Problem], sample: Sampler) -> Groups:
        return sample(problems, self.base_temperatures(len(problems)))

    def cluster_ids(self, problems: Sequence[Problem]) -> torch.Tensor | None:
        if self.cluster_key is None:
            return None
        labels = [str(getattr(p, self.cluster_key)) for p in problems]
        for label in labels:
            self.cluster_index.setdefault(label, len(self.cluster_index))
        return torch.tensor([self.cluster_index[label] for label in labels])

    def prompt_ids(self, problems: Sequence[Problem] | None) -> list[str] | None:
        """Each prompt's Problem id, for an estimator that keeps state per prompt (SPO's tracker),
        else None."""
        if not self.estimator.needs_prompt_ids or problems is None:
            return None
        return [str(p.id) for p in problems]

    def advantages(self, rewards: torch.Tensor, problems: Sequence[Problem]) -> AdvantageResult:
        """docs/algorithms.md §1–§2 on the whole batch's rewards [P, G]."""
        return self.estimator(rewards, self.cluster_ids(problems), self.prompt_ids(problems))

    def clip_rule(self, groups: Groups) -> ClipRule:
        return FixedClip(*self.eps, len(groups.problems))

    def token_advantages(self, batch: TrainBatch) -> TrainBatch:
        """The batch as the update trains on it, once its passes ran: each row's advantage,
        broadcast over its tokens (PPO: per-token advantages and the value targets)."""
        return batch

    def loss(self, cfg: TrainConfig, reference: bool) -> Loss:
        """The update's loss (docs/algorithms.md §4): ``loss.loss_mode``'s entry, under truncated
        importance sampling where the sampler is not the training forward (``rlkit.tis``), plus
        the KL term where the reference pass runs (``reference``), as each micro-batch's share
        of its mini-batch's loss."""
        loss = get_loss(cfg.loss.loss_mode)
        if (cap := sampler_tis_cap(cfg)) is not None:
            tripwire = resolve_tis_tripwire(cap, cfg.loss.tis_tripwire)
            loss = TruncatedIS(loss, cap, cfg.loss.tis_mode, tripwire)
        if reference:
            loss = KLPenalty(loss, cfg.loss.kl_coef, cfg.loss.kl_estimator)
        return MiniBatchShare(loss, cfg.loss.loss_agg, cfg.rollout.max_new_tokens)

    def train(self, update: Update, batch: TrainBatch, groups: Groups, step: int):
        """The step's update (docs/algorithms.md §4) under the clip rule, over the batch's rows
        (DPO: over the groups' pairs, §4d). Returns the UpdateResult."""
        return update(batch, self.clip_rule(groups), step)

    def generated_tokens(self, lengths: torch.Tensor) -> int:
        """The tokens this step generated for training (``tokens/generated``), from every rank's
        row lengths: all of them (offline DPO: none once it replays its first groups)."""
        return int(lengths.sum())

    def after_update(self, groups: Groups, drift: Callable[[], torch.Tensor]) -> dict:
        """Feedback once the policy is updated (``drift()`` runs the post-update pass)."""
        return {}

    def metrics(self, groups: Groups, old: PolicyPass) -> dict:
        """The method's own signals, logged before the common keys."""
        return {}

    def state_dict(self) -> dict:
        return {
            "estimator": self.estimator.state_dict(),
            "cluster_index": dict(self.cluster_index),
            "temperature_ctl": None,
            "clip_ctl": None,
            "previous_stats": {},
        }

    def load_state_dict(self, state: dict) -> None:
        self.estimator.load_state_dict(state["estimator"])
        self.cluster_index = dict(state["cluster_index"])
