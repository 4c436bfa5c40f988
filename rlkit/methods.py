"""What differs between methods, behind one small interface (docs/algorithms.md §1–§4).

A :class:`Method` answers, for one step: how its groups are drawn (``groups``, given the
sampler), the advantages (``advantages``, the registry's estimator), the clip rule (``clip_rule``),
the update it runs (``train``), the tokens it generated (``generated_tokens``), what happens after
the update (``after_update``), its own logged signals (``metrics``) and its state
(``state_dict``, under the checkpoint's keys). GRPO, Dr. GRPO, RLOO and EBPO differ only in
their estimator, so they are one class; :class:`AGPO` adds the controllers, its body written as
the steps of docs/algorithms.md §3; :class:`PPO` adds a value head and per-token advantages
(``token_advantages``, §4c); :class:`DPO` trains on preference pairs of each group, fresh or
collected once (§4d). :func:`build_method` is the only reader of ``algo.*``, ``agpo.*``,
``ppo.*`` and ``dpo.*``. A sampler is any callable ``sample(problems, temperatures, stats=None, probe=False)``
returning scored :class:`~rlkit.batch.Groups` (:class:`Sampler`): the trainer's
``rlkit.collect.Collector`` or the bandit of simulations/experiments.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Protocol

import torch

from rlkit.advantages import AdvantageEstimator, AdvantageResult, get_estimator
from rlkit.batch import Groups, PolicyPass, TrainBatch, UpdateResult
from rlkit.clip_rules import AdaptiveClipRule, FixedClip
from rlkit.config import DPOConfig, PPOConfig, TrainConfig, run_tis_cap, run_tis_tripwire
from rlkit.controllers import AdaptiveClip, AdaptiveTemperature, ProbeStats
from rlkit.dist import Collective, Local
from rlkit.dpo import build_pairs
from rlkit.losses import (
    ClipRule,
    KLPenalty,
    Loss,
    MiniBatchShare,
    WithTerm,
    get_loss,
    kl_divergence,
)
from rlkit.ppo import (
    AdaptiveKLController,
    FixedKLController,
    ValueLoss,
    gae,
    reward_kl_metrics,
    token_rewards,
    whiten,
)
from rlkit.tasks.base import Problem
from rlkit.tis import TruncatedIS

# the update (rlkit.update.PolicyUpdate): (batch, clip rule, step, units=None) -> UpdateResult
Update = Callable[..., UpdateResult]

STAT_FIELDS = ("dispersion", "skewness", "vote_entropy")


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


def summary(prefix: str, values: torch.Tensor) -> dict[str, torch.Tensor]:
    values = values.float()
    return {
        f"{prefix}/mean": values.mean(),
        f"{prefix}/min": values.min(),
        f"{prefix}/max": values.max(),
    }


class Method:
    """GRPO, Dr. GRPO, RLOO, EBPO: groups at τ_base, the estimator's advantages (with per-cluster
    priors when ``cluster_key`` is set), the loss's fixed clip, nothing after the update."""

    needs_entropy = False  # π_old's entropy is needed beyond the log (AGPO's signals)
    clip_needs_entropy = False  # the clip rule reads the pre-update entropy
    needs_step_kl = False  # after_update reads the post-update drift
    needs_values = False  # a value head, and V_old from π_old's pass (PPO)
    needs_reference = False  # the reference pass, whatever loss.kl_coef is (PPO's reward KL)
    needs_old = True  # the loss reads π_old (DPO's does not)

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
        if (cap := run_tis_cap(cfg)) is not None:
            loss = TruncatedIS(loss, cap, cfg.loss.tis_mode, run_tis_tripwire(cfg))
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


def gather_stats(stats: ProbeStats, dist: Collective) -> ProbeStats:
    return ProbeStats(*(dist.all_gather(getattr(stats, f)) for f in STAT_FIELDS))


