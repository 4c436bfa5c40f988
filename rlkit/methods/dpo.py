"""DPO on the policy's own rollouts, online or offline (docs/algorithms.md §4d); chosen by
``algo.method=dpo`` (its own estimator, ``algo.estimator=dpo``)."""

from __future__ import annotations

import torch

from rlkit.advantages import AdvantageEstimator
from rlkit.batch import Groups, PolicyPass, TrainBatch
from rlkit.config.schema import DPOConfig, TrainConfig
from rlkit.dist import Collective
from rlkit.dpo import build_pairs
from rlkit.losses import Loss, get_loss
from rlkit.methods.base import Method, Sampler, Update, configured_estimator
from rlkit.methods.registry import register_method
from rlkit.settings import Refuses, Replaces, When, equals, reads
from rlkit.tasks.base import Problem


@register_method("dpo")
class DPO(Method):
    """DPO on the policy's own rollouts (docs/algorithms.md §4d): each prompt's group gives
    disjoint (better, worse) pairs (``rlkit.dpo.build_pairs``), trained on with the preference
    loss against the reference pass (the disabled adapter, or the frozen starting weights under
    ``model.mode=full``). ``online``: the pairs of each step's fresh groups. ``offline``: at the
    first step, ``offline_batches`` batches of groups drawn from the starting policy (the step's
    own prompts and the next ones in the run's order), kept on the CPU (and checkpointed); step
    k trains on batch (k − 1) mod ``offline_batches``, and later steps generate nothing (their
    drawn prompts go unused)."""

    own_estimator = "dpo"
    needs_reference = True
    needs_old = False  # the loss's ratio is to π_ref; π_old's pass runs only for the entropy
    reads = reads("dpo.beta", "dpo.mode") | reads(
        "dpo.offline_batches",
        when=equals("dpo.mode", "offline"),  # online: every pair is fresh
    )
    replaces = (
        Replaces(
            (
                "loss.eps_low",
                "loss.eps_high",
                "loss.dual_clip",
                "loss.kl_coef",
                "loss.loss_agg",
                "loss.exclude_zero_var_from_norm",
                "loss.loss_mode",
                "loss.tis_cap",
                "loss.tis_mode",
                "loss.tis_tripwire",
            ),
            "its preference loss on sequence log-probs replaces the clipped surrogate, its KL "
            "term, token aggregation and importance weights (β is dpo.beta)",
        ),
    )
    refuses = (
        Refuses(
            equals("parallel.strategy", "fsdp2"),
            "DPO trains on one process only (each rank's pairs would differ in number, and "
            "the ranks' gradient reductions with them)",
            "run one process",
        ),
        Refuses(
            equals("dpo.mode", "offline") & equals("rollout.dynamic_sampling", True),
            "offline DPO replays the groups it collected at the first step and generates "
            "nothing to refill with",
            "set rollout.dynamic_sampling=false or dpo.mode=online",
        ),
        Refuses(
            equals("dpo.mode", "offline")
            & When("task.shift", lambda cfg: bool(cfg.task.shift), ("task.shift",)),
            "offline DPO collects its prompts at the first step, before the shift",
            "leave task.shift out or set dpo.mode=online",
        ),
    )

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
                f"algo.method=dpo with {dist.world} processes: DPO trains on one process "
                "only (each rank's pairs would differ in number, and the ranks' gradient "
                "reductions with them); run one process"
            )
        self.dpo, self.offline_batches = dpo, offline_batches
        self.device = device  # the rollouts' device
        self.stored: list[Groups] = []  # offline: the batches collected at the first step
        self.position = 0  # offline: the steps drawn so far
        self.fresh_tokens = 0  # offline: the tokens this step generated

    @classmethod
    def from_config(cls, cfg: TrainConfig, dist: Collective | None = None) -> DPO:
        """The ``dpo`` section's pairs; offline, one batch per step unless
        ``dpo.offline_batches`` says otherwise."""
        offline_batches = cfg.dpo.offline_batches or cfg.steps
        return cls(
            configured_estimator(cfg),
            cfg.dpo,
            offline_batches,
            cfg.rollout.temperature,
            dist,
            cfg.model.torch_device,
        )

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
            "dpo/beta": self.dpo.beta,
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
