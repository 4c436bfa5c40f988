"""JSPO and JSPO++ (rlkit.advantages, docs/algorithms.md §2b): a hand-worked example, the float64
reference, the published code's results (tests/data/jspo_published.json) and resume equality."""

import io
import json
from pathlib import Path

import numpy as np
import pytest
import reference as ref
import torch

from rlkit.advantages import get_estimator

PUBLISHED = json.loads((Path(__file__).parent / "data" / "jspo_published.json").read_text())
RULES = ["published", "james_stein"]


def random_batch(seed: int, shape: tuple[int, int], kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "bernoulli":
        theta = torch.rand(shape[0], 1, generator=g, dtype=torch.float64)
        return torch.bernoulli(theta.expand(shape), generator=g)
    return torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5


def test_jspo_hand_example():
    # prompt means 0.75, 0.25, 1; Var_unbiased/G = 0.0625, 0.0625, 0
    r = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    out = get_estimator("jspo")(r.double())
    # prompt 0: others 0.25, 1 → mean 0.625, v = 0.03125, s = 0.140625
    lam0 = 0.03125 / (0.03125 + 0.140625 + 1e-6)
    # prompt 2: others 0.75, 0.25 → mean 0.5, v = 0.0625, s = 0.0625
    lam2 = 0.0625 / (0.125 + 1e-6)
    assert out.diagnostics["shrinkage"][0].item() == pytest.approx(lam0, rel=1e-6)
    assert out.diagnostics["shrinkage"][2].item() == pytest.approx(lam2, rel=1e-6)
    a = out.advantages
    # r_01 = 0: its leave-one-out mean is 1 (the three ones)
    assert a[0, 1].item() == pytest.approx(0 - ((1 - lam0) * 1.0 + lam0 * 0.625), rel=1e-12)
    assert a[0, 0].item() == pytest.approx(1 - ((1 - lam0) * 2 / 3 + lam0 * 0.625), rel=1e-12)
    # the all-correct prompt is shrunk toward 0.5: a positive advantage GRPO would not give
    assert torch.allclose(a[2], torch.full((4,), 1 - ((1 - lam2) * 1.0 + lam2 * 0.5)).double())
    assert (a[2] > 0).all()


def test_jspo_plus_plus_hand_example():
    r = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]).double()
    out = get_estimator("jspo_plus_plus")(r)
    r_bar = 8 / 12
    v = (0.0625 + 0.0625 + 0) / 3
    s = ((0.75 - r_bar) ** 2 + (0.25 - r_bar) ** 2 + (1 - r_bar) ** 2) / 3
    lam = v / (v + s + 1e-6)
    assert out.diagnostics["shrinkage"].tolist() == pytest.approx([lam] * 3, rel=1e-6)  # float32
    expected = 1 - ((1 - lam) * 1.0 + lam * r_bar)
    assert out.advantages[2, 0].item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", [(1, 4), (2, 3), (4, 2), (5, 1), (7, 8), (16, 4)])
