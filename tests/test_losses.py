"""rlkit.losses: clipped surrogate, KL estimators, entropy and loss aggregation (docs/algorithms.md §4)."""

import math

import numpy as np
import pytest
import reference as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.losses import aggregate_loss, clipped_surrogate, entropy_from_logits, kl_divergence

# ---------------------------------------------------------------------------------------------
# clipped surrogate


def hand_tokens():
    """One row of tokens with ratios ρ and advantages A covering every branch."""
    rho = torch.tensor([[1.5, 0.5, 1.1, 0.9, 0.5, 1.5, 4.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    return torch.log(rho), torch.zeros_like(rho), adv


def test_clipped_surrogate_hand_example():
    # ε_low = .2, ε_high = .28 (DAPO clip-higher), L = −min(ρA, clip(ρ, .8, 1.28)·A):
    # ρ 1.5, A +1 → −min(1.5, 1.28) = −1.28 (high-clipped);  ρ .5, A −1 → −min(−.5, −.8) = .8
    # (low-clipped);  ρ 1.1, A +1 → −1.1;  ρ .9, A −1 → .9;  ρ .5, A +1 → −min(.5, .8) = −.5;
    # ρ 1.5, A −1 → −min(−1.5, −1.28) = 1.5;  ρ 4, A −1 → 4 (3 with the dual clip c = 3).
    logp, old, adv = hand_tokens()
    loss, clip = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    expected = [-1.28, 0.8, -1.1, 0.9, -0.5, 1.5, 4.0]
    assert loss[0].tolist() == pytest.approx(expected)
    assert clip.low.item() == pytest.approx(1 / 7)
    assert clip.high.item() == pytest.approx(1 / 7)
    assert clip.region.item() == pytest.approx(2 / 7)
    assert clip.dual.item() == 0.0
    loss, clip = clipped_surrogate(logp, old, adv, 0.2, 0.28, dual_clip=3.0)
    assert loss[0].tolist() == pytest.approx(expected[:-1] + [3.0])
    assert clip.dual.item() == pytest.approx(1 / 7)
    # a mask excluding the two clipped tokens: clip fractions over the 5 real tokens are 0
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    _, clip = clipped_surrogate(logp, old, adv, 0.2, 0.28, mask=mask)
    assert (clip.low.item(), clip.high.item()) == (0.0, 0.0)


def random_policy_batch(seed: int, batch: int = 6, length: int = 9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 4
    logp = old + torch.randn(batch, length, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(batch, generator=g, dtype=torch.float64)
    return logp, old, adv, g


@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("per_sequence_eps", [False, True])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_clipped_surrogate_matches_reference(dual_clip, per_sequence_eps, per_token_adv):
    logp, old, adv, g = random_policy_batch(seed=int(per_sequence_eps) + 2 * int(per_token_adv))
    b, t = logp.shape
    if per_token_adv:
        adv = adv[:, None] + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.1
    eps_low, eps_high = 0.2, 0.28
    if per_sequence_eps:  # AGPO: one ε per prompt, used symmetrically
        eps_low = eps_high = 0.05 + torch.rand(b, generator=g, dtype=torch.float64) * 0.35
    mask = torch.rand(b, t, generator=g) < 0.8
    loss, clip = clipped_surrogate(
        logp, old, adv, eps_low, eps_high, mask=mask, dual_clip=dual_clip
    )

    def at(x, i, j):
        x = torch.as_tensor(x, dtype=torch.float64)
        return x.item() if x.dim() == 0 else (x[i].item() if x.dim() == 1 else x[i, j].item())

    expected = np.zeros((b, t))
    low = high = 0
    for i in range(b):
        for j in range(t):
            a, lo, hi = at(adv, i, j), at(eps_low, i, j), at(eps_high, i, j)
            expected[i, j] = ref.clipped_surrogate_token(
                logp[i, j].item(), old[i, j].item(), a, lo, hi, dual_clip
            )
            rho = math.exp(logp[i, j].item() - old[i, j].item())
            low += bool(mask[i, j]) and rho < 1 - lo and a < 0
            high += bool(mask[i, j]) and rho > 1 + hi and a > 0
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-12, atol=1e-12)
    n = mask.sum().item()
    assert clip.low.item() == pytest.approx(low / n)
    assert clip.high.item() == pytest.approx(high / n)
    assert clip.region.item() == pytest.approx((low + high) / n)


def test_clipped_tokens_get_zero_gradient():
    logp, old, adv = hand_tokens()
    logp = logp.clone().requires_grad_(True)
    loss, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28, dual_clip=3.0)
    loss.sum().backward()
    grad = logp.grad[0]
    # tokens 0 (high-clipped), 1 (low-clipped) and 6 (dual-clipped) carry no gradient; the others
    # carry dL/dlogp = −A·ρ.
    rho = torch.tensor([1.5, 0.5, 1.1, 0.9, 0.5, 1.5, 4.0], dtype=torch.float64)
    a = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    expected = -a * rho
    expected[[0, 1, 6]] = 0.0
    torch.testing.assert_close(grad, expected)


def test_clipped_surrogate_bad_input():
    logp, old, adv = hand_tokens()
    with pytest.raises(ValueError, match="epsilons"):
        clipped_surrogate(logp, old, adv, -0.1, 0.2)
    with pytest.raises(ValueError, match="epsilons"):
        clipped_surrogate(logp, old, adv, 0.2, torch.tensor([-0.2]))
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate(logp, old, adv, 0.2, 0.2, dual_clip=1.0)


# ---------------------------------------------------------------------------------------------
# KL


def test_kl_hand_example():
    # π_θ = .5, π_ref = .25: k1 = ln .5 − ln .25 = ln 2; k3 with x = ln π_ref − ln π_θ = −ln 2:
    # e^x − x − 1 = .5 + ln 2 − 1.
    logp, ref_logp = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_divergence(logp, ref_logp, "k1").item() == pytest.approx(math.log(2))
    assert kl_divergence(logp, ref_logp, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_divergence(logp, ref_logp).item() == pytest.approx(0.5 + math.log(2) - 1)  # k3
    assert kl_divergence(logp, logp, "k3").item() == 0.0


def test_kl_matches_reference_and_k3_is_nonnegative_in_float64():
    logp, ref_logp, _, _ = random_policy_batch(seed=7, batch=20, length=30)
    k1 = kl_divergence(logp, ref_logp, "k1")
    k3 = kl_divergence(logp, ref_logp, "k3")
    pairs = list(zip(logp.reshape(-1).tolist(), ref_logp.reshape(-1).tolist()))
    assert k1.reshape(-1).tolist() == pytest.approx([ref.k1(a, b) for a, b in pairs], rel=1e-12)
    assert k3.reshape(-1).tolist() == pytest.approx([ref.k3(a, b) for a, b in pairs], rel=1e-9)
    assert (k3 >= 0).all()


def test_k3_is_nonnegative_in_float32_for_tiny_log_ratios():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(10_000, generator=g) * 1e-3
    assert (kl_divergence(logp, torch.zeros_like(logp), "k3") >= 0).all()


def test_kl_unknown_estimator():
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k2'.*k1.*k3"):
        kl_divergence(torch.zeros(2), torch.zeros(2), "k2")


# ---------------------------------------------------------------------------------------------
# entropy


def test_entropy_hand_examples():
    # uniform over 2 and 4 → ln 2, ln 4; p = [.25, .75] → −(.25 ln .25 + .75 ln .75);
    # a one-hot (very peaked) distribution → 0.
    logits = torch.tensor(
        [
            [0.0, 0.0, -1e4, -1e4],
            [1.0, 1.0, 1.0, 1.0],
            [0.0, math.log(3), -1e4, -1e4],
            [60, 0, 0, 0],
        ]
    )
    expected = [math.log(2), math.log(4), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0]
    assert entropy_from_logits(logits).tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0, 100.0])
def test_entropy_matches_float64_reference(scale):
    g = torch.Generator().manual_seed(int(scale * 10))
    logits = torch.randn(3, 5, 50, generator=g) * scale
    h = entropy_from_logits(logits)
    assert h.shape == (3, 5)
    expected = [ref.entropy(row) for row in logits.double().reshape(-1, 50).numpy()]
    np.testing.assert_allclose(h.reshape(-1).numpy(), expected, rtol=1e-5, atol=2e-5)
    assert ((h >= -1e-5) & (h <= math.log(50) + 1e-5)).all()


def test_entropy_is_shift_invariant_for_large_logits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g) + 1e4
    expected = [ref.entropy(row) for row in logits.double().numpy()]  # the same float32 inputs
    np.testing.assert_allclose(entropy_from_logits(logits).numpy(), expected, atol=1e-5)


def test_entropy_of_masked_logits():
    logits = torch.tensor([[0.0, 0.0, -float("inf")]])
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(2))


