"""rlkit.advantages: the estimator registry, GRPO, Dr. GRPO, RLOO, AGPO and EBPO (docs/algorithms.md §1, §2)."""

import copy
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import reference as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rlkit.advantages import ESTIMATORS, get_estimator

SHAPES = [(1, 1), (1, 4), (6, 1), (5, 2), (16, 8), (9, 16)]
KINDS = ["bernoulli", "continuous"]


def random_rewards(seed: int, shape: tuple[int, int], kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "bernoulli":
        # per-prompt success rates spread over [0, 1] so that some groups are constant
        theta = torch.rand(shape[0], 1, generator=g, dtype=torch.float64)
        return torch.bernoulli(theta.expand(shape), generator=g)
    return torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5


def assert_close(tensor, expected, rtol=1e-6, atol=1e-9):
    np.testing.assert_allclose(tensor.double().numpy(), np.asarray(expected), rtol=rtol, atol=atol)


def seed_of(shape, kind) -> int:
    return 100 * shape[0] + shape[1] + (7 if kind == "bernoulli" else 0)


# ---------------------------------------------------------------------------------------------
# registry


def test_registry_holds_every_spec_estimator():
    # a superset: a new file in rlkit/advantages/ registers one more (docs/contributing.md)
    assert set(ESTIMATORS) >= {
        "grpo",
        "dr_grpo",
        "rloo",
        "ebpo",
        "agpo",
        "jspo",
        "jspo_plus_plus",
        "jspo_page",
        "bnpo",
        "grpo_bn",
        "spo",
        "ppo",
        "dpo",
    }
    for name in ESTIMATORS:
        assert get_estimator(name).name == name


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'a2c'.*dr_grpo.*rloo"):
        get_estimator("a2c")


def test_a_taken_estimator_name_is_refused_and_the_first_kept():
    from rlkit.advantages import GRPO, register

    with pytest.raises(ValueError, match=r"'grpo' is already registered \(by GRPO\); Again needs"):
        register("grpo")(type("Again", (GRPO,), {}))
    assert ESTIMATORS["grpo"] is GRPO


# ---------------------------------------------------------------------------------------------
# §1: hand-worked examples


def test_grpo_hand_example():
    # [1, 0, 0, 1]: mean .5, Bessel std √(4·.25/3) = √(1/3) → A = ±.5/(√(1/3) + 1e-4).
    # [1, 1, 1, 1]: identical rewards → A = 0 (the null-gradient case).
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    out = get_estimator("grpo")(r)
    assert_close(out.advantages, [[a, -a, -a, a], [0, 0, 0, 0]])
    assert out.diagnostics["frac_reward_zero_std"].item() == pytest.approx(0.5)
    # ddof 0: std .5 → ±.5/.5001; eps 0.1 with ddof 1 → ±.5/(√(1/3) + .1)
    a0 = 0.5 / (0.5 + 1e-4)
    assert_close(get_estimator("grpo", std_ddof=0)(r[:1]).advantages, [[a0, -a0, -a0, a0]])
    a1 = 0.5 / (math.sqrt(1 / 3) + 0.1)
    assert_close(get_estimator("grpo", eps=0.1)(r[:1]).advantages, [[a1, -a1, -a1, a1]])


def test_grpo_batch_std_hand_example():
    # TRL's scale_rewards="batch": group-mean baseline, one std over all 8 rewards
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    out = get_estimator("grpo", scale_rewards="batch")(r)
    std = math.sqrt((5 * (1 - 0.625) ** 2 + 3 * 0.625**2) / 7)
    assert_close(out.advantages[0], [0.75 / (std + 1e-4)] + [-0.25 / (std + 1e-4)] * 3)
    assert out.advantages[1].abs().max().item() == 0.0
    assert out.diagnostics["batch_std"].item() == pytest.approx(std, rel=1e-6)


def test_dr_grpo_and_rloo_hand_examples():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    # Dr. GRPO: r − mean → [±.5], and mean 2 → [1, −1, 0, 0].
    assert_close(get_estimator("dr_grpo")(r).advantages, [[0.5, -0.5, -0.5, 0.5], [1, -1, 0, 0]])
    # RLOO: r_0 = 1, others (0 + 0 + 1)/3 → 2/3; r_1 = 0, others 2/3 → −2/3.
    # Row 2: 3 − (1 + 2 + 2)/3 = 4/3; 1 − 7/3 = −4/3; 2 − 6/3 = 0.
    expected = [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [4 / 3, -4 / 3, 0, 0]]
    assert_close(get_estimator("rloo")(r).advantages, expected)


def test_agpo_hand_examples():
    r = torch.tensor([[0.0, 1.0, 2.0, 10.0]], dtype=torch.float64)
    centred = np.array([[-3.25, -2.25, -1.25, 6.75]])  # mean 3.25
    # std: √(62.75/3); MAD: median 1.5, |d| = [1.5, .5, .5, 8.5] → 1.4826·1;
    # IQR: q25 = .75, q75 = 2 + .25·8 = 4 → 3.25/1.349.
    for kind, disp in [("std", math.sqrt(62.75 / 3)), ("mad", 1.4826), ("iqr", 3.25 / 1.349)]:
        assert_close(get_estimator("agpo", dispersion=kind)(r).advantages, centred / disp, 1e-9)
    # robust fallback: [1, 1, 1, 1, 0] has MAD = IQR = 0 → std √.2 (mean .8, Σd² = .8)
    r = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    expected = np.array([[0.2, 0.2, 0.2, 0.2, -0.8]]) / math.sqrt(0.2)
    for kind in ("mad", "iqr"):
        assert_close(get_estimator("agpo", dispersion=kind)(r).advantages, expected, 1e-9)


def test_agpo_mad_median_conventions_on_a_half_success_group():
    # [0, 0, 1, 1] − mean .5 = ±.5. Midpoint median .5, |d| = .5 → MAD 1.4826·.5. The authors'
    # lower median 0, |d| = [0, 0, 1, 1] → lower median 0 → MAD 0 → the std √(1/3) (Σd² = 1).
    # Odd G = 3 ([0, 1, 1]: median 1, |d| = [1, 0, 0] → 0 → std √(1/3)) has one convention.
    r = torch.tensor([[0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    half = np.array([[-0.5, -0.5, 0.5, 0.5]])
    for convention, disp in [("midpoint", 1.4826 * 0.5), ("lower", math.sqrt(1 / 3))]:
        agpo = get_estimator("agpo", dispersion="mad", mad_median=convention)
        assert_close(agpo(r).advantages, half / disp, 1e-12)
        odd = agpo(torch.tensor([[0.0, 1.0, 1.0]], dtype=torch.float64)).advantages
        assert_close(odd, np.array([[-2 / 3, 1 / 3, 1 / 3]]) / math.sqrt(1 / 3), 1e-12)


def test_ebpo_batch_prior_hand_example():
    # rewards [[1, 0], [1, 1]]: group means [.5, 1] → μ_glob = .75, τ² = .0625;
    # σ² = popvar[1, 0, 1, 1] = .75·.25 = .1875, σ²/G = .09375 → S = .09375/.15625 = .6;
    # V = .4·[.5, 1] + .6·.75 = [.65, .85] → Â = [[.35, −.65], [.15, .15]]; mean(Â) = 0,
    # Bessel std over the 4 entries √((.1225 + .4225 + .0225 + .0225)/3) = √(.59/3).
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    raw = np.array([[0.35, -0.65], [0.15, 0.15]])
    out = get_estimator("ebpo", prior="batch", whitening="none")(r)
    d = out.diagnostics
    assert_close(d["shrinkage"], [0.6, 0.6])
    assert_close(d["baseline"], [0.65, 0.85])
    assert_close(d["prior_mean"], [0.75, 0.75])
    assert_close(torch.stack([d["mu_glob"], d["sigma2"], d["tau2"]]), [0.75, 0.1875, 0.0625])
    assert_close(out.advantages, raw, 1e-12)
    assert_close(d["raw_advantages"], raw)
    whitened = get_estimator("ebpo", prior="batch")(r).advantages
    assert_close(whitened, raw / (math.sqrt(0.59 / 3) + 1e-6), 1e-12)
    centred = get_estimator("ebpo", prior="batch", whitening="center")(r).advantages
    assert_close(centred, raw, 1e-12)  # mean(Â) is 0 here


def test_ebpo_all_zero_group_is_penalised_where_grpo_is_silent():
    # Thm 3.2. rewards [[0, 0], [1, 0]]: group means [0, .5] → μ_glob = .25, τ² = .0625;
    # σ² = popvar[0, 0, 1, 0] = .1875 → S = .6 → Â(all-zero group) = −S·μ_glob = −.15 < 0.
    r = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    raw = get_estimator("ebpo", prior="batch", whitening="none")(r).advantages
    assert_close(raw[0], [-0.15, -0.15])
    assert get_estimator("grpo")(r).advantages[0].tolist() == [0.0, 0.0]


def test_ebpo_constant_batch_gets_full_shrinkage_and_zero_advantage():
    # σ²/G + τ² = 0 ≤ 1e-6 → S = 1, V = μ_glob = r, Â = 0 and the whitened A = 0/(0 + 1e-6) = 0.
    out = get_estimator("ebpo", prior="batch")(torch.full((3, 4), 0.7))
    assert out.diagnostics["shrinkage"].tolist() == [1.0, 1.0, 1.0]
    assert out.advantages.abs().max().item() == 0.0
    assert out.diagnostics["frac_reward_zero_std"].item() == 1.0


# ---------------------------------------------------------------------------------------------
# §2: against the EBPO authors' function
#
# ``compute_ebpo_outcome_advantage`` of github.com/Tonyzhou98/verl at commit
# 75b014702650312cb1e7c3537183d7df6dc5a81f (verl/trainer/ppo/core_algos.py). It imports verl, so
# it was run once in float64 on the inputs of tests/data/ebpo_baselines_published.json, and its
# outputs stored in tests/data/ebpo_published.json (how: its "source"). It builds fresh statistics
# on every call, which is rlkit's ``prior="batch"``; norm_adv_by_std_in_grpo=False is ``center``.

EBPO_PUBLISHED = json.loads((Path(__file__).parent / "data" / "ebpo_published.json").read_text())


@pytest.mark.parametrize(
    "whitening, case",
    [("whiten", c) for c in EBPO_PUBLISHED["ebpo"]]
    + [("center", c) for c in EBPO_PUBLISHED["ebpo_center"]],
    ids=lambda v: v["case"] if isinstance(v, dict) else v,
)
def test_ebpo_batch_prior_matches_the_authors_function(whitening, case):
    out = get_estimator("ebpo", prior="batch", whitening=whitening)(
        torch.tensor(case["rewards"], dtype=torch.float64)
    )
    np.testing.assert_allclose(out.advantages.numpy(), case["advantages"], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# §1, §2: against the float64 reference on random inputs


STATELESS = [
    ("grpo", {}, lambda r: ref.grpo(r)),
    ("grpo", {"std_ddof": 0, "eps": 1e-3}, lambda r: ref.grpo(r, std_ddof=0, eps=1e-3)),
    ("grpo", {"scale_rewards": "batch"}, lambda r: ref.grpo_batch_std(r)),
    ("grpo", {"scale_rewards": "batch", "std_ddof": 0}, lambda r: ref.grpo_batch_std(r, 0)),
    ("dr_grpo", {}, ref.dr_grpo),
    ("rloo", {}, ref.rloo),
    ("agpo", {"dispersion": "std"}, lambda r: ref.agpo(r, "std")),
    ("agpo", {"dispersion": "mad"}, lambda r: ref.agpo(r, "mad")),
    ("agpo", {"dispersion": "iqr"}, lambda r: ref.agpo(r, "iqr")),
    ("agpo", {"dispersion": "mad", "mad_median": "lower"}, lambda r: ref.agpo(r, "mad", "lower")),
]


# ids from the name and options alone: a function's repr holds its address, which differs between
# processes (pytest-xdist's workers must collect the same ids)
@pytest.mark.parametrize(
    "name, options, reference", STATELESS, ids=[f"{n}-{o}" for n, o, _ in STATELESS]
)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_stateless_estimators_match_reference(name, options, reference, shape, kind):
    r = random_rewards(seed_of(shape, kind), shape, kind)
    out = get_estimator(name, **options)(r)
    assert out.advantages.dtype == torch.float64
    np.testing.assert_allclose(out.advantages.numpy(), reference(r.numpy()), rtol=1e-9, atol=1e-9)
    zero_std = np.mean([len(set(row)) == 1 for row in r.tolist()])
    assert out.diagnostics["frac_reward_zero_std"].item() == pytest.approx(zero_std)


def ebpo_batches(kind: str, seed: int, steps: int = 5, clusters: int | None = None):
    """A sequence of (rewards, cluster_ids) with varying P and G, as a trainer would produce."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for step in range(steps):
        shape = (int(torch.randint(1, 12, (1,), generator=g)), [2, 4, 8][step % 3])
        r = random_rewards(seed * 31 + step, shape, kind)
        ids = None if clusters is None else torch.randint(0, clusters, (shape[0],), generator=g)
        out.append((r, ids))
    return out


def assert_matches_ebpo_reference(out, expected):
    np.testing.assert_allclose(out.advantages.numpy(), expected["advantages"], rtol=1e-9, atol=1e-9)
    d = out.diagnostics
    for key in ("shrinkage", "baseline", "prior_mean", "raw_advantages"):
        np.testing.assert_allclose(d[key].numpy(), expected[key], rtol=1e-5, atol=1e-6)
    for key in ("mu_glob", "sigma2", "tau2"):
        assert d[key].item() == pytest.approx(expected[key], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("prior", ["history", "batch"])
@pytest.mark.parametrize("decay", [1.0, 0.7])
@pytest.mark.parametrize("whitening", ["whiten", "center", "none"])
def test_ebpo_matches_reference_over_steps(kind, prior, decay, whitening):
    options = dict(prior=prior, prior_decay=decay, whitening=whitening)
    est, expected = get_estimator("ebpo", **options), ref.EBPOReference(**options)
    for r, _ in ebpo_batches(kind, seed=3 + len(whitening)):
        assert_matches_ebpo_reference(est(r), expected(r.numpy()))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("prior", ["history", "batch"])
@pytest.mark.parametrize("decay", [1.0, 0.8])
def test_ebpo_per_cluster_priors_match_reference_over_steps(kind, prior, decay):
    options = dict(prior=prior, prior_decay=decay, min_cluster_count=3)
    est, expected = get_estimator("ebpo", **options), ref.EBPOReference(**options)
    for r, ids in ebpo_batches(kind, seed=11, steps=8, clusters=4):
        assert_matches_ebpo_reference(est(r, ids), expected(r.numpy(), ids.tolist()))


# ---------------------------------------------------------------------------------------------
# §2 properties


def test_batch_prior_ignores_history_while_history_prior_does_not():
    first = random_rewards(1, (8, 4), "bernoulli") * 0 + 1  # an all-success batch
    second = random_rewards(2, (8, 4), "bernoulli")
    fresh = {p: get_estimator("ebpo", prior=p)(second) for p in ("batch", "history")}
    after = {}
    for p in ("batch", "history"):
        est = get_estimator("ebpo", prior=p)
        est(first)
        after[p] = est(second)
    assert torch.equal(after["batch"].advantages, fresh["batch"].advantages)
    assert torch.equal(
        after["batch"].diagnostics["shrinkage"], fresh["batch"].diagnostics["shrinkage"]
    )
    # history: μ_glob now includes the all-success groups of the first batch
    mu_fresh = fresh["history"].diagnostics["mu_glob"].item()
    assert after["history"].diagnostics["mu_glob"].item() > mu_fresh + 0.1
    assert not torch.allclose(after["history"].advantages, fresh["history"].advantages)


def clustered_batch():
    """Cluster 0 easy (θ = .9), cluster 1 hard (θ = .1), each with an all-zero (failed) group;
    cluster 2 holds a single prompt, below min_cluster_count = 4."""
    g = torch.Generator().manual_seed(5)
    easy = torch.bernoulli(torch.full((7, 8), 0.9, dtype=torch.float64), generator=g)
    hard = torch.bernoulli(torch.full((7, 8), 0.1, dtype=torch.float64), generator=g)
    zero = torch.zeros(1, 8, dtype=torch.float64)
    rewards = torch.cat([easy, zero, hard, zero, torch.ones(1, 8, dtype=torch.float64)])
    ids = torch.tensor([0] * 8 + [1] * 8 + [2])
    return rewards, ids


@pytest.mark.parametrize("prior", ["batch", "history"])
def test_per_cluster_priors_separate_clusters_and_small_clusters_fall_back(prior):
    rewards, ids = clustered_batch()
    est = get_estimator("ebpo", prior=prior, whitening="none", min_cluster_count=4)
    d = est(rewards, ids).diagnostics
    means = rewards.mean(1)
    mu = {c: means[ids == c].mean().item() for c in (0, 1)}
    assert mu[0] > 0.7 and mu[1] < 0.3
    assert d["prior_mean"][:8].tolist() == pytest.approx([mu[0]] * 8, rel=1e-6)
    assert d["prior_mean"][8:16].tolist() == pytest.approx([mu[1]] * 8, rel=1e-6)
    assert d["prior_mean"][16].item() == pytest.approx(means.mean().item(), rel=1e-6)  # global
    assert d["mu_glob"].item() == pytest.approx(means.mean().item(), rel=1e-6)
    # Cor 3.5: failing a group of the easy cluster costs more than failing one of the hard cluster
    raw = d["raw_advantages"]
    assert raw[7, 0].item() < raw[15, 0].item() < 0
    for p in (7, 15):
        assert raw[p, 0].item() == pytest.approx(-(d["shrinkage"][p] * d["prior_mean"][p]).item())


def test_small_cluster_gets_its_own_prior_once_it_has_enough_history():
    # Cluster 2 holds one all-ones prompt per batch: it uses the global prior (the mean of all
    # group means, < 1) until its accumulator holds min_cluster_count = 4 group means (step 3).
    est = get_estimator("ebpo", whitening="none", min_cluster_count=4)
    rewards, ids = clustered_batch()
    global_mean = rewards.mean(1).mean().item()
    for step in range(4):
        prior = est(rewards, ids).diagnostics["prior_mean"][16].item()
        assert prior == pytest.approx(1.0 if step == 3 else global_mean, rel=1e-6), step
    assert global_mean < 0.9


@settings(max_examples=40, deadline=None)
@given(
    rewards=arrays(
        np.float64, st.tuples(st.integers(1, 6), st.integers(1, 8)), elements=st.floats(-10, 10)
    ),
)
def test_ebpo_with_zero_shrinkage_gives_centred_group_advantages(rewards):
    # Force S → 0 with a prior whose τ² is huge and σ² ≈ 0 (10⁹ equal past rewards): then
    # V = μ_group and Â = r − mean_p exactly up to S·|μ_group − μ_glob| ≈ 1e-11.
    est = get_estimator("ebpo", whitening="none")
    big = 1e9
    state = est.state_dict()
    state["reward_moments"].update(
        count=torch.tensor([big], dtype=torch.float64),
        mean=torch.zeros(1, dtype=torch.float64),
        m2=torch.zeros(1, dtype=torch.float64),
    )
    state["group_mean_moments"].update(
        count=torch.tensor([big], dtype=torch.float64),
        mean=torch.zeros(1, dtype=torch.float64),
        m2=torch.tensor([big * 1e4], dtype=torch.float64),  # τ² = 1e4
    )
    est.load_state_dict(state)
    r = torch.from_numpy(rewards)
    out = est(r)
    assert out.diagnostics["shrinkage"].max().item() < 1e-9
    centred = r - r.mean(1, keepdim=True)
    torch.testing.assert_close(out.advantages, centred, rtol=0, atol=1e-8)


@settings(max_examples=60, deadline=None)
@given(
    others=arrays(
        np.float64,
        st.tuples(st.integers(1, 6), st.just(4)),
        elements=st.sampled_from([0.0, 0.5, 1.0]),
    ),
    prior=st.sampled_from(["batch", "history"]),
    history=st.integers(0, 2),
)
def test_ebpo_raw_advantage_of_an_all_zero_group_is_minus_s_mu_glob(others, prior, history):
    est = get_estimator("ebpo", prior=prior, whitening="none")
    r = torch.cat([torch.zeros(1, 4, dtype=torch.float64), torch.from_numpy(others)])
    for _ in range(history):
        est(torch.from_numpy(others))
    d = est(r).diagnostics
    s, mu = d["shrinkage"][0].item(), d["mu_glob"].item()
    assert d["raw_advantages"][0].tolist() == pytest.approx([-s * mu] * 4, abs=1e-7)
    if s > 1e-6 and mu > 1e-6:  # Thm 3.2: a strictly negative, non-vanishing signal
        assert d["raw_advantages"][0].max().item() < 0


def test_ebpo_shrinkage_lies_in_unit_interval_and_raw_identity_holds():
    est = get_estimator("ebpo", whitening="none", prior_decay=0.9)
    for r, _ in ebpo_batches("continuous", seed=9, steps=6):
        d = est(r).diagnostics
        s = d["shrinkage"].double()
        assert ((s >= 0) & (s <= 1)).all()
        v = (1 - s) * r.mean(1) + s * d["prior_mean"].double()
        torch.testing.assert_close(
            d["raw_advantages"].double(), r - v[:, None], rtol=1e-5, atol=1e-5
        )


# ---------------------------------------------------------------------------------------------
# robustness: no NaN / inf whatever the rewards


CONFIGS = (
    [(name, options) for name, options, _ in STATELESS]
    + [
        ("ebpo", {"prior": prior, "whitening": w, "prior_decay": decay, "min_cluster_count": 2})
        for prior in ("history", "batch")
        for w in ("whiten", "center", "none")
        for decay in (1.0, 0.5)
    ]
    + [("jspo", {"shrinkage": rule}) for rule in ("published", "james_stein")]
    + [("jspo_plus_plus", {"smooth_coef": coef}) for coef in (0.0, 0.99)]
)
# shrinkage baselines: a constant group's baseline may differ from its mean
SHRINKING = ("ebpo", "jspo", "jspo_plus_plus")


@st.composite
def reward_tensors(draw):
    shape = (draw(st.integers(1, 6)), draw(st.integers(1, 8)))
    kind = draw(st.sampled_from(["constant", "bernoulli", "huge", "any"]))
    finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
    if kind == "constant":
        value = draw(st.sampled_from([0.0, 1.0, -1e30, 1e30]) | finite32)
        r = np.full(shape, value, dtype=np.float32)
    else:
        elements = {
            "bernoulli": st.sampled_from([0.0, 1.0]),
            "huge": st.sampled_from([-1e30, 0.0, 1e30, 3.4e38, -3.4e38]),
            "any": finite32,
        }[kind]
        r = draw(arrays(np.float32, shape, elements=elements))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return torch.from_numpy(r).to(dtype)


def assert_finite(out, r):
    assert out.advantages.shape == r.shape and out.advantages.dtype == r.dtype
    assert torch.isfinite(out.advantages).all(), out.advantages
    # σ², τ² and Â scale with the rewards (σ² of ±1e30 rewards exceeds the float32 range of the
    # diagnostics); these are bounded by the rewards or by [0, 1]:
    for key in ("shrinkage", "baseline", "prior_mean", "mu_glob", "frac_reward_zero_std"):
        if key in out.diagnostics:
            assert torch.isfinite(out.diagnostics[key]).all(), key


@settings(max_examples=60, deadline=None)
@given(r=reward_tensors(), data=st.data())
def test_no_nan_or_inf_for_any_rewards(r, data):
    ids = data.draw(arrays(np.int64, r.shape[0], elements=st.integers(0, 2)))
    for name, options in CONFIGS:
        est = get_estimator(name, **options)
        for _ in range(2):  # the second call runs on accumulated state
            assert_finite(est(r), r)
        if name == "ebpo":
            assert_finite(est(r, torch.from_numpy(ids)), r)


@pytest.mark.parametrize("name, options", CONFIGS, ids=str)
@pytest.mark.parametrize(
    "r",
    [
        torch.zeros(4, 8),
        torch.ones(4, 8),
        torch.full((3, 5), -2.5),
        torch.tensor([[1.0], [0.0], [3.0]]),  # G = 1
        torch.tensor([[1.0, 0.0, 1.0]]),  # P = 1
        torch.tensor([[0.0]]),  # P = G = 1
        torch.tensor([[1e30, -1e30, 0.0], [1e30, 1e30, 1e30]]),
    ],
    ids=["zeros", "ones", "constant", "G1", "P1", "P1G1", "huge"],
)
def test_edge_cases_are_finite_and_constant_groups_get_zero(name, options, r):
    out = get_estimator(name, **options)(r)
    assert_finite(out, r)
    constant = r.amax(1) == r.amin(1)
    if name not in SHRINKING and constant.any():
        assert out.advantages[constant].abs().max().item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name, options", CONFIGS[:4] + CONFIGS[-1:], ids=str)
def test_low_precision_rewards_keep_their_dtype(name, options, dtype):
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [60000.0, -60000.0, 0.0, 1.0]]).to(dtype)
    out = get_estimator(name, **options)(r)
    assert out.advantages.dtype == dtype
    assert torch.isfinite(out.advantages).all()


# ---------------------------------------------------------------------------------------------
# state and determinism


def test_ebpo_state_dict_round_trip_continues_identically():
    batches = ebpo_batches("bernoulli", seed=21, steps=6, clusters=3)
    a = get_estimator("ebpo", prior_decay=0.9, min_cluster_count=2)
    for r, ids in batches[:3]:
        a(r, ids)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)  # checkpoints go through torch.save / weights_only load
    buffer.seek(0)
    b = get_estimator("ebpo", prior_decay=0.9, min_cluster_count=2)
    b.load_state_dict(torch.load(buffer, weights_only=True))
    c = get_estimator("ebpo", prior_decay=0.9, min_cluster_count=2)  # no state: must differ
    for r, ids in batches[3:]:
        out_a, out_b, out_c = a(r, ids), b(r, ids), c(r, ids)
        assert torch.equal(out_a.advantages, out_b.advantages)
        for key in out_a.diagnostics:
            assert torch.equal(out_a.diagnostics[key], out_b.diagnostics[key]), key
    assert not torch.equal(out_a.diagnostics["prior_mean"], out_c.diagnostics["prior_mean"])


def test_state_dict_is_a_snapshot_and_reset_forgets():
    est = get_estimator("ebpo")
    est(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
    snapshot = copy.deepcopy(est.state_dict())
    state = est.state_dict()
    est(torch.tensor([[0.0, 0.0], [0.0, 1.0]]))
    assert torch.equal(
        state["group_mean_moments"]["count"], snapshot["group_mean_moments"]["count"]
    )
    est.reset()
    fresh = get_estimator("ebpo")
    r = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    assert torch.equal(est(r).advantages, fresh(r).advantages)


@pytest.mark.parametrize("name, options", CONFIGS, ids=str)
def test_identical_inputs_give_identical_outputs_on_every_rank(name, options):
    batches = ebpo_batches("continuous", seed=4, steps=4, clusters=3)
    ranks = [get_estimator(name, **options) for _ in range(2)]
    for r, ids in batches:
        outs = [est(r, ids) for est in ranks]
        assert torch.equal(outs[0].advantages, outs[1].advantages)


def test_stateless_estimators_have_empty_state():
    for name in ("grpo", "dr_grpo", "rloo", "agpo", "jspo"):
        est = get_estimator(name)
        assert est.state_dict() == {}
        est.load_state_dict({})
        est.reset()


# ---------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_bad_rewards_raise_clear_errors(name):
    est = get_estimator(name)
    with pytest.raises(ValueError, match="rank 2"):
        est(torch.zeros(8))
    with pytest.raises(ValueError, match="rank 2"):
        est(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="P >= 1"):
        est(torch.zeros(0, 4))
    with pytest.raises(ValueError, match="NaN"):
        est(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="inf"):
        est(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(ValueError, match="torch.Tensor"):
        est([[1.0, 0.0]])


def test_bad_cluster_ids_raise_clear_errors():
    est = get_estimator("ebpo")
    r = torch.zeros(3, 4)
    with pytest.raises(ValueError, match=r"cluster_ids must have shape \[P\] = \[3\]"):
        est(r, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integers"):
        est(r, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="non-negative"):
        est(r, torch.tensor([0, -1, 2]))


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("grpo", {"std_ddof": 2}, "std_ddof"),
        ("grpo", {"eps": 0.0}, "eps"),
        ("grpo", {"scale_rewards": "global"}, "unknown GRPO scale_rewards 'global'"),
        ("agpo", {"dispersion": "range"}, "unknown dispersion 'range'"),
        ("agpo", {"mad_median": "upper"}, "unknown mad_median 'upper'"),
        ("ebpo", {"prior": "global"}, "unknown EBPO prior 'global'"),
        ("ebpo", {"whitening": "zscore"}, "unknown EBPO whitening 'zscore'"),
        ("ebpo", {"prior_decay": 0.0}, "decay"),
        ("ebpo", {"prior_decay": 1.2}, "decay"),
        ("ebpo", {"min_cluster_count": -1}, "min_cluster_count"),
    ],
)
def test_bad_options_raise_clear_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        get_estimator(name, **options)
