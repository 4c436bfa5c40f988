"""The course's exercise checkers (simulations/exercises.py), without running a notebook: each
passes on its reference answer and FAILS, with a message that says what is wrong, on a wrong one;
every exercise a notebook checks is registered, and every registered one is checked by a notebook.
Under RLKIT_EXERCISE_ANSWERS=reference (``make test``, notebooks/conftest.py) the notebooks run
every checker on its reference answer."""

import json
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch

from simulations import exercises
from simulations.exercises import EXERCISES, ExerciseFailed, check

ROOT = Path(__file__).resolve().parent.parent
CHECK_CALL = re.compile(r'exercises\.check\(\s*"([^"]+)"')


def committed_row(group_size: int = 2) -> dict:
    summary = json.loads((ROOT / "results/07_group_size/summary.json").read_text())
    return next(
        r
        for r in summary["rows"]
        if (r["arm"], r["group_size"], r["metric"]) == ("EBPO", group_size, "eval/greedy_accuracy")
    )


def committed_claim(name: str) -> dict:
    summary = json.loads((ROOT / "results/22_agpo_controls/summary.json").read_text())
    return next(c for c in summary["claims"] if c["name"] == name)


def holm_family() -> list[dict]:
    return [
        {"name": "a", "p_exact": 0.01, "p_holm": 0.03},
        {"name": "b", "p_exact": 0.04, "p_holm": 0.06},  # the running maximum
        {"name": "c", "p_exact": 0.03, "p_holm": 0.06},
    ]


# Each exercise's context (what its notebook passes, at the notebook's default values) and a
# deliberately wrong answer: a near miss or the usual slip, not garbage.
CASES = {
    "00_null_share": ({"group_size": 4, "measured": 0.61}, 0.25),
    "00_rloo_by_hand": ({}, [0.75, -0.25, -0.25, -0.25]),  # Dr. GRPO's
    "00_best_baseline": ({"best": 0.2, "theta": 0.299}, 0.5),
    "00_group_advantage": (
        {},
        lambda flat, g: (
            (flat.reshape(-1, g) - flat.reshape(-1, g).mean(1, keepdim=True))
            / (flat.reshape(-1, g).std(1, unbiased=False, keepdim=True) + 1e-4)
        ).reshape(-1),
    ),
    "02_oracle_gain": ({"tau2": 0.04, "sigma2": 0.25, "group_size": 4, "measured": 0.61}, 0.39),
    "02_shrink_side": (
        {"sigma2": 0.2, "tau2": 0.04, "group_size": 32, "measured": 0.1389, "star": 0.135},
        "less",
    ),
    "02_s_star_by_hand": ({}, 0.5),
    "02_shrinkage_weight": (
        {},
        lambda r: (r.var() / r.shape[1]) / (r.var() / r.shape[1] + r.mean(1).var()),  # ddof 1
    ),
    "03_constant_share": (
        {"beta": (1.0, 3.0), "group_size": 4, "measured": 0.4607, "num": 50_000},
        0.3,
    ),
    "03_equal_topics": (
        {"measured": [-0.223, -0.2196, -0.2202, -0.2251, -0.2208], "se": [0.003] * 5},
        -0.5,
    ),
    "03_all_fail_by_hand": ({}, 0.0),  # GRPO's
    "03_baseline_lemma": (
        {},
        lambda z, r, b: (
            (z.softmax(-1) * (r - b)) @ (torch.eye(len(z), dtype=z.dtype) - z.softmax(-1))
            - b * z.softmax(-1)
        ),
    ),
    "07_smallest_std": ({"group_size": 4, "measured": 0.5}, 0.577),
    "07_entropy_gap": ({"lr": 0.5, "mean": -0.3618, "low": -0.4034, "high": -0.3202}, 0.2),
    "07_silent_bug": ({}, lambda flat, ids: exercises.buggy_group_advantage(flat, 4)),
    "04_equal_means_gain": ({"closed_gap": 0.0, "measured_gap": 0.00025, "se": 0.0005}, 0.05),
    "04_between_by_hand": ({}, 0.2),
    "04_gap_at_b1": ({"gap": 0.0}, 0.05),
    "05_vote_entropy": ({}, math.log(3)),
    "05_eps_by_hand": ({}, 0.2),
    "05_clamp_share": ({"rate": 0.01, "measured": 0.79}, 0.0),
    "05_adaptive_eps": (
        {},
        lambda d, e, r, kl: 0.2 * r.clamp(0.5, 1.5) * (1 + 0.1 * e) / (1 + d + 0.5 * kl),
    ),
    "01_rloo_one_right": ({"group_size": 4}, (0.75, -0.25)),
    "01_clipped_side": ({"log_ratio": -0.5, "eps": 0.2}, "high"),
    "01_adam_step_ratio": ({"measured": 1.0}, 3.0),
    "01_clip_by_cases": ({}, lambda rho, a, eps: -(rho.clamp(1 - eps, 1 + eps) * a)),
    "06_reward_se": ({"p": 0.277, "answers": 128}, 0.447),  # one answer's std, not the mean's
    "06_clip_share": ({"measured": 0.0}, 0.2),  # ε itself, not the share it clips
    "08_mdd_from_interval": ({"row": committed_row()}, committed_row()["mdd"] / 2),
    "08_one_seed_spread": ({"row": committed_row()}, 0.3),  # the SE, not one seed's spread
    "09_verdict": (
        {"claim": committed_claim("IQR as AGPO's dispersion is no worse than the std")},
        "inconclusive",
    ),
    "09_temperature_gain": ({"lam": 0.6}, 1.0),
    "synthesis_holm_by_hand": (
        {"family": holm_family()},
        {"a": 0.03, "b": 0.12, "c": 0.09},
    ),  # Bonf.
    "synthesis_seeds_for_mdd": ({"seeds": 20, "mdd": 0.94, "effect": 0.5}, 38),
}


