"""Losses as registered plug-ins (docs/algorithms.md §4; adding one: docs/contributing.md).

Every module of this package is imported with it, so a new file here that decorates its
function with :func:`register_loss` is a new ``loss.loss_mode``. The built-in entries:
``vanilla`` (the clipped surrogate with the dual clip), ``clip_cov`` and ``kl_cov``
(:mod:`rlkit.losses.clipped`), ``gspo`` and ``cispo`` (:mod:`rlkit.losses.sequence`), and DPO's
pairwise ``dpo`` (:mod:`rlkit.losses.dpo`); the KL term and the aggregation wrap them
(:mod:`rlkit.losses.base`), as truncated IS does (``rlkit.tis.TruncatedIS``) and PPO's value loss
adds to them (``rlkit.ppo.ValueLoss``).
"""

from __future__ import annotations

from rlkit.losses.base import (
    LOSSES,
    ClipRule,
    KLPenalty,
    Loss,
    LossContext,
    LossOutput,
    MiniBatch,
    MiniBatchShare,
    WithTerm,
    Wrapper,
    get_loss,
    loss_modes,
    register_loss,
)
from rlkit.losses.clipped import clip_cov, kl_cov, token_covariance
from rlkit.losses.core import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    ClipStats,
    aggregate_loss,
    clipped_surrogate,
    entropy_from_logits,
    kl_divergence,
    masked_mean,
)
from rlkit.losses.dpo import DPO_METRICS, dpo_loss, pair_statistics
from rlkit.losses.sequence import cispo, gspo
from rlkit.registry import import_all

import_all(__name__, __path__)

__all__ = [
    "DPO_METRICS",
    "KL_ESTIMATORS",
    "LOSSES",
    "LOSS_AGGREGATIONS",
    "ClipRule",
    "ClipStats",
    "KLPenalty",
    "Loss",
    "LossContext",
    "LossOutput",
    "MiniBatch",
    "MiniBatchShare",
    "WithTerm",
    "Wrapper",
    "aggregate_loss",
    "cispo",
    "clip_cov",
    "clipped_surrogate",
    "dpo_loss",
    "entropy_from_logits",
    "get_loss",
    "gspo",
    "kl_cov",
    "kl_divergence",
    "loss_modes",
    "masked_mean",
    "pair_statistics",
    "register_loss",
    "token_covariance",
]
