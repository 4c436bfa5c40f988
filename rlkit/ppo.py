"""PPO with a learned value function (docs/algorithms.md §4c): token rewards, GAE, whitening, the
clipped value loss and the KL controllers (fixed and adaptive).

Shapes: per-token tensors are ``[B, T]`` (B completions, T completion tokens, right-padded) with
a ``mask`` of real tokens; ``scores`` are the verifiable rewards ``[B]``. Every reduction over the
batch passes a :class:`~rlkit.dist.Collective`, so several processes whiten over the global batch
and the KL controller sees the global KL.
"""

from __future__ import annotations

import torch

from rlkit.dist import Collective, Local
from rlkit.losses import Loss, LossContext, LossOutput


def token_rewards(
    scores: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """r_t = −β·KL_t + 1[t = last real token]·R (§4c, eq. 4c.1; Ziegler et al. 2019, TRL 0.11's
    ``compute_rewards``, verl's reward managers and ``apply_kl_penalty``); 0 at padding. TRL ≥
    0.12's ``PPOTrainer`` puts R one token past the last real token instead (§4c)."""
    mask = mask.bool()
    rewards = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.to(torch.float64).masked_fill(~mask, 0.0)
    last = (mask.long().sum(-1) - 1).clamp_min(0)
    has_tokens = mask.any(-1)
    rows = torch.arange(len(mask), device=mask.device)[has_tokens]
    rewards[rows, last[has_tokens]] += scores.to(rewards)[has_tokens]
    return rewards


def reward_kl_metrics(
    kl: torch.Tensor, mask: torch.Tensor, dist: Collective | None = None
) -> dict[str, torch.Tensor]:
    """The KL in the reward (KL_t of eq. 4c.1) averaged three ways over every rank's
    completions (§4c, "Logged"), float64:

    - ``ppo/reward_kl_penalty``: verl's ``actor/reward_kl_penalty``, the mean over completions of each completion's
      token mean (verl's ``apply_kl_penalty``; a completion without real tokens counts 0);
    - ``objective/kl``: TRL's, the mean over completions of each completion's summed KL, which
      is what the adaptive controller reads (eq. 4c.5);
    - ``ppo/kl_token_mean``: the mean over all real tokens (a long completion weighs more).
    """
    dist = dist or Local()
    m = mask.to(torch.float64)
    kl64 = kl.to(torch.float64) * m
    rows = dist.all_reduce_sum(torch.tensor(float(len(mask)), dtype=torch.float64))
    row_means = kl64.sum(-1) / m.sum(-1).clamp_min(1.0)
    tokens = dist.all_reduce_sum(m.sum()).clamp_min(1.0)
    return {
        "ppo/reward_kl_penalty": dist.all_reduce_sum(row_means.sum()) / rows,
        # summed in KL's dtype, as the controller's input always was (β unchanged bit for bit)
        "objective/kl": dist.all_reduce_sum((kl * mask).sum().double()) / rows,
        "ppo/kl_token_mean": dist.all_reduce_sum(kl64.sum()) / tokens,
    }


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (§4c, eq. 4c.2; Schulman et al. 2016), in float64:

        δ_t = r_t + γ·V_{t+1} − V_t,   A_t = δ_t + γλ·A_{t+1},   R_t = A_t + V_t

    with V = 0 past the last real token (the episode ends there). Returns (A, R), 0 at padding."""
    mask = mask.bool()
    r = rewards.to(torch.float64).masked_fill(~mask, 0.0)
    v = values.to(torch.float64).masked_fill(~mask, 0.0)
    advantages = torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    next_adv = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        next_adv = delta + gamma * lam * next_adv
        advantages[:, t] = next_adv
        next_value = v[:, t]
    advantages = advantages.masked_fill(~mask, 0.0)
    return advantages, (advantages + v).masked_fill(~mask, 0.0)


def whiten(x: torch.Tensor, mask: torch.Tensor, dist: Collective | None = None) -> torch.Tensor:
    """(x − mean) / sqrt(var + 1e-8) over the real tokens of every rank's rows, with the unbiased
    variance (§4c, eq. 4c.3; TRL's ``masked_whiten``); 0 at padding."""
    dist = dist or Local()
    m = mask.to(torch.float64)
    x64 = x.to(torch.float64)
    count = dist.all_reduce_sum(m.sum())
    mean = dist.all_reduce_sum((x64 * m).sum()) / count.clamp_min(1.0)
    squares = dist.all_reduce_sum((((x64 - mean) * m) ** 2).sum())
    var = squares / (count - 1).clamp_min(1.0)
    return ((x64 - mean) * torch.rsqrt(var + 1e-8) * m).to(x.dtype)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    cliprange: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ½·max((V − R)², (clip(V, V_old − c, V_old + c) − R)²) (§4c, eq. 4c.4; TRL's and
    verl's value loss) and where the clipped branch was the larger (TRL's ``vf_clipfrac``)."""
    returns = returns.to(values.dtype)
    clipped = old_values + (values - old_values).clamp(-cliprange, cliprange)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_loss, clipped_loss), clipped_loss > unclipped_loss


class ValueLoss(Loss):
    """PPO's value-head term (§4c): ``vf_coef`` times the micro-batch's share of the mini-batch's
    clipped value loss (eq. 4c.4), a token mean over every rank's tokens of the mini-batch, with
    its shares of ``loss/value_avg`` and ``val/clipfrac_avg`` (TRL's names; verl's
    ``critic/vf_loss`` and ``critic/vf_clipfrac``)."""

    metrics = ("loss/value_avg", "val/clipfrac_avg")

    def __init__(self, vf_coef: float, cliprange: float):
        self.vf_coef, self.cliprange = vf_coef, cliprange

    def __call__(self, logp: torch.Tensor, sub, ctx: LossContext) -> LossOutput:
        m = sub.rollouts.completion_mask
        loss_tok, clipped = clipped_value_loss(
            ctx.values, sub.old.values, sub.returns, self.cliprange
        )
        total = ctx.mini.tokens.to(loss_tok.dtype)
        loss = (loss_tok * m).sum() / total
        frac = (clipped & m).sum().to(loss_tok.dtype) / total
        stats = {"loss/value_avg": loss.detach(), "val/clipfrac_avg": frac}
        return LossOutput(self.vf_coef * loss, stats)


class FixedKLController:
    """β held constant (TRL's ``FixedKLController``; verl's ``kl_ctrl.type=fixed``)."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """Ziegler et al. 2019 (§2.2), TRL's ``AdaptiveKLController`` (§4c, eq. 4c.5)::

        e = clip(KL / KL_target − 1, −0.2, 0.2),   β ← β·(1 + e·n / horizon)

    with n the rows of the step's batch and KL each row's summed KL averaged over the rows
    (TRL's ``objective/kl``, :func:`reward_kl_metrics`). verl's controller reads a per-token mean
    KL instead, so a verl ``target_kl`` ports as that target times the mean completion length
    in tokens (§4c)."""

    def __init__(self, kl_coef: float, target: float, horizon: int):
        super().__init__(kl_coef)
        self.target, self.horizon = target, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
