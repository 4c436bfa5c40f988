"""The course's exercises and their checkers: each judges the student's answer, against rlkit where
rlkit computes the quantity, and says what is wrong.

A notebook's exercise sets a variable (``my_rloo = None``) or fills a stub function, then calls
``exercises.check("00_rloo_by_hand", my_rloo, **context)``. ``context`` is what the check needs
from the notebook (a measured value, a summary row); the checker computes the true value from
rlkit or from the context, never from the student's answer.

Three kinds: ``predict`` (the student types a number or a word before running the cell),
``implement`` (the student writes a function, checked against rlkit's implementation on random
inputs) and ``bug`` (the student fixes a buggy function, checked against rlkit).

Reference answers: with ``RLKIT_EXERCISE_ANSWERS=reference`` in the environment, every check
uses the exercise's reference answer instead of the student's, so ``make test`` runs every
checking assert. Unset, an unanswered exercise (``None``, or a stub that still raises
NotImplementedError) prints what to do and passes, so that running a whole notebook never stops
at an exercise; a wrong answer raises :class:`ExerciseFailed` (an AssertionError) with a message
that says what is wrong.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

ANSWERS_ENV = "RLKIT_EXERCISE_ANSWERS"
KINDS = ("predict", "implement", "bug")


class ExerciseFailed(AssertionError):
    """A wrong answer: the message says what is wrong; the folded answer below the cell says why."""


@dataclass(frozen=True)
class Exercise:
    name: str  # "<notebook number>_<topic>", e.g. "00_rloo_by_hand"
    kind: str  # one of KINDS
    variable: str  # what the student sets or fills in the notebook
    judge: Callable[..., str]  # (answer, **context) -> a line saying why it is right; or raises
    reference: Callable[..., Any]  # (**context) -> the reference answer


EXERCISES: dict[str, Exercise] = {}


def exercise(name: str, kind: str, variable: str, reference: Callable[..., Any]):
    """Register the decorated judge as exercise ``name``."""
    if kind not in KINDS:
        raise ValueError(f"unknown exercise kind {kind!r}; known: {KINDS}")

    def add(judge):
        if name in EXERCISES:
            raise ValueError(f"exercise {name!r} registered twice")
        EXERCISES[name] = Exercise(name, kind, variable, judge, reference)
        return judge

    return add


def reference_answers() -> bool:
    """Whether ``RLKIT_EXERCISE_ANSWERS=reference``: every check uses the reference answer."""
    value = os.environ.get(ANSWERS_ENV, "")
    if value not in ("", "reference"):
        raise ValueError(f"{ANSWERS_ENV} must be unset or 'reference', got {value!r}")
    return value == "reference"


def check(name: str, answer: Any = None, **context) -> None:
    """Judge ``answer`` to exercise ``name`` (the reference answer under
    ``RLKIT_EXERCISE_ANSWERS=reference``) and print why it is right; ExerciseFailed if it is not.
    An exercise not answered yet prints what to set and passes. Returns None, so that a notebook
    cell ending with the check shows only what it prints."""
    item = EXERCISES[name]
    if reference_answers():
        answer, whose = item.reference(**context), "the reference answer"
    else:
        whose = "your answer"
        if answer is None:
            print(
                f"Not answered yet: set {item.variable} in the cell above, run it, then run this "
                "cell again (the answer is folded below)."
            )
            return
    try:
        message = item.judge(answer, **context)
    except ExerciseFailed as failed:  # raised afresh: the traceback stops here, not in the judge
        raise ExerciseFailed(str(failed)) from None
    except NotImplementedError:
        if reference_answers():
            raise
        print(
            f"Not written yet: fill in {item.variable} above (replace its `raise "
            "NotImplementedError`), run it, then run this cell again."
        )
        return
    print(f"Correct ({whose}): {message}")


def fail(message: str) -> None:
    raise ExerciseFailed(f"Not yet: {message} (see the folded answer below).")


def as_number(answer: Any, what: str) -> float:
    try:
        value = float(answer)
    except (TypeError, ValueError):
        fail(f"{what} should be a number, got {answer!r}")
    if not math.isfinite(value):
        fail(f"{what} should be a finite number, got {answer!r}")
    return value


def close_number(answer: Any, truth: float, tol: float, what: str, show: bool = True) -> float:
    """``answer`` as a float, or ExerciseFailed if it is more than ``tol`` from ``truth`` (named
    in the message when ``show``: for predictions the run prints it anyway)."""
    value = as_number(answer, what)
    if not abs(value - truth) <= tol:
        told = f"; the run gives {truth:.4g}" if show else ""
        fail(f"your {what}, {value:.4g}, is more than {tol:g} away{told}")
    return value


def as_tensor(answer: Any, what: str) -> torch.Tensor:
    try:
        return torch.as_tensor(answer, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        fail(f"{what} should be a list or tensor of numbers, got {answer!r}")


def one_of(answer: Any, choices: tuple[str, ...], what: str) -> str:
    if answer not in choices:
        fail(f"{what} should be one of {', '.join(map(repr, choices))}, got {answer!r}")
    return answer


def call(function: Any, *args, what: str) -> torch.Tensor:
    """Call the student's ``function`` on ``args`` and return its result as a float64 tensor."""
    if not callable(function):
        fail(f"{what} should be a function, got {function!r}")
    out = function(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))  # its own copy
    if out is None:
        fail(f"{what} returned None: return the result")
    return as_tensor(out.detach() if isinstance(out, torch.Tensor) else out, f"what {what} returns")


