"""AGPO controllers: adaptive sampling temperature (ATS) and adaptive clip radius (docs/algorithms.md §3).

Both are fed by a :class:`ProbeStats` record computed from a probe group of G completions per
prompt, and return one value per prompt. They are small stateful objects with ``state_dict`` so a
resumed run continues with the same EMAs.

``ema_update`` picks when the running averages Ū (temperature) and H̄_ref (clip) are read and
written within one call, i.e. one step's prompts over every rank (docs/algorithms.md §3,
"Running averages"):

- ``per_prompt`` (default): Ū is read and updated prompt by prompt, as the authors' code at
  commit 11e5596 does; H̄_ref is read once and updated once from the batch mean of H, initialised
  at the first batch's mean (rlkit's convention).
- ``per_minibatch``: every prompt reads the same frozen copy of Ū and of H̄_ref, and each is
  updated once from the batch mean, as the authors' code at commit d6676b8 does
  (``update_ema_from_batch`` in ``src/llamafactory/train/agpo/trainer.py``). Warm-up: while the
  copy is ≤ 1e-8, every prompt's Ũ is 0, every prompt's H is its own reference (ratio 1), and the
  average is set to the batch mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlkit.answers import vote_entropy
from rlkit.stats import Ema, adjusted_skewness, dispersion

EMA_FLOOR = 1e-8  # Ū (both rules) or H̄_ref (per_minibatch) at or below this: not initialised


@dataclass
class ProbeStats:
    """Per-prompt probe statistics (docs/algorithms.md §3 step 1): σ̂, κ̃₃ and E_probe, each of shape [P]."""

    dispersion: torch.Tensor
    skewness: torch.Tensor
    vote_entropy: torch.Tensor

    @classmethod
    def from_rewards(
        cls,
        rewards: torch.Tensor,
        answers: Sequence[Sequence[str]] | None = None,
        dispersion_kind: str = "std",
        mad_median: str = "midpoint",
    ) -> ProbeStats:
        """σ̂ = dispersion of each probe group (``mad_median`` as in ``rlkit.stats.dispersion``),
        κ̃₃ = its adjusted skewness, E_probe = vote entropy of its extracted answers (0 when
        ``answers`` is None)."""
        if rewards.dim() != 2:
            raise ValueError(
                f"probe rewards must have rank 2 [P, G], got shape {tuple(rewards.shape)}"
            )
        rewards = rewards.to(torch.float32)
        num_prompts = rewards.shape[0]
        if answers is None:
            entropy = torch.zeros(num_prompts)
        else:
            if len(answers) != num_prompts:
                raise ValueError(
                    f"answers must hold one group per prompt: {len(answers)} != {num_prompts}"
                )
            entropy = vote_entropy(answers)
        return cls(
            dispersion=dispersion(rewards, dispersion_kind, dim=1, ddof=1, mad_median=mad_median),
            skewness=adjusted_skewness(rewards, dim=1),
            vote_entropy=entropy,
        )

    def select(self, index: torch.Tensor) -> ProbeStats:
        """The statistics of the prompts ``index`` (indices or a boolean mask)."""
        return ProbeStats(self.dispersion[index], self.skewness[index], self.vote_entropy[index])

    @classmethod
    def cat(cls, parts: Sequence[ProbeStats]) -> ProbeStats:
        return cls(
            *(
                torch.cat([getattr(p, f) for p in parts])
                for f in ("dispersion", "skewness", "vote_entropy")
            )
        )

    @classmethod
    def zeros(cls, num_prompts: int) -> ProbeStats:
        """No information: every controller then falls back to its base value."""
        return cls(torch.zeros(num_prompts), torch.zeros(num_prompts), torch.zeros(num_prompts))


def _check_range(name: str, low: float, high: float) -> None:
    if not 0 < low <= high:
        raise ValueError(f"{name} bounds must satisfy 0 < min <= max, got min={low}, max={high}")


def _check_nonnegative(**values: float) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def _choose_rule(key: str, name: str, rules: dict):
    if name not in rules:
        raise ValueError(f"{key} must be one of {', '.join(rules)}, got {name!r}")
    return rules[name]


def centre_per_prompt(u: list[float], u_bar: float, rate: float) -> tuple[list[float], float]:
    """Ũ of each prompt against Ū as the prompts before it left it, and the final Ū: the authors'
    ``compute_centered_uncertainty`` called prompt by prompt (commit 11e5596)."""
    u_tilde = []
    for u_p in u:
        if u_bar <= EMA_FLOOR:
            u_tilde.append(0.0)
            u_bar = u_p
            continue
        u_tilde.append((u_p - u_bar) / (u_bar + EMA_FLOOR))
        u_bar = (1 - rate) * u_bar + rate * u_p
    return u_tilde, u_bar


def centre_per_minibatch(u: list[float], u_bar: float, rate: float) -> tuple[list[float], float]:
    """Ũ of every prompt against the same Ū, then Ū ← EMA of the batch mean of U (mean ``Σ/n``
    summed in order): the authors' snapshot and ``update_ema_from_batch`` (commit d6676b8)."""
    if not u:
        return [], u_bar
    mean = sum(u) / len(u)
    if u_bar <= EMA_FLOOR:
        return [0.0] * len(u), mean
    return [(u_p - u_bar) / (u_bar + EMA_FLOOR) for u_p in u], (1 - rate) * u_bar + rate * mean


