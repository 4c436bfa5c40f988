"""The update (docs/algorithms.md §4): μ epochs × mini-batches × micro-batches of the method's
loss over a :class:`~rlkit.batch.TrainBatch`, backward, one optimizer step per mini-batch.

The loss is any :class:`rlkit.losses.Loss` (``Method.loss``: a registered entry with its
wrappers and the method's terms); it returns each micro-batch's share of its mini-batch's loss,
so the micro-batches' gradients add up to the mini-batch's. The units drawn into mini-batches
are the batch's rows, or groups of rows (DPO's pairs); ``optim.mini_batch_size`` and
``optim.micro_batch_size`` count rows over every rank. The per-row clip radii come from a
:class:`~rlkit.losses.ClipRule`, called once every row's pre-update entropy is known: before the
loop when π_old's pass ran, else at the first training forward (the fused on-policy path, where
that forward is π_old). After each optimizer step the weights, and the log-probs of one row,
must be finite; a non-finite loss or gradient skips the step, and too many in a row stop the
run (:class:`NonFiniteGuard`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from rlkit.batch import PolicyPass, TrainBatch, UpdateResult
from rlkit.config import TrainConfig
from rlkit.dist import Collective
from rlkit.logprobs import PolicyForward
from rlkit.losses import ClipRule, Loss, LossContext, MiniBatch
from rlkit.models.loading import Policy
from rlkit.pass_plan import PassPlan
from rlkit.phases import Phases
from rlkit.rollout import NonFiniteScoresError


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
    (``update/optimizer_steps``); keys keep the order given."""

    def __init__(self, keys: Sequence[str]):
        self.sums = dict.fromkeys(keys, 0.0)
        self.steps = 0

    def add(self, key: str, value: float) -> None:
        self.sums[key] += value

    def add_shares(self, parts: Sequence[dict]) -> None:
        """Add each micro-batch's statistics (already its share of the step), in order."""
        for stats in parts:
            for key, value in stats.items():
                self.add(key, float(value))

    def reduce(self, dist: Collective, keys: Sequence[str]) -> None:
        """Sum ``keys`` over the ranks: each rank added its rows' token-weighted shares."""
        for key in keys:
            self.sums[key] = float(
                dist.all_reduce_sum(torch.tensor(self.sums[key], dtype=torch.float64))
            )

    def result(self) -> dict[str, float]:
        n = self.steps
        return {k: v / max(n, 1) for k, v in self.sums.items()} | {"update/optimizer_steps": n}


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
        loss: Loss,
    ):
        self.policy, self.forward, self.plan, self.cfg = policy, forward, plan, cfg
        self.phases, self.dist, self.loss = phases, dist, loss
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(),
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(cfg))
        self.guard = NonFiniteGuard(cfg.optim.max_nonfinite_skips, cfg.optim.lr)

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

    def __call__(
        self, batch: TrainBatch, clip: ClipRule, step: int, units: torch.Tensor | None = None
    ) -> UpdateResult:
        """μ epochs of the loss over mini-batches of ``units`` ([U, k] row indices, default each
        row alone; DPO's (chosen, rejected) pairs); ``step`` (the steps done before this one)
        only names the step in messages. A step with no unit logs NaN for every mean."""
        opt, loss_fn = self.cfg.optim, self.loss
        units = torch.arange(len(batch))[:, None] if units is None else units
        mini, micro = self.sizes(len(units), units.shape[1])
        old, fill_old = self.old_pass(batch)
        eps = None if fill_old and clip.needs_entropy else self.radii(batch, clip, old)
        means = StepMeans(["loss", *loss_fn.metrics, "grad_norm", *loss_fn.late_metrics])
        self.policy.model.train()
        with self.phases("train"):
            for epoch in range(opt.update_epochs):
                order = torch.randperm(len(units))
                for start in range(0, len(units), mini):
                    mb = self.micro_order(units, order[start : start + mini], micro, batch)
                    totals = self.mini_batch(batch, units[mb].T.flatten(), len(mb))
                    self.optimizer.zero_grad(set_to_none=True)
                    loss_total, parts = 0.0, []
                    for mstart in range(0, len(mb), micro):
                        rows = units[mb[mstart : mstart + micro]].T.flatten()
                        sub, logp, values = self.train_forward(batch, rows, old, fill_old)
                        eps = eps or self.radii(batch, clip, old)  # on-policy: ε from this pass
                        ctx = LossContext(
                            old.logp[rows], eps[0][rows], eps[1][rows], values, totals, self.cfg
                        )
                        out = loss_fn(logp, sub, ctx)
                        out.loss.backward()
                        loss_total += out.loss.item()
                        parts.append(out.stats)
                    last = epoch == opt.update_epochs - 1 and start + mini >= len(units)
                    # the post-update pass (AGPO's step KL) runs every row through the final
                    # weights next and checks their log-probs, so the last one-row probe would
                    # repeat it
                    probe = None if last and self.plan.step_kl else units[mb[:1], 0]
                    if self.optimizer_step(step, loss_total, batch, probe, means):
                        means.add_shares(parts)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        means.reduce(self.dist, [k for k in means.sums if k not in ("loss", "grad_norm")])
        stats = means.result()
        if not len(units):  # no update: no loss, gradient norm or loss statistics
            stats |= dict.fromkeys(means.sums, math.nan)
        return UpdateResult(stats | loss_fn.summary(batch, old, self.dist, step), old)

    def sizes(self, count: int, rows_per_unit: int) -> tuple[int, int]:
        """Units per mini-batch and per micro-batch: ``optim.mini_batch_size`` rows over every
        rank (0: all ``count`` units) and ``optim.micro_batch_size`` rows on this one (0: the
        mini-batch), at least one unit each (a one-row micro-batch of pairs takes a pair)."""
        opt, per_rank = self.cfg.optim, self.dist.world * rows_per_unit
        mini = max(opt.mini_batch_size // per_rank, 1) if opt.mini_batch_size else max(count, 1)
        if not opt.micro_batch_size:
            return mini, mini
        return mini, min(max(opt.micro_batch_size // rows_per_unit, 1), mini)

    def train_forward(
        self, batch: TrainBatch, rows: torch.Tensor, old: PolicyPass, fill_old: bool
    ) -> tuple[TrainBatch, torch.Tensor, torch.Tensor | None]:
        """The micro-batch of ``rows``, its log-probs and values from the training forward; with
        ``fill_old`` (on-policy) the pass is also π_old's, detached into ``old`` (with the
        entropy where the plan logs it), so it holds every row's once each row has run."""
        sub = batch.select(rows)
        logp, entropy, values = self.forward.train(
            sub.rollouts, sub.ratio_temps, fill_old and self.plan.entropy, self.plan.values
        )
        if fill_old:
            old.logp[rows.to(old.logp.device)] = logp.detach()
            if entropy is not None:
                old.entropy[rows.to(old.logp.device)] = entropy
        return sub, logp, values

    def old_pass(self, batch: TrainBatch) -> tuple[PolicyPass, bool]:
        """π_old's pass, and whether the training forward fills it in as it runs: on-policy
        (``batch.old`` None) it is that forward, detached (log-probs at least float32, as
        ``logprobs.sequence_logprobs`` gives them)."""
        if batch.old is not None:
            return batch.old, False
        mask = batch.rollouts.completion_mask
        dtype = torch.promote_types(self.cfg.model.dtype, torch.float32)
        zeros = [torch.zeros(mask.shape, device=mask.device, dtype=dtype) for _ in range(2)]
        return PolicyPass(*zeros), True

    def mini_batch(self, batch: TrainBatch, rows: torch.Tensor, units: int) -> MiniBatch:
        """The mini-batch of ``rows`` (``units`` units) summed over every rank: its real tokens,
        units and normaliser scale (:meth:`norm_scale`)."""
        mask = batch.rollouts.completion_mask
        tokens = self.dist.all_reduce_sum(mask[rows].sum()).clamp_min(1)
        return MiniBatch(tokens, units * self.dist.world, self.norm_scale(batch, rows, tokens))

    def norm_scale(self, batch: TrainBatch, mb: torch.Tensor, mb_tokens: torch.Tensor) -> float:
        """The factor from the mini-batch ``mb``'s normaliser, every rank's real tokens
        (``token-mean``) or rows (``seq-mean-*``), to the one the loss divides by: 1, or with
        ``batch.norm_rows`` (``loss.exclude_zero_var_from_norm``, docs/algorithms.md §4) the
        tokens or the rows of groups whose rewards differ (1 where there is none). The metrics
        keep the full shares."""
        norm_rows = batch.norm_rows
        if norm_rows is None:
            return 1.0
        if self.cfg.loss.loss_agg == "token-mean":
            counted = batch.rollouts.completion_mask & norm_rows[:, None]
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

    def micro_order(
        self, units: torch.Tensor, mb: torch.Tensor, micro: int, batch: TrainBatch
    ) -> torch.Tensor:
        """The mini-batch's units in the order its micro-batches take them: as drawn, or with
        shared prompt forwards (`PassPlan.share_prompts`, when the mini-batch is split) in the
        order of their first row's prompt, so that a group's rows share a micro-batch and its
        prompt runs through the model once there (`rlkit.logprobs._completion_states`). Which
        units form the mini-batch does not change, so neither do its gradient and metrics, up to
        float rounding; a loss that selects tokens by micro-batch statistics (Clip-Cov, KL-Cov,
        docs/algorithms.md §4b) keeps the drawn order."""
        if not self.plan.share_prompts or micro >= len(mb) or self.loss.keeps_order:
            return mb
        prompts = units[mb, 0] // batch.group_size
        return mb[torch.sort(prompts, stable=True).indices]  # a prompt's units are adjacent

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