# ---------------------------------------------------------------------------------------------
# aggregation


def test_aggregation_hand_example():
    # loss [[1, 2, 3], [4, 0, 0]], mask [[1, 1, 1], [1, 0, 0]]:
    # token-mean (1 + 2 + 3 + 4)/4 = 2.5; seq-mean-token-mean (2 + 4)/2 = 3;
    # seq-mean-token-sum-norm with T = 3: (6/3 + 4/3)/2 = 5/3, with max_len 4: (6/4 + 4/4)/2.
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(2.5)
    assert aggregate_loss(loss, mask).item() == pytest.approx(2.5)  # default
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(5 / 3)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_len=4).item() == pytest.approx(
        1.25
    )


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", range(3))
def test_aggregation_matches_reference_with_ragged_masks(mode, seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 7, 12
    loss = torch.randn(b, t, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    got = aggregate_loss(loss, mask, mode).item()
    assert got == pytest.approx(ref.aggregate(loss.numpy(), mask.numpy(), mode), rel=1e-12)
    # gradients flow only through real tokens
    leaf = loss.clone().requires_grad_(True)
    aggregate_loss(leaf, mask, mode).backward()
    assert (leaf.grad[~mask] == 0).all() and (leaf.grad[mask] != 0).all()


def test_aggregation_modes_weight_tokens_differently():
    # a long and a short sequence with per-token losses 1 and 0: token-mean weights tokens
    # (8/10), seq-mean-token-mean weights sequences (1/2), sum-norm divides by T (8/10/2).
    loss = torch.tensor([[1.0] * 8 + [0.0, 0.0], [0.0] * 10])
    mask = torch.tensor([[1] * 8 + [0, 0], [1, 1] + [0] * 8])
    modes = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    got = [aggregate_loss(loss, mask, m).item() for m in modes]
    assert got == pytest.approx([0.8, 0.5, 0.4])


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    mode=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]),
)
def test_aggregation_is_finite_with_empty_rows(lengths, mode):
    mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]
    loss = torch.ones(len(lengths), 6)
    out = aggregate_loss(loss, mask, mode)
    assert torch.isfinite(out)
    assert out.item() == pytest.approx(ref.aggregate(loss.numpy(), mask.numpy(), mode))


def test_aggregation_bad_input():
    loss, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"unknown loss aggregation 'sum'.*token-mean"):
        aggregate_loss(loss, mask, "sum")
    with pytest.raises(ValueError, match="max_len"):
        aggregate_loss(loss, mask, "seq-mean-token-sum-norm", max_len=0)
