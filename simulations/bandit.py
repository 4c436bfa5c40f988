"""A trainable "policy" on which entropy and gradients are real: a tabular softmax bandit.

Prompt q has K candidate answers with logits z[q, :]; the answers in ``correct[q, :]`` earn
reward 1, the others 0, so the policy's success rate is θ_q = Σ_k π_qk·correct_qk. One training
step samples G answers per prompt (at a per-prompt temperature τ), scores them, turns the rewards
into advantages with any rlkit estimator, and takes ``epochs`` plain-gradient steps on rlkit's
clipped surrogate (docs/algorithms.md §4), each completion being a one-token sequence. Every prompt owns its
logits, so the per-prompt step size must not depend on the batch size: the loss is summed over
prompts (B × the token-mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlkit.losses import aggregate_loss, clipped_surrogate, kl_divergence
from rlkit.losses import entropy_from_logits as entropy


@dataclass
class StepResult:
    """What one update did, per prompt of the batch ([B] tensors unless noted)."""

    delta_logits: torch.Tensor  # [B, K]: z_new − z_old
    grad_norm: torch.Tensor  # ‖∇_z loss‖ at the first epoch (the policy-gradient norm)
    entropy_before: torch.Tensor
    entropy_after: torch.Tensor
    kl: torch.Tensor  # k1 drift mean_i(log π_old − log π_new) on the sampled answers
    clip_fraction: torch.Tensor  # scalar: fraction of samples whose ratio was clipped


class SoftmaxBandit:
    """A pool of prompts, each a softmax over K answers (float64 logits)."""

    def __init__(self, logits: torch.Tensor, correct: torch.Tensor):
        if logits.dim() != 2 or logits.shape != correct.shape:
            raise ValueError(
                f"logits and correct must both be [P, K], got {tuple(logits.shape)} and {tuple(correct.shape)}"
            )
        if not correct.any(dim=1).all():
            raise ValueError("every prompt needs at least one correct answer")
        self.logits = logits.to(torch.float64).clone()
        self.correct = correct.to(torch.bool)

    @classmethod
    def from_success_rates(
        cls, theta: torch.Tensor, num_answers: int, num_correct: int = 1
    ) -> SoftmaxBandit:
        """A bandit whose starting success rates are ``theta``: the first ``num_correct`` answers
        are correct and share θ equally, the other K − num_correct share 1 − θ equally."""
        if not 1 <= num_correct < num_answers:
            raise ValueError(
                f"num_correct must be in [1, num_answers), got {num_correct} of {num_answers}"
            )
        theta = theta.to(torch.float64).clamp(1e-6, 1 - 1e-6).unsqueeze(1)
        correct = torch.zeros(theta.shape[0], num_answers, dtype=torch.bool)
        correct[:, :num_correct] = True
        probs = torch.where(correct, theta / num_correct, (1 - theta) / (num_answers - num_correct))
        return cls(probs.log(), correct)

    @property
    def num_prompts(self) -> int:
        return self.logits.shape[0]

    def _index(self, prompts: torch.Tensor | None) -> torch.Tensor:
        return torch.arange(self.num_prompts) if prompts is None else prompts

    def log_probs(self, prompts=None, temperature=1.0) -> torch.Tensor:
        """log softmax(z / τ) for the batch ``prompts`` ([B, K]); τ a float or one per prompt."""
        z = self.logits[self._index(prompts)]
        return torch.log_softmax(z / _column(temperature, z), dim=-1)

    def success_rate(self, prompts=None) -> torch.Tensor:
        """θ_q = π(correct answer) at T = 1."""
        idx = self._index(prompts)
        return (self.log_probs(idx).exp() * self.correct[idx]).sum(1)

    def entropy(self, prompts=None) -> torch.Tensor:
        """Policy entropy (nats, T = 1, float64) per prompt."""
        return entropy(self.logits[self._index(prompts)])

    def sample(
        self, group_size: int, gen: torch.Generator, prompts=None, temperature=1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """G answers per prompt at temperature τ: (actions [B, G] long, rewards [B, G] float64)."""
        idx = self._index(prompts)
        probs = self.log_probs(idx, temperature).exp()
        actions = torch.multinomial(probs, group_size, replacement=True, generator=gen)
        rewards = self.correct[idx].gather(1, actions).to(torch.float64)
        return actions, rewards

    def policy_gradient(
        self,
        actions,
        advantages,
        prompts=None,
        temperature=1.0,
        logits=None,
        old_logp=None,
        eps_low=0.2,
        eps_high=0.2,
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """∇_z of the clipped-surrogate loss (rlkit.losses), B·token-mean over the B·G samples.

        Returns (gradient [B, K], log π of the sampled answers [B, G], clip fraction).
        """
        idx = self._index(prompts)
        z = (self.logits[idx] if logits is None else logits).detach().requires_grad_(True)
        logp = torch.log_softmax(z / _column(temperature, z), dim=-1).gather(1, actions)
        if old_logp is None:
            old_logp = logp.detach()
        num_prompts, group_size = actions.shape
        per_sample = lambda x: _column(x, z).expand(num_prompts, group_size).reshape(-1, 1)
        loss_tok, clip = clipped_surrogate(
            logp.reshape(-1, 1),
            old_logp.reshape(-1, 1),
            advantages.to(torch.float64).reshape(-1),
            per_sample(eps_low),
            per_sample(eps_high),
        )
        mask = torch.ones_like(loss_tok, dtype=torch.bool)
        loss = num_prompts * aggregate_loss(loss_tok, mask, "token-mean")
        (grad,) = torch.autograd.grad(loss, z)
        return grad, logp.detach(), float(clip.region)

    def update(
        self,
        actions,
        advantages,
        lr: float,
        prompts=None,
        temperature=1.0,
        epochs: int = 1,
        eps_low=0.2,
        eps_high=0.2,
    ) -> StepResult:
        """``epochs`` gradient steps z ← z − lr·∇loss on one sampled batch (PPO-style reuse).

        The importance ratio uses log-probs at each prompt's sampling temperature (docs/algorithms.md §3,
        ``ratio_temperature: sampling``). With ``epochs = 1`` the ratio is 1 and the step is the
        vanilla policy gradient, which the first-order entropy theory describes.
        """
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        idx = self._index(prompts)
        start = self.logits[idx].clone()
        z, old_logp, grad_norm, clipped = start, None, None, []
        for _ in range(epochs):
            grad, logp, clip = self.policy_gradient(
                actions, advantages, idx, temperature, z, old_logp, eps_low, eps_high
            )
            if old_logp is None:
                old_logp, grad_norm = logp, grad.norm(dim=1)
            clipped.append(clip)
            z = z - lr * grad
        self.logits[idx] = z
        new_logp = torch.log_softmax(z / _column(temperature, z), dim=-1).gather(1, actions)
        return StepResult(
            delta_logits=z - start,
            grad_norm=grad_norm,
            entropy_before=entropy(start),
            entropy_after=entropy(z),
            kl=kl_divergence(old_logp, new_logp, "k1").mean(1),
            clip_fraction=torch.tensor(clipped).mean(),
        )


def _column(x, like: torch.Tensor) -> torch.Tensor:
    """A float or a per-prompt [B] tensor as a [B, 1] (or scalar) tensor for broadcasting."""
    x = torch.as_tensor(x, dtype=like.dtype)
    return x.unsqueeze(-1) if x.dim() == 1 else x