def compare_on(cases, student, truth, what: str, tol: float = 1e-6, hints=()) -> int:
    """Run ``student`` and ``truth`` on each case (a tuple of arguments) and fail on the first case
    where they differ by more than ``tol``, showing that case; ``hints`` are (rlkit-computed
    function, message) pairs: a wrong answer that matches one gets its message."""
    for args in cases:
        expected = as_tensor(truth(*args), "rlkit's result")
        got = call(student, *args, what=what)
        if got.shape != expected.shape:
            fail(
                f"{what}{shown(args)} returns shape {tuple(got.shape)}, not {tuple(expected.shape)}"
            )
        if not torch.allclose(got, expected, atol=tol, rtol=0):
            where = mismatch(args, got, expected)
            for hinted, message in hints:
                if torch.allclose(got, as_tensor(hinted(*args), "hint"), atol=tol, rtol=0):
                    fail(f"{where}: {message}")
            fail(where)
    return len(cases)


SHOWN_ENTRIES = 8  # inputs up to this size are shown whole in a message; larger, one entry


def mismatch(args, got: torch.Tensor, expected: torch.Tensor) -> str:
    """Where the student's result differs from rlkit's: the whole case if small, else the first
    entry that differs, with the inputs at that entry."""
    if got.numel() <= SHOWN_ENTRIES:
        return f"on {shown(args)} yours returns {fmt(got)}, rlkit {fmt(expected)}"
    i = int((got - expected).abs().reshape(-1).argmax())
    at = [
        fmt(a.reshape(-1)[i])
        if isinstance(a, torch.Tensor) and a.numel() == got.numel()
        else (fmt(a) if not isinstance(a, torch.Tensor) else f"a tensor of shape {tuple(a.shape)}")
        for a in args
    ]
    return (
        f"on an input of {got.numel()} entries, entry {i} (inputs there: {', '.join(at)}) is "
        f"{float(got.reshape(-1)[i]):.6g} in yours, {float(expected.reshape(-1)[i]):.6g} in rlkit's"
    )