def relative_entropy_batch_mean(entropy: torch.Tensor, ref: Ema) -> torch.Tensor:
    """H / max(H̄_ref, 1e-8) with H̄_ref initialised at the first batch mean of H, then H̄_ref
    takes in this batch's mean (rlkit's convention, ``ema_update=per_prompt``)."""
    if ref.value is None:
        ref.update(entropy.mean())
    ratio = entropy / max(ref.value, EMA_FLOOR)
    ref.update(entropy.mean())
    return ratio


def relative_entropy_snapshot(entropy: torch.Tensor, ref: Ema) -> torch.Tensor:
    """max(H, 1e-8) / max(H̄_ref, 1e-8) against one frozen H̄_ref, each prompt's own H while
    H̄_ref ≤ 1e-8; then H̄_ref ← EMA of the batch mean of H, or the mean itself while ≤ 1e-8
    (commit d6676b8: ``entropy_ref_snapshot``, ``update_ema_from_batch``). In float64, as
    theirs, rounded to float32."""
    h = entropy.to(torch.float64)
    values = h.reshape(-1).tolist()
    warm = ref.value is None or ref.value <= EMA_FLOOR
    reference = h if warm else torch.full_like(h, ref.value)
    ratio = h.clamp_min(EMA_FLOOR) / reference.clamp_min(EMA_FLOOR)
    if warm:
        ref.value = None  # the next update sets it to the mean
    ref.update(sum(values) / len(values))
    return ratio.to(torch.float32)


CENTRE_UNCERTAINTY = {"per_prompt": centre_per_prompt, "per_minibatch": centre_per_minibatch}
RELATIVE_ENTROPY = {
    "per_prompt": relative_entropy_batch_mean,
    "per_minibatch": relative_entropy_snapshot,
}
EMA_UPDATES = tuple(CENTRE_UNCERTAINTY)


class AdaptiveTemperature:
    """Adaptive temperature sampling (docs/algorithms.md §3 step 2)::

        U  = w_r·σ̂ + w_e·E_probe + w_k·|κ̃₃|
        Ũ  = (U − Ū) / (Ū + 1e-8)
        τ  = clip(τ_base · (1 + λ·Ũ), τ_min, τ_max)

    Ū is an EMA (``ema_rate``) of U. ``ema_update="per_prompt"``: updated prompt by prompt, after
    that prompt's τ is computed; warm-up: while Ū ≤ 1e-8, Ũ = 0 and Ū ← U (commit 11e5596).
    ``"per_minibatch"``: every prompt of the call reads the same Ū, then Ū ← EMA of the batch mean
    of U; warm-up: while Ū ≤ 1e-8, Ũ = 0 for the whole batch and Ū ← mean U (commit d6676b8).
    """

    def __init__(
        self,
        w_dispersion: float = 1.0,
        w_entropy: float = 1.0,
        w_skew: float = 0.0,
        lam: float = 0.15,
        tau_base: float = 1.0,
        tau_min: float = 0.5,
        tau_max: float = 1.5,
        ema_rate: float = 0.1,
        ema_update: str = "per_prompt",
    ):
        _check_range("temperature", tau_min, tau_max)
        _check_nonnegative(w_dispersion=w_dispersion, w_entropy=w_entropy, w_skew=w_skew, lam=lam)
        if tau_base <= 0:
            raise ValueError(f"tau_base must be > 0, got {tau_base}")
        if not 0 < ema_rate <= 1:
            raise ValueError(f"ema_rate must be in (0, 1], got {ema_rate}")
        self.centre = _choose_rule("ema_update", ema_update, CENTRE_UNCERTAINTY)
        self.w = (w_dispersion, w_entropy, w_skew)
        self.lam, self.tau_base, self.tau_min, self.tau_max = lam, tau_base, tau_min, tau_max
        self.ema_rate = ema_rate
        self.u_bar = 0.0

    def uncertainty(self, stats: ProbeStats) -> torch.Tensor:
        w_r, w_e, w_k = self.w
        return w_r * stats.dispersion + w_e * stats.vote_entropy + w_k * stats.skewness.abs()

    def __call__(self, stats: ProbeStats) -> torch.Tensor:
        u = self.uncertainty(stats).to(torch.float64)
        u_tilde, self.u_bar = self.centre(u.tolist(), self.u_bar, self.ema_rate)
        u_tilde = torch.tensor(u_tilde, dtype=torch.float64)
        tau = self.tau_base * (1 + self.lam * u_tilde)
        self.last_u, self.last_u_tilde = u.to(torch.float32), u_tilde.to(torch.float32)
        return tau.clamp(self.tau_min, self.tau_max).to(torch.float32)

    def state_dict(self) -> dict:
        return {"u_bar": self.u_bar}

    def load_state_dict(self, state: dict) -> None:
        u_bar = float(state["u_bar"])
        if not (math.isfinite(u_bar) and u_bar >= 0):  # an EMA of uncertainties, each >= 0
            raise ValueError(f"AGPO's running uncertainty Ū must be finite and >= 0, got {u_bar}")
        self.u_bar = u_bar


