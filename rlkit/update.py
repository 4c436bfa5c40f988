"""The policy update (docs/algorithms.md §4): μ epochs × mini-batches × micro-batches over a
:class:`~rlkit.batch.TrainBatch`, with the clipped surrogate, the KL term, the non-finite guard.

One optimizer step per mini-batch: its micro-batches accumulate gradients, each weighted by its
share of the mini-batch's tokens (``token-mean``) or rows, so the step is the mini-batch's loss.
The per-row clip radii come from a :class:`ClipRule`, called once every row's pre-update entropy
is known: before the loop when π_old's pass ran, else at the first training forward (the fused
on-policy path, where that forward is π_old). After each optimizer step the weights, and the
log-probs of one row, must be finite; a non-finite loss or gradient skips the step, and too many
in a row stop the run (:class:`NonFiniteGuard`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from rlkit.batch import PolicyPass, TrainBatch, UpdateResult
from rlkit.clip_rules import ClipRule
from rlkit.config import TrainConfig, run_tis_cap, run_tis_tripwire
from rlkit.dist import Collective
from rlkit.dpo import DPO_METRICS, Pairs, dpo_loss, pair_statistics
from rlkit.logprobs import PolicyForward
from rlkit.losses import (
    BATCH_STATISTIC_MODES,
    LOSS_MODE_METRICS,
    aggregate_loss,
    kl_divergence,
    masked_mean,
    policy_loss,
)
from rlkit.models.loading import Policy
from rlkit.pass_plan import PassPlan
from rlkit.phases import Phases
from rlkit.ppo import clipped_value_loss
from rlkit.rollout import NonFiniteScoresError
from rlkit.tis import check_divergence, importance_weights, mismatch_metrics

CRITIC_METRICS = ["critic/vf_loss", "critic/vf_clipfrac"]  # verl's names


class NonFiniteError(RuntimeError):
    """Raised after too many consecutive steps with a non-finite loss or gradient, when an
    optimizer step leaves the policy non-finite, or when sampling from the policy meets
    non-finite scores."""


def lr_factor(cfg: TrainConfig) -> Callable[[int], float]:
    """Linear warm-up over ``warmup_steps``, then constant or cosine decay to 0 at ``steps``."""
    warmup, total, schedule = cfg.optim.warmup_steps, cfg.steps, cfg.optim.schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "cosine":
            return 0.5 * (
                1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup)))
            )
        return 1.0

    return factor


class StepMeans:
    """Per-optimizer-step sums of named statistics, reported as their mean over the steps taken
    (``optimizer_steps``); keys keep the order given."""

    def __init__(self, keys: Sequence[str]):
        self.sums = dict.fromkeys(keys, 0.0)
        self.steps = 0

    def add(self, key: str, value: float) -> None:
        self.sums[key] += value

    def reduce(self, dist: Collective, keys: Sequence[str]) -> None:
        """Sum ``keys`` over the ranks: each rank added its rows' token-weighted shares."""
        for key in keys:
            self.sums[key] = float(
                dist.all_reduce_sum(torch.tensor(self.sums[key], dtype=torch.float64))
            )

    def result(self) -> dict[str, float]:
        n = self.steps
        return {k: v / max(n, 1) for k, v in self.sums.items()} | {"optimizer_steps": n}