@pytest.mark.parametrize("kind", ["bernoulli", "continuous"])
def test_jspo_matches_reference(rule, shape, kind):
    r = random_batch(31 * shape[0] + shape[1], shape, kind)
    out = get_estimator("jspo", shrinkage=rule)(r)
    expected, lams = ref.jspo(r.numpy(), rule)
    np.testing.assert_allclose(out.advantages.numpy(), expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out.diagnostics["shrinkage"].double(), lams, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("coef", [0.0, 0.5, 0.99])
def test_jspo_plus_plus_matches_reference_over_steps(rule, coef):
    est = get_estimator("jspo_plus_plus", shrinkage=rule, smooth_coef=coef)
    reference = ref.JSPOPlusPlusReference(coef, rule)
    for step in range(8):
        r = random_batch(step, (6, 4), "bernoulli" if step % 2 else "continuous")
        expected, lam = reference(r.numpy())
        out = est(r)
        np.testing.assert_allclose(out.advantages.numpy(), expected, rtol=1e-9, atol=1e-12)
        assert out.diagnostics["shrinkage"][0].item() == pytest.approx(lam, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("case", range(len(PUBLISHED["jspo"])))
def test_jspo_matches_the_published_code(case):
    data = PUBLISHED["jspo"][case]
    out = get_estimator("jspo")(torch.tensor(data["rewards"], dtype=torch.float64))
    np.testing.assert_allclose(out.advantages.numpy(), data["advantages"], rtol=1e-12, atol=1e-12)
    for key, theirs in (
        ("shrinkage", "js_lambda"),
        ("v_square", "v_square"),
        ("s_square", "s_square"),
    ):
        np.testing.assert_allclose(
            out.diagnostics[key].double(), data[theirs], rtol=1e-6, atol=1e-7
        )


@pytest.mark.parametrize("coef", ["0.0", "0.99"])
def test_jspo_plus_plus_matches_the_published_code_over_steps(coef):
    # with smoothing the published code rebuilds λ and r̄ with torch.tensor(float): float32
    rtol = 1e-12 if coef == "0.0" else 1e-6
    est = get_estimator("jspo_plus_plus", smooth_coef=float(coef))
    for data in PUBLISHED["jspo_plus_plus"][coef]:
        out = est(torch.tensor(data["rewards"], dtype=torch.float64))
        np.testing.assert_allclose(out.advantages.numpy(), data["advantages"], rtol=rtol, atol=rtol)
        np.testing.assert_allclose(
            out.diagnostics["shrinkage"].double(), data["js_lambda"], rtol=1e-6
        )


def test_jspo_single_prompt_is_rloo_and_single_completion_is_zero():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]]).double()
    assert torch.equal(get_estimator("jspo")(r).advantages, get_estimator("rloo")(r).advantages)
    for name in ("jspo", "jspo_plus_plus"):
        out = get_estimator(name)(torch.tensor([[1.0], [0.0], [1.0]]))
        assert torch.equal(out.advantages, torch.zeros(3, 1))


def test_james_stein_rule_shrinks_fully_when_prompts_are_alike():
    # ten prompts drawn alike: the spread of their means is all sampling noise
    r = random_batch(5, (10, 8), "continuous")
    r = r - r.mean(1, keepdim=True) + 0.5  # identical means: s = 0
    published = get_estimator("jspo")(r).diagnostics["shrinkage"]
    classical = get_estimator("jspo", shrinkage="james_stein")(r).diagnostics["shrinkage"]
    assert torch.allclose(published, torch.ones(10), atol=1e-4)  # s = 0 exactly: both give 1
    assert torch.equal(classical, torch.ones(10))
    few = get_estimator("jspo", shrinkage="james_stein")(r[:3]).diagnostics["shrinkage"]
    assert torch.equal(few, torch.zeros(3))  # k = 2 other prompts ≤ 3: no shrinkage


def test_jspo_plus_plus_state_round_trip_continues_identically():
    batches = [random_batch(s, (6, 4), "bernoulli") for s in range(6)]
    a = get_estimator("jspo_plus_plus", smooth_coef=0.99)
    for r in batches[:3]:
        a(r)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)  # checkpoints go through torch.save / weights_only load
    buffer.seek(0)
    b = get_estimator("jspo_plus_plus", smooth_coef=0.99)
    b.load_state_dict(torch.load(buffer, weights_only=True))
    fresh = get_estimator("jspo_plus_plus", smooth_coef=0.99)
    for r in batches[3:]:
        out_a, out_b, out_c = a(r), b(r), fresh(r)
        assert torch.equal(out_a.advantages, out_b.advantages)
    assert not torch.equal(out_a.advantages, out_c.advantages)
    a.reset()
    assert a.state_dict() == get_estimator("jspo_plus_plus").state_dict()


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("jspo", {"shrinkage": "oracle"}, "unknown JSPO shrinkage 'oracle'"),
        ("jspo", {"eps": -1.0}, "eps"),
        ("jspo", {"shrinkage": "james_stein", "eps": 1e-3}, "used only by shrinkage='published'"),
        ("jspo_plus_plus", {"smooth_coef": 1.0}, "smooth_coef"),
        ("jspo_plus_plus", {"smooth_coef": -0.1}, "smooth_coef"),
    ],
)
def test_bad_jspo_options_raise_clear_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        get_estimator(name, **options)
