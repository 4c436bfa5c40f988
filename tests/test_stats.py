"""rlkit.stats: Welford/Chan running moments, EMA, dispersion and adjusted skewness (docs/algorithms.md §2, §3)."""

import math

import numpy as np
import pytest
import reference as ref
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.stats import Ema, RunningMoments, adjusted_skewness, dispersion, group_std


def random_groups(seed: int, shape: tuple[int, int], kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "bernoulli":
        return torch.bernoulli(torch.full(shape, 0.4, dtype=torch.float64), generator=g)
    return torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 1


SHAPES = [(1, 3), (5, 4), (16, 8), (7, 16)]
KINDS = ["bernoulli", "continuous"]


# ---------------------------------------------------------------------------------------------
# RunningMoments


def test_running_moments_hand_example():
    # [1, 2, 3, 4]: mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
    m = RunningMoments()
    m.update(torch.tensor([1.0, 2.0]))
    m.update(torch.tensor([3.0, 4.0]))
    assert m.count.item() == 4
    assert m.mean.item() == pytest.approx(2.5)
    assert m.variance.item() == pytest.approx(1.25)


def test_running_moments_decay_hand_example():
    # decay 0.5: [1, 2] then [3, 4] → weights [.5, .5, 1, 1], count 3, mean 8.5/3 = 17/6,
    # deviations (−11, −5, 1, 7)/6 → Σ w·d² = (60.5 + 12.5 + 1 + 49)/36 = 123/36 → var = 41/36.
    m = RunningMoments(decay=0.5)
    m.update(torch.tensor([1.0, 2.0]))
    m.update(torch.tensor([3.0, 4.0]))
    assert m.count.item() == pytest.approx(3.0)
    assert m.mean.item() == pytest.approx(17 / 6)
    assert m.variance.item() == pytest.approx(41 / 36)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=6),
)
def test_welford_batch_equals_sequential_and_chunked(values, cuts):
    x = torch.tensor(values, dtype=torch.float64)
    whole, one_by_one, chunked = RunningMoments(), RunningMoments(), RunningMoments()
    whole.update(x)
    for v in x:
        one_by_one.update(v.reshape(1))
    bounds = sorted({0, len(values), *[min(c, len(values)) for c in cuts]})
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        chunked.update(x[lo:hi])
    expected_var = float(np.var(np.asarray(values)))
    scale = 1.0 + expected_var
    for m in (whole, one_by_one, chunked):
        assert m.count.item() == len(values)
        assert m.mean.item() == pytest.approx(float(np.mean(values)), rel=1e-9, abs=1e-6)
        assert m.variance.item() == pytest.approx(expected_var, rel=1e-7, abs=1e-9 * scale)


@settings(max_examples=40, deadline=None)
@given(
    chunks=st.lists(
        st.lists(st.floats(-100, 100), min_size=1, max_size=10), min_size=1, max_size=8
    ),
    decay=st.floats(0.05, 1.0),
)
def test_welford_decay_matches_weighted_statistics(chunks, decay):
    m, expected = RunningMoments(decay=decay), ref.WeightedSamples(decay)
    for chunk in chunks:
        m.update(torch.tensor(chunk, dtype=torch.float64))
        expected.add(chunk)
    assert m.count.item() == pytest.approx(expected.count, rel=1e-12)
    assert m.mean.item() == pytest.approx(expected.mean, rel=1e-9, abs=1e-9)
    assert m.variance.item() == pytest.approx(expected.variance, rel=1e-7, abs=1e-9)


def test_welford_slots_are_independent_streams():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(200, generator=g, dtype=torch.float64)
    slots = torch.randint(0, 4, (200,), generator=g)
    m = RunningMoments(decay=0.9)
    refs = [ref.WeightedSamples(0.9) for _ in range(4)]
    for lo in range(0, 200, 50):
        m.update(values[lo : lo + 50], slots[lo : lo + 50])
        for k in range(4):
            refs[k].add(values[lo : lo + 50][slots[lo : lo + 50] == k].tolist())
    assert m.num_slots == 4
    for k in range(4):
        assert m.count[k].item() == pytest.approx(refs[k].count)
        assert m.mean[k].item() == pytest.approx(refs[k].mean, rel=1e-10)
        assert m.variance[k].item() == pytest.approx(refs[k].variance, rel=1e-10)


