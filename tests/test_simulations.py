"""Unit tests of simulations/: closed forms against Monte Carlo, determinism, shapes, gradients."""

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from rlkit.advantages import get_estimator
from rlkit.losses import entropy_from_logits
from rlkit.models.tiny import one_torch_thread
from simulations import closed_forms as cf
from simulations import experiments as ex
from simulations.bandit import SoftmaxBandit
from simulations.population import (
    BetaPopulation,
    ClusteredPopulation,
    GaussianPopulation,
    bernoulli_rewards,
)
from simulations.stats import (
    Interval,
    binomial_z,
    judge_paired,
    mean_ci,
    minimum_detectable_difference,
    paired_difference,
    within_standard_errors,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The simulations' seeded figures at one intra-op thread, as the notebooks compute them;
    restored afterwards, so the rest of the suite runs at the thread count CI asks for."""
    with one_torch_thread():
        yield


def test_beta_population_moments_match_samples():
    pop = BetaPopulation(2.0, 5.0)
    theta = pop.sample(200_000, np.random.default_rng(0))
    assert theta.dtype == torch.float64 and theta.shape == (200_000,)
    assert abs(theta.mean().item() - pop.mean) < 4 * math.sqrt(pop.tau2 / 200_000)
    assert theta.var().item() == pytest.approx(pop.tau2, rel=0.02)
    assert (theta * (1 - theta)).mean().item() == pytest.approx(pop.sigma2, rel=0.01)


def test_populations_are_deterministic_under_a_seed():
    pop = ClusteredPopulation((0.2, 0.8), 5.0)
    a = pop.sample(100, np.random.default_rng(3))
    b = pop.sample(100, np.random.default_rng(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], pop.sample(100, np.random.default_rng(4))[0])


def test_invalid_population_parameters_raise():
    with pytest.raises(ValueError, match="a must be positive"):
        BetaPopulation(0.0, 1.0)
    with pytest.raises(ValueError, match="cluster means"):
        ClusteredPopulation((0.0, 0.5), 2.0)
    with pytest.raises(ValueError, match="group_size"):
        bernoulli_rewards(torch.tensor([0.5]), 0, np.random.default_rng(0))


def test_bernoulli_group_mean_variance_is_theta_one_minus_theta_over_g():
    theta = torch.full((100_000,), 0.3, dtype=torch.float64)
    rewards = bernoulli_rewards(theta, 4, np.random.default_rng(1))
    assert rewards.shape == (100_000, 4)
    var = rewards.mean(1).var().item()
    assert var == pytest.approx(cf.group_mean_mse(0.3 * 0.7, 4), rel=0.02)


def test_bayes_risk_is_the_minimum_of_the_linear_risk():
    s_star = cf.shrinkage_factor(0.2, 0.05, 4)
    grid = np.linspace(0, 1, 1001)
    risks = cf.linear_baseline_mse(grid, 0.2, 0.05, 4)
    assert grid[np.argmin(risks)] == pytest.approx(s_star, abs=1e-3)
    assert risks.min() == pytest.approx(cf.bayes_risk(0.2, 0.05, 4), rel=1e-6)
    assert cf.bayes_risk(0.2, 0.05, 4) < cf.group_mean_mse(0.2, 4)


@pytest.mark.parametrize(
    "population", [BetaPopulation(2.0, 3.0), GaussianPopulation(0.5, 0.04, 0.25)]
)
def test_shrinkage_mse_matches_closed_forms(population):
    r = ex.shrinkage_mse(population, 4, 512, 20, seed=0)
    assert within_standard_errors(r["group_mean"], r["closed_group_mean"])
    assert within_standard_errors(r["oracle"], r["closed_bayes"])
    assert within_standard_errors(r["ebpo"], r["closed_plugin_raw"])
    assert r["oracle"].mean < r["ebpo"].mean < r["group_mean"].mean


def test_beta_all_zero_probability_matches_monte_carlo():
    closed = cf.beta_prob_all_zero(1.0, 3.0, 4)
    assert closed == pytest.approx(math.gamma(7) * math.gamma(4) / (math.gamma(3) * math.gamma(8)))
    sim = ex.beta_all_zero_rate(BetaPopulation(1.0, 3.0), 4, 50_000, seed=0)
    assert abs(binomial_z(sim, closed, 50_000)) < 4


def test_null_group_rates_grpo_vs_ebpo():
    r = ex.null_group_rates([0.1, 0.5], 4, 5000, seed=0)
    z = binomial_z(r["grpo_null"], r["closed_constant"], 5000)
    assert np.all(np.abs(z) < 4)
    assert np.all(r["ebpo_null"] == 0)


def test_variance_decomposition_sums_and_matches_samples():
    pop = ClusteredPopulation((0.2, 0.5, 0.8), 4.0)
    parts = cf.variance_decomposition(pop)
    assert parts["total"] == pytest.approx(parts["within"] + parts["between"])
    theta, _ = pop.sample(200_000, np.random.default_rng(0))
    assert theta.var().item() == pytest.approx(parts["total"], rel=0.02)


def test_batch_prior_error_matches_monte_carlo():
    pop = BetaPopulation(2.0, 2.0)
    rng = np.random.default_rng(0)
    theta = pop.sample(32 * 4000, rng).reshape(4000, 32)
    rewards = bernoulli_rewards(theta, 4, rng)
    prior = rewards.mean(2).mean(1, keepdim=True)
    err = ((theta - prior) ** 2).mean(1).numpy()
    assert within_standard_errors(mean_ci(err), cf.batch_prior_error(pop.tau2, pop.sigma2, 4, 32))


def test_bandit_from_success_rates_and_sampling():
    theta = torch.tensor([0.1, 0.5, 0.9])
    bandit = SoftmaxBandit.from_success_rates(theta, num_answers=5, num_correct=2)
    assert torch.allclose(bandit.success_rate(), theta.double())
    gen = torch.Generator().manual_seed(0)
    actions, rewards = bandit.sample(6, gen)
    assert actions.shape == rewards.shape == (3, 6)
    assert torch.equal(rewards, bandit.correct.gather(1, actions).double())
    again = bandit.sample(6, torch.Generator().manual_seed(0))
    assert torch.equal(actions, again[0])
    with pytest.raises(ValueError, match="num_correct"):
        SoftmaxBandit.from_success_rates(theta, num_answers=2, num_correct=2)


def test_policy_gradient_matches_finite_differences_and_closed_form():
    gen = torch.Generator().manual_seed(0)
    bandit = SoftmaxBandit.from_success_rates(torch.tensor([0.3, 0.6]), num_answers=4)
    bandit.logits += torch.randn(bandit.logits.shape, generator=gen, dtype=torch.float64)
    actions, rewards = bandit.sample(5, gen)
    adv = get_estimator("dr_grpo")(rewards).advantages.double() + 0.1  # also a non-centred part
    grad, _, _ = bandit.policy_gradient(actions, adv)
    # closed form of the on-policy gradient: −(1/G) Σ_i A_i (e_{a_i} − π)
    probs = torch.softmax(bandit.logits, -1)
    onehot = torch.nn.functional.one_hot(actions, 4).double()
    expected = -(adv.unsqueeze(-1) * (onehot - probs.unsqueeze(1))).mean(1)
    assert torch.allclose(grad, expected, atol=1e-12)
    # finite differences of the surrogate −mean_i A_i·π(a_i)/π_old(a_i), summed over prompts
    old = torch.log_softmax(bandit.logits, -1).gather(1, actions)

    def surrogate(z):
        return -(adv * torch.exp(torch.log_softmax(z, -1).gather(1, actions) - old)).mean(1).sum()

    h = 1e-6
    for p in range(2):
        for k in range(4):
            bump = torch.zeros_like(bandit.logits)
            bump[p, k] = h
            fd = (surrogate(bandit.logits + bump) - surrogate(bandit.logits - bump)) / (2 * h)
            assert fd.item() == pytest.approx(grad[p, k].item(), abs=1e-7)


def test_clipping_stops_the_ratio_past_one_plus_eps():
    gen = torch.Generator().manual_seed(1)
    bandit = SoftmaxBandit.from_success_rates(torch.full((8,), 0.5), num_answers=4)
    actions, rewards = bandit.sample(4, gen)
    adv = get_estimator("grpo")(rewards).advantages
    result = bandit.update(actions, adv, lr=5.0, epochs=20, eps_low=0.1, eps_high=0.1)
    assert result.clip_fraction > 0
    # once every ratio of a positive-advantage answer passes 1 + ε its gradient is zero
    loose = SoftmaxBandit.from_success_rates(torch.full((8,), 0.5), num_answers=4)
    loose_result = loose.update(actions, adv, lr=5.0, epochs=20, eps_low=10.0, eps_high=10.0)
    assert result.kl.abs().sum() < loose_result.kl.abs().sum()


def test_first_order_entropy_prediction_is_the_linearisation():
    gen = torch.Generator().manual_seed(2)
    bandit = SoftmaxBandit.from_success_rates(torch.rand(16, generator=gen, dtype=torch.float64), 6)
    actions, rewards = bandit.sample(4, gen)
    for name in ("grpo", "ebpo"):
        adv = get_estimator(name)(rewards).advantages.double()
        start = bandit.logits.clone()
        predicted = cf.entropy_decay_prediction(start, actions, adv, lr=1e-4)
        step = SoftmaxBandit(start, bandit.correct).update(actions, adv, lr=1e-4)
        linear = cf.first_order_entropy_change(start, step.delta_logits)
        assert torch.allclose(predicted, linear, atol=1e-12)
        measured = step.entropy_after - step.entropy_before
        assert torch.allclose(measured, linear, atol=1e-7, rtol=1e-3)


def test_entropy_gradient_matches_autograd():
    z = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    (auto,) = torch.autograd.grad(entropy_from_logits(z).sum(), z)
    assert torch.allclose(cf.entropy_gradient(z.detach()), auto, atol=1e-12)


def test_train_bandit_is_deterministic_and_learns():
    config = ex.BanditConfig(num_prompts=16, steps=30)
    a = ex.train_bandit("EBPO", config, seed=5)
    b = ex.train_bandit("EBPO", config, seed=5)
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    assert a["entropy"].shape == (30,)
    assert a["success"][-1] > a["success"][0]


def test_whitening_only_arm_has_unit_batch_std_and_zero_group_sums():
    rewards = bernoulli_rewards(torch.rand(32, dtype=torch.float64), 4, np.random.default_rng(0))
    adv = ex.make_estimator("EBPO whitening only")(rewards).advantages
    assert adv.std().item() == pytest.approx(1.0, abs=1e-4)
    assert torch.allclose(adv.sum(1), torch.zeros(32, dtype=adv.dtype), atol=1e-9)
    with pytest.raises(ValueError, match="unknown method"):
        ex.make_estimator("PPO")


def test_stream_orders():
    pop = ClusteredPopulation((0.2, 0.8), 5.0)
    rng = np.random.default_rng(0)
    theta, cluster = ex.clustered_pool(pop, 64, rng)
    topic = ex.stream_order(theta, cluster, "topic", rng)
    assert sorted(topic.tolist()) == list(range(128))
    assert (cluster[topic].diff() != 0).sum() == 1  # one topic after the other
    hard_last = ex.stream_order(theta, cluster, "difficulty", rng)
    assert theta[hard_last[:32]].mean() > theta[hard_last[-32:]].mean()
    with pytest.raises(ValueError, match="stream order"):
        ex.stream_order(theta, cluster, "random", rng)


def test_shift_bandit_respects_bounds_and_is_paired():
    config = ex.ShiftConfig(
        num_prompts=8,
        steps=12,
        population=ex.DriftingPopulation(BetaPopulation(3, 2), BetaPopulation(1, 6), 6),
    )
    adaptive = ex.train_shift_bandit(config, seed=0, adaptive_clip=True, adaptive_temperature=True)
    fixed = ex.train_shift_bandit(config, seed=0, adaptive_clip=False, adaptive_temperature=False)
    assert (adaptive["eps_min"] >= 0.05 - 1e-6).all() and (adaptive["eps_max"] <= 0.4 + 1e-6).all()
    assert (adaptive["tau_min"] >= 0.5 - 1e-6).all() and (adaptive["tau_max"] <= 1.5 + 1e-6).all()
    assert adaptive["success"][0] == fixed["success"][0]  # same pool, same start
    assert np.allclose(fixed["eps_mean"], 0.2)


def test_shift_bandit_eps_schedule_sets_each_steps_eps_and_keeps_the_stream_paired():
    population = ex.DriftingPopulation(BetaPopulation(3, 2), BetaPopulation(1, 6), 6)
    config = ex.ShiftConfig(num_prompts=8, steps=12, population=population)
    fixed = ex.train_shift_bandit(config, seed=0, adaptive_clip=False, adaptive_temperature=False)
    same = replace(config, eps_schedule=(0.2,) * 12)
    flat = ex.train_shift_bandit(same, seed=0, adaptive_clip=False, adaptive_temperature=False)
    assert all(np.array_equal(fixed[k], flat[k]) for k in fixed)  # draws nothing extra
    eps = tuple(np.linspace(0.1, 0.3, 12).tolist())
    stepped = replace(config, eps_schedule=eps)
    log = ex.train_shift_bandit(stepped, seed=0, adaptive_clip=False, adaptive_temperature=False)
    for key in ("eps_min", "eps_max"):
        assert np.allclose(log[key], eps)
    assert log["success"][0] == fixed["success"][0]
    assert not np.array_equal(log["success"], fixed["success"])  # the schedule reached the loss
    with pytest.raises(ValueError, match="eps_schedule is a fixed .* needs adaptive_clip=False"):
        ex.train_shift_bandit(stepped, seed=0, adaptive_clip=True, adaptive_temperature=False)
    for bad in ((0.1,) * 11, (0.1,) * 11 + (0.0,), (0.1,) * 11 + (1.5,)):
        with pytest.raises(ValueError, match=r"one ε per step \(12\), each in \(0, 1\)"):
            replace(config, eps_schedule=bad)


def test_shift_bandit_clip_kwargs_reach_the_adaptive_clip():
    population = ex.DriftingPopulation(BetaPopulation(3, 2), BetaPopulation(1, 6), 6)
    config = ex.ShiftConfig(num_prompts=8, steps=12, population=population)
    fixed = ex.train_shift_bandit(config, seed=0, adaptive_clip=False, adaptive_temperature=False)
    off = {"entropy_ratio": False, "alpha": 0.0, "gamma": 0.0, "delta": 0.0}
    neutral = replace(config, clip=off)  # every signal left out: ε = ε_base on every prompt
    log = ex.train_shift_bandit(neutral, seed=0, adaptive_clip=True, adaptive_temperature=False)
    assert np.array_equal(log["eps_min"], fixed["eps_min"])
    assert np.array_equal(log["eps_max"], fixed["eps_max"])
    assert np.array_equal(log["success"], fixed["success"])
    with pytest.raises(TypeError, match="alpah"):
        ex.train_shift_bandit(replace(config, clip={"alpah": 0.0}), 0, True, False)


def test_judge_paired_applies_rlkit_reports_tests_and_holm_over_the_family():
    up = np.arange(1.0, 9.0)  # 8 paired seeds, every difference positive
    values = {
        "base": {"m": np.zeros(8)},
        "better": {"m": up},
        "same": {"m": np.array([0.01, -0.01] * 4)},
        "worse": {"m": -up},
    }
    comparisons = [(arm, "base", "m", +1, 0.5) for arm in ("better", "same", "worse")]
    better, same, worse = judge_paired(values, comparisons, family="f")
    assert better["p_exact"] == 1 / 256  # exact: only the observed flip reaches Σd
    assert better["p_holm"] == 3 / 256  # Holm over the 3 claims of the family
    assert better["difference"]["mean"] == 4.5 and better["mdd"] > 0
    assert [r["verdict"] for r in (better, same, worse)] == [
        "reproduced",
        "not reproduced",  # inside ±0.5: equivalent, so the claim is not reproduced
        "contradicted",
    ]
    alone = judge_paired(values, comparisons[:1], family="g")[0]
    assert alone["p_holm"] == 1 / 256  # a family of one: no adjustment
    with pytest.raises(ValueError, match="better, m: seeds at \\[2\\]"):
        judge_paired({**values, "better": {"m": np.r_[up[:2], np.nan, up[3:]]}}, comparisons, "f")
    with pytest.raises(ValueError, match="'m' for arm 'bettr'"):
        judge_paired(values, [("bettr", "base", "m", +1, 0.5)], "f")
    # an arm or measure no comparison names is not read: a level it never reached is no error
    never = {
        **values,
        "unused": {"m": np.full(8, np.nan)},
        "base": {"m": np.zeros(8), "x": [np.nan]},
    }
    assert judge_paired(never, comparisons, "f") == [better, same, worse]


def test_interval_helpers():
    ci = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert ci.mean == 2.5 and ci.low < 2.5 < ci.high
    diff = paired_difference([1.0, 2.0, 3.0], [0.0, 1.0, 2.1])
    assert diff.mean == pytest.approx(0.9667, abs=1e-4)
    with pytest.raises(ValueError, match="at least 2"):
        mean_ci([1.0])


def test_value_at_level_interpolates_between_the_steps_around_the_crossing():
    success = np.array([[0.0, 0.5, 1.0, 1.0], [0.0, 0.1, 0.2, 0.3], [0.9, 0.95, 1.0, 1.0]])
    entropy = np.array([[2.0, 1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
    out = ex.value_at_level(success, entropy, 0.8)
    assert out[0] == pytest.approx(0.4)  # 60% of the way from step 1 to step 2
    assert np.isnan(out[1]) and np.isnan(out[2])  # never reached / started above
    steps = ex.steps_to_level(success[:1], 0.75, start=1)
    assert steps[0] == pytest.approx(0.5)


def test_shrunk_batch_variance_is_the_variance_ebpo_whitens():
    rewards = bernoulli_rewards(torch.rand(64, dtype=torch.float64), 4, np.random.default_rng(0))
    diag = get_estimator("ebpo", prior="batch", whitening="none")(rewards).diagnostics
    shrinkage = float(diag["shrinkage"][0])
    terms = cf.shrunk_batch_variance(rewards, shrinkage)
    measured = float(diag["raw_advantages"].to(torch.float64).var(unbiased=False))
    assert terms["within"] + terms["between_shrunk"] == pytest.approx(measured, rel=1e-5)
    assert 0 < shrinkage < 1 and terms["between_full"] > terms["between_shrunk"]


@pytest.mark.parametrize("group_size", [2, 4, 32])
def test_raw_shrinks_less_iff_tau2_below_sigma2_over_root_g(group_size):
    for tau2 in np.linspace(0.005, 0.2, 40):
        s_star = cf.shrinkage_factor(0.2, tau2, group_size)
        s_raw = cf.shrinkage_factor(*cf.raw_hyperparameters(0.2, tau2, group_size), group_size)
        assert (s_raw < s_star) == cf.raw_shrinks_less(0.2, tau2, group_size)


def test_minimum_detectable_difference_has_the_stated_power():
    n, rng = 12, np.random.default_rng(0)
    samples = rng.normal(0.0, 1.0, (4000, n))
    null = mean_ci(samples, axis=1)
    # a true difference equal to the MDD at the true SE 1/√n is detected ~80% of the time
    shift = minimum_detectable_difference(Interval(0.0, 1 / math.sqrt(n), 0.0, 0.0), n)
    detected = mean_ci(samples + shift, axis=1).low > 0
    assert 0.72 < detected.mean() < 0.86
    assert (null.low > 0).mean() < 0.04  # and no difference is rarely "detected"


def test_step_size_sweep_adds_grpo_at_the_matched_step():
    config = ex.BanditConfig(num_prompts=8, num_answers=4)
    out = ex.step_size_sweep(["GRPO", "EBPO"], config, [0.5, 0.25], seeds=[0, 1], horizon=3)
    assert set(out) == {0.5, 0.25}
    for lr, result in out.items():
        runs = result["runs"]
        assert set(runs) == {"GRPO", "EBPO", ex.MATCHED_STEP}
        assert runs["GRPO"]["success"].shape == (2, math.ceil(3 / lr))
        assert result["k"] == pytest.approx(ex.effective_step_ratio(runs, "EBPO"))
        # the matched arm's first step is k times GRPO's on the same data
        assert runs[ex.MATCHED_STEP]["grad_norm"][:, 0] == pytest.approx(
            runs["GRPO"]["grad_norm"][:, 0]
        )
    assert out[0.5]["k"] > 1  # EBPO's whitened step is larger than GRPO's at G = 4


def test_baseline_gradient_variance_rows():
    pop = BetaPopulation(2.0, 3.0)
    out = ex.baseline_gradient_variance(pop, 4, 64, 50, num_answers=4, seed=0)
    assert set(out) >= {"group mean (GRPO)", "EBPO (estimated)", "oracle EB", "true θ"}
    assert np.all(out["true θ"]["mse"] == 0)
    group_mean = mean_ci(out["group mean (GRPO)"]["mse"])
    assert group_mean.mean == pytest.approx(cf.group_mean_mse(pop.sigma2, 4), rel=0.15)
    for row in out.values():
        assert row["grad_variance"].shape == (64,) and (row["grad_variance"] >= 0).all()


def test_shift_bandit_logs_what_pins_eps():
    config = ex.ShiftConfig(
        num_prompts=8,
        steps=12,
        population=ex.DriftingPopulation(BetaPopulation(3, 2), BetaPopulation(1, 6), 6),
    )
    adaptive = ex.train_shift_bandit(config, seed=0, adaptive_clip=True, adaptive_temperature=False)
    fixed = ex.train_shift_bandit(config, seed=0, adaptive_clip=False, adaptive_temperature=False)
    for key in ("eps_at_floor", "ratio_at_floor"):
        assert ((adaptive[key] >= 0) & (adaptive[key] <= 1)).all()
    assert adaptive["entropy_ratio"][0] == 1.0  # H̄_ref starts at the first entropy
    assert np.all(fixed["entropy_ratio"] == 1.0) and np.all(fixed["eps_at_floor"] == 0)


def test_poke_overrides_are_the_sweeps_own_run_plus_the_changes(tmp_path):
    from rlkit.config import load_config
    from rlkit.sweep import parse_spec, plan
    from simulations.poke import poke_overrides

    spec_path = ROOT / "sweeps/07_group_size.yaml"
    run = next(r for r in plan(parse_spec(spec_path)) if r.key == "EBPO/G2/seed3")
    base, overrides = poke_overrides(
        spec_path, "EBPO", 3, tmp_path / "poke", group_size=2, changes=["rollout.temperature=0.7"]
    )
    assert base == "tiny-cpu" and overrides[: len(run.overrides)] == list(run.overrides)
    cfg = load_config(base, overrides)
    assert cfg.output_dir == str(tmp_path / "poke") and cfg.rollout.temperature == 0.7
    assert (cfg.seed, cfg.rollout.group_size, cfg.algo.estimator) == (3, 2, "ebpo")


def test_poke_overrides_name_what_the_spec_runs():
    from simulations.poke import poke_overrides

    spec_path = ROOT / "sweeps/07_group_size.yaml"
    with pytest.raises(ValueError, match=r"no arm 'DAPO' at seed 0.*arms are \['GRPO', 'EBPO'\]"):
        poke_overrides(spec_path, "DAPO", 0, "out")
    with pytest.raises(ValueError, match=r"at G = \[2, 4, 8, 16\]: pass group_size"):
        poke_overrides(spec_path, "EBPO", 0, "out")
    _, overrides = poke_overrides(ROOT / "sweeps/08_components.yaml", "AGPO", 0, "out")
    assert "rollout.group_size=4" in overrides  # one group size: no need to name it


def test_jspo_lambda_limit_tends_to_half_not_one():
    # prompts alike (τ² → 0): the published λ → ½, the James-Stein λ → 1 (docs/algorithms.md §2b)
    assert cf.jspo_lambda_limit(0.2, 0.0, 4) == pytest.approx(0.5)
    assert cf.jspo_lambda_limit(0.2, 0.0, 4, "james_stein") == pytest.approx(1.0)
    assert cf.jspo_lambda_limit(0.2, 0.05, 4) == pytest.approx(0.05 / 0.15)
    assert cf.jspo_baseline_mse(0.0, 0.2, 0.05, 4) == pytest.approx(0.2 / 3)  # leave-one-out: G − 1
    with pytest.raises(ValueError, match="unknown JSPO rule 'stein'"):
        cf.jspo_lambda_limit(0.2, 0.05, 4, "stein")


def test_shrinkage_mse_jspo_matches_its_limit():
    r = ex.shrinkage_mse(BetaPopulation(2.0, 3.0), 4, 512, 20, seed=0)
    assert within_standard_errors(r["jspo"], r["closed_jspo"])
    assert within_standard_errors(r["jspo_lambda"], r["closed_jspo_lambda"])
    assert r["jspo_vs_ebpo"].low > 0  # the leave-one-out mean is noisier than the group mean
    alike = ex.shrinkage_mse(BetaPopulation(200.0, 300.0), 4, 512, 20, seed=0)
    assert abs(alike["jspo_lambda"].mean - 0.5) < 0.01 and alike["jspo_js_lambda"].mean > 0.95
    assert alike["jspo_vs_js"].low > 0


def test_jspo_failure_advantage_is_minus_lambda_mu():
    r = ex.jspo_failure_advantage(BetaPopulation(1.0, 3.0), 4, 500, 20, seed=0)
    assert r["null_share"].high == 0
    assert within_standard_errors(r["advantage"], r["closed"])
    assert r["all_fail_batch_advantage"] == 0
    assert np.all(ex.null_group_rates([0.1, 0.5], 4, 2000, seed=0)["jspo_null"] == 0)