class AdaptiveClip:
    """Adaptive clip radius, used symmetrically as [1 − ε, 1 + ε] (docs/algorithms.md §3 step 4)::

        ε = clip( ε_base · clip(H / H̄_ref, 0.5, 1.5) · (1 + δ·E_probe)
                  / (1 + α·σ̂ + γ·D̂_KL + ζ·|κ̃₃|),  ε_min, ε_max )

    H is the mean token entropy of the pre-update policy on the training completions (a scalar or
    one value per prompt), H̄_ref an EMA of its batch mean (rate ``entropy_ema_rate``), read once
    per call and updated after use. ``ema_update="per_prompt"``: H̄_ref is initialised at the first
    batch mean, which that batch's ratio already reads. ``"per_minibatch"`` (commit d6676b8):
    while H̄_ref ≤ 1e-8 each prompt's H is its own reference and H̄_ref ← the batch mean; the ratio
    is max(H, 1e-8) / max(H̄_ref, 1e-8). D̂_KL is an EMA (rate ``kl_ema_rate``) of the
    post-update drift: :meth:`update_kl` receives the per-prompt k1 estimates
    mean_t(log π_old − log π_new), clamps them at 0 and feeds their batch mean, so each step's ε
    uses the previous step's drift (docs/algorithms.md §3 step 5).

    ``entropy_ratio=False`` replaces clip(H / H̄_ref, 0.5, 1.5) by 1: the policy-entropy signal
    left out (notebook 09's leave-one-out; α, γ, δ, ζ = 0 leave out the others).
    """

    def __init__(
        self,
        eps_base: float = 0.2,
        eps_min: float = 0.05,
        eps_max: float = 0.4,
        alpha: float = 1.0,
        gamma: float = 0.5,
        delta: float = 0.1,
        zeta: float = 0.0,
        entropy_ema_rate: float = 0.01,
        kl_ema_rate: float = 0.1,
        entropy_ratio: bool = True,
        ema_update: str = "per_prompt",
    ):
        _check_range("clip epsilon", eps_min, eps_max)
        if not isinstance(entropy_ratio, bool):
            raise ValueError(f"entropy_ratio must be true or false, got {entropy_ratio!r}")
        _check_nonnegative(alpha=alpha, gamma=gamma, delta=delta, zeta=zeta)
        if eps_base <= 0:
            raise ValueError(f"eps_base must be > 0, got {eps_base}")
        self.eps_base, self.eps_min, self.eps_max = eps_base, eps_min, eps_max
        self.alpha, self.gamma, self.delta, self.zeta = alpha, gamma, delta, zeta
        self.entropy_ratio = entropy_ratio
        self.relative_entropy = _choose_rule("ema_update", ema_update, RELATIVE_ENTROPY)
        self.entropy_ref = Ema(entropy_ema_rate)
        self.kl = Ema(kl_ema_rate, value=0.0)

    def __call__(self, stats: ProbeStats, entropy: torch.Tensor | float) -> torch.Tensor:
        entropy = torch.as_tensor(entropy, dtype=torch.float32)
        ratio = self.relative_entropy(entropy, self.entropy_ref).clamp(0.5, 1.5)
        if not self.entropy_ratio:
            ratio = torch.ones_like(ratio)
        numerator = self.eps_base * ratio * (1 + self.delta * stats.vote_entropy)
        denominator = (
            1
            + self.alpha * stats.dispersion
            + self.gamma * self.kl.value
            + self.zeta * stats.skewness.abs()
        )
        self.last_eps = (
            (numerator / denominator).clamp(self.eps_min, self.eps_max).to(torch.float32)
        )
        return self.last_eps

    def update_kl(self, kl_per_prompt: torch.Tensor) -> float:
        """Feed the post-update k1 drift of each prompt; returns the new D̂_KL."""
        return self.kl.update(torch.as_tensor(kl_per_prompt).clamp_min(0).mean())

    def state_dict(self) -> dict:
        return {"entropy_ref": self.entropy_ref.state_dict(), "kl": self.kl.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.entropy_ref.load_state_dict(state["entropy_ref"])
        self.kl.load_state_dict(state["kl"])
