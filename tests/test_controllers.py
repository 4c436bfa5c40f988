"""rlkit.controllers: ProbeStats, adaptive temperature (ATS) and adaptive clip (docs/algorithms.md §3)."""

import copy
import io
import math

import numpy as np
import pytest
import reference as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.controllers import EMA_UPDATES, AdaptiveClip, AdaptiveTemperature, ProbeStats


def stats(dispersion, entropy=None, skewness=None) -> ProbeStats:
    d = torch.tensor(dispersion, dtype=torch.float32)
    zeros = torch.zeros_like(d)
    e = zeros if entropy is None else torch.tensor(entropy, dtype=torch.float32)
    k = zeros if skewness is None else torch.tensor(skewness, dtype=torch.float32)
    return ProbeStats(dispersion=d, skewness=k, vote_entropy=e)


def random_stats(g: torch.Generator, num_prompts: int) -> ProbeStats:
    return ProbeStats(
        dispersion=torch.rand(num_prompts, generator=g) * 0.6,
        skewness=torch.randn(num_prompts, generator=g) * 3,
        vote_entropy=torch.rand(num_prompts, generator=g) * math.log(8),
    )


def round_trip(state: dict) -> dict:
    """Through torch.save / torch.load(weights_only=True), as a checkpoint would go."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# ---------------------------------------------------------------------------------------------
# ProbeStats


def test_probe_stats_from_rewards_match_reference():
    g = torch.Generator().manual_seed(0)
    rewards = torch.bernoulli(torch.rand(6, 1, generator=g).expand(6, 8), generator=g)
    rewards[0] = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1.0])
    answers = [[str(int(v)) for v in torch.randint(0, 3, (8,), generator=g)] for _ in range(6)]
    for kind in ("std", "mad", "iqr"):
        s = ProbeStats.from_rewards(rewards, answers, dispersion_kind=kind)
        rows = rewards.tolist()
        assert s.dispersion.tolist() == pytest.approx([ref.dispersion(r, kind) for r in rows])
        assert s.skewness.tolist() == pytest.approx([ref.adjusted_skewness(r) for r in rows])
        assert s.vote_entropy.tolist() == pytest.approx([ref.vote_entropy(a) for a in answers])
    # [0×6, 1×2]: mean .25, Bessel std √(.1875·8/7); skewness > 0 (a right tail of successes)
    assert s.dispersion[0].item() > 0 and s.skewness[0].item() > 0
    no_answers = ProbeStats.from_rewards(rewards)
    assert no_answers.vote_entropy.tolist() == [0.0] * 6


def test_probe_stats_mad_median_lower_leaves_a_half_success_probe_at_the_std():
    # [0, 0, 1, 1]: midpoint MAD 1.4826·.5; lower median 0 → MAD 0 → the std √(1/3)
    rewards = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    for convention, expected in [("midpoint", 1.4826 * 0.5), ("lower", math.sqrt(1 / 3))]:
        s = ProbeStats.from_rewards(rewards, dispersion_kind="mad", mad_median=convention)
        assert s.dispersion.tolist() == pytest.approx([expected], rel=1e-6)


def test_probe_stats_bad_input():
    with pytest.raises(ValueError, match="rank 2"):
        ProbeStats.from_rewards(torch.zeros(8))
    with pytest.raises(ValueError, match="one group per prompt"):
        ProbeStats.from_rewards(torch.zeros(2, 4), answers=[["1"] * 4])
    with pytest.raises(ValueError, match="unknown dispersion"):
        ProbeStats.from_rewards(torch.zeros(2, 4), dispersion_kind="range")


# ---------------------------------------------------------------------------------------------
# AdaptiveTemperature


def test_ats_hand_example():
    # U = σ̂ (w_e·E = 0 here): [1, 2, .5], λ = .15, EMA rate .1.
    # p0: warm-up → τ = τ_base = 1, Ū = 1.  p1: Ũ = (2 − 1)/(1 + 1e-8) → τ = 1.15, Ū = .9 + .2 = 1.1.
    # p2: Ũ = (.5 − 1.1)/1.1 = −6/11 → τ = 1 − .15·6/11, Ū = .99 + .05 = 1.04.
    ats = AdaptiveTemperature()
    tau = ats(stats([1.0, 2.0, 0.5]))
    assert tau.tolist() == pytest.approx([1.0, 1.15, 1 - 0.15 * 6 / 11], rel=1e-6)
    assert ats.u_bar == pytest.approx(1.04)
    # U combines the three terms: w_r·σ̂ + w_e·E + w_k·|κ̃₃| = .5·.2 + 2·.3 + 1·|−.4| = 1.1
    weighted = AdaptiveTemperature(w_dispersion=0.5, w_entropy=2.0, w_skew=1.0)
    weighted(stats([0.2], [0.3], [-0.4]))
    assert weighted.u_bar == pytest.approx(1.1, rel=1e-6)


def test_ats_warm_up_persists_while_u_is_zero():
    # U = 0 keeps Ū = 0 (≤ 1e-8), so every prompt is still in warm-up until the first U > 0.
    ats = AdaptiveTemperature(tau_base=0.9)
    tau = ats(stats([0.0, 0.0, 0.4, 0.8]))
    assert tau[:3].tolist() == pytest.approx([0.9, 0.9, 0.9])
    assert tau[3].item() == pytest.approx(0.9 * (1 + 0.15 * 1.0), rel=1e-6)  # Ũ = (.8 − .4)/.4


def test_ats_heats_above_and_cools_below_the_running_uncertainty():
    ats = AdaptiveTemperature()
    ats(stats([0.5]))  # Ū = .5
    tau = ats(stats([1.0, 0.5, 0.1]))
    assert tau[0].item() > 1.0  # more uncertain than usual → hotter
    assert tau[2].item() < 1.0  # less uncertain → cooler
    # τ is monotone in U for a fixed Ū
    a, b = AdaptiveTemperature(), AdaptiveTemperature()
    for c in (a, b):
        c(stats([0.5]))
    assert a(stats([0.7])).item() > b(stats([0.6])).item()


def test_ats_matches_reference_over_steps():
    g = torch.Generator().manual_seed(1)
    options = dict(lam=0.3, tau_base=0.8, tau_min=0.4, tau_max=1.6, ema_rate=0.2)
    weights = dict(w_dispersion=1.0, w_entropy=0.5, w_skew=0.1)
    ats, u_bar = AdaptiveTemperature(**weights, **options), 0.0
    for step in range(6):
        s = random_stats(g, 1 + 3 * step)
        u = (s.dispersion + 0.5 * s.vote_entropy + 0.1 * s.skewness.abs()).tolist()
        expected, u_bar = ref.adaptive_temperature(u, u_bar, **options)
        assert ats(s).tolist() == pytest.approx(expected, rel=1e-6)
        assert ats.u_bar == pytest.approx(u_bar, rel=1e-6)


@pytest.mark.parametrize("rule", EMA_UPDATES)
def test_ats_state_dict_round_trip_continues_identically(rule):
    g = torch.Generator().manual_seed(2)
    batches = [random_stats(g, 5) for _ in range(4)]
    a = AdaptiveTemperature(ema_update=rule)
    for s in batches[:2]:
        a(s)
    b = AdaptiveTemperature(ema_update=rule)
    b.load_state_dict(round_trip(a.state_dict()))
    fresh = AdaptiveTemperature(ema_update=rule)
    for s in batches[2:]:
        assert torch.equal(a(s), b(s))
    assert not torch.equal(fresh(batches[3]), a(batches[3]))


@settings(max_examples=100, deadline=None)
@given(
    batches=st.lists(
        st.lists(
            st.tuples(st.floats(0, 1e6), st.floats(0, math.log(64)), st.floats(-10, 10)),
            min_size=1,
            max_size=8,
        ),
        min_size=1,
        max_size=4,
    ),
    lam=st.floats(0, 5),
    bounds=st.tuples(st.floats(0.05, 2), st.floats(0.05, 2)).map(sorted),
    w_skew=st.floats(0, 2),
)
def test_ats_stays_within_its_clip_bounds(batches, lam, bounds, w_skew):
    ats = AdaptiveTemperature(w_skew=w_skew, lam=lam, tau_min=bounds[0], tau_max=bounds[1])
    for batch in batches:
        d, e, k = zip(*batch)
        tau = ats(stats(list(d), list(e), list(k)))
        assert tau.shape == (len(batch),)
        assert torch.isfinite(tau).all()
        assert (tau >= np.float32(bounds[0])).all() and (tau <= np.float32(bounds[1])).all()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(tau_min=1.2, tau_max=0.8), "temperature bounds"),
        (dict(tau_min=0.0), "temperature bounds"),
        (dict(w_dispersion=-1.0), "w_dispersion"),
        (dict(w_entropy=-0.1), "w_entropy"),
        (dict(w_skew=-0.1), "w_skew"),
        (dict(lam=-0.15), "lam"),
        (dict(tau_base=0.0), "tau_base"),
        (dict(ema_rate=-0.1), "ema_rate"),
        (dict(ema_rate=1.5), "ema_rate"),
        (dict(ema_update="per_step"), "ema_update must be one of per_prompt, per_minibatch"),
    ],
)
def test_ats_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveTemperature(**options)


# ---------------------------------------------------------------------------------------------
# AdaptiveClip


def test_adaptive_clip_without_the_entropy_ratio_ignores_the_policy_entropy():
    # same inputs as the hand example: with the H/H̄_ref factor fixed at 1, ε0 = .2·(1 + .1 ln 2)/1.5
    # and ε1 = .2, whatever H is
    clip = AdaptiveClip(entropy_ratio=False)
    eps = clip(stats([0.5, 0.0], [math.log(2), 0.0]), torch.tensor([1.0, 2.0]))
    assert eps.tolist() == pytest.approx([0.2 * (1 + 0.1 * math.log(2)) / 1.5, 0.2], rel=1e-6)
    assert clip(stats([0.0]), 100.0).item() == pytest.approx(0.2)
    with_ratio = AdaptiveClip()  # H̄_ref starts at H = 1, so H = 100 hits the 1.5 cap
    with_ratio(stats([0.0]), 1.0)
    assert with_ratio(stats([0.0]), 100.0).item() == pytest.approx(0.3)
    with pytest.raises(ValueError, match="entropy_ratio"):
        AdaptiveClip(entropy_ratio="no")


def test_adaptive_clip_hand_example():
    # σ̂ = [.5, 0], E = [ln 2, 0], H = [1, 2] → H̄_ref initialised at mean(H) = 1.5, D̂_KL = 0:
    # ε0 = .2·(1/1.5)·(1 + .1 ln 2)/(1 + .5);  ε1 = .2·(2/1.5)·1/1 = .2667.
    clip = AdaptiveClip()
    eps = clip(stats([0.5, 0.0], [math.log(2), 0.0]), torch.tensor([1.0, 2.0]))
    e0 = 0.2 * (1 / 1.5) * (1 + 0.1 * math.log(2)) / 1.5
    assert eps.tolist() == pytest.approx([e0, 0.2 * 2 / 1.5], rel=1e-6)
    assert clip.entropy_ref.value == pytest.approx(1.5)  # EMA of 1.5 with itself
    # update_kl: per-prompt k1 [.2, −.1] clamped → [.2, 0], mean .1; EMA from 0 at rate .1 → .01
    assert clip.update_kl(torch.tensor([0.2, -0.1])) == pytest.approx(0.01)
    # next step: H = 2 (scalar) against H̄_ref = 1.5 (updated after use → .99·1.5 + .01·2);
    # ε = .2·(2/1.5)/(1 + .3 + .5·.01) for σ̂ = .3
    eps = clip(stats([0.3]), 2.0)
    assert eps.item() == pytest.approx(0.2 * (2 / 1.5) / (1 + 0.3 + 0.5 * 0.01), rel=1e-6)
    assert clip.entropy_ref.value == pytest.approx(0.99 * 1.5 + 0.01 * 2.0)


def test_adaptive_clip_is_clipped_to_its_bounds_and_entropy_ratio_to_half_and_1_5():
    # ratio H/H̄_ref is clipped to [.5, 1.5]: H = [10, .01] against H̄_ref = 5.005
    clip = AdaptiveClip(eps_min=1e-6, eps_max=10.0)
    eps = clip(stats([0.0, 0.0]), torch.tensor([10.0, 0.01]))
    assert eps.tolist() == pytest.approx([0.2 * 1.5, 0.2 * 0.5], rel=1e-6)
    # the default bounds: a very noisy prompt hits ε_min = .05, a high-entropy one ε_max = .4
    clip = AdaptiveClip(eps_base=0.35)
    clip(stats([0.0]), 1.0)
    eps = clip(stats([50.0, 0.0]), torch.tensor([1.0, 1.5]))
    assert eps.tolist() == pytest.approx([0.05, 0.4])


def adaptive_eps(sigma=0.2, e_probe=0.5, h=1.0, kl=0.0, skew=0.0, zeta=0.0) -> float:
    """ε for one prompt with H̄_ref = 1 and D̂_KL = kl, bounds wide open."""
    clip = AdaptiveClip(eps_min=1e-6, eps_max=10.0, zeta=zeta)
    clip.entropy_ref.update(1.0)
    clip.kl.value = kl
    return clip(stats([sigma], [e_probe], [skew]), torch.tensor([h])).item()


def test_adaptive_clip_monotonicity():
    base = adaptive_eps()
    assert adaptive_eps(sigma=0.6) < base  # noisier rewards → tighter trust region
    assert adaptive_eps(kl=0.4) < base  # recent drift → tighter
    assert adaptive_eps(e_probe=1.5) > base  # disagreeing answers → wider (explore)
    assert adaptive_eps(h=1.3) > base > adaptive_eps(h=0.7)  # entropy above its reference → wider
    assert adaptive_eps(skew=5.0) == base  # ζ = 0 (reserved) by default
    assert adaptive_eps(skew=5.0, zeta=0.1) < adaptive_eps(zeta=0.1)


def test_adaptive_clip_matches_reference_over_steps():
    g = torch.Generator().manual_seed(3)
    options = dict(eps_base=0.25, alpha=0.8, gamma=2.0, delta=0.3, zeta=0.05)
    clip = AdaptiveClip(**options, entropy_ema_rate=0.2, kl_ema_rate=0.5)
    h_ref, kl = None, 0.0
    for step in range(6):
        p = 2 + step
        s = random_stats(g, p)
        h = torch.rand(p, generator=g) * 2 + 0.1
        h_ref = h.mean().item() if h_ref is None else h_ref
        expected = ref.adaptive_clip(
            sigma=s.dispersion.tolist(),
            e_probe=s.vote_entropy.tolist(),
            skew=s.skewness.tolist(),
            entropy=h.tolist(),
            entropy_ref=h_ref,
            kl=kl,
            **options,
        )
        assert clip(s, h).tolist() == pytest.approx(expected, rel=1e-5)
        h_ref = 0.8 * h_ref + 0.2 * h.mean().item()
        drift = torch.randn(p, generator=g) * 0.05
        kl = 0.5 * kl + 0.5 * drift.clamp_min(0).mean().item()
        assert clip.update_kl(drift) == pytest.approx(kl, rel=1e-6)
        assert clip.entropy_ref.value == pytest.approx(h_ref, rel=1e-6)


@pytest.mark.parametrize("rule", EMA_UPDATES)
def test_adaptive_clip_state_dict_round_trip_continues_identically(rule):
    g = torch.Generator().manual_seed(4)
    steps = [
        (random_stats(g, 4), torch.rand(4, generator=g) + 0.5, torch.randn(4, generator=g))
        for _ in range(4)
    ]
    a = AdaptiveClip(ema_update=rule)
    for s, h, kl in steps[:2]:
        a(s, h)
        a.update_kl(kl)
    b = AdaptiveClip(ema_update=rule)
    b.load_state_dict(round_trip(copy.deepcopy(a.state_dict())))
    fresh = AdaptiveClip(ema_update=rule)
    for s, h, kl in steps[2:]:
        assert torch.equal(a(s, h), b(s, h))
        assert a.update_kl(kl) == b.update_kl(kl)
    s, h, _ = steps[0]
    assert not torch.equal(fresh(s, h * 3), a(s, h * 3))


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(
                st.tuples(st.floats(0, 1e6), st.floats(0, math.log(64)), st.floats(0, 20)),
                min_size=1,
                max_size=6,
            ),
            st.floats(-5, 5),  # the drift fed to update_kl
        ),
        min_size=1,
        max_size=4,
    ),
    bounds=st.tuples(st.floats(0.01, 1), st.floats(0.01, 1)).map(sorted),
    eps_base=st.floats(0.01, 5),
)
def test_adaptive_clip_stays_within_its_clip_bounds(steps, bounds, eps_base):
    clip = AdaptiveClip(eps_base=eps_base, eps_min=bounds[0], eps_max=bounds[1], zeta=0.1)
    for batch, drift in steps:
        d, e, h = zip(*batch)
        eps = clip(stats(list(d), list(e)), torch.tensor(h))
        assert torch.isfinite(eps).all()
        assert (eps >= np.float32(bounds[0])).all() and (eps <= np.float32(bounds[1])).all()
        assert clip.update_kl(torch.tensor([drift])) >= 0


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(eps_min=0.3, eps_max=0.2), "clip epsilon bounds"),
        (dict(eps_min=0.0), "clip epsilon bounds"),
        (dict(eps_base=0.0), "eps_base"),
        (dict(alpha=-1.0), "alpha"),
        (dict(gamma=-0.5), "gamma"),
        (dict(delta=-0.1), "delta"),
        (dict(zeta=-0.1), "zeta"),
        (dict(entropy_ema_rate=-0.01), "rate"),
        (dict(kl_ema_rate=0.0), "rate"),
        (dict(ema_update="per_step"), "ema_update must be one of per_prompt, per_minibatch"),
    ],
)
def test_adaptive_clip_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveClip(**options)


# ---------------------------------------------------------------------------------------------
# The running averages against the AGPO authors' code (docs/algorithms.md §3, "Running averages")
#
# Transcribed from github.com/wandugu/paper_agpo, src/llamafactory/train/agpo/trainer.py:
# ``compute_centered_uncertainty``, ``compute_adaptive_temperature``, ``compute_adaptive_clip``
# (the same at commits 11e5596 and d6676b8 but for the clip's entropy ratio, whose denominator
# gained no ``+ floor`` at d6676b8), ``update_ema_from_batch`` (new at d6676b8), the controller
# lines of ``_collect_agpo_rollouts`` and the step-KL EMA of ``ppo_train``. Their defaults
# (config.yaml): floors 1e-8, ema_alpha 0.1, entropy_ref_ema_alpha 0.01, entropy clamp [0.5, 1.5].
FLOOR = 1e-8


def authors_centered_uncertainty(raw, ema, alpha):
    if ema <= FLOOR:
        return 0.0, raw
    return (raw - ema) / (ema + FLOOR), alpha * raw + (1.0 - alpha) * ema


def authors_update_ema_from_batch(values, previous, alpha):
    if not values:
        return previous
    batch_mean = sum(values) / len(values)
    if previous <= FLOOR:
        return batch_mean
    return alpha * batch_mean + (1.0 - alpha) * previous


def authors_temperature(centered, tau_base, lam, tau_min, tau_max):
    tau = torch.tensor(tau_base * (1.0 + lam * centered))
    return float(torch.clamp(tau, min=tau_min, max=tau_max).item())


def authors_clip(sigma, skew, entropy, entropy_ref, e_probe, step_kl, o):
    denom = 1.0 + o["alpha"] * sigma + o["gamma"] * step_kl + o["zeta"] * abs(skew)
    ratio = max(entropy, FLOOR) / max(entropy_ref, FLOOR)  # d6676b8
    controller = float(torch.clamp(torch.tensor(ratio), min=0.5, max=1.5).item())
    eps = o["eps_base"] * controller * (1.0 + o["delta"] * e_probe) / denom
    return float(torch.clamp(torch.tensor(eps), min=o["eps_min"], max=o["eps_max"]).item())


def authors_minibatch(u, s, h, state, t, c):
    """One ``_collect_agpo_rollouts`` of d6676b8: every prompt reads the snapshots taken before
    the first; both EMAs are updated once from the batch means afterwards."""
    u_snapshot, h_snapshot, step_kl_ema = state
    taus, centred, eps = [], [], []
    for p in range(len(u)):
        centered, _ = authors_centered_uncertainty(u[p], u_snapshot, t["ema_rate"])
        centred.append(centered)
        taus.append(authors_temperature(centered, t["tau_base"], t["lam"], 0.5, 1.5))
        h_ref = h_snapshot if h_snapshot > FLOOR else h[p]
        sigma, skew, e_probe = (float(getattr(s, f)[p]) for f in STATS)
        eps.append(authors_clip(sigma, skew, h[p], h_ref, e_probe, step_kl_ema, c))
    u_bar = authors_update_ema_from_batch(u, u_snapshot, t["ema_rate"])
    h_bar = authors_update_ema_from_batch(h, h_snapshot, c["entropy_ema_rate"])
    return taus, centred, eps, (u_bar, h_bar, step_kl_ema)


def authors_per_prompt_ubar(u, u_bar, rate):
    """11e5596: ``compute_centered_uncertainty`` prompt by prompt, its EMA written back."""
    centred = []
    for value in u:
        centered, u_bar = authors_centered_uncertainty(value, u_bar, rate)
        centred.append(centered)
    return centred, u_bar


STATS = ("dispersion", "skewness", "vote_entropy")
RULE_STEPS = [(3, 2, True), (4, 2, False), (1, 4, False), (5, 8, False), (6, 2, False)]


def probe_batches(seed: int):
    """Probe statistics of P prompts × G rewards per step, (P, G, all rewards equal): a first
    batch of constant groups with one vote each (U = 0: the warm-up holds), then G = 2, a single
    prompt, G = 8 and groups with repeated rewards; the per-prompt H and step drift of each."""
    g = torch.Generator().manual_seed(seed)
    for p, group, constant in RULE_STEPS:
        rewards = torch.randint(0, 3, (p, group), generator=g).float() / 2
        rewards[0] = rewards[0, 0]  # one constant group in every batch
        votes = torch.randint(0, 3, (p, group), generator=g)
        if constant:
            rewards[:] = 1.0
            votes[:] = 0
        answers = [[str(v) for v in row.tolist()] for row in votes]
        stats = ProbeStats.from_rewards(rewards, answers)
        entropy = torch.rand(p, generator=g) * 2 + 0.05
        yield stats, entropy, torch.randn(p, generator=g) * 0.05


def test_per_minibatch_rule_is_the_authors_d6676b8_on_the_same_inputs():
    """``ema_update=per_minibatch`` against d6676b8 over five steps (a warm-up batch of constant
    groups, G = 2, P = 1, G = 8): Ū, H̄_ref and D̂_KL equal in float64, Ũ and τ equal (float32,
    theirs through ``torch.tensor``), ε to float32 rounding (their ε is computed in float64 from
    a float32-rounded entropy factor, rlkit's in float32)."""
    t = dict(lam=0.3, tau_base=1.0, ema_rate=0.2)
    c = dict(eps_base=0.25, eps_min=0.05, eps_max=0.4, alpha=0.8, gamma=2.0, delta=0.3, zeta=0.1)
    ats = AdaptiveTemperature(**t, w_skew=0.5, ema_update="per_minibatch")
    rates = dict(entropy_ema_rate=0.05, kl_ema_rate=t["ema_rate"])  # their step KL: ema_alpha
    clip = AdaptiveClip(**c, **rates, ema_update="per_minibatch")
    c |= rates
    state = (0.0, 0.0, 0.0)  # their *_ema_init
    for step, (stats, entropy, drift) in enumerate(probe_batches(0)):
        u = ats.uncertainty(stats).to(torch.float64).tolist()  # the same U into both
        taus, centred, eps, state = authors_minibatch(u, stats, entropy.tolist(), state, t, c)
        assert ats(stats).tolist() == taus
        assert ats.last_u_tilde.tolist() == torch.tensor(centred).tolist()
        assert clip(stats, entropy).tolist() == pytest.approx(eps, rel=2e-7)
        step_kl = float(torch.stack(list(drift.clamp_min(0))).mean())  # _estimate_step_kl
        state = (*state[:2], t["ema_rate"] * step_kl + (1.0 - t["ema_rate"]) * state[2])
        assert (ats.u_bar, clip.entropy_ref.value, clip.update_kl(drift)) == state
        if step == 0:  # constant groups, one vote: U = 0, still warming up, τ = τ_base
            assert ats.u_bar == 0.0 and taus == [1.0] * 3 and centred == [0.0] * 3
        if step == 1:  # the first batch with U > 0 only sets Ū (Ũ = 0), as the first H̄_ref
            assert centred == [0.0] * 4 and ats.u_bar == sum(u) / len(u) > 0


def test_per_prompt_rule_is_the_authors_11e5596_on_the_same_inputs():
    """``ema_update=per_prompt`` (the default): Ū read and written prompt by prompt, as
    11e5596's ``compute_centered_uncertainty`` in its prompt loop, equal in float64. d6676b8's
    snapshot agrees during the warm-up and departs from the first batch with U > 0 on; with one
    prompt per call (their example configs' per_device_train_batch_size: 1) the rules coincide."""
    t = dict(lam=0.3, tau_base=1.0, ema_rate=0.2)
    per_prompt = AdaptiveTemperature(**t)
    snapshot = AdaptiveTemperature(**t, ema_update="per_minibatch")
    one_by_one = [AdaptiveTemperature(**t, ema_update=rule) for rule in EMA_UPDATES]
    u_bar, differ = 0.0, []
    for stats, _, _ in probe_batches(1):
        u = per_prompt.uncertainty(stats).to(torch.float64).tolist()
        centred, u_bar = authors_per_prompt_ubar(u, u_bar, t["ema_rate"])
        taus = [authors_temperature(x, t["tau_base"], t["lam"], 0.5, 1.5) for x in centred]
        assert per_prompt(stats).tolist() == taus and per_prompt.u_bar == u_bar
        differ.append(snapshot(stats).tolist() != taus)
        for p in range(len(u)):
            a, b = (ctl(stats.select([p])) for ctl in one_by_one)
            assert torch.equal(a, b) and one_by_one[0].u_bar == one_by_one[1].u_bar
    assert differ == [False, True, True, True, True]
    assert one_by_one[0].u_bar == per_prompt.u_bar  # one prompt per call = prompt by prompt


def test_per_minibatch_entropy_reference_warms_up_on_each_prompts_own_entropy():
    """d6676b8: while H̄_ref ≤ 1e-8 every prompt's ratio is max(H, 1e-8)/max(H, 1e-8) = 1 (a
    prompt with H = 0 too), and H̄_ref becomes the batch mean; rlkit's per_prompt rule reads the
    first batch mean at once, so its first ratios are H / mean H."""
    s = stats([0.0, 0.0, 0.0])
    h = torch.tensor([0.0, 0.5, 1.5])
    options = dict(alpha=0.0, gamma=0.0, delta=0.0, eps_min=0.01, eps_max=1.0)
    snapshot = AdaptiveClip(**options, ema_update="per_minibatch")
    assert snapshot(s, h).tolist() == pytest.approx([0.2] * 3)
    assert snapshot.entropy_ref.value == pytest.approx(2 / 3)
    per_prompt = AdaptiveClip(**options)  # ratios 0, .75, 2.25, clamped to [.5, 1.5]
    assert per_prompt(s, h).tolist() == pytest.approx([0.1, 0.15, 0.3])
