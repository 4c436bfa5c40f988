"""One loss signature, its registry, and the wrappers that compose losses (docs/algorithms.md §4).

A loss maps one micro-batch to a :class:`LossOutput`::

    loss(logp, sub, ctx) -> LossOutput(loss, stats)

``logp`` [b, T] are the training forward's log-probs of the micro-batch ``sub`` (a
:class:`~rlkit.batch.TrainBatch` of b rows), ``ctx`` (:class:`LossContext`) what else it reads: π_old,
the per-row clip radii, the value head's output, the mini-batch's totals and the config. A
registered entry (:func:`register_loss`) returns a per-token loss [b, T] and its statistics, each
the micro-batch's mean; :class:`MiniBatchShare` turns that into the micro-batch's scalar share of
the mini-batch's loss, the statistics into shares of the step's means, which is what the update
backpropagates and logs. An entry may also return that share itself (DPO's pairwise loss).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlkit.losses.core import aggregate_loss, kl_divergence, masked_mean
from rlkit.registry import Registry
from rlkit.settings import When


@dataclass(frozen=True)
class MiniBatch:
    """The mini-batch a micro-batch belongs to, summed over every rank: its real ``tokens``, its
    ``units`` (rows, or DPO's pairs) and ``scale``, the factor from its normaliser to the one the
    loss divides by (``loss.exclude_zero_var_from_norm``, §4; else 1)."""

    tokens: torch.Tensor
    units: int
    scale: float


@dataclass(frozen=True)
class LossContext:
    """What a loss reads besides the micro-batch's log-probs and rows: π_old's log-probs and the
    clip radii (ε_low, ε_high) of its rows, the value head's V(s_t) (None: no value head), its
    mini-batch, and the run's config (``rlkit.config.TrainConfig``)."""

    old_logp: torch.Tensor
    eps_low: torch.Tensor
    eps_high: torch.Tensor
    values: torch.Tensor | None
    mini: MiniBatch
    cfg: Any


@dataclass
class LossOutput:
    """A loss ([b, T] per token, or a scalar share of the mini-batch's loss) and its statistics
    under the keys the loss declares."""

    loss: torch.Tensor
    stats: dict[str, torch.Tensor | float]


class ClipRule(Protocol):
    """Per-prompt clip radii (ε_low, ε_high), each [P]. ``needs_entropy``: the rule reads each
    prompt's mean pre-update token entropy (else it is called with None)."""

    needs_entropy: bool

    def __call__(
        self, prompt_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class Loss:
    """A loss the update runs: ``(logp, sub, ctx) -> LossOutput``. ``metrics``: its statistics'
    keys, logged after ``loss``; ``late_metrics``: those logged after ``grad_norm`` (the KL
    term's ``kl``); ``keeps_order``: its micro-batches take the units in the drawn order, never
    in prompt order (a loss that selects tokens by the micro-batch's statistics: Clip-Cov and
    KL-Cov, §4b); ``pairs``: its units are (chosen, rejected) row pairs (DPO, §4d), so
    ``loss.loss_mode`` cannot name it; ``reads``: the config settings it reads
    (`rlkit.settings`)."""

    metrics: tuple[str, ...] = ()
    late_metrics: tuple[str, ...] = ()
    keeps_order = False
    pairs = False
    reads: dict[str, When | None] = {}

    def __call__(self, logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
        raise NotImplementedError

    def summary(self, batch, old, dist, step: int) -> dict[str, float]:
        """Statistics of the whole update, once it is done (truncated IS's mismatch)."""
        return {}


class Registered(Loss):
    """A registered function with its declared metrics."""

    def __init__(self, fn: Callable, metrics, keeps_order: bool, pairs: bool, reads: dict):
        self.fn, self.metrics = fn, tuple(metrics)
        self.keeps_order, self.pairs, self.reads = keeps_order, pairs, reads
        self.__doc__ = fn.__doc__

    def __call__(self, logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
        return self.fn(logp, sub, ctx)


LOSSES: Registry[Registered] = Registry("loss", sort_known=True)


def register_loss(
    name: str,
    metrics: tuple[str, ...] = (),
    keeps_order: bool = False,
    pairs: bool = False,
    reads: dict[str, When | None] | None = None,
) -> Callable[[Callable], Callable]:
    """Register ``fn(logp, sub, ctx) -> LossOutput`` as the loss ``name`` (``loss.loss_mode=name``
    unless ``pairs``), reporting ``metrics`` and reading the config settings ``reads`` (see
    :class:`Loss`); a taken name is a ValueError."""

    def add(fn: Callable) -> Callable:
        LOSSES.add(name, Registered(fn, metrics, keeps_order, pairs, reads or {}), fn)
        return fn

    return add


get_loss = LOSSES.get  # the registered loss ``name``; an unknown name lists the known ones


def loss_modes() -> list[str]:
    """The losses ``loss.loss_mode`` may name: every registered one on rows."""
    return [name for name, loss in LOSSES.items() if not loss.pairs]


class Wrapper(Loss):
    """A loss around ``inner``, with its metrics and order rule; :meth:`summary` passes on."""

    def __init__(self, inner: Loss):
        self.inner = inner
        self.metrics, self.late_metrics = inner.metrics, inner.late_metrics
        self.keeps_order, self.pairs = inner.keeps_order, inner.pairs

    def summary(self, batch, old, dist, step: int) -> dict[str, float]:
        return self.inner.summary(batch, old, dist, step)


class KLPenalty(Wrapper):
    """The per-token loss plus β·KL(π_θ ‖ π_ref) of the micro-batch's reference log-probs, with
    Schulman's k1 or k3 estimator (§4, ``loss.kl_coef``, ``loss.kl_estimator``); logs the mean KL
    over the real tokens as ``kl``."""

    def __init__(self, inner: Loss, coef: float, estimator: str):
        super().__init__(inner)
        self.coef, self.estimator = coef, estimator
        self.late_metrics = (*inner.late_metrics, "kl")

    def __call__(self, logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
        out = self.inner(logp, sub, ctx)
        kl = kl_divergence(logp, sub.ref_logp, self.estimator)
        stats = out.stats | {"kl": masked_mean(kl.detach(), sub.rollouts.completion_mask)}
        return LossOutput(out.loss + self.coef * kl, stats)


class MiniBatchShare(Wrapper):
    """The micro-batch's share of the mini-batch's loss (§4, Aggregation): the per-token loss
    aggregated by ``loss.loss_agg`` over the micro-batch, weighted by the micro-batch's share of
    the mini-batch's tokens (``token-mean``) or rows, every rank's (their gradients are summed),
    times the normaliser's ``scale``; each statistic weighted by the same share."""

    def __init__(self, inner: Loss, agg: str, max_len: int):
        super().__init__(inner)
        self.agg, self.max_len = agg, max_len

    def __call__(self, logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
        out = self.inner(logp, sub, ctx)
        m, dtype = sub.rollouts.completion_mask, out.loss.dtype
        weight = (  # in the loss's precision (float64 models: exactly)
            m.sum().to(dtype) / ctx.mini.tokens.to(dtype)
            if self.agg == "token-mean"
            else len(sub) / ctx.mini.units
        )
        loss = aggregate_loss(out.loss, m, self.agg, self.max_len) * weight * ctx.mini.scale
        w = float(weight)
        return LossOutput(loss, {key: w * float(value) for key, value in out.stats.items()})


class WithTerm(Wrapper):
    """``inner``'s share plus a method's own term (PPO's value loss, §4c), each reporting its
    statistics (the term's after ``inner``'s)."""

    def __init__(self, inner: Loss, term: Loss):
        super().__init__(inner)
        self.term = term
        self.metrics = (*inner.metrics, *term.metrics)

    def __call__(self, logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
        out, extra = self.inner(logp, sub, ctx), self.term(logp, sub, ctx)
        return LossOutput(out.loss + extra.loss, out.stats | extra.stats)