@pytest.fixture
def reference(monkeypatch):
    monkeypatch.setenv(exercises.ANSWERS_ENV, "reference")


@pytest.fixture
def student(monkeypatch):
    monkeypatch.delenv(exercises.ANSWERS_ENV, raising=False)


def test_every_exercise_has_a_case_here():
    assert set(CASES) == set(EXERCISES)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_reference_answer_passes(name, reference, capsys):
    context, _ = CASES[name]
    check(name, None, **context)
    assert "Correct (the reference answer)" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_reference_answer_passes_as_a_students(name, student, capsys):
    """The reference is a correct answer, not a key the checker merely recognises."""
    context, _ = CASES[name]
    check(name, EXERCISES[name].reference(**context), **context)
    assert "Correct (your answer)" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_a_wrong_answer_fails_with_a_clear_message(name, student):
    context, wrong = CASES[name]
    with pytest.raises(ExerciseFailed) as failed:
        check(name, wrong, **context)
    message = str(failed.value)
    assert message.startswith("Not yet: ") and "see the folded answer" in message
    assert len(message) > 40, message  # says what is wrong, not just "wrong"


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_an_unanswered_exercise_says_what_to_do_and_does_not_stop_the_notebook(
    name, student, capsys
):
    context, _ = CASES[name]
    item = EXERCISES[name]
    if item.kind == "predict":
        answer = None
    else:

        def answer(*args):
            raise NotImplementedError("your code here")

    check(name, answer, **context)
    out = capsys.readouterr().out
    assert item.variable in out and ("Not answered yet" in out or "Not written yet" in out)


def test_the_wrong_answers_get_the_hint_for_their_slip(student):
    hints = {
        "00_group_advantage": "population std",
        "02_shrinkage_weight": "population variances",
        "03_baseline_lemma": "moves with b",
        "07_silent_bug": "buggy grouping",
        "05_adaptive_eps": "clamped to [ε_min, ε_max]",
        "01_clip_by_cases": "only binds where it would gain",
    }
    for name, hint in hints.items():
        context, wrong = CASES[name]
        with pytest.raises(ExerciseFailed, match=re.escape(hint)):
            check(name, wrong, **context)


