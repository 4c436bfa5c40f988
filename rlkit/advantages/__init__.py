"""Advantage estimators as registered plug-ins (docs/algorithms.md §1–§2c; adding one:
docs/contributing.md).

Every module of this package is imported with it, so a new file here that decorates its
:class:`~rlkit.advantages.base.AdvantageEstimator` subclass with :func:`register` is a new
``algo.estimator``. The interface, the registry and the shared helpers are in
:mod:`rlkit.advantages.base`; the built-in entries: ``grpo``, ``dr_grpo``, ``rloo`` and ``agpo``
(:mod:`rlkit.advantages.grpo`), ``ebpo`` (:mod:`rlkit.advantages.ebpo`), ``jspo``,
``jspo_plus_plus`` and ``jspo_page`` (:mod:`rlkit.advantages.jspo`), ``bnpo``
(:mod:`rlkit.advantages.bnpo`), ``grpo_bn`` and ``spo`` (:mod:`rlkit.advantages.whitened`), and
the inputs of PPO and DPO, ``ppo`` and ``dpo`` (:mod:`rlkit.advantages.method_inputs`).

    est = get_estimator("ebpo", prior="history")
    out = est(rewards)            # out.advantages [P, G], out.diagnostics {"shrinkage": [P], ...}
"""

from __future__ import annotations

from rlkit.advantages.base import (
    ESTIMATORS,
    MAX_ABS_REWARD,
    WHITENINGS,
    AdvantageEstimator,
    AdvantageResult,
    centered,
    check_cluster_ids,
    check_prompt_ids,
    check_rewards,
    check_whitening,
    get_estimator,
    loo_group_baseline,
    register,
    whiten,
    zero_variance_groups,
)
from rlkit.advantages.bnpo import BNPO
from rlkit.advantages.ebpo import EBPO
from rlkit.advantages.grpo import GRPO, RLOO, AGPOAdvantage, DrGRPO
from rlkit.advantages.jspo import (
    JSPO,
    JSPO_SHRINKAGE,
    WANDB_VIEWPORT,
    JSPOBase,
    JSPOPage,
    JSPOPlusPlus,
    jspo_baseline,
    jspo_lambda,
    loo_prompt_statistics,
)
from rlkit.advantages.method_inputs import DPOPairRoles, PPOReward
from rlkit.advantages.whitened import SPO, GRPOBatchNorm, WhitenedBaseline
from rlkit.registry import import_all

import_all(__name__, __path__)

__all__ = [
    "BNPO",
    "EBPO",
    "ESTIMATORS",
    "GRPO",
    "JSPO",
    "JSPO_SHRINKAGE",
    "MAX_ABS_REWARD",
    "RLOO",
    "SPO",
    "WANDB_VIEWPORT",
    "WHITENINGS",
    "AGPOAdvantage",
    "AdvantageEstimator",
    "AdvantageResult",
    "DPOPairRoles",
    "DrGRPO",
    "GRPOBatchNorm",
    "JSPOBase",
    "JSPOPage",
    "JSPOPlusPlus",
    "PPOReward",
    "WhitenedBaseline",
    "centered",
    "check_cluster_ids",
    "check_prompt_ids",
    "check_rewards",
    "check_whitening",
    "get_estimator",
    "jspo_baseline",
    "jspo_lambda",
    "loo_group_baseline",
    "loo_prompt_statistics",
    "register",
    "whiten",
    "zero_variance_groups",
]