class AGPO(Method):
    """AGPO (docs/algorithms.md §3), on top of any estimator, step by step:

    1. :meth:`probe` — probe statistics per prompt (``full`` | ``previous`` | ``reuse``);
    2. :meth:`temperatures` — τ_t from the probe (ATS), or τ_base;
    3. :meth:`groups` — the training groups at τ_t (``reuse``: the probe group where τ_t = τ_base);
    4. :meth:`clip_rule` — ε per prompt from the probe and the pre-update entropy, or the loss's;
    5. :meth:`after_update` — D̂_KL from the post-update drift; ``previous`` remembers the stats.
    """

    needs_entropy = True
    needs_step_kl = True

    def __init__(
        self,
        estimator: AdvantageEstimator,
        temperature: AdaptiveTemperature,
        clip: AdaptiveClip,
        cluster_key: str | None = None,
        eps: tuple[float, float] = (0.2, 0.2),
        tau_base: float = 1.0,
        probe: str = "full",
        dispersion: str = "std",
        mad_median: str = "midpoint",
        adaptive_temperature: bool = True,
        adaptive_clip: bool = True,
        dist: Collective | None = None,
    ):
        super().__init__(estimator, cluster_key, eps, tau_base)
        self.temperature_ctl, self.clip_ctl = temperature, clip
        self.probe_mode, self.dispersion, self.mad_median = probe, dispersion, mad_median
        self.adaptive_temperature, self.adaptive_clip = adaptive_temperature, adaptive_clip
        self.clip_needs_entropy = adaptive_clip
        self.dist = dist or Local()
        self.previous_stats: dict[str, ProbeStats] = {}  # probe "previous": problem id → stats

    # 1. probe
    def probe(self, problems: list[Problem], sample: Sampler) -> tuple[ProbeStats, Groups | None]:
        """``full``/``reuse``: sample a probe group at τ_base. ``previous``: the statistics of the
        prompt's last training group, else the mean of the last batch's (no generation)."""
        if self.probe_mode == "previous":
            fallback = self.previous_stats.get("__batch__")
            known = [self.previous_stats.get(p.id, fallback) for p in problems]
            if fallback is None:
                return ProbeStats.zeros(len(problems)), None
            return ProbeStats.cat(known), None
        probe = sample(problems, self.base_temperatures(len(problems)), probe=True)
        return self.probe_stats(probe), probe

    def probe_stats(self, groups: Groups) -> ProbeStats:
        """σ̂, κ̃₃ and E_probe of each group (docs/algorithms.md §3 step 1)."""
        return ProbeStats.from_rewards(
            groups.rewards, groups.answers, self.dispersion, self.mad_median
        )

    # 2. temperature
    def temperatures(self, stats: ProbeStats) -> torch.Tensor:
        """τ_t per prompt; Ū runs over every rank's prompts in the global order."""
        if not self.adaptive_temperature:
            return self.base_temperatures(len(stats.dispersion))
        return self.dist.my_rows(self.temperature_ctl(gather_stats(stats, self.dist)))

    # 3. train group (steps 1–3)
    def groups(self, problems: list[Problem], sample: Sampler) -> Groups:
        stats, probe = self.probe(problems, sample)
        tau = self.temperatures(stats)
        if probe is None or self.probe_mode != "reuse":
            return sample(problems, tau, stats)
        base = self.base_temperatures(len(problems))
        reuse = (tau - base).abs() <= 1e-6  # the probe was drawn at τ_t already: train on it
        probe.probe_stats = stats
        parts = [sample.trained_probe(probe.select(reuse))] if reuse.any() else []
        if not reuse.all():
            fresh = [p for p, r in zip(problems, reuse.tolist()) if not r]
            parts.append(sample(fresh, tau[~reuse], stats.select(~reuse)))
        return sample.cat(parts)

    # 4. clip radius
    def clip_rule(self, groups: Groups) -> ClipRule:
        if not self.adaptive_clip:
            return super().clip_rule(groups)
        return AdaptiveClipRule(
            self.clip_ctl, gather_stats(groups.probe_stats, self.dist), self.dist
        )

    # 5. update feedback
    def after_update(self, groups: Groups, drift: Callable[[], torch.Tensor]) -> dict:
        kl = self.clip_ctl.update_kl(self.dist.all_gather(drift().cpu()))
        self.remember(groups)
        return {"agpo/kl_drift": kl}

    def remember(self, groups: Groups) -> None:
        """For probe ``previous``: each prompt's training-group statistics, and the batch mean
        (every rank's prompts: a prompt may go to another rank next time)."""
        if self.probe_mode != "previous":
            return
        stats = gather_stats(self.probe_stats(groups), self.dist)
        problems = [p for part in self.dist.all_gather_object(groups.problems) for p in part]
        for i, problem in enumerate(problems):
            self.previous_stats[problem.id] = stats.select([i])
        self.previous_stats["__batch__"] = ProbeStats(
            *(getattr(stats, f).mean().reshape(1) for f in STAT_FIELDS)
        )

    def metrics(self, groups: Groups, old: PolicyPass) -> dict:
        """The controllers' signals over every rank's prompts."""
        gather = self.dist.all_gather
        out = summary("agpo/temperature", gather(groups.temperatures))
        if self.adaptive_temperature:  # the controller ran in groups this step
            out |= {
                "agpo/U": self.temperature_ctl.last_u.mean(),
                "agpo/U_bar": self.temperature_ctl.u_bar,
            }
        out["agpo/H"] = gather(groups.per_prompt(old.entropy)).mean()
        if self.adaptive_clip:
            out["agpo/H_ref"] = self.clip_ctl.entropy_ref.value
            out |= summary("agpo/epsilon", self.clip_ctl.last_eps)
        return out

    def state_dict(self) -> dict:
        return super().state_dict() | {
            "temperature_ctl": self.temperature_ctl.state_dict(),
            "clip_ctl": self.clip_ctl.state_dict(),
            "previous_stats": {k: asdict(v) for k, v in self.previous_stats.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.temperature_ctl.load_state_dict(state["temperature_ctl"])
        self.clip_ctl.load_state_dict(state["clip_ctl"])
        self.previous_stats = {k: ProbeStats(**v) for k, v in state["previous_stats"].items()}


class PPO(Method):
    """PPO with a value head on the shared backbone (docs/algorithms.md §4c): the verifiable
    reward on the last token minus β·KL(π_old ‖ π_ref) on every token (k1, as TRL and verl),
    GAE(γ, λ) over the value head's V_old, whitened over every rank's real tokens; β fixed or
    Ziegler et al.'s adaptive controller, updated each step from the observed KL."""

    needs_values = True

    def __init__(
        self,
        estimator: AdvantageEstimator,
        ppo: PPOConfig,
        eps: tuple[float, float] = (0.2, 0.2),
        tau_base: float = 1.0,
        dist: Collective | None = None,
    ):
        super().__init__(estimator, None, eps, tau_base)
        self.ppo, self.dist = ppo, dist or Local()
        self.needs_reference = ppo.kl_coef > 0
        self.kl_ctl = (
            AdaptiveKLController(ppo.kl_coef, ppo.kl_target, ppo.kl_horizon)
            if ppo.adaptive_kl
            else FixedKLController(ppo.kl_coef)
        )
        self.last_metrics: dict = {}

    @property
    def name(self) -> str:
        return "ppo-adaptive-kl" if self.ppo.adaptive_kl else "ppo"

    def global_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean of ``x`` over every rank's real tokens (float64)."""
        m = mask.to(torch.float64)
        total = self.dist.all_reduce_sum((x.to(torch.float64) * m).sum())
        return total / self.dist.all_reduce_sum(m.sum()).clamp_min(1.0)

    def token_advantages(self, batch: TrainBatch) -> TrainBatch:
        """§4c eqs. 4c.1–4c.3 on this rank's rows; ``batch.advantages`` holds each row's reward.
        The KL controller then moves β from the batch's KL (eq. 4c.5), for the next step."""
        old, mask, ppo = batch.old, batch.rollouts.completion_mask, self.ppo
        kl = None if batch.ref_logp is None else kl_divergence(old.logp, batch.ref_logp, "k1")
        beta = self.kl_ctl.value
        rewards = token_rewards(batch.advantages, mask, kl, beta)
        advantages, returns = gae(rewards, old.values, mask, ppo.gamma, ppo.lam)
        if ppo.whiten_advantages:
            advantages = whiten(advantages, mask, self.dist)
        rows = self.dist.all_reduce_sum(torch.tensor(float(len(batch)), dtype=torch.float64))
        metrics = {
            "critic/score/mean": self.dist.all_reduce_sum(batch.advantages.double().sum()) / rows,
            "critic/rewards/mean": self.dist.all_reduce_sum(rewards.sum()) / rows,
            "critic/advantages/mean": self.global_mean(advantages, mask),
            "critic/returns/mean": self.global_mean(returns, mask),
            "critic/values/mean": self.global_mean(old.values, mask),
            "actor/reward_kl_penalty_coeff": beta,
        }
        if kl is not None:  # the controller reads TRL's KL: each row's summed KL, mean over rows
            metrics |= reward_kl_metrics(kl, mask, self.dist)
            self.kl_ctl.update(float(metrics["objective/kl"]), int(rows))
        self.last_metrics = metrics
        return replace(
            batch, advantages=advantages.to(old.logp.dtype), returns=returns.to(old.logp.dtype)
        )

    def loss(self, cfg: TrainConfig, reference: bool) -> Loss:
        """The policy loss plus the value head's clipped value loss (§4c, eq. 4c.4)."""
        value = ValueLoss(self.ppo.vf_coef, self.ppo.cliprange_value)
        return WithTerm(super().loss(cfg, reference), value)

    def metrics(self, groups: Groups, old: PolicyPass) -> dict:
        return self.last_metrics

    def state_dict(self) -> dict:
        return super().state_dict() | {"kl_ctl": self.kl_ctl.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.kl_ctl.load_state_dict(state["kl_ctl"])


class DPO(Method):
    """DPO on the policy's own rollouts (docs/algorithms.md §4d): each prompt's group gives
    disjoint (better, worse) pairs (``rlkit.dpo.build_pairs``), trained on with the preference
    loss against the reference pass (the disabled adapter, or the frozen starting weights under
    ``model.mode=full``). ``online``: the pairs of each step's fresh groups. ``offline``: at the
    first step, ``offline_batches`` batches of groups drawn from the starting policy (the step's
    own prompts and the next ones in the run's order), kept on the CPU (and checkpointed); step
    k trains on batch (k − 1) mod ``offline_batches``, and later steps generate nothing (their
    drawn prompts go unused)."""

    needs_reference = True
    needs_old = False  # the loss's ratio is to π_ref; π_old's pass runs only for the entropy

    def __init__(
        self,
        estimator: AdvantageEstimator,
        dpo: DPOConfig,
        offline_batches: int = 1,
        tau_base: float = 1.0,
        dist: Collective | None = None,
        device: torch.device | str = "cpu",
    ):
        super().__init__(estimator, None, tau_base=tau_base)
        if dist is not None and dist.world > 1:
            raise ValueError(
                f"algo.estimator=dpo with {dist.world} processes: DPO trains on one process "
                "only (each rank's pairs would differ in number, and the ranks' gradient "
                "reductions with them); run one process"
            )
        self.dpo, self.offline_batches = dpo, offline_batches
        self.device = device  # the rollouts' device
        self.stored: list[Groups] = []  # offline: the batches collected at the first step
        self.position = 0  # offline: the steps drawn so far
        self.fresh_tokens = 0  # offline: the tokens this step generated

    @property
    def name(self) -> str:
        return f"dpo-{self.dpo.mode}"

    def groups(self, problems: list[Problem], sample: Sampler) -> Groups:
        if self.dpo.mode == "online":
            return super().groups(problems, sample)
        self.fresh_tokens = 0
        if not self.stored:  # the first step: the whole offline set, from the starting policy
            batches = [problems]
            batches += [sample.next_problems() for _ in range(self.offline_batches - 1)]
            self.stored = [super(DPO, self).groups(b, sample).to("cpu") for b in batches]
            self.fresh_tokens = sum(int(g.rollouts.lengths.sum()) for g in self.stored)
        groups = self.stored[self.position % len(self.stored)]
        self.position += 1
        return groups.to(self.device)

    def loss(self, cfg: TrainConfig, reference: bool) -> Loss:
        """The pairwise loss of §4d (eq. 4d.1); no KL term (π_ref is inside it)."""
        return get_loss("dpo")

    def train(self, update: Update, batch: TrainBatch, groups: Groups, step: int):
        self.pairs = build_pairs(groups.rewards)
        return update(batch, self.clip_rule(groups), step, self.pairs.units)

    def generated_tokens(self, lengths: torch.Tensor) -> int:
        """Online: the step's rows. Offline: every collected batch's at the first step, then 0."""
        if self.dpo.mode == "online":
            return super().generated_tokens(lengths)
        return self.fresh_tokens

    def metrics(self, groups: Groups, old: PolicyPass) -> dict:
        replayed = self.dpo.mode == "offline" and self.position > 1
        return {
            "dpo/pairs": len(self.pairs),
            "dpo/prompts_without_pair": self.pairs.prompts_without_pair,
            "dpo/replayed": float(replayed),
            "beta": self.dpo.beta,
        }

    def state_dict(self) -> dict:
        return super().state_dict() | {
            "dpo_groups": [g.state_dict() for g in self.stored],
            "dpo_position": self.position,
        }

    def load_state_dict(self, state: dict) -> None:
        """The offline set and the draws so far; offline, a checkpoint (written after a step)
        without the set collected at the first step is a ValueError: replaying would collect it
        again from the current policy."""
        super().load_state_dict(state)
        self.stored = [Groups.from_state(g) for g in state["dpo_groups"]]
        self.position = state["dpo_position"]
        if self.dpo.mode == "offline" and not (self.stored and self.position >= state["step"]):
            raise ValueError(
                "dpo.mode=offline collects its set at the first step and keeps it, but this "
                f"checkpoint of step {state['step']} holds {len(self.stored)} collected batches "
                f"after {self.position} draws"
            )


def build_method(cfg: TrainConfig, dist: Collective | None = None) -> Method:
    """The configured method; the only reader of ``algo.*``, ``agpo.*``, ``ppo.*`` and
    ``dpo.*``."""
    options = dict(cfg.algo.options)
    if cfg.algo.estimator == "agpo":  # one setting for the probe and the advantage
        options |= {"dispersion": cfg.agpo.dispersion, "mad_median": cfg.agpo.mad_median}
    common = {
        "estimator": get_estimator(cfg.algo.estimator, **options),
        "cluster_key": cfg.algo.cluster_key,
        "eps": (cfg.loss.eps_low, cfg.loss.eps_high),
        "tau_base": cfg.rollout.temperature,
    }
    agpo = cfg.agpo
    if cfg.algo.estimator == "ppo":
        del common["cluster_key"]
        return PPO(**common, ppo=cfg.ppo, dist=dist)
    if cfg.algo.estimator == "dpo":
        offline_batches = cfg.dpo.offline_batches or cfg.steps
        return DPO(
            common["estimator"],
            cfg.dpo,
            offline_batches,
            cfg.rollout.temperature,
            dist,
            cfg.model.torch_device,
        )
    if not agpo.enabled:
        return Method(**common)
    return AGPO(
        **common,
        temperature=AdaptiveTemperature(
            tau_base=cfg.rollout.temperature, ema_update=agpo.ema_update, **agpo.temperature
        ),
        clip=AdaptiveClip(ema_update=agpo.ema_update, **agpo.clip),
        probe=agpo.probe,
        dispersion=agpo.dispersion,
        mad_median=agpo.mad_median,
        adaptive_temperature=agpo.adaptive_temperature,
        adaptive_clip=agpo.adaptive_clip,
        dist=dist,
    )


def method_switches(cfg: TrainConfig) -> dict[str, bool]:
    """Which of the methods' mechanisms ``cfg`` switches on, by name, for code that describes
    runs without building them (`rlkit.reanalysis`' one manipulation rule per mechanism): EBPO's
    shrinkage, AGPO's adaptive clip and adaptive temperature, Dr. GRPO's normalisation. Read here,
    beside :func:`build_method`, so the methods' config has one reader."""
    agpo = cfg.algo.estimator == "agpo" and cfg.agpo.enabled
    return {
        "ebpo": cfg.algo.estimator == "ebpo",
        "agpo_adaptive_clip": agpo and cfg.agpo.adaptive_clip,
        "agpo_adaptive_temperature": agpo and cfg.agpo.adaptive_temperature,
        "dr_grpo": cfg.algo.estimator == "dr_grpo",
    }