def test_a_function_that_returns_nothing_or_the_wrong_shape_is_told_so(student):
    with pytest.raises(ExerciseFailed, match="returned None"):
        check("00_group_advantage", lambda flat, g: None)
    with pytest.raises(ExerciseFailed, match="shape"):
        check("00_group_advantage", lambda flat, g: flat.reshape(-1, g))
    with pytest.raises(ExerciseFailed, match="should be a number"):
        check("02_s_star_by_hand", "five ninths")


def test_the_clip_checker_needs_the_gradient_right_too(student):
    def detached(rho, a, eps):  # right values, no gradient through ρ
        return exercises.clipped_loss_reference(rho.detach(), a, eps)

    with pytest.raises(ExerciseFailed, match="gradient"):
        check("01_clip_by_cases", detached)


def test_the_answers_variable_accepts_only_unset_or_reference(monkeypatch):
    monkeypatch.setenv(exercises.ANSWERS_ENV, "yes")
    with pytest.raises(ValueError, match="reference"):
        exercises.reference_answers()


# the lessons, and the results notebooks beside them (notebooks/results/)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "notebooks" / "results").glob("*.ipynb")
)


def notebook_checks() -> dict[str, list[str]]:
    found = {}
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                for name in CHECK_CALL.findall(cell.source):
                    found.setdefault(name, []).append(path.stem)
    return found


def notebook_of(name: str) -> Path:
    """An exercise's notebook: a lesson's name starts with its number ("01_clip_by_cases"), a
    results notebook's with its stem ("synthesis_holm_by_hand")."""
    number = [p for p in NOTEBOOKS if p.parent.name == "notebooks" and p.name[:3] == name[:3]]
    named = [p for p in NOTEBOOKS if name.startswith(f"{p.stem}_")]
    assert len(number + named) == 1, (name, number + named)
    return (number + named)[0]


def test_every_registered_exercise_is_checked_once_in_its_own_notebook():
    found = notebook_checks()
    assert set(found) == set(EXERCISES), set(found) ^ set(EXERCISES)
    for name, stems in found.items():
        assert stems == [notebook_of(name).stem], (name, stems)


def test_each_core_idea_has_a_write_it_yourself_exercise_and_there_is_a_silent_bug():
    kinds = {name: item.kind for name, item in EXERCISES.items()}
    for name in (
        "00_group_advantage",  # GRPO's group advantage
        "03_baseline_lemma",  # the baseline lemma
        "02_shrinkage_weight",  # EBPO's shrinkage weight
        "01_clip_by_cases",  # PPO's clip by cases
        "05_adaptive_eps",  # AGPO's adaptive ε
    ):
        assert kinds[name] == "implement", name
    assert [n for n, k in kinds.items() if k == "bug"] == ["07_silent_bug"]


def test_make_test_and_the_notebook_conftest_fill_in_the_reference_answers():
    makefile = (ROOT / "Makefile").read_text()
    test_rule = makefile[makefile.index("\ntest: venv") :].split("\n\n")[0]
    assert f"{exercises.ANSWERS_ENV}=reference" in test_rule
    conftest = (ROOT / "notebooks/conftest.py").read_text()
    assert "ANSWERS_ENV" in conftest and '"reference"' in conftest


def folded_answer_code(name: str) -> str:
    """The python block of the folded answer after exercise ``name``'s check cell."""
    nb_cells = nbformat.read(notebook_of(name), as_version=4).cells
    i = next(i for i, c in enumerate(nb_cells) if f'exercises.check("{name}"' in c.source)
    answer = next(c.source for c in nb_cells[i + 1 :] if c.cell_type == "markdown")
    block = re.search(r"```python\n(.*?)```", answer, re.S)
    assert block, f"{name}: the folded answer shows no code"
    return block.group(1)


@pytest.mark.parametrize("name", sorted(n for n, e in EXERCISES.items() if e.kind != "predict"))
def test_the_folded_answers_code_passes_as_a_students(name, student, capsys):
    namespace = {"torch": torch}
    exec(folded_answer_code(name), namespace)
    check(name, namespace[EXERCISES[name].variable])
    assert "Correct (your answer)" in capsys.readouterr().out