class NonFiniteGuard:
    """Skips an optimizer step with a non-finite loss or gradient and stops the run after
    ``max_skips`` in a row; stops at once when an optimizer step leaves the policy non-finite."""

    def __init__(self, max_skips: int, lr: float):
        self.max_skips, self.lr = max_skips, lr
        self.skips = self.consecutive = 0

    def skip(self, step: int, loss: float, grad_norm: float) -> None:
        self.skips += 1
        self.consecutive += 1
        tqdm.write(f"step {step}: non-finite loss ({loss}) or grad norm ({grad_norm}); skipped")
        if self.consecutive >= self.max_skips:
            raise NonFiniteError(
                f"{self.consecutive} consecutive optimizer steps had a non-finite loss "
                f"or gradient (last loss {loss}, grad norm {grad_norm}); lower optim.lr or check the rewards"
            )

    @contextlib.contextmanager
    def sampling(self, step: int) -> Iterator[None]:
        """Turn sampling's non-finite scores after ``step`` steps (a broken policy: finite but
        huge weights can pass the update's one-row check, :meth:`PolicyUpdate.check_finite`)
        into a NonFiniteError naming the step, raised before anything of the step is logged or
        saved."""
        try:
            yield
        except NonFiniteScoresError as err:
            raise NonFiniteError(
                f"sampling after step {step} met {err}: "
                + (
                    "the starting policy is non-finite"
                    if step == 0
                    else "an optimizer step left the policy non-finite; lower optim.lr "
                    f"(now {self.lr:g}). The run's checkpoints are kept."
                )
            ) from None

    def check_logprobs(self, step: int, logp: torch.Tensor) -> None:
        if not torch.isfinite(logp).all():
            self.stop(step, "finite weights but non-finite log-probabilities")

    def stop(self, step: int, problem: str) -> None:
        raise NonFiniteError(
            f"step {step + 1}: the optimizer step left the policy with {problem}; "
            f"lower optim.lr (now {self.lr:g}). The last checkpoint is unaffected."
        )


