"""Independent float64 reference implementations of docs/algorithms.md §1–§4 (docs/algorithms.md).

Written straight from docs/algorithms.md with plain Python/numpy loops, one group / prompt / token at a
time, and deliberately sharing no code with ``rlkit``: a vectorization, broadcasting or state
mistake in rlkit cannot hide in the reference as well. Everything takes and returns numpy float64
arrays (or Python floats). Where docs/algorithms.md leaves a detail open, the choice is stated in the
docstring (it follows rlkit's documented behaviour, so that the tests check the formula).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

MAD_SCALE = 1.4826
IQR_SCALE = 1.349


# ---------------------------------------------------------------------------------------------
# §1, §3 step 1: per-group statistics


def mean(x) -> float:
    return sum(float(v) for v in x) / len(x)


def std(x, ddof: int = 1) -> float:
    """sqrt(Σ (x − x̄)² / (n − ddof)); 0 when n ≤ ddof."""
    n = len(x)
    if n <= ddof:
        return 0.0
    m = mean(x)
    return math.sqrt(sum((float(v) - m) ** 2 for v in x) / (n - ddof))


def quantile(x, q: float) -> float:
    """Linear-interpolation quantile of the sorted values (numpy's default method)."""
    s = sorted(float(v) for v in x)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def median(x, convention: str = "midpoint") -> float:
    """The middle value; at even n the midpoint of the two middle values, or the ``lower`` one."""
    if convention == "midpoint":
        return quantile(x, 0.5)
    return sorted(float(v) for v in x)[(len(x) - 1) // 2]


def mad(x, convention: str = "midpoint") -> float:
    """1.4826 · median|x − median(x)|, both medians of the ``convention``."""
    med = median(x, convention)
    return MAD_SCALE * median([abs(float(v) - med) for v in x], convention)


def iqr(x) -> float:
    """(q75 − q25) / 1.349."""
    return (quantile(x, 0.75) - quantile(x, 0.25)) / IQR_SCALE


def dispersion(x, kind: str = "std", ddof: int = 1, mad_median: str = "midpoint") -> float:
    """std | mad | iqr; a robust measure that is 0 on a non-constant group falls back to std."""
    s = std(x, ddof)
    if kind == "std":
        return s
    robust = mad(x, mad_median) if kind == "mad" else iqr(x)
    return s if robust <= 0 and s > 0 else robust


def adjusted_skewness(x, std_ddof: int = 1, clip: float = 10.0) -> float:
    """√(n(n−1))/(n−2) · mean(((x − x̄)/s)³); 0 if s < 1e-6 or n < 3; clipped to ±clip."""
    n = len(x)
    if n < 3:
        return 0.0
    s = std(x, std_ddof)
    if s < 1e-6:
        return 0.0
    m = mean(x)
    g = math.sqrt(n * (n - 1)) / (n - 2) * mean([((float(v) - m) / s) ** 3 for v in x])
    return max(-clip, min(clip, g))


def rows(rewards) -> list[list[float]]:
    return [[float(v) for v in row] for row in np.asarray(rewards, dtype=np.float64)]


# ---------------------------------------------------------------------------------------------
# §1: group advantages


def grpo(rewards, std_ddof: int = 1, eps: float = 1e-4) -> np.ndarray:
    """A = (r − mean_p) / (std_p + eps)."""
    return np.array(
        [[(v - mean(row)) / (std(row, std_ddof) + eps) for v in row] for row in rows(rewards)]
    )


def grpo_batch_std(rewards, std_ddof: int = 1, eps: float = 1e-4) -> np.ndarray:
    """A = (r − mean_p) / (std over all P·G rewards + eps) (TRL's scale_rewards="batch")."""
    flat = [v for row in rows(rewards) for v in row]
    return np.array(
        [[(v - mean(row)) / (std(flat, std_ddof) + eps) for v in row] for row in rows(rewards)]
    )


def dr_grpo(rewards) -> np.ndarray:
    """A = r − mean_p."""
    return np.array([[v - mean(row) for v in row] for row in rows(rewards)])


def rloo(rewards) -> np.ndarray:
    """A_i = r_i − mean_{j≠i} r_j (0 for a group of one)."""
    out = []
    for row in rows(rewards):
        g = len(row)
        out.append(
            [0.0 if g == 1 else v - (sum(row) - v) / (g - 1) for v in row]
        )  # leave-one-out mean
    return np.array(out)


def agpo(rewards, kind: str = "std", mad_median: str = "midpoint") -> np.ndarray:
    """A = (r − mean_p) / max(disp_p, 1e-8)."""
    return np.array(
        [
            [(v - mean(row)) / max(dispersion(row, kind, mad_median=mad_median), 1e-8) for v in row]
            for row in rows(rewards)
        ]
    )


# ---------------------------------------------------------------------------------------------
# §2: EBPO with explicit weighted samples instead of Welford accumulators


class WeightedSamples:
    """Every value ever seen with its weight; ``add`` first multiplies old weights by ``decay``.

    This is the definition that exponential forgetting approximates in closed form: after k
    further additions a value weighs decay^k. Statistics are the weighted count, mean and
    population variance computed directly from the list.
    """

    def __init__(self, decay: float = 1.0):
        self.decay = decay
        self.values: list[float] = []
        self.weights: list[float] = []

    def add(self, values) -> None:
        values = [float(v) for v in values]
        if not values:
            return
        self.weights = [w * self.decay for w in self.weights] + [1.0] * len(values)
        self.values = self.values + values

    @property
    def count(self) -> float:
        return sum(self.weights)

    @property
    def mean(self) -> float:
        return sum(w * v for w, v in zip(self.weights, self.values)) / self.count

    @property
    def variance(self) -> float:
        m = self.mean
        return sum(w * (v - m) ** 2 for w, v in zip(self.weights, self.values)) / self.count


class EBPOReference:
    """EBPO (docs/algorithms.md §2) one prompt at a time.

    Priors: key "global" sees every batch; with cluster ids, key c sees the prompts of cluster c
    (a cluster's samples decay only when that cluster receives new data, as rlkit documents). A
    cluster whose weighted count of group means is below ``min_cluster_count`` uses "global".
    Whitening uses the ddof = 1 std over all P·G raw advantages (as verl; docs/algorithms.md leaves ddof
    open) plus 1e-6.
    """

    def __init__(self, prior="history", prior_decay=1.0, whitening="whiten", min_cluster_count=8):
        self.prior, self.decay, self.whitening = prior, prior_decay, whitening
        self.min_cluster_count = min_cluster_count
        self.rewards: dict = {}
        self.group_means: dict = {}

    def add(self, key, rewards, group_means) -> None:
        self.rewards.setdefault(key, WeightedSamples(self.decay)).add(rewards)
        self.group_means.setdefault(key, WeightedSamples(self.decay)).add(group_means)

    def __call__(self, rewards, cluster_ids=None) -> dict:
        if self.prior == "batch":
            self.rewards, self.group_means = {}, {}
        r = rows(rewards)
        g = len(r[0])
        self.add("global", [v for row in r for v in row], [mean(row) for row in r])
        if cluster_ids is not None:
            for c in sorted(set(int(c) for c in cluster_ids)):
                members = [row for row, k in zip(r, cluster_ids) if int(k) == c]
                self.add(c, [v for row in members for v in row], [mean(row) for row in members])

        out = {k: [] for k in ("shrinkage", "baseline", "prior_mean", "raw_advantages")}
        for p, row in enumerate(r):
            key = "global"
            if cluster_ids is not None:
                c = int(cluster_ids[p])
                key = c if self.group_means[c].count >= self.min_cluster_count else "global"
            mu, tau2 = self.group_means[key].mean, self.group_means[key].variance
            sigma2_over_g = self.rewards[key].variance / g
            denom = sigma2_over_g + tau2
            s = sigma2_over_g / denom if denom > 1e-6 else 1.0
            baseline = (1 - s) * mean(row) + s * mu
            out["shrinkage"].append(s)
            out["baseline"].append(baseline)
            out["prior_mean"].append(mu)
            out["raw_advantages"].append([v - baseline for v in row])
        out = {k: np.array(v) for k, v in out.items()}
        out["mu_glob"] = self.group_means["global"].mean
        out["sigma2"] = self.rewards["global"].variance
        out["tau2"] = self.group_means["global"].variance
        out["advantages"] = self.whiten(out["raw_advantages"])
        return out

    def whiten(self, raw: np.ndarray) -> np.ndarray:
        flat = [float(v) for v in raw.reshape(-1)]
        if self.whitening == "none":
            return raw.copy()
        m = mean(flat)
        if self.whitening == "center":
            return raw - m
        return (raw - m) / (std(flat, 1) + 1e-6)


# ---------------------------------------------------------------------------------------------
# §3: AGPO controllers


def vote_entropy(keys) -> float:
    """−Σ_a (n_a/G) ln(n_a/G) over the distinct answer keys of one group."""
    n = len(keys)
    return -sum(c / n * math.log(c / n) for c in Counter(keys).values())


def adaptive_temperature(
    u_values, u_bar, lam=0.15, tau_base=1.0, tau_min=0.5, tau_max=1.5, ema_rate=0.1
) -> tuple[list[float], float]:
    """τ per prompt from its U, with Ū updated sequentially after each prompt (warm-up rule)."""
    taus = []
    for u in u_values:
        if u_bar <= 1e-8:
            u_tilde, u_bar = 0.0, u
        else:
            u_tilde = (u - u_bar) / (u_bar + 1e-8)
            u_bar = (1 - ema_rate) * u_bar + ema_rate * u
        taus.append(min(tau_max, max(tau_min, tau_base * (1 + lam * u_tilde))))
    return taus, u_bar


def adaptive_clip(
    sigma,
    e_probe,
    skew,
    entropy,
    entropy_ref,
    kl,
    eps_base=0.2,
    eps_min=0.05,
    eps_max=0.4,
    alpha=1.0,
    gamma=0.5,
    delta=0.1,
    zeta=0.0,
) -> list[float]:
    """ε per prompt (docs/algorithms.md §3 step 4) for given H (one per prompt), H̄_ref and D̂_KL."""
    out = []
    for s, e, k, h in zip(sigma, e_probe, skew, entropy):
        ratio = min(1.5, max(0.5, h / max(entropy_ref, 1e-8)))
        eps = eps_base * ratio * (1 + delta * e) / (1 + alpha * s + gamma * kl + zeta * abs(k))
        out.append(min(eps_max, max(eps_min, eps)))
    return out


# ---------------------------------------------------------------------------------------------
# §4: losses


def clipped_surrogate_token(logp, old_logp, adv, eps_low, eps_high, dual_clip=None) -> float:
    """L = −min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)·A), capped at −c·A for A < 0 (dual clip)."""
    rho = math.exp(logp - old_logp)
    loss = -min(rho * adv, min(1 + eps_high, max(1 - eps_low, rho)) * adv)
    if dual_clip is not None and adv < 0:
        loss = min(loss, -dual_clip * adv)
    return loss


def k1(logp, ref_logp) -> float:
    return logp - ref_logp


def k3(logp, ref_logp) -> float:
    x = ref_logp - logp
    return math.exp(x) - x - 1


def entropy(logits) -> float:
    """−Σ p log p of softmax(logits) in float64, via the max-shifted log-softmax."""
    z = np.asarray(logits, dtype=np.float64)
    finite = z[np.isfinite(z)]
    zmax = finite.max()
    log_norm = zmax + math.log(sum(math.exp(v - zmax) for v in finite))
    return -sum(math.exp(v - log_norm) * (v - log_norm) for v in finite)


def aggregate(loss, mask, mode: str, max_len: int | None = None) -> float:
    """token-mean | seq-mean-token-mean | seq-mean-token-sum-norm over ragged rows."""
    loss, mask = np.asarray(loss, np.float64), np.asarray(mask, bool)
    per_row = [[float(v) for v, m in zip(lr, mr) if m] for lr, mr in zip(loss, mask)]
    if mode == "token-mean":
        tokens = [v for row in per_row for v in row]
        return sum(tokens) / max(len(tokens), 1)
    if mode == "seq-mean-token-mean":
        return mean([sum(row) / max(len(row), 1) for row in per_row])
    norm = loss.shape[1] if max_len is None else max_len
    return mean([sum(row) / norm for row in per_row])


# ---------------------------------------------------------------------------------------------
# DAPO


def overlong_penalty(length: float, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO eq. 13: 0 | factor·((L_max − L_buf) − L)/L_buf | −factor."""
    if length <= max_length - buffer:
        return 0.0
    if length <= max_length:
        return factor * ((max_length - buffer) - length) / buffer
    return -factor


# ---------------------------------------------------------------------------------------------
# §2b: JSPO, one prompt and one sample at a time


def jspo_lambda(v: float, s: float, k: int, rule: str, eps: float = 1e-6) -> float:
    """published: v / (v + s + eps); james_stein: min(1, max(0, (k − 3)·v / Σ_k (μ̂ − μ̄)²)),
    with Σ = k·s (1 where that sum is 0 and k > 3)."""
    if rule == "published":
        return v / (v + s + eps)
    if k <= 3:
        return 0.0
    if s == 0:
        return 1.0
    return min(1.0, (k - 3) * v / (k * s))


def jspo(rewards, rule: str = "published", eps: float = 1e-6) -> tuple[np.ndarray, list[float]]:
    """JSPO's advantages and λ per prompt: for sample j of prompt i, the statistics of the other
    prompts k ≠ i only; one prompt → λ = 0 (RLOO); G = 1 → A = 0."""
    r = rows(rewards)
    n, g = len(r), len(r[0])
    if g == 1:
        return np.zeros((n, 1)), [0.0] * n
    adv, lams = [], []
    for i in range(n):
        others = [r[k] for k in range(n) if k != i]
        if others:
            means = [mean(row) for row in others]
            m_bar = mean(means)
            v = mean([std(row) ** 2 / g for row in others])
            s = mean([(x - m_bar) ** 2 for x in means])
            lam = jspo_lambda(v, s, len(others), rule, eps)
        else:
            lam, m_bar = 0.0, 0.0
        lams.append(lam)
        adv.append(
            [
                r[i][j] - ((1 - lam) * (sum(r[i]) - r[i][j]) / (g - 1) + lam * m_bar)
                for j in range(g)
            ]
        )
    return np.array(adv), lams


class JSPOPlusPlusReference:
    """JSPO++ with the published smoothing written as its definition: the whole history of λ and
    r̄ re-weighted each step (wandb's time-weighted EMA, point i of n weighted by the product of
    w^(1642.65/(l − 1)) over l = i + 1 … n, w = min(√coef, 0.999))."""

    def __init__(self, smooth_coef: float = 0.0, rule: str = "published", eps: float = 1e-6):
        self.coef, self.rule, self.eps = smooth_coef, rule, eps
        self.history: list[tuple[float, float]] = []

    def ema(self, values: list[float]) -> float:
        w = min(math.sqrt(self.coef), 0.999)
        n = len(values)
        weights = [
            math.prod(w ** (1642.65 / (t - 1)) for t in range(i + 1, n + 1))
            for i in range(1, n + 1)
        ]
        return sum(a * b for a, b in zip(weights, values)) / sum(weights)

    def __call__(self, rewards) -> tuple[np.ndarray, float]:
        r = rows(rewards)
        n, g = len(r), len(r[0])
        flat = [v for row in r for v in row]
        r_bar = mean(flat)
        v = mean([std(row) ** 2 / g for row in r])
        s = mean([(mean(row) - r_bar) ** 2 for row in r])
        lam = jspo_lambda(v, s, n, self.rule, self.eps)
        self.history.append((lam, r_bar))
        if self.coef > 0:
            lam = self.ema([h[0] for h in self.history])
            r_bar = self.ema([h[1] for h in self.history])
        if g == 1:
            return np.zeros((n, 1)), lam
        adv = [
            [row[j] - ((1 - lam) * (sum(row) - row[j]) / (g - 1) + lam * r_bar) for j in range(g)]
            for row in r
        ]
        return np.array(adv), lam


# ---------------------------------------------------------------------------------------------
# §4b: EntropyMech, one token at a time


def token_covariances(logp, adv, mask) -> dict[tuple[int, int], float]:
    """cov_t = (A_t − mean A)(log π_t − mean log π) for every real token (b, t), means over the
    real tokens; ``adv`` one value per row."""
    tokens = [
        (b, t) for b in range(len(mask)) for t in range(len(mask[b])) if float(mask[b][t]) > 0
    ]
    a_bar = mean([float(adv[b]) for b, _ in tokens])
    l_bar = mean([float(logp[b][t]) for b, t in tokens])
    return {(b, t): (float(adv[b]) - a_bar) * (float(logp[b][t]) - l_bar) for b, t in tokens}


def clip_cov_candidates(logp, old_logp, adv, mask, eps_low, eps_high, lb, ub) -> list:
    """Real tokens, row-major, with lb < cov < ub whose ratio was not clipped (A > 0 and
    ρ > 1 + ε_high, or A < 0 and ρ < 1 − ε_low)."""
    cov = token_covariances(logp, adv, mask)
    out = []
    for (b, t), c in cov.items():
        rho = math.exp(float(logp[b][t]) - float(old_logp[b][t]))
        a = float(adv[b])
        clipped = (a > 0 and rho > 1 + eps_high) or (a < 0 and rho < 1 - eps_low)
        if lb < c < ub and not clipped:
            out.append((b, t))
    return out


def kl_cov_tokens(logp, old_logp, adv, mask, ratio: float, coef: float) -> np.ndarray:
    """−ρ·A on every token, + coef·|log π − log π_old| on the ⌊ratio·N⌋ (≥ 1) largest-cov ones."""
    cov = token_covariances(logp, adv, mask)
    count = max(1, int(len(cov) * ratio))
    top = set(sorted(cov, key=lambda bt: -cov[bt])[:count])
    out = np.zeros((len(logp), len(logp[0])))
    for b in range(len(logp)):
        for t in range(len(logp[0])):
            d = float(logp[b][t]) - float(old_logp[b][t])
            out[b, t] = -float(adv[b]) * math.exp(d) + (coef * abs(d) if (b, t) in top else 0.0)
    return out
