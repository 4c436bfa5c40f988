"""Running and per-group statistics used by the estimators and controllers (docs/algorithms.md §2, §3)."""

from __future__ import annotations

import math

import torch

_ROBUST_SCALE_MAD = 1.4826  # makes MAD consistent with the std of a normal distribution
_ROBUST_SCALE_IQR = 1.349  # (q75 - q25) of a standard normal


class RunningMoments:
    """Mergeable Welford accumulators for ``num_slots`` independent streams (docs/algorithms.md §2, `history`).

    A batch is merged in one vectorized step with Chan et al.'s parallel formula::

        n = n_a + n_b,  δ = m_b − m_a,  m = m_a + δ·n_b/n,  M2 = M2_a + M2_b + δ²·n_a·n_b/n

    With ``decay`` < 1 the old count and M2 are scaled by ``decay`` before each merge (exponential
    forgetting), so the statistics follow a drifting distribution. ``decay = 1`` gives plain
    running statistics. State is float64 so long runs do not lose precision.
    """

    def __init__(self, decay: float = 1.0, num_slots: int = 1):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.decay = float(decay)
        self.count = torch.zeros(num_slots, dtype=torch.float64)
        self.mean = torch.zeros(num_slots, dtype=torch.float64)
        self.m2 = torch.zeros(num_slots, dtype=torch.float64)

    @property
    def num_slots(self) -> int:
        return self.count.numel()

    @property
    def variance(self) -> torch.Tensor:
        """Population variance M2 / n per slot (0 for an empty slot)."""
        return torch.where(self.count > 0, self.m2 / self.count.clamp_min(1e-300), 0.0)

    def grow(self, num_slots: int) -> None:
        """Add empty slots so that the accumulator holds at least ``num_slots`` streams."""
        extra = num_slots - self.num_slots
        if extra > 0:
            pad = torch.zeros(extra, dtype=torch.float64)
            self.count, self.mean, self.m2 = (torch.cat([t, pad]) for t in self.state_tensors())

    def state_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.count, self.mean, self.m2

    def update(self, values: torch.Tensor, slots: torch.Tensor | None = None) -> None:
        """Merge ``values`` (any shape) into the accumulators; ``slots`` gives each value's stream."""
        values = values.detach().reshape(-1).to(torch.float64)
        if slots is None:
            slots = torch.zeros_like(values, dtype=torch.long)
        slots = slots.reshape(-1).to(torch.long)
        if slots.shape != values.shape:
            raise ValueError(
                f"slots must have one entry per value, got {tuple(slots.shape)} for {values.numel()} values"
            )
        if values.numel() == 0:
            return
        self.grow(int(slots.max()) + 1)
        k = self.num_slots
        n_b = torch.zeros(k, dtype=torch.float64).index_add_(0, slots, torch.ones_like(values))
        sum_b = torch.zeros(k, dtype=torch.float64).index_add_(0, slots, values)
        mean_b = sum_b / n_b.clamp_min(1.0)
        m2_b = torch.zeros(k, dtype=torch.float64).index_add_(
            0, slots, (values - mean_b[slots]) ** 2
        )

        touched = n_b > 0
        n_a = torch.where(touched, self.count * self.decay, self.count)
        m2_a = torch.where(touched, self.m2 * self.decay, self.m2)
        n = n_a + n_b
        delta = mean_b - self.mean
        safe_n = n.clamp_min(1e-300)
        self.mean = torch.where(touched, self.mean + delta * n_b / safe_n, self.mean)
        self.m2 = torch.where(touched, m2_a + m2_b + delta**2 * n_a * n_b / safe_n, self.m2)
        self.count = n

    def state_dict(self) -> dict:
        return {
            "decay": self.decay,
            "count": self.count.clone(),
            "mean": self.mean.clone(),
            "m2": self.m2.clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        """A saved state, checked first: decay in (0, 1], count/mean/M2 of one shape, finite,
        count and M2 ≥ 0 (a ValueError names what breaks)."""
        decay = float(state["decay"])
        count, mean, m2 = (state[k].clone().to(torch.float64) for k in ("count", "mean", "m2"))
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"running moments: decay must be in (0, 1], got {decay}")
        if not count.shape == mean.shape == m2.shape or count.dim() != 1:
            shapes = [tuple(t.shape) for t in (count, mean, m2)]
            raise ValueError(f"running moments: count, mean, M2 of shapes {shapes}")
        if not all(torch.isfinite(t).all() for t in (count, mean, m2)):
            raise ValueError("running moments: a count, mean or M2 is not finite")
        if (count < 0).any() or (m2 < 0).any():
            raise ValueError("running moments: a negative count or M2")
        self.decay, self.count, self.mean, self.m2 = decay, count, mean, m2