class PolicyUpdate:
    """AdamW with its schedule, and the update of one step (``__call__``)."""

    def __init__(
        self,
        policy: Policy,
        forward: PolicyForward,
        plan: PassPlan,
        cfg: TrainConfig,
        phases: Phases,
        dist: Collective,
    ):
        self.policy, self.forward, self.plan, self.cfg = policy, forward, plan, cfg
        self.phases, self.dist = phases, dist
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(),
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(cfg))
        self.guard = NonFiniteGuard(cfg.optim.max_nonfinite_skips, cfg.optim.lr)
        self.tis_cap = run_tis_cap(cfg)
        self.tis_tripwire = run_tis_tripwire(cfg)

    @property
    def lr(self) -> float:
        """This step's learning rate (the update steps the scheduler at its end)."""
        return self.scheduler.get_last_lr()[0]

    def radii(
        self, batch: TrainBatch, clip: ClipRule, old: PolicyPass
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row (ε_low, ε_high) [B] from the rule's per-prompt radii."""
        entropy = batch.per_prompt(old.entropy).cpu() if clip.needs_entropy else None
        low, high = clip(entropy)
        return low.repeat_interleave(batch.group_size), high.repeat_interleave(batch.group_size)

    def __call__(self, batch: TrainBatch, clip: ClipRule, step: int) -> UpdateResult:
        """μ epochs of clipped-surrogate updates over mini-batches of ``batch``; ``step`` (the
        steps done before this one) only names the step in messages."""
        cfg, opt, world = self.cfg, self.cfg.optim, self.dist.world
        rows = len(batch)  # this rank's; optim.mini_batch_size counts every rank's
        mini = opt.mini_batch_size // world or rows
        micro = opt.micro_batch_size or mini
        mask = batch.rollouts.completion_mask
        # the tokens and rows of the loss's normaliser (loss.exclude_zero_var_from_norm, §4)
        norm_rows = batch.norm_rows
        counted = mask if norm_rows is None else mask & norm_rows[:, None]
        on_policy = batch.old is None
        old = batch.old
        if on_policy:  # π_old is the detached training forward: filled in as it runs
            # log-probs are at least float32 (logprobs.sequence_logprobs)
            dtype = torch.promote_types(cfg.model.dtype, torch.float32)
            old = PolicyPass(
                torch.zeros(mask.shape, device=mask.device, dtype=dtype),
                torch.zeros(mask.shape, device=mask.device, dtype=dtype),
            )
        eps = None if on_policy and clip.needs_entropy else self.radii(batch, clip, old)
        sampler_logp = batch.rollouts.sampler_logp
        if self.tis_cap is not None and sampler_logp is None:
            raise ValueError(
                f"loss.tis_cap={cfg.loss.tis_cap} is on, but the rollouts carry no sampler "
                f"log-probs (rollout.engine={cfg.rollout.engine})"
            )
        keys = ["loss", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
        keys += LOSS_MODE_METRICS[cfg.loss.loss_mode]
        critic = batch.returns is not None  # PPO's value head trains with the policy (§4c)
        keys += CRITIC_METRICS if critic else []
        means = StepMeans([*keys, "grad_norm", *(["kl"] if batch.ref_logp is not None else [])])
        self.policy.model.train()
        with self.phases("train"):
            for epoch in range(opt.update_epochs):
                order = torch.randperm(rows)
                for start in range(0, rows, mini):
                    mb = self.micro_order(order[start : start + mini], micro, batch.group_size)
                    mb_tokens = self.dist.all_reduce_sum(mask[mb].sum()).clamp_min(1)
                    scale = self.norm_scale(counted, norm_rows, mb, mb_tokens)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss_total, parts = 0.0, []
                    for mstart in range(0, len(mb), micro):
                        idx = mb[mstart : mstart + micro]
                        sub = batch.select(idx)
                        logp, entropy, values = self.forward.train(
                            sub.rollouts, sub.ratio_temps, on_policy and self.plan.entropy, critic
                        )
                        if on_policy:
                            old.logp[idx.to(mask.device)] = logp.detach()
                            if entropy is not None:
                                old.entropy[idx.to(mask.device)] = entropy
                        if (
                            eps is None
                        ):  # on-policy, entropy-dependent ε: this forward had every row
                            eps = self.radii(batch, clip, old)
                        m = sub.rollouts.completion_mask
                        old_logp = old.logp[idx] if on_policy else sub.old.logp
                        loss_tok, clipped, cov = policy_loss(  # loss.loss_mode's
                            cfg.loss,
                            logp,
                            old_logp,
                            sub.advantages,
                            eps[0][idx],
                            eps[1][idx],
                            m,
                        )
                        if self.tis_cap is not None:  # rlkit.tis: the sampler is not π_old
                            loss_tok = loss_tok * importance_weights(
                                old_logp,
                                sub.rollouts.sampler_logp,
                                m,
                                self.tis_cap,
                                cfg.loss.tis_mode,
                            )
                        kl = None
                        if sub.ref_logp is not None:
                            kl_tok = kl_divergence(logp, sub.ref_logp, cfg.loss.kl_estimator)
                            loss_tok = loss_tok + cfg.loss.kl_coef * kl_tok
                            kl = masked_mean(kl_tok.detach(), m)
                        # the global mini-batch's share: the ranks' gradients are summed
                        weight = (  # in the loss's precision (float64 models: exactly)
                            (m.sum().to(loss_tok.dtype) / mb_tokens.to(loss_tok.dtype))
                            if cfg.loss.loss_agg == "token-mean"
                            else len(idx) / (len(mb) * world)
                        )
                        loss = (
                            aggregate_loss(
                                loss_tok, m, cfg.loss.loss_agg, cfg.rollout.max_new_tokens
                            )
                            * weight
                            * scale
                        )
                        shares = {}  # statistics already weighted by their share
                        if critic:
                            vf_loss, shares = self.value_loss(values, sub, mb_tokens)
                            loss = loss + cfg.ppo.vf_coef * vf_loss
                        loss.backward()
                        loss_total += loss.item()
                        parts.append((weight, clipped, kl, cov, shares))
                    last = epoch == opt.update_epochs - 1 and start + mini >= rows
                    # the post-update pass (AGPO's step KL) runs every row through the final
                    # weights next and checks their log-probs, so the last one-row probe would
                    # repeat it
                    probe = None if last and self.plan.step_kl else mb[:1]
                    if not self.optimizer_step(step, loss_total, batch, probe, means):
                        continue
                    for weight, clipped, kl, cov, shares in parts:
                        w = float(weight)
                        for key, value in cov.items():
                            means.add(key, w * float(value))
                        for key, value in shares.items():
                            means.add(key, float(value))
                        if kl is not None:
                            means.add("kl", w * float(kl))
                        means.add("clip_ratio/low_mean", w * float(clipped.low))
                        means.add("clip_ratio/high_mean", w * float(clipped.high))
                        means.add("clip_ratio/region_mean", w * float(clipped.region))
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        means.reduce(self.dist, [k for k in means.sums if k not in ("loss", "grad_norm")])
        stats = means.result()
        if self.tis_cap is not None:
            stats |= mismatch_metrics(old.logp, sampler_logp, mask, self.tis_cap)
        if self.tis_tripwire is not None:
            check_divergence(old.logp, sampler_logp, mask, self.tis_tripwire, self.dist, step + 1)
        return UpdateResult(stats, old)

    def norm_scale(
        self,
        counted: torch.Tensor,
        norm_rows: torch.Tensor | None,
        mb: torch.Tensor,
        mb_tokens: torch.Tensor,
    ) -> float:
        """The factor from the mini-batch ``mb``'s normaliser, every rank's real tokens
        (``token-mean``) or rows (``seq-mean-*``), to the one the loss divides by: 1, or with
        ``norm_rows`` (``loss.exclude_zero_var_from_norm``, docs/algorithms.md §4) the tokens
        ``counted`` or the rows of groups whose rewards differ (1 where there is none). The
        metrics keep the full shares."""
        if norm_rows is None:
            return 1.0
        if self.cfg.loss.loss_agg == "token-mean":
            full, kept = float(mb_tokens), float(self.dist.all_reduce_sum(counted[mb].sum()))
        else:
            full = float(len(mb) * self.dist.world)
            kept = float(self.dist.all_reduce_sum(norm_rows[mb].sum()))
        return full / kept if kept > 0 else 1.0

    def optimizer_step(
        self,
        step: int,
        loss: float,
        batch: TrainBatch,
        probe: torch.Tensor | None,
        means: StepMeans,
    ) -> bool:
        """One mini-batch's optimizer step once its micro-batches' gradients are in: the loss
        summed over the ranks, the gradient clipped; a non-finite loss or gradient skips the step
        (False, :class:`NonFiniteGuard`); else the step, the finite check on the rows ``probe``,
        and ``loss`` and ``grad_norm`` added to ``means``."""
        loss = float(self.dist.all_reduce_sum(torch.tensor(loss, dtype=torch.float64)))
        params = self.policy.trainable_parameters()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.max_grad_norm)
        if not (math.isfinite(loss) and torch.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            self.guard.skip(step, loss, float(grad_norm))
            return False
        self.optimizer.step()
        self.check_finite(step, batch, probe)
        self.guard.consecutive = 0
        means.steps += 1
        means.add("loss", loss)
        means.add("grad_norm", float(grad_norm))
        return True

    def preference(self, batch: TrainBatch, pairs: Pairs, beta: float, step: int) -> UpdateResult:
        """DPO's update (docs/algorithms.md §4d): μ epochs over mini-batches of pairs,
        ``optim.mini_batch_size // 2`` pairs per optimizer step (0: every pair; at least 1) and
        ``optim.micro_batch_size // 2`` per forward (0: the mini-batch; at least 1), its loss
        the mean of eq. 4d.1 over its pairs. Sequence log-probs sum the completion's real tokens
        at the ratio temperature, the reference's from ``batch.ref_logp``. A step without pairs
        updates nothing (the schedule still steps) and logs NaN loss, gradient norm and pair
        statistics. One process."""
        opt = self.cfg.optim
        k = len(pairs)
        # a set size of one row still means one pair per step / forward, never "all of them"
        mini = max(opt.mini_batch_size // 2, 1) if opt.mini_batch_size else max(k, 1)
        micro = min(max(opt.micro_batch_size // 2, 1), mini) if opt.micro_batch_size else mini
        mask = batch.rollouts.completion_mask
        ref = (batch.ref_logp * mask).sum(-1)  # [B] log π_ref(y) of each row
        means = StepMeans(["loss", *DPO_METRICS, "grad_norm"])
        self.policy.model.train()
        with self.phases("train"):
            for _ in range(opt.update_epochs):
                order = torch.randperm(k)
                for start in range(0, k, mini):
                    mb = order[start : start + mini]
                    self.optimizer.zero_grad(set_to_none=True)
                    loss_total, stats = 0.0, torch.zeros(len(DPO_METRICS), dtype=torch.float64)
                    for mstart in range(0, len(mb), micro):
                        idx = mb[mstart : mstart + micro]
                        rows = torch.cat([pairs.chosen[idx], pairs.rejected[idx]])
                        sub = batch.select(rows)
                        logp, _, _ = self.forward.train(sub.rollouts, sub.ratio_temps, False)
                        seq = (logp * sub.rollouts.completion_mask).sum(-1)
                        n, ref_rows = len(idx), ref[rows.to(ref.device)]
                        losses, chosen, rejected = dpo_loss(
                            seq[:n], seq[n:], ref_rows[:n], ref_rows[n:], beta
                        )
                        loss = losses.sum() / len(mb)
                        loss.backward()
                        loss_total += loss.item()
                        per_pair = pair_statistics(seq[:n], seq[n:], chosen, rejected)
                        stats += per_pair.sum(0).double().cpu() / len(mb)
                    if not self.optimizer_step(
                        step, loss_total, batch, pairs.chosen[mb[:1]], means
                    ):
                        continue
                    for key, value in zip(DPO_METRICS, stats.tolist()):
                        means.add(key, value)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        stats = means.result()
        if k == 0:  # no pair: no update, so no loss, gradient norm or pair statistics
            stats |= dict.fromkeys(("loss", *DPO_METRICS, "grad_norm"), math.nan)
        return UpdateResult(stats, batch.old)

    def micro_order(self, mb: torch.Tensor, micro: int, group_size: int) -> torch.Tensor:
        """The mini-batch's rows in the order its micro-batches take them: as drawn, or with
        shared prompt forwards (`PassPlan.share_prompts`, when the mini-batch is split) in
        prompt order, so that a group's rows share a micro-batch and its prompt runs through the model once there
        (`rlkit.logprobs._completion_states`). Which rows form the mini-batch does not change,
        so neither do its gradient and metrics, up to float rounding; Clip-Cov and KL-Cov
        select tokens by micro-batch statistics (docs/algorithms.md §4b), so they keep the
        drawn order."""
        if (
            not self.plan.share_prompts
            or micro >= len(mb)
            or self.cfg.loss.loss_mode in BATCH_STATISTIC_MODES
        ):
            return mb
        return mb[torch.sort(mb // group_size, stable=True).indices]  # rows of a group are adjacent

    def value_loss(
        self, values: torch.Tensor, sub: TrainBatch, mb_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This micro-batch's share of the mini-batch's clipped value loss, a token mean over
        every rank's tokens of the mini-batch (docs/algorithms.md §4c, eq. 4c.4), and its shares
        of ``critic/vf_loss`` and ``critic/vf_clipfrac``."""
        m = sub.rollouts.completion_mask
        loss_tok, clipped = clipped_value_loss(
            values, sub.old.values, sub.returns, self.cfg.ppo.cliprange_value
        )
        total = mb_tokens.to(loss_tok.dtype)
        loss = (loss_tok * m).sum() / total
        frac = (clipped & m).sum().to(loss_tok.dtype) / total
        return loss, {"critic/vf_loss": loss.detach(), "critic/vf_clipfrac": frac}

    @torch.no_grad()
    def check_finite(self, step: int, batch: TrainBatch, rows: torch.Tensor | None) -> None:
        """After an optimizer step the weights, and the log-probs of ``rows`` (None: the weights
        only), must be finite (finite but huge weights, e.g. from optim.lr=1e30, give NaN
        outputs); otherwise stop with NonFiniteError before sampling from a broken policy."""
        with self.phases("check_finite"):
            params = self.policy.trainable_parameters()
            if not all(torch.isfinite(p).all() for p in params):
                self.guard.stop(step, "non-finite weights")
            if rows is not None:
                logp, _ = self.forward(
                    self.policy.model, batch.rollouts.select(rows), batch.ratio_temps[rows]
                )
                self.guard.check_logprobs(step, logp)

    def drift(self, batch: TrainBatch, old: PolicyPass, step: int) -> torch.Tensor:
        """Per-prompt k1 drift mean_t(log π_old − log π_new) after the update (docs/algorithms.md
        §3 step 5); the pass also checks the final weights' log-probs (the update left it that)."""
        new_logp = self.forward.after(batch.rollouts, batch.ratio_temps)
        self.guard.check_logprobs(step, new_logp)
        return batch.per_prompt(old.logp - new_logp)
