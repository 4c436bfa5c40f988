"""PPO with a value head and per-token advantages (docs/algorithms.md §4c); chosen by
``algo.method=ppo`` (its own estimator, ``algo.estimator=ppo``)."""

from __future__ import annotations

from dataclasses import replace

import torch

from rlkit.advantages import AdvantageEstimator
from rlkit.batch import Groups, PolicyPass, TrainBatch
from rlkit.config.schema import PPOConfig, TrainConfig
from rlkit.dist import Collective, Local
from rlkit.losses import Loss, WithTerm, kl_divergence
from rlkit.methods.base import Method, configured_estimator
from rlkit.methods.registry import register_method
from rlkit.ppo import (
    AdaptiveKLController,
    FixedKLController,
    ValueLoss,
    gae,
    reward_kl_metrics,
    token_rewards,
    whiten,
)
from rlkit.settings import Refuses, equals, reads


@register_method("ppo")
class PPO(Method):
    """PPO with a value head on the shared backbone (docs/algorithms.md §4c): the verifiable
    reward on the last token minus β·KL(π_old ‖ π_ref) on every token (k1, as TRL and verl),
    GAE(γ, λ) over the value head's V_old, whitened over every rank's real tokens; β fixed or
    Ziegler et al.'s adaptive controller, updated each step from the observed KL."""

    own_estimator = "ppo"
    needs_values = True
    reads = (
        Method.reads
        | reads(
            "ppo.gamma",
            "ppo.lam",
            "ppo.vf_coef",
            "ppo.cliprange_value",
            "ppo.whiten_advantages",
            "ppo.kl_coef",
            "ppo.adaptive_kl",
        )
        | reads("ppo.kl_target", "ppo.kl_horizon", when=equals("ppo.adaptive_kl", True))
    )
    refuses = (
        Refuses(
            equals("loss.exclude_zero_var_from_norm", True),
            "PPO's advantages come from its value head, so a group whose rewards are all equal "
            "still has a policy gradient",
            "set loss.exclude_zero_var_from_norm=false",
        ),
        Refuses(
            equals("parallel.strategy", "fsdp2"),
            "PPO's value head is saved from whole weights, which FSDP2 shards",
            "use parallel.strategy=ddp",
        ),
    )

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

    @classmethod
    def from_config(cls, cfg: TrainConfig, dist: Collective | None = None) -> PPO:
        """The ``ppo`` section's value head and reward KL on ``algo.estimator``'s rewards."""
        eps = (cfg.loss.eps_low, cfg.loss.eps_high)
        return cls(configured_estimator(cfg), cfg.ppo, eps, cfg.rollout.temperature, dist)

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
            "objective/scores": self.dist.all_reduce_sum(batch.advantages.double().sum()) / rows,
            "objective/rlhf_reward": self.dist.all_reduce_sum(rewards.sum()) / rows,
            "ppo/advantages_mean": self.global_mean(advantages, mask),
            "ppo/returns_mean": self.global_mean(returns, mask),
            "ppo/values_mean": self.global_mean(old.values, mask),
            "objective/kl_coef": beta,
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