def fmt(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return np.array2string(x.detach().double().numpy(), precision=4, separator=", ")
    return repr(x)


def shown(args) -> str:
    return "(" + ", ".join(fmt(a) for a in args) + ")"


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# 00 · GRPO from scratch

NULL_SHARE_TOL = 0.05


def null_share_reference(group_size: int, measured: float, prior_b: float = 6.0) -> float:
    from simulations import closed_forms as cf

    return cf.beta_prob_constant_group(1.0, prior_b, group_size)  # E[(1 − θ)^G + θ^G]


@exercise("00_null_share", "predict", "my_null_share", null_share_reference)
def _(answer, group_size: int, measured: float, prior_b: float = 6.0) -> str:
    close_number(answer, measured, NULL_SHARE_TOL, f"null share at G = {group_size}")
    return (
        f"about {measured:.2f} of the groups are null at G = {group_size}: "
        "(1 − θ)^G + θ^G averaged over the prompts"
    )


RLOO_GROUP = [[1.0, 0.0, 0.0, 0.0]]


@exercise("00_rloo_by_hand", "predict", "my_rloo", lambda: [1.0, -1 / 3, -1 / 3, -1 / 3])
def _(answer) -> str:
    from rlkit.advantages import get_estimator

    truth = get_estimator("rloo")(torch.tensor(RLOO_GROUP)).advantages[0].double()
    got = as_tensor(answer, "my_rloo")
    if got.shape != truth.shape:
        fail(f"my_rloo should hold 4 advantages, one per answer, got {answer!r}")
    if not torch.allclose(got, truth, atol=1e-3):
        fail(f"{fmt(got)} is not RLOO's (rlkit.advantages, 'rloo') for the group [1, 0, 0, 0]")
    return "rlkit's RLOO gives [1, −1/3, −1/3, −1/3] too"


BEST_BASELINE_TOL = 0.15


@exercise("00_best_baseline", "predict", "my_best_b", lambda best, theta: theta)
def _(answer, best: float, theta: float) -> str:
    close_number(answer, best, BEST_BASELINE_TOL, "variance-minimising baseline b*")
    return (
        f"b* = {best:.3f} for this prompt, near its success rate θ = {theta:.3f}: "
        "the expected reward is a good (not the best) baseline"
    )


def grpo_flat_reference(flat_rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    grouped = flat_rewards.reshape(-1, group_size)  # one row per prompt: its G rewards
    mean = grouped.mean(1, keepdim=True)
    std = grouped.std(1, keepdim=True)  # Bessel-corrected, as GRPO's
    return ((grouped - mean) / (std + 1e-4)).reshape(-1)


def reward_batches(seed: int, shapes) -> list[torch.Tensor]:
    """[P, G] reward batches: 0/1 rewards, real-valued ones, and one with a constant group."""
    gen, out = generator(seed), []
    for p, g in shapes:
        out.append((torch.rand(p, g, generator=gen, dtype=torch.float64) < 0.4).double())
        out.append(torch.randn(p, g, generator=gen, dtype=torch.float64))
    constant = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    return [constant.double(), *out]


@exercise("00_group_advantage", "implement", "my_group_advantage", lambda: grpo_flat_reference)
def _(answer) -> str:
    from rlkit.advantages import get_estimator

    def rlkit_flat(options):
        estimator = get_estimator("grpo", **options)
        return lambda flat, g: estimator(flat.reshape(-1, g)).advantages.reshape(-1)

    batches = reward_batches(0, [(1, 2), (3, 4), (5, 8), (16, 4)])
    cases = [(r.reshape(-1).clone(), r.shape[1]) for r in batches]
    hints = [
        (
            rlkit_flat({"std_ddof": 0}),
            "the population std (ddof = 0); GRPO's is Bessel's (ddof = 1)",
        ),
        (rlkit_flat({"scale_rewards": "batch"}), "you divided by the batch's std, not the group's"),
        (
            lambda flat, g: get_estimator("dr_grpo")(flat.reshape(-1, g)).advantages.reshape(-1),
            "that is Dr. GRPO: divide by the group's std (+ 1e-4)",
        ),
    ]
    n = compare_on(cases, answer, rlkit_flat({}), "my_group_advantage", 1e-6, hints)
    return f"matches rlkit's GRPO (get_estimator('grpo')) on {n} random batches"


# ---------------------------------------------------------------------------------------------
# 02 · Shrinkage MSE


def oracle_gain_reference(tau2: float, sigma2: float, group_size: int, measured: float) -> float:
    from simulations import closed_forms as cf

    return cf.shrinkage_factor(sigma2, tau2, group_size)  # the oracle's relative gain is S*


@exercise("02_oracle_gain", "predict", "my_gain", oracle_gain_reference)
def _(answer, tau2: float, sigma2: float, group_size: int, measured: float) -> str:
    close_number(answer, measured, 0.03, f"oracle's relative gain at τ² = {tau2}")
    return f"the oracle's MSE is {measured:.1%} below the group mean's: S* itself"


def shrink_side_reference(sigma2: float, tau2: float, group_size: int, measured, star) -> str:
    from simulations import closed_forms as cf

    return "less" if cf.raw_shrinks_less(sigma2, tau2, group_size) else "more"


@exercise("02_shrink_side", "predict", "my_side", shrink_side_reference)
def _(answer, sigma2: float, tau2: float, group_size: int, measured: float, star: float) -> str:
    side = one_of(answer, ("less", "more"), "my_side")
    truth = "less" if measured < star else "more"
    if side != truth:
        fail(
            f"the measured Ŝ = {measured:.3f} is {'below' if truth == 'less' else 'above'} S* = {star:.3f}"
        )
    return f"EBPO's Ŝ = {measured:.3f} shrinks {truth} than S* = {star:.3f}"


@exercise("02_s_star_by_hand", "predict", "my_s_star", lambda: 5 / 9)
def _(answer) -> str:
    from rlkit.advantages import get_estimator

    # rlkit's EBPO on a batch with σ² = 0.2 and τ² = 0.04 exactly: its diagnostics give S
    rewards = s_star_batch()
    diag = get_estimator("ebpo", prior="batch")(rewards).diagnostics
    truth = float(diag["shrinkage"][0])
    close_number(answer, truth, 0.005, "S*", show=False)
    return f"rlkit's EBPO, on a batch with σ² = 0.2, τ² = 0.04 and G = 4, shrinks by {truth:.3f}"


def s_star_batch() -> torch.Tensor:
    """Four-answer groups whose reward variance σ² is 0.2 and group-mean variance τ² is 0.04
    (population variances, as EBPO's; found by construction, then checked)."""
    # group means m ± d with within-group spread s: τ² = d², σ² = s² + τ² (law of total variance)
    d, s = 0.2, 0.4
    rows = [[m - s, m - s, m + s, m + s] for m in (0.5 - d, 0.5 + d)]
    return torch.tensor(rows, dtype=torch.float64)


def shrinkage_weight_reference(rewards: torch.Tensor) -> float:
    g = rewards.shape[1]
    sigma2 = rewards.var(unbiased=False)  # the population variance of every reward
    tau2 = rewards.mean(1).var(unbiased=False)  # and of the group means
    if sigma2 / g + tau2 <= 1e-6:
        return 1.0  # every reward equal: nothing to estimate from, the prior is all there is
    return float((sigma2 / g) / (sigma2 / g + tau2))


@exercise(
    "02_shrinkage_weight", "implement", "my_shrinkage_weight", lambda: shrinkage_weight_reference
)
def _(answer) -> str:
    from rlkit.advantages import get_estimator

    def rlkit_s(rewards):
        return get_estimator("ebpo", prior="batch")(rewards).diagnostics["shrinkage"][0].double()

    def with_ddof1(rewards):
        g = rewards.shape[1]
        sigma2, tau2 = rewards.var(), rewards.mean(1).var()
        return (sigma2 / g) / (sigma2 / g + tau2)

    cases = [(r,) for r in reward_batches(1, [(8, 4), (32, 2), (4, 16)])[1:]]
    cases.append((torch.zeros(4, 4, dtype=torch.float64),))
    hints = [(with_ddof1, "EBPO's σ² and τ² are population variances (ddof = 0)")]
    n = compare_on(cases, answer, rlkit_s, "my_shrinkage_weight", 1e-6, hints)
    return f"matches rlkit's EBPO shrinkage (prior='batch') on {n} batches"


# ---------------------------------------------------------------------------------------------
# 03 · Vanishing gradients


def beta_null_reference(beta, group_size: int, measured: float, num: int) -> float:
    from simulations import closed_forms as cf

    return cf.beta_prob_constant_group(*beta, group_size)


@exercise("03_constant_share", "predict", "my_constant_share", beta_null_reference)
def _(answer, beta, group_size: int, measured: float, num: int) -> str:
    se = math.sqrt(max(measured * (1 - measured), 1e-12) / num)
    close_number(
        answer,
        measured,
        max(0.02, 4 * se),
        f"constant-group share of Beta{tuple(beta)}, G = {group_size}",
    )
    return f"{measured:.3f} of the groups are constant"


@exercise("03_equal_topics", "predict", "my_penalty", lambda measured, se: -0.22)
def _(answer, measured, se) -> str:
    measured, se = np.asarray(measured, dtype=float), np.asarray(se, dtype=float)
    value = as_number(answer, "my_penalty")
    far = np.abs(value - measured) > np.maximum(4 * se, 0.03)
    if far.any():
        fail(
            f"a penalty of {value:+.3f} is far from the measured "
            f"{np.array2string(measured, precision=3)} (± {np.array2string(se, precision=3)})"
        )
    return f"every equally hard topic's all-fail group gets about {measured.mean():+.2f}"


@exercise("03_all_fail_by_hand", "predict", "my_advantage", lambda: -0.15)
def _(answer) -> str:
    value = as_number(answer, "my_advantage")
    baseline = (1 - 0.6) * 0.0 + 0.6 * 0.25  # V = (1 − S)·mean + S·μ_glob for the all-fail group
    if abs(value - (0.0 - baseline)) > 1e-6:
        fail(f"{value:g} is not r − V for every answer of the group (r = 0)")
    return "A = 0 − V = −0.15 for each of the four answers; GRPO gives them 0"


def expected_gradient_reference(logits, rewards, baseline) -> torch.Tensor:
    probs = logits.softmax(-1)
    score = torch.eye(len(logits), dtype=logits.dtype) - probs  # row a: ∇_z log π(a) = e_a − π
    return (probs * (rewards - baseline)) @ score  # Σ_a π(a)(r_a − b)(e_a − π)


def rlkit_expected_gradient(logits, rewards, baseline) -> torch.Tensor:
    """E_{a∼π}[(r_a − b)∇_z log π(a)] through rlkit's clipped loss and autograd: each answer a is a
    one-token sequence with advantage r_a − b, weighted by its probability π(a)."""
    from rlkit.losses import clipped_surrogate

    z = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(z, -1).unsqueeze(1)  # [K answers, 1 token]
    loss, _ = clipped_surrogate(logp, logp.detach(), rewards - baseline, 0.2, 0.2)
    weighted = (z.softmax(-1).detach() * loss.squeeze(1)).sum()  # exact expectation over answers
    (grad,) = torch.autograd.grad(-weighted, z)  # the loss is minus the objective
    return grad


@exercise(
    "03_baseline_lemma", "implement", "my_expected_gradient", lambda: expected_gradient_reference
)
def _(answer) -> str:
    gen = generator(2)
    cases = []
    for k in (2, 3, 5, 8):
        logits = torch.randn(k, generator=gen, dtype=torch.float64)
        rewards = (torch.rand(k, generator=gen, dtype=torch.float64) < 0.5).double()
        for b in (0.0, 0.5, float(torch.randn(1, generator=gen)), 3.0):
            cases.append((logits, rewards, b))
    hints = [
        (
            lambda z, r, b: rlkit_expected_gradient(z, r, 0.0) - b * z.softmax(-1),
            "your gradient moves with b; Σ_a π(a)∇ log π(a) = 0, so b must drop out",
        ),
        (
            lambda z, r, b: (r - b) * z.softmax(-1),
            "that is π·(r − b): the gradient of log π(a) is e_a − π, not e_a",
        ),
    ]
    n = compare_on(cases, answer, rlkit_expected_gradient, "my_expected_gradient", 1e-9, hints)
    return (
        f"matches autograd through rlkit's loss on {n} cases, the same for every baseline b: "
        "an action-independent baseline leaves the expected gradient unchanged"
    )


# ---------------------------------------------------------------------------------------------
# 07 · Entropy decay


@exercise(
    "07_smallest_std",
    "predict",
    "my_smallest_std",
    lambda group_size, measured: 1 / math.sqrt(group_size),
)
def _(answer, group_size: int, measured: float) -> str:
    close_number(answer, measured, 0.005, f"smallest mixed-group std at G = {group_size}")
    verdict = "≥" if measured >= 0.5 else "<"
    return f"1/√G = {measured:.3f} {verdict} 0.5 at G = {group_size}"


ENTROPY_GAPS = {0.5: -0.36, 0.1: -0.14, 0.02: -0.02}  # the folded answer's EBPO − GRPO, nats


@exercise(
    "07_entropy_gap",
    "predict",
    "my_entropy_gap",
    lambda lr, mean, low, high: ENTROPY_GAPS.get(lr, mean),
)
def _(answer, lr: float, mean: float, low: float, high: float) -> str:
    value = as_number(answer, "my_entropy_gap")
    tol = max(0.05, (high - low) / 2)
    if abs(value - mean) > tol:
        fail(
            f"at η = {lr} EBPO − GRPO is {mean:+.3f} nats [{low:+.3f}, {high:+.3f}], not {value:+.3f}"
        )
    return f"EBPO − GRPO = {mean:+.3f} nats at η = {lr}: whitening's larger step costs entropy"


def buggy_group_advantage(flat_rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """The silent bug: rows taken G at a time as one group, wherever their prompts are."""
    grouped = flat_rewards.reshape(-1, group_size)
    mean, std = grouped.mean(1, keepdim=True), grouped.std(1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).reshape(-1)


def fixed_group_advantage_reference(flat_rewards: torch.Tensor, prompt_ids) -> torch.Tensor:
    ids = torch.as_tensor(prompt_ids)
    out = torch.empty_like(flat_rewards)
    for prompt in ids.unique():  # group by the prompt each row answers, not by position
        rows = ids == prompt
        group = flat_rewards[rows]
        out[rows] = (group - group.mean()) / (group.std() + 1e-4)
    return out


def shuffled_layouts(seed: int):
    """(flat rewards, prompt ids, rlkit's advantages in the same row order) in three layouts:
    interleaved as in the bug, shuffled (as a batch balancer reorders rows), and contiguous."""
    from rlkit.advantages import get_estimator

    gen, out = generator(seed), []
    for p, g in ((3, 4), (8, 4), (5, 8)):
        rewards = (torch.rand(p, g, generator=gen, dtype=torch.float64) < 0.4).double()
        rewards[0] = 0.0  # one all-fail group: its advantages must stay 0
        truth = get_estimator("grpo")(rewards).advantages.reshape(-1)
        ids = torch.arange(p).repeat_interleave(g)
        for order in (
            torch.arange(p * g).reshape(p, g).T.reshape(-1),  # [p0, p1, …] repeated G times
            torch.randperm(p * g, generator=gen),
            torch.arange(p * g),
        ):
            out.append((rewards.reshape(-1)[order], ids[order], truth[order]))
    return out


@exercise(
    "07_silent_bug", "bug", "my_fixed_group_advantage", lambda: fixed_group_advantage_reference
)
def _(answer) -> str:
    cases = shuffled_layouts(3)
    truths = {id(c[0]): c[2] for c in cases}
    hints = [
        (
            lambda flat, ids: buggy_group_advantage(flat, int((ids == ids[0]).sum())),
            "that is still the buggy grouping by position",
        ),
    ]
    n = compare_on(
        [c[:2] for c in cases],
        answer,
        lambda flat, ids: truths[id(flat)],
        "my_fixed_group_advantage",
        1e-6,
        hints,
    )
    return f"matches rlkit's GRPO in {n} row orders: interleaved, shuffled and contiguous"


# ---------------------------------------------------------------------------------------------
# 04 · Clustered priors


def topic_gain_reference(closed_gap: float, measured_gap: float, se: float) -> float:
    return closed_gap


@exercise("04_equal_means_gain", "predict", "my_topic_gain", topic_gain_reference)
def _(answer, closed_gap: float, measured_gap: float, se: float) -> str:
    close_number(answer, measured_gap, max(3 * se, 0.002), "J_shuffle − J_topic")
    return (
        f"topic-coherent batches lower the prior error by {measured_gap:.4f}: Var_k(μ_k)·(1 − 1/B)"
    )


@exercise("04_between_by_hand", "predict", "my_between", lambda: 0.05)
def _(answer) -> str:
    from simulations import closed_forms as cf
    from simulations import experiments as ex

    parts = cf.variance_decomposition(ex.ClusteredPopulation((0.15, 0.35, 0.55, 0.75), 8.0))
    close_number(answer, parts["between"], 1e-6, "Var_k(μ_k)", show=False)
    return "Var_k(μ_k) = (0.09 + 0.01 + 0.01 + 0.09)/4 = 0.05"


@exercise("04_gap_at_b1", "predict", "my_gap_at_1", lambda gap: 0.0)
def _(answer, gap: float) -> str:
    close_number(answer, gap, 1e-4, "gap at B = 1")
    return "at B = 1 the batch prior is the prompt's own group mean, whatever the order: no gap"


# ---------------------------------------------------------------------------------------------
# 05 · AGPO controllers


@exercise("05_vote_entropy", "predict", "my_vote_entropy", lambda: 1.5 * math.log(2))
def _(answer) -> str:
    from rlkit.answers import vote_entropy

    truth = float(vote_entropy([["7", "7", "9", "12"]])[0])
    close_number(answer, truth, 1e-3, "E_probe", show=False)
    return f"rlkit's vote_entropy gives {truth:.4f} nats = 1.5 ln 2"


@exercise("05_eps_by_hand", "predict", "my_eps", lambda: 0.2 * (1 + 0.1 * math.log(2)) / 1.5)
def _(answer) -> str:
    from rlkit.controllers import AdaptiveClip, ProbeStats

    stats = ProbeStats(torch.tensor([0.5]), torch.zeros(1), torch.tensor([math.log(2)]))
    truth = float(AdaptiveClip()(stats, torch.ones(1))[0])
    close_number(answer, truth, 1e-4, "ε", show=False)
    return f"rlkit's AdaptiveClip gives {truth:.4f}"


CLAMP_SHARES = {0.01: 0.8, 0.1: 0.0, 0.5: 0.0}  # the folded answer's share of steps at ε = 0.1


@exercise(
    "05_clamp_share",
    "predict",
    "my_clamp_share",
    lambda rate, measured: CLAMP_SHARES.get(rate, measured),
)
def _(answer, rate: float, measured: float) -> str:
    close_number(answer, measured, 0.05, f"share of steps on the clamp at rate {rate}")
    return f"ε sits on its 0.1 clamp in {measured:.0%} of the steps at entropy_ema_rate {rate}"


def adaptive_eps_reference(dispersion, vote_entropy, entropy_ratio, kl) -> torch.Tensor:
    ratio = entropy_ratio.clamp(0.5, 1.5)  # H / H̄_ref, bounded
    eps = 0.2 * ratio * (1 + 0.1 * vote_entropy) / (1 + 1.0 * dispersion + 0.5 * kl)
    return eps.clamp(0.05, 0.4)


def rlkit_adaptive_eps(dispersion, vote_entropy, entropy_ratio, kl) -> torch.Tensor:
    from rlkit.controllers import AdaptiveClip, ProbeStats

    clip = AdaptiveClip()  # the defaults: ε_base 0.2, α 1, γ 0.5, δ 0.1, ζ 0, ε in [0.05, 0.4]
    clip.entropy_ref.update(1.0)  # H̄_ref = 1, so the entropy H is the ratio H/H̄_ref
    clip.kl.value = float(kl)
    stats = ProbeStats(
        dispersion.float(), torch.zeros_like(dispersion).float(), vote_entropy.float()
    )
    return clip(stats, entropy_ratio.float())


@exercise("05_adaptive_eps", "implement", "my_adaptive_eps", lambda: adaptive_eps_reference)
def _(answer) -> str:
    gen, cases = generator(5), []
    for p, kl in ((4, 0.0), (16, 0.05), (16, 0.6)):
        dispersion = 3 * torch.rand(p, generator=gen, dtype=torch.float64) ** 2  # some hit ε_min
        entropy = math.log(8) * torch.rand(p, generator=gen, dtype=torch.float64)
        ratio = 2 * torch.rand(p, generator=gen, dtype=torch.float64)  # some outside [0.5, 1.5]
        cases.append((dispersion, entropy, ratio, kl))

    def unclamped(dispersion, vote_entropy, entropy_ratio, kl):
        return (
            0.2
            * entropy_ratio.clamp(0.5, 1.5)
            * (1 + 0.1 * vote_entropy)
            / (1 + dispersion + 0.5 * kl)
        )

    hints = [
        (unclamped, "ε itself is clamped to [ε_min, ε_max] = [0.05, 0.4]"),
        (
            lambda d, e, r, kl: (0.2 * r * (1 + 0.1 * e) / (1 + d + 0.5 * kl)).clamp(0.05, 0.4),
            "the entropy ratio H/H̄_ref is clipped to [0.5, 1.5] first",
        ),
    ]
    n = compare_on(cases, answer, rlkit_adaptive_eps, "my_adaptive_eps", 1e-6, hints)
    return f"matches rlkit's AdaptiveClip on {n} random batches of probes"


# ---------------------------------------------------------------------------------------------
# 01 · One GRPO step


@exercise(
    "01_rloo_one_right", "predict", "my_rloo", lambda group_size: (1.0, -1 / (group_size - 1))
)
def _(answer, group_size: int) -> str:
    from rlkit.advantages import get_estimator

    group = torch.zeros(1, group_size)
    group[0, 0] = 1.0
    rloo = get_estimator("rloo")(group).advantages[0].double()
    got = as_tensor(answer, "my_rloo")
    if got.shape != (2,):
        fail(f"my_rloo should be (the correct answer's advantage, a wrong one's), got {answer!r}")
    if not torch.allclose(got, rloo[:2], atol=1e-3):
        fail(
            f"{fmt(got)} is not RLOO's (correct, wrong) pair for a group with one success of {group_size}"
        )
    return f"rlkit's RLOO gives ({float(rloo[0]):.3f}, {float(rloo[1]):.3f})"


def clipped_side_reference(log_ratio: float, eps: float = 0.2) -> str:
    rho = math.exp(log_ratio)
    return "low" if rho < 1 - eps else "high" if rho > 1 + eps else "none"


@exercise("01_clipped_side", "predict", "my_clipped_side", clipped_side_reference)
def _(answer, log_ratio: float, eps: float = 0.2) -> str:
    from rlkit.losses import clipped_surrogate

    side = one_of(answer, ("low", "high", "none"), "my_clipped_side")
    advantages = torch.tensor([1.0, -1.0])
    logp = torch.full((2, 1), float(log_ratio))
    _, stats = clipped_surrogate(logp, torch.zeros(2, 1), advantages, eps, eps)
    truth = "low" if stats.low > 0 else "high" if stats.high > 0 else "none"
    if side != truth:
        fail(f"at ρ = {math.exp(log_ratio):.3f} rlkit's clipped loss clips {truth!r}, not {side!r}")
    return f"at ρ = {math.exp(log_ratio):.3f} the clip takes {truth!r}"


@exercise("01_adam_step_ratio", "predict", "my_ratio", lambda measured: 1.0)
def _(answer, measured: float) -> str:
    close_number(answer, measured, 0.05, "step-size ratio for advantages × 3")
    return f"the step grows by {measured:.3f}, not 3: Adam's first step is about lr·sign(g)"


def clipped_loss_reference(ratio, advantages, eps):
    clipped_high = (advantages > 0) & (ratio > 1 + eps)  # pushing up past 1 + ε gains nothing
    clipped_low = (advantages < 0) & (ratio < 1 - eps)  # pushing down past 1 − ε gains nothing
    loss = -ratio * advantages
    loss = torch.where(clipped_high, -(1 + eps) * advantages, loss)
    return torch.where(clipped_low, -(1 - eps) * advantages, loss)


@exercise("01_clip_by_cases", "implement", "my_clipped_loss", lambda: clipped_loss_reference)
def _(answer) -> str:
    from rlkit.losses import clipped_surrogate

    def rlkit_loss(ratio, advantages, eps):
        logp = ratio.log().unsqueeze(1)  # N one-token sequences
        loss, _ = clipped_surrogate(logp, torch.zeros_like(logp), advantages, eps, eps)
        return loss.squeeze(1)

    gen, cases = generator(6), []
    for n, eps in ((6, 0.2), (64, 0.2), (64, 0.1)):
        ratio = torch.exp(0.5 * torch.randn(n, generator=gen, dtype=torch.float64))
        cases.append((ratio, torch.randn(n, generator=gen, dtype=torch.float64), eps))
    hints = [
        (
            lambda r, a, e: -(r.clamp(1 - e, 1 + e) * a),
            "clipping ρ everywhere is not PPO's min: "
            "the clip only binds where it would gain (A > 0 above 1 + ε, A < 0 below 1 − ε)",
        ),
        (
            lambda r, a, e: -torch.maximum(r * a, r.clamp(1 - e, 1 + e) * a),
            "the loss is minus the *min* of ρA and clip(ρ)A, not the max",
        ),
    ]
    count = compare_on(cases, answer, rlkit_loss, "my_clipped_loss", 1e-9, hints)
    # the gradient: zero exactly where the clip binds, −A elsewhere
    for ratio, advantages, eps in cases:
        mine = ratio.clone().requires_grad_(True)
        out = answer(mine, advantages, eps)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            fail(
                "my_clipped_loss should be built from torch operations on ρ, so that it has a gradient"
            )
        (got,) = torch.autograd.grad(out.sum(), mine)
        theirs = ratio.clone().requires_grad_(True)
        (want,) = torch.autograd.grad(rlkit_loss(theirs, advantages, eps).sum(), theirs)
        if not torch.allclose(got, want, atol=1e-9):
            fail("the values match but the gradient in ρ does not: a clipped token gets none")
    return f"matches rlkit's clipped_surrogate, values and gradients, on {count} random batches"


# ---------------------------------------------------------------------------------------------
# 06 · One run of each method

REWARD_SE_TOL = 0.01


def reward_se_reference(p: float, answers: int) -> float:
    return math.sqrt(p * (1 - p) / answers)  # the binomial SE of a mean of `answers` rewards


@exercise("06_reward_se", "predict", "my_reward_se", reward_se_reference)
def _(answer, p: float, answers: int) -> str:
    truth = reward_se_reference(p, answers)
    close_number(answer, truth, REWARD_SE_TOL, f"SE of a mean of {answers} rewards at p = {p:.3f}")
    return f"√(p(1 − p)/n) = {truth:.3f}: a few points of noise on every step's reward"


@exercise("06_clip_share", "predict", "my_clip_share", lambda measured: 0.0)
def _(answer, measured: float) -> str:
    close_number(answer, measured, 1e-3, "share of tokens the clip bound on")
    return "ρ = 1 at the only update of each batch, so no token is clipped, whatever ε is"


# ---------------------------------------------------------------------------------------------
# 08 · EBPO on the language model


def mdd_reference(row: dict) -> float:
    from scipy import stats

    n = len(row["vs_baseline_seeds"])
    t95, t80 = stats.t.ppf(0.975, n - 1), stats.t.ppf(0.8, n - 1)
    se = (row["vs_baseline"]["high"] - row["vs_baseline"]["low"]) / (2 * t95)
    return (t95 + t80) * se


@exercise("08_mdd_from_interval", "predict", "my_mdd", mdd_reference)
def _(answer, row: dict) -> str:
    close_number(answer, row["mdd"], 1e-6, "MDD", show=False)
    return f"the report's MDD is {100 * row['mdd']:.2f} points too"


def one_seed_sd_reference(row: dict) -> float:
    from scipy import stats

    n = len(row["seeds"])
    se = (row["end"]["high"] - row["end"]["low"]) / (2 * stats.t.ppf(0.975, n - 1))
    return 100 * math.sqrt(n) * se


@exercise("08_one_seed_spread", "predict", "my_seed_sd", one_seed_sd_reference)
def _(answer, row: dict) -> str:
    truth = one_seed_sd_reference(row)
    close_number(answer, truth, 0.1, "one seed's standard deviation (points)", show=False)
    return f"one seed's spread is √n·SE = {truth:.2f} points: a poke of one seed moves within ±{2 * truth:.1f}"


# ---------------------------------------------------------------------------------------------
# 09 · AGPO on the language model


@exercise("09_verdict", "predict", "my_verdict", lambda claim: claim["verdict"])
def _(answer, claim: dict) -> str:
    if not isinstance(answer, str):
        fail(f"my_verdict should be a verdict such as 'reproduced', got {answer!r}")
    if answer != claim["verdict"]:
        fail(f"the pre-registered rule does not say {answer!r} for this claim")
    return f"the report says {claim['verdict']!r} too"


def temperature_swing_ratio(lam: float, base_lam: float = 0.15) -> float:
    """How many times farther from 1 rlkit's ATS moves τ with gain ``lam`` than with
    ``base_lam``, on a fixed sequence of probe statistics (no clamp reached)."""
    from rlkit.controllers import AdaptiveTemperature, ProbeStats

    gen = generator(8)
    stats = ProbeStats(
        0.2 + 0.3 * torch.rand(64, generator=gen),
        torch.zeros(64),
        0.5 * torch.rand(64, generator=gen),
    )
    swings = []
    for gain in (lam, base_lam):
        tau = AdaptiveTemperature(lam=gain, tau_min=0.01, tau_max=100.0)(stats)
        swings.append(float((tau - 1).abs().max()))
    return swings[0] / swings[1]


@exercise("09_temperature_gain", "predict", "my_swing_factor", lambda lam: lam / 0.15)
def _(answer, lam: float) -> str:
    truth = temperature_swing_ratio(lam)
    close_number(answer, truth, 0.05 * truth, f"swing factor at λ = {lam}", show=False)
    return (
        f"rlkit's ATS moves τ − 1 in proportion to λ: {truth:.2f}× at λ = {lam} (until τ's bounds)"
    )


# ---------------------------------------------------------------------------------------------
# The synthesis (notebooks/results/synthesis.ipynb)


def holm_reference(family: list[dict]) -> dict[str, float]:
    ordered = sorted(family, key=lambda c: c["p_exact"])
    adjusted, running = {}, 0.0
    for k, c in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - k) * c["p_exact"]))
        adjusted[c["name"]] = running
    return adjusted


@exercise("synthesis_holm_by_hand", "predict", "my_holm", holm_reference)
def _(answer, family: list[dict]) -> str:
    if not isinstance(answer, dict):
        fail(f"my_holm should be a dict {{claim name: Holm p}}, got {type(answer).__name__}")
    missing = [c["name"] for c in family if c["name"] not in answer]
    if missing:
        fail(f"my_holm has no value for {missing}")
    wrong = [
        c["name"]
        for c in family
        if abs(as_number(answer[c["name"]], c["name"]) - c["p_holm"]) > 1e-9
    ]
    if wrong:
        fail(f"the report's Holm p differs for {wrong}")
    return f"the report's Holm p-values, all {len(family)} of them"


def seeds_reference(seeds: int, mdd: float, effect: float) -> int:
    return math.ceil(seeds * (mdd / effect) ** 2)


@exercise("synthesis_seeds_for_mdd", "predict", "my_seeds", seeds_reference)
def _(answer, seeds: int, mdd: float, effect: float) -> str:
    truth = seeds_reference(seeds, mdd, effect)
    close_number(answer, truth, 1, f"seeds for an MDD of {effect} points", show=False)
    return f"about {truth} seeds: the MDD falls as 1/√(seeds)"