def test_welford_untouched_slot_is_unchanged_and_empty_slot_has_zero_variance():
    m = RunningMoments(decay=0.5)
    m.update(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    m.update(torch.tensor([5.0]), torch.tensor([2]))
    assert m.count.tolist() == [2.0, 0.0, 1.0]  # slot 0 not decayed: it got no new data
    assert m.mean[0].item() == 2.0 and m.variance[0].item() == 1.0
    assert m.variance[1].item() == 0.0 and m.variance[2].item() == 0.0


def test_welford_state_dict_round_trip_continues_identically():
    a = RunningMoments(decay=0.8)
    a.update(torch.tensor([1.0, 4.0, 2.0]))
    b = RunningMoments()
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        m.update(torch.tensor([7.0, -1.0]))
    assert b.decay == 0.8
    for ta, tb in zip(a.state_tensors(), b.state_tensors()):
        assert torch.equal(ta, tb)


def test_welford_bad_input():
    with pytest.raises(ValueError, match="decay"):
        RunningMoments(decay=0.0)
    with pytest.raises(ValueError, match="decay"):
        RunningMoments(decay=1.5)
    with pytest.raises(ValueError, match="num_slots"):
        RunningMoments(num_slots=0)
    with pytest.raises(ValueError, match="slots"):
        RunningMoments().update(torch.ones(3), torch.zeros(2, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# Ema


def test_ema_hand_example_and_first_value_initialisation():
    # rate 0.1: first value 1 initialises; then 0.9·1 + 0.1·2 = 1.1; then 0.9·1.1 + 0.1·0 = 0.99.
    e = Ema(0.1)
    assert e.update(1.0) == 1.0
    assert e.update(2.0) == pytest.approx(1.1)
    assert e.update(0.0) == pytest.approx(0.99)
    f = Ema(0.5, value=0.0)  # explicit initial value: no first-value initialisation
    assert f.update(4.0) == pytest.approx(2.0)
    g = Ema(1.0)
    g.load_state_dict(e.state_dict())
    assert (g.rate, g.value) == (e.rate, e.value)


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5])
def test_ema_bad_rate(rate):
    with pytest.raises(ValueError, match="rate"):
        Ema(rate)


# ---------------------------------------------------------------------------------------------
# dispersion and skewness


def test_dispersion_hand_examples():
    x = torch.tensor([[0.0, 1.0, 2.0, 10.0]], dtype=torch.float64)
    # std (ddof 1): mean 3.25, Σd² = 10.5625 + 5.0625 + 1.5625 + 45.5625 = 62.75 → √(62.75/3).
    assert dispersion(x, "std").item() == pytest.approx(math.sqrt(62.75 / 3))
    # ddof 0: √(62.75/4).
    assert dispersion(x, "std", ddof=0).item() == pytest.approx(math.sqrt(62.75 / 4))
    # MAD: median 1.5, |x − 1.5| = [1.5, .5, .5, 8.5] → median 1.0 → 1.4826.
    assert dispersion(x, "mad").item() == pytest.approx(1.4826)
    # IQR (linear): q25 at position 0.75 → 0.75, q75 at 2.25 → 2 + 0.25·8 = 4 → 3.25 / 1.349.
    assert dispersion(x, "iqr").item() == pytest.approx(3.25 / 1.349)


@pytest.mark.parametrize("kind", ["mad", "iqr"])
def test_robust_dispersion_falls_back_to_std(kind):
    # [1, 1, 1, 1, 0]: MAD = 0 (median 1, |d| = [0, 0, 0, 0, 1]) and IQR = 0 (q25 at position 1
    # and q75 at position 3 of the sorted [0, 1, 1, 1, 1] are both 1), but the group is not
    # constant → std: mean .8, Σd² = 4·.04 + .64 = .8 → √(.8/4) = √.2. A constant group stays 0.
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    assert dispersion(x, kind).tolist() == pytest.approx([math.sqrt(0.2), 0.0])


def test_mad_median_conventions_hand_examples():
    # G = 4, [0, 1, 3, 10]. Midpoint: median 2, |d| = [2, 1, 1, 8] → median 1.5 → 1.4826·1.5.
    # Lower: median 1, |d| = [1, 0, 2, 9] → lower median 1 → 1.4826.
    # Half-success [0, 0, 1, 1]: midpoint MAD 1.4826·.5; lower median 0, |d| = [0, 0, 1, 1] →
    # 0 → falls back to the std √(1/3) (mean .5, Σd² = 1). Odd G = 5 has one median.
    x = torch.tensor([[0.0, 1.0, 3.0, 10.0], [0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    midpoint = dispersion(x, "mad", mad_median="midpoint").tolist()
    assert midpoint == pytest.approx([1.4826 * 1.5, 1.4826 * 0.5], rel=1e-15)
    assert dispersion(x, "mad").tolist() == midpoint  # the default
    lower = dispersion(x, "mad", mad_median="lower").tolist()
    assert lower == pytest.approx([1.4826, math.sqrt(1 / 3)], rel=1e-15)
    odd = torch.tensor([[0.0, 1.0, 3.0, 10.0, 4.0]], dtype=torch.float64)  # median 3, |d| med 2
    for convention in ("midpoint", "lower"):
        assert dispersion(odd, "mad", mad_median=convention).item() == pytest.approx(1.4826 * 2)
        # the IQR has no median option: linear quantiles under both
        assert dispersion(x, "iqr", mad_median=convention).tolist() == dispersion(x, "iqr").tolist()


@pytest.mark.parametrize("g", [2, 3, 4, 8, 16])
def test_lower_mad_on_binary_rewards_is_the_std(g):
    """docs/algorithms.md §1: on 0/1 rewards the lower-median MAD is 0 on every non-constant
    group (so the std), and the midpoint MAD departs from the std only at k = G/2 successes."""
    k = torch.arange(g + 1).unsqueeze(1)
    x = (torch.arange(g) < k).to(torch.float64)  # one group per success count k = 0 … G
    std = dispersion(x, "std")
    assert torch.equal(dispersion(x, "mad", mad_median="lower"), std)
    midpoint = dispersion(x, "mad")
    half = (2 * k.squeeze(1) == g).nonzero().flatten().tolist()
    assert (midpoint != std).nonzero().flatten().tolist() == half
    assert midpoint[half].tolist() == [1.4826 * 0.5] * len(half)


def authors_dispersion(values: torch.Tensor, mode: str, fallback_to_std: bool) -> torch.Tensor:
    """``AGPOTrainer._dispersion`` of github.com/wandugu/paper_agpo at commit 11e5596
    (src/llamafactory/train/agpo/trainer.py), copied with its ``_bessel_std`` inlined."""
    if values.numel() == 0:
        return torch.zeros((), device=values.device)
    if mode == "mad":
        median = values.median()
        dispersion = 1.4826 * (values - median).abs().median()
    elif mode == "iqr":
        q75 = values.quantile(0.75)
        q25 = values.quantile(0.25)
        dispersion = (q75 - q25) / 1.349
    else:
        dispersion = values.std(unbiased=True)
    if fallback_to_std and values.numel() > 1 and dispersion <= 1e-8:
        if not torch.allclose(values, values[0].expand_as(values)):
            dispersion = values.std(unbiased=True)
    return dispersion


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(20, 2), (20, 4), (20, 8), (10, 7)])
def test_lower_mad_median_is_the_authors_advantage_dispersion(shape, kind):
    """With the std fallback (their advantage's), ``mad_median="lower"`` is their MAD: the same
    value, to the last bits of a std reduced along a batch dimension instead of one row."""
    x = random_groups(shape[1] + len(kind), shape, kind)
    theirs = [authors_dispersion(row, "mad", fallback_to_std=True).item() for row in x]
    assert dispersion(x, "mad", mad_median="lower").tolist() == pytest.approx(theirs, rel=1e-15)
    if shape[1] % 2 == 0:  # at even G the midpoint median is not theirs
        assert dispersion(x, "mad").tolist() != pytest.approx(theirs, rel=1e-15)


def test_lower_mad_of_a_group_of_two_is_always_the_std():
    """docs/algorithms.md §1: at G = 2 the lower median of |x − med| is 0 on every pair, so with
    ``mad_median="lower"`` every non-constant pair falls back to the std, on continuous rewards
    too. The authors' advantage dispersion (with the fallback) agrees; their probe's σ̂ (without
    it) is 0; the midpoint MAD is 1.4826·|a − b|/2, 1.048 times the std |a − b|/√2."""
    from rlkit.advantages import get_estimator
    from rlkit.controllers import ProbeStats

    x = random_groups(2, (50, 2), "continuous").to(torch.float64)
    x[0] = 0.25  # a constant pair: 0 under every convention
    std = dispersion(x, "std")
    assert torch.equal(dispersion(x, "mad", mad_median="lower"), std)
    probe = ProbeStats.from_rewards(x, dispersion_kind="mad", mad_median="lower")
    assert probe.dispersion.tolist() == pytest.approx(std.to(torch.float32).tolist(), rel=1e-6)
    for row, s in zip(x, std.tolist()):
        assert authors_dispersion(row, "mad", fallback_to_std=True).item() == pytest.approx(
            s, rel=1e-15
        )
        assert authors_dispersion(row, "mad", fallback_to_std=False).item() == 0.0
    gap = (x[:, 0] - x[:, 1]).abs()
    assert dispersion(x, "mad").tolist() == pytest.approx((1.4826 * gap / 2).tolist(), rel=1e-12)
    assert std[1:].tolist() == pytest.approx((gap[1:] / math.sqrt(2)).tolist(), rel=1e-12)
    # the agpo advantage of every non-constant pair is then ±(a − b)/2 / std = ±1/√2
    agpo = get_estimator("agpo", dispersion="mad", mad_median="lower")(x).advantages
    assert agpo[1:].abs().flatten().tolist() == pytest.approx([1 / math.sqrt(2)] * 98, rel=1e-9)
    assert agpo[0].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("disp", ["std", "mad", "iqr", "mad-lower"])
def test_dispersion_matches_reference(shape, kind, disp):
    x = random_groups(sum(shape) + len(kind) + len(disp), shape, kind)
    disp, _, convention = disp.partition("-")
    options = {"mad_median": convention} if convention else {}
    expected = [ref.dispersion(row, disp, **options) for row in x.tolist()]
    assert dispersion(x, disp, **options).tolist() == pytest.approx(expected, rel=1e-10, abs=1e-12)
    # dim argument: the same statistic along dim 0 of the transpose
    along0 = dispersion(x.T, disp, dim=0, **options).tolist()
    assert along0 == pytest.approx(expected, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("shape", [(20, 5), (20, 8), (10, 31)])
def test_mad_and_iqr_match_scipy(shape):
    x = random_groups(shape[1], shape, "continuous")
    xn = x.numpy()
    # scipy's 'normal' scales are 1/Φ⁻¹(3/4) = 1.482602… and 2Φ⁻¹(3/4) = 1.348979…; docs/algorithms.md §1
    # rounds them to 1.4826 and 1.349, a relative difference below 2e-5.
    mad = scipy.stats.median_abs_deviation(xn, axis=1, scale="normal")
    iqr = scipy.stats.iqr(xn, axis=1, scale="normal")
    assert dispersion(x, "mad").numpy() == pytest.approx(mad, rel=2e-5)
    assert dispersion(x, "iqr").numpy() == pytest.approx(iqr, rel=2e-5)


def test_dispersion_keeps_floating_dtype():
    x = torch.tensor([[0.0, 1.0, 1.0, 3.0]])
    for kind in ("std", "mad", "iqr"):
        assert dispersion(x, kind).dtype == torch.float32
        assert dispersion(x.to(torch.float64), kind).dtype == torch.float64


@pytest.mark.parametrize(
    "kind",
    [
        "std",
        "mad",
        "iqr",
    ],
)
def test_dispersion_accepts_integer_rewards(kind):
    # [0, 1, 1, 3]: median 1, |d| = [1, 0, 0, 2] → median .5 → MAD 1.4826·.5; IQR: q25 at
    # position .75 → .75, q75 at 2.25 → 1.5 → .75/1.349; std: mean 1.25, Σd² = 4.75 → √(4.75/3).
    expected = {"std": math.sqrt(4.75 / 3), "mad": 1.4826 * 0.5, "iqr": 0.75 / 1.349}[kind]
    out = dispersion(torch.tensor([[0, 1, 1, 3]]), kind)
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(expected, rel=1e-6)


def test_group_std_with_too_few_values_is_zero():
    assert group_std(torch.tensor([[3.0]]), dim=1).tolist() == [0.0]
    assert group_std(torch.tensor([[3.0]]), dim=1, ddof=0).tolist() == [0.0]


def test_dispersion_bad_input():
    with pytest.raises(ValueError, match="unknown dispersion 'range'"):
        dispersion(torch.ones(2, 3), "range")
    with pytest.raises(ValueError, match="unknown mad_median 'upper'"):
        dispersion(torch.ones(2, 3), "mad", mad_median="upper")
    with pytest.raises(ValueError, match="ddof"):
        dispersion(torch.ones(2, 3), "std", ddof=2)


def test_adjusted_skewness_hand_example():
    # x = [0, 0, 3]: mean 1, d = [−1, −1, 2]. ddof 1: s = √3, mean(z³) = 6 / (3·3√3) = 2/(3√3),
    # factor √(3·2)/1 = √6 → 2√2/3. ddof 0: s = √2, mean(z³) = 6/(3·2√2) = 1/√2 → √3.
    x = torch.tensor([[0.0, 0.0, 3.0]], dtype=torch.float64)
    assert adjusted_skewness(x).item() == pytest.approx(2 * math.sqrt(2) / 3)
    assert adjusted_skewness(x, std_ddof=0).item() == pytest.approx(math.sqrt(3))
    assert adjusted_skewness(-x).item() == pytest.approx(-2 * math.sqrt(2) / 3)


def test_adjusted_skewness_degenerate_and_clipped():
    # n < 3 → 0; constant → 0; a single outlier among many equal values exceeds 10 → clipped.
    assert adjusted_skewness(torch.tensor([[0.0, 5.0]])).item() == 0.0
    assert adjusted_skewness(torch.full((1, 6), 0.7)).item() == 0.0
    spike = torch.zeros(1, 400, dtype=torch.float64)
    spike[0, 0] = 1.0
    assert adjusted_skewness(spike).item() == 10.0
    assert adjusted_skewness(-spike).item() == -10.0
    assert adjusted_skewness(spike, clip=100.0).item() > 10.0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_adjusted_skewness_matches_reference(shape, kind):
    x = random_groups(7 + shape[1], shape, kind)
    for ddof in (0, 1):
        expected = [ref.adjusted_skewness(row, ddof) for row in x.tolist()]
        got = adjusted_skewness(x, std_ddof=ddof).tolist()
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("n", [3, 4, 8, 17])
def test_adjusted_skewness_matches_scipy(n):
    x = random_groups(n, (12, n), "continuous") ** 2  # right-skewed
    g1 = scipy.stats.skew(x.numpy(), axis=1, bias=False)
    assert adjusted_skewness(x, std_ddof=0, clip=1e9).numpy() == pytest.approx(g1, rel=1e-9)
    # the default (spec: s with ddof 1) is scipy's value times ((n − 1)/n)^{3/2}
    scaled = g1 * ((n - 1) / n) ** 1.5
    assert adjusted_skewness(x, clip=1e9).numpy() == pytest.approx(scaled, rel=1e-9)