class Ema:
    """Exponential moving average ``v ← (1 − rate)·v + rate·x``, initialised at the first value."""

    def __init__(self, rate: float, value: float | None = None):
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"EMA rate must be in (0, 1], got {rate}")
        self.rate = float(rate)
        self.value = value

    def update(self, x: float) -> float:
        x = float(x)
        self.value = x if self.value is None else (1.0 - self.rate) * self.value + self.rate * x
        return self.value

    def state_dict(self) -> dict:
        return {"rate": self.rate, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        rate, value = float(state["rate"]), state["value"]
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"EMA rate must be in (0, 1], got {rate}")
        if value is not None and not math.isfinite(value):
            raise ValueError(f"EMA value must be finite, got {value}")
        self.rate, self.value = rate, value


def group_std(x: torch.Tensor, dim: int = -1, ddof: int = 1) -> torch.Tensor:
    """Standard deviation with ``ddof`` (Bessel for 1); 0 where fewer than ddof + 1 values exist."""
    if ddof not in (0, 1):
        raise ValueError(f"std ddof must be 0 or 1, got {ddof}")
    n = x.shape[dim]
    if n <= ddof:
        return torch.zeros_like(x.select(dim, 0))
    return x.std(dim=dim, correction=ddof)


MAD_MEDIANS = {"midpoint": "linear", "lower": "lower"}  # mad_median → torch.quantile interpolation


def check_dispersion(kind: str, mad_median: str = "midpoint") -> None:
    """ValueError naming an unknown dispersion ``kind`` or MAD median convention."""
    if kind not in ("std", "mad", "iqr"):
        raise ValueError(f"unknown dispersion {kind!r}; known: 'std', 'mad', 'iqr'")
    if mad_median not in MAD_MEDIANS:
        raise ValueError(f"unknown mad_median {mad_median!r}; known: 'midpoint', 'lower'")


def dispersion(
    x: torch.Tensor, kind: str = "std", dim: int = -1, ddof: int = 1, mad_median: str = "midpoint"
) -> torch.Tensor:
    """Per-group dispersion (docs/algorithms.md §1 `agpo`, §3 step 1).

    - ``std``: ddof std;
    - ``mad``: 1.4826 · median(|x − median(x)|)   (scipy ``median_abs_deviation(scale='normal')``);
    - ``iqr``: (q75 − q25) / 1.349                   (scipy ``iqr(scale='normal')``, linear quantiles).

    ``mad_median`` is the MAD's median (both of them) at even group size: ``midpoint`` of the two
    middle values (scipy's), or the ``lower`` one (``torch.median``, the AGPO authors' code; on a
    half-success 0/1 group its MAD is 0, docs/algorithms.md §1).

    A robust measure that is 0 on a group whose values are not all equal falls back to the std
    (binary rewards make MAD and IQR collapse whenever one outcome is a majority).
    """
    check_dispersion(kind, mad_median)
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    if kind == "std":
        return group_std(xf, dim, ddof)
    if kind == "mad":
        how = MAD_MEDIANS[mad_median]
        med = xf.quantile(0.5, dim=dim, keepdim=True, interpolation=how)
        robust = _ROBUST_SCALE_MAD * (xf - med).abs().quantile(0.5, dim=dim, interpolation=how)
    else:
        q = xf.quantile(torch.tensor([0.25, 0.75], dtype=xf.dtype), dim=dim)
        robust = (q[1] - q[0]) / _ROBUST_SCALE_IQR
    std = group_std(xf, dim, ddof)
    return torch.where((robust <= 0) & (std > 0), std, robust).to(
        x.dtype if x.is_floating_point() else xf.dtype
    )


def adjusted_skewness(
    x: torch.Tensor, dim: int = -1, std_ddof: int = 1, clip: float = 10.0
) -> torch.Tensor:
    """Adjusted Fisher–Pearson skewness κ̃₃ (docs/algorithms.md §3 step 1)::

        κ̃₃ = √(n(n−1)) / (n−2) · mean(((x − x̄) / s)³)

    with ``s`` the ``std_ddof`` std. docs/algorithms.md §3 (and AGPO's code) use s with ddof = 1; the textbook
    G1 (scipy ``skew(bias=False)``) uses ddof = 0, i.e. it is κ̃₃(ddof=1) · (n / (n−1))^{3/2}.
    Returns 0 where s < 1e-6 or n < 3, clipped to ±``clip``.
    """
    n = x.shape[dim]
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    if n < 3:
        return torch.zeros_like(xf.select(dim, 0))
    s = group_std(xf, dim, std_ddof)
    z = (xf - xf.mean(dim=dim, keepdim=True)) / s.clamp_min(1e-6).unsqueeze(dim)
    g = math.sqrt(n * (n - 1)) / (n - 2) * (z**3).mean(dim=dim)
    return torch.where(s < 1e-6, torch.zeros_like(g), g).clamp(-clip, clip)
