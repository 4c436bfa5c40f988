"""AGPO: adaptive sampling temperature and adaptive clip radius from a probe of each prompt
(docs/algorithms.md §3), on top of any estimator; chosen by ``algo.method=agpo``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch

from rlkit.advantages import ESTIMATORS, AdvantageEstimator, AGPOAdvantage
from rlkit.batch import Groups, PolicyPass
from rlkit.clip_rules import AdaptiveClipRule
from rlkit.config.schema import TrainConfig
from rlkit.controllers import AdaptiveClip, AdaptiveTemperature, ProbeStats
from rlkit.dist import Collective, Local
from rlkit.losses import ClipRule, get_loss
from rlkit.methods.base import Method, Sampler, configured_estimator
from rlkit.methods.registry import register_method
from rlkit.settings import Refuses, Replaces, When, equals, reads
from rlkit.tasks.base import Problem

STAT_FIELDS = ("dispersion", "skewness", "vote_entropy")
ADAPTIVE_CLIP = equals("agpo.adaptive_clip", True)
ADAPTIVE_TEMPERATURE = equals("agpo.adaptive_temperature", True)
UNCLIPPED_LOSS = When(  # KL-Cov's −ρ·A (docs/algorithms.md §4b)
    "a loss.loss_mode that reads no ratio clip",
    lambda cfg: "loss.eps_low" not in get_loss(cfg.loss.loss_mode).reads,
    ("loss.loss_mode",),
)


def summary(prefix: str, values: torch.Tensor) -> dict[str, torch.Tensor]:
    values = values.float()
    return {
        f"{prefix}/mean": values.mean(),
        f"{prefix}/min": values.min(),
        f"{prefix}/max": values.max(),
    }


def gather_stats(stats: ProbeStats, dist: Collective) -> ProbeStats:
    return ProbeStats(*(dist.all_gather(getattr(stats, f)) for f in STAT_FIELDS))


@register_method("agpo")
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
    min_group_size = 2  # the probe's statistics need two completions
    reads = (
        Method.reads
        | reads("agpo.probe", "agpo.adaptive_temperature", "agpo.adaptive_clip")
        | AGPOAdvantage.reads  # the probe's dispersion, as the advantage's (§1)
        | reads("agpo.temperature", when=ADAPTIVE_TEMPERATURE)
        | reads("agpo.clip", when=ADAPTIVE_CLIP)
        | reads("agpo.ema_update", when=ADAPTIVE_TEMPERATURE | ADAPTIVE_CLIP)  # their averages
    )
    replaces = (
        Replaces(
            ("loss.eps_low", "loss.eps_high"),
            "AGPO's clip radius replaces it (symmetric, per prompt, from agpo.clip's eps_base, "
            "default 0.2)",
            ADAPTIVE_CLIP,
            "set the radius in agpo.clip, or agpo.adaptive_clip=false to keep the loss's clip",
        ),
    )
    refuses = (
        Refuses(
            ADAPTIVE_CLIP & UNCLIPPED_LOSS,
            "the loss's surrogate has no ratio clip for AGPO's ε to set",
            "set agpo.adaptive_clip=false",
        ),
    )

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

    @classmethod
    def from_config(cls, cfg: TrainConfig, dist: Collective | None = None) -> AGPO:
        """The ``agpo`` section's controllers on ``algo.estimator``'s advantages."""
        agpo = cfg.agpo
        return cls(
            configured_estimator(cfg),
            temperature=AdaptiveTemperature(
                tau_base=cfg.rollout.temperature, ema_update=agpo.ema_update, **agpo.temperature
            ),
            clip=AdaptiveClip(ema_update=agpo.ema_update, **agpo.clip),
            cluster_key=cfg.algo.cluster_key,
            eps=(cfg.loss.eps_low, cfg.loss.eps_high),
            tau_base=cfg.rollout.temperature,
            probe=agpo.probe,
            dispersion=agpo.dispersion,
            mad_median=agpo.mad_median,
            adaptive_temperature=agpo.adaptive_temperature,
            adaptive_clip=agpo.adaptive_clip,
            dist=dist,
        )

    @classmethod
    def mechanisms(cls, cfg: TrainConfig) -> set[str]:
        """The estimator's, and the switched-on controllers where they act on AGPO's own
        advantage (§1), the combination reanalysis' committed verdicts name AGPO."""
        names = super().mechanisms(cfg)
        if issubclass(ESTIMATORS[cfg.algo.estimator], AGPOAdvantage):
            names |= {
                f"agpo_adaptive_{part}"
                for part, on in (
                    ("clip", cfg.agpo.adaptive_clip),
                    ("temperature", cfg.agpo.adaptive_temperature),
                )
                if on
            }
        return names

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
                "agpo/uncertainty_mean": self.temperature_ctl.last_u.mean(),
                "agpo/uncertainty_ema": self.temperature_ctl.u_bar,
            }
        out["agpo/entropy_mean"] = gather(groups.per_prompt(old.entropy)).mean()
        if self.adaptive_clip:
            out["agpo/entropy_ref"] = self.clip_ctl.entropy_ref.value
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
