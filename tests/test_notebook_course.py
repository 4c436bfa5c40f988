"""The notebooks as a course: the lessons are notebooks/NN_*.ipynb, read in file order (docs/course.md
and the README state that order); each is short enough for one sitting and opens with a question, a
"Start here" box (prerequisites, what you will learn, run time, next notebook) linking the
glossary, and a picture; its text names no issue and no date (the results notebooks in
notebooks/results/ keep the history). Each course notebook has 2-4 "Try it" exercises, every one
judging the student's own answer (a prediction or a function, through simulations.exercises.check)
and followed by a folded answer; each theory notebook draws a picture before its claim or formulas;
05 names its signals and weights before its formulas; 06 teaches how to read a training curve and
01 warns that the loss value means nothing; theory and practice point to each other."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))  # the lessons
RESULTS_NOTEBOOKS = sorted((ROOT / "notebooks" / "results").glob("*.ipynb"))
LESSON_NAME = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")
# a lesson is read in one sitting: under about an hour at a plain reading rate
LESSON_MARKDOWN_LIMIT = 16_000  # characters of Markdown
# a lesson opens with a picture: the first figure within its first cells, before this much Markdown
PICTURE_WITHIN_CELLS = 10
PICTURE_WITHIN_MARKDOWN = 5_000  # characters
ISSUE_OR_DATE = re.compile(r"\bissues? #?\d+|\b20\d\d-\d\d-\d\d\b", re.I)
# the course notebooks, with Try-it exercises; 10 (the 8B recipe) and 11 (a real pretrained model)
# have none, but every lesson opens with a Start-here box; the synthesis, a results notebook,
# keeps its two
COURSE_NOTEBOOKS = [
    "00_grpo_from_scratch",
    "01_one_grpo_step",
    "02_shrinkage_mse",
    "03_vanishing_gradients",
    "04_clustered_priors",
    "05_agpo_controllers",
    "06_one_run_of_each_method",
    "07_entropy_decay",
    "08_ebpo_on_the_language_model",
    "09_agpo_on_the_language_model",
    "results/synthesis",
]
# a question and a picture before the claim
THEORY_NOTEBOOKS = [
    "02_shrinkage_mse",
    "03_vanishing_gradients",
    "04_clustered_priors",
    "05_agpo_controllers",
    "07_entropy_decay",
]
# a claim or a formula: where a theory notebook stops asking and starts stating
CLAIM = re.compile(r"\*\*Claims?\*\*|\*\*What AGPO claims\*\*|\$\$")
# theory and practice point to each other
CROSS_REFERENCES = [
    ("04_clustered_priors", "08_ebpo_on_the_language_model"),
    ("07_entropy_decay", "06_one_run_of_each_method"),
    ("03_vanishing_gradients", "01_one_grpo_step"),
]
START_HERE_ITEMS = ("**Prerequisites:**", "**You will learn:**", "**Run time:**", "**Next:**")


def cells(stem: str):
    return nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells


def try_it_cells(nb_cells) -> list[int]:
    return [
        i
        for i, cell in enumerate(nb_cells)
        if cell.cell_type == "code" and cell.source.startswith("# Try it")
    ]


def markdown_text(stem: str) -> str:
    return "\n".join(c.source for c in cells(stem) if c.cell_type == "markdown")


def test_the_lessons_are_numbered_from_00_without_gaps():
    names = [path.name for path in NOTEBOOKS]
    assert all(LESSON_NAME.match(name) for name in names), names
    assert [name[:2] for name in names] == [f"{i:02d}" for i in range(len(names))]


def lesson_links(text: str) -> list[str]:
    """The lessons a text links, in order: notebooks/NN_….ipynb, from the repository's root or
    from docs/."""
    return re.findall(r"\]\((?:\.\./)?notebooks/(\d\d_[a-z0-9_]+)\.ipynb(?:#[^)]*)?\)", text)


def test_the_reading_order_is_the_file_order():
    """docs/course.md states the reading order and its table has one row per lesson, both in
    file order; the README's Learn list links the lessons in the same order."""
    stems = [path.stem for path in NOTEBOOKS]
    course = (ROOT / "docs" / "course.md").read_text(encoding="utf-8")
    order = re.search(r"\*\*Reading order for students:\*\*(.*?)\n\n", course, re.S)
    assert order, "docs/course.md has no reading order for students"
    assert "file order" in order.group(1)
    assert lesson_links(order.group(1)) == stems
    assert re.findall(r"^\| `(\d\d_[a-z0-9_]+)` \|", course, re.M) == stems
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    learn = re.search(r"^## Learn\n(.*?)^## ", readme, re.S | re.M)
    assert learn, "the README has no Learn section"
    assert lesson_links(learn.group(1)) == stems


@pytest.mark.parametrize("stem", [path.stem for path in NOTEBOOKS])
def test_a_lesson_is_short_enough_for_one_sitting(stem):
    size = len(markdown_text(stem))
    assert size <= LESSON_MARKDOWN_LIMIT, f"{stem}: {size} characters of Markdown"


@pytest.mark.parametrize("stem", [path.stem for path in NOTEBOOKS])
def test_a_lesson_opens_with_a_question(stem):
    first = cells(stem)[0]
    assert "**The question.**" in first.source and "?" in first.source, stem


def shows_a_picture(cell) -> bool:
    """A code cell whose stored outputs hold an image, or Markdown that embeds one."""
    if cell.cell_type == "markdown":
        return "![" in cell.source
    return any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))


@pytest.mark.parametrize("stem", [path.stem for path in NOTEBOOKS])
def test_a_lesson_opens_with_a_picture(stem):
    # 10 and 11 once opened with text only, and 11's one plot never showed (a library import had
    # switched the notebook's backend to Agg)
    nb_cells = cells(stem)
    first = next((i for i, c in enumerate(nb_cells) if shows_a_picture(c)), None)
    assert first is not None, f"{stem} shows no picture"
    text = sum(len(c.source) for c in nb_cells[:first] if c.cell_type == "markdown")
    assert first < PICTURE_WITHIN_CELLS, f"{stem}: the first picture is cell {first}"
    assert text <= PICTURE_WITHIN_MARKDOWN, (
        f"{stem}: {text} characters of Markdown before a picture"
    )


def test_11s_opening_picture_draws_the_scores_its_runs_printed():
    # 11's opening picture cannot wait for its 3.5-hour runs: it draws their committed scores,
    # which must be the ones the runs' cell printed
    stem = "11_smollm2_word_problems"
    source = next(
        c.source for c in cells(stem) if c.cell_type == "code" and "SCORES = {" in c.source
    )
    drawn = dict(re.findall(r'^    "(\w+)": "([^"]+)",$', source, re.M))
    assert set(drawn) == {"start", "GRPO", "EBPO", "AGPO"}, drawn
    printed = outputs(stem).splitlines()
    for name, scores in drawn.items():
        assert f"{name}: {scores} (% of held-out problems)" in printed, name


@pytest.mark.parametrize("stem", [path.stem for path in NOTEBOOKS])
def test_a_lessons_text_names_no_issue_and_no_date(stem):
    found = ISSUE_OR_DATE.findall(markdown_text(stem))
    assert not found, f"{stem}: {found} (the history belongs in notebooks/results/)"


def test_the_lesson_checks_catch_an_issue_a_date_and_a_long_lesson():
    assert ISSUE_OR_DATE.findall("as issue 22 asks, regenerated 2026-12-02") == [
        "issue 22",
        "2026-12-02",
    ]
    assert not ISSUE_OR_DATE.findall("G = 16, seeds 16-47, 828 problems")
    assert len("x" * (LESSON_MARKDOWN_LIMIT + 1)) > LESSON_MARKDOWN_LIMIT


@pytest.mark.parametrize("stem", [path.stem for path in NOTEBOOKS])
def test_first_cell_has_a_start_here_box_and_links_the_glossary(stem):
    first = cells(stem)[0]
    assert first.cell_type == "markdown"
    assert "> **Start here.**" in first.source
    missing = [item for item in START_HERE_ITEMS if item not in first.source]
    assert not missing, f"{stem}: the Start-here box lacks {missing}"
    assert "](../docs/glossary.md)" in first.source


@pytest.mark.parametrize("stem", COURSE_NOTEBOOKS)
def test_every_try_it_cell_is_followed_by_a_folded_answer(stem):
    nb_cells = cells(stem)
    exercises = try_it_cells(nb_cells)
    assert exercises, f"{stem} has no Try-it cell"
    for i in exercises:
        following = nb_cells[i + 1 : i + 3]  # the answer comes after at most one check cell
        assert any(
            c.cell_type == "markdown" and "<details><summary>Answer</summary>" in c.source
            for c in following
        ), f"{stem} cell {i}: Try it without a folded answer after it"


# an exercise's check: simulations.exercises.check judges the student's answer (asserts inside,
# a clear message when wrong; the reference answer under RLKIT_EXERCISE_ANSWERS=reference)
CHECK = re.compile(r'exercises\.check\(\s*"[^"]+",\s*(my_\w+)')
STUDENT_VARIABLE = re.compile(r"^(?:(my_\w+) = None\b|def (my_\w+)\()", re.M)


def checked_source(nb_cells, i: int) -> str:
    """The Try-it cell ``i`` and, if code, the check cell after it."""
    after = nb_cells[i + 1] if i + 1 < len(nb_cells) else None
    return nb_cells[i].source + ("\n" + after.source if after and after.cell_type == "code" else "")


@pytest.mark.parametrize("stem", COURSE_NOTEBOOKS)
def test_two_to_four_try_it_cells_each_checked_by_an_assert(stem):
    nb_cells = cells(stem)
    exercises = try_it_cells(nb_cells)
    assert 2 <= len(exercises) <= 4, f"{stem}: {len(exercises)} Try-it cells, not 2-4"
    for i in exercises:  # the exercise asserts its answer itself, or the check cell after it does
        source = checked_source(nb_cells, i)
        checked = "assert" in source or CHECK.search(source)
        assert checked, f"{stem} cell {i}: a Try-it cell without a check"


@pytest.mark.parametrize("stem", COURSE_NOTEBOOKS)
def test_every_try_it_judges_the_students_own_answer(stem):
    # issue 43: a check that the simulation agrees with itself, or one behind `if my_x is None`,
    # never judges the student; each exercise names a `my_…` answer (a prediction set to None, or
    # a stub function) and passes that very variable to exercises.check
    nb_cells = cells(stem)
    for i in try_it_cells(nb_cells):
        source = checked_source(nb_cells, i)
        asked = {a or b for a, b in STUDENT_VARIABLE.findall(nb_cells[i].source)}
        judged = set(CHECK.findall(source))
        assert asked, f"{stem} cell {i}: a Try-it cell that asks the student for nothing"
        assert asked <= judged, f"{stem} cell {i}: {sorted(asked - judged)} set but never judged"
        assert not re.search(r"if my_\w+ is None", source), f"{stem} cell {i}: an opt-in check"


@pytest.mark.parametrize("stem", THEORY_NOTEBOOKS)
def test_theory_notebooks_open_with_a_question_and_a_picture_before_the_claim(stem):
    nb_cells = cells(stem)
    assert "**The question.**" in nb_cells[0].source, f"{stem}: the first cell asks no question"
    claim = next(
        i for i, c in enumerate(nb_cells) if c.cell_type == "markdown" and CLAIM.search(c.source)
    )
    picture = next(
        i for i, c in enumerate(nb_cells) if c.cell_type == "code" and "plotting.save(" in c.source
    )
    assert picture < claim, f"{stem}: the first figure (cell {picture}) comes after the claim"


def test_05_names_its_signals_and_weights_before_its_formulas():
    nb_cells = cells("05_agpo_controllers")
    formulas = next(
        i for i, c in enumerate(nb_cells) if r"$\varepsilon = \operatorname{clip}(" in c.source
    )
    before = "\n".join(c.source for c in nb_cells[:formulas] if c.cell_type == "markdown")
    for symbol in (
        r"\alpha",
        r"\gamma",
        r"\delta",
        r"\lambda",
        r"\zeta",
        r"\hat{\sigma}",
        r"E_{\text{probe}}",
        r"\hat{D}_{\mathrm{KL}}",
        r"\bar{H}_{\text{ref}}",
    ):
        assert symbol in before, f"05 uses {symbol} in its formulas before defining it"
    assert "7, 7, 7, 9" in before, "05 defines vote entropy without a four-answer example"
    curves = next(i for i, c in enumerate(nb_cells) if "05_agpo_controllers_eps" in c.source)
    assert curves < formulas, "05 shows its formulas before its one-signal response curves"
    assert "*for*" in nb_cells[0].source, "05 does not say what the clip and temperature are for"


def test_06_teaches_how_to_read_a_training_curve():
    nb_cells = cells("06_one_run_of_each_method")
    section = next(
        c.source
        for c in nb_cells
        if c.cell_type == "markdown" and c.source.startswith("## How to read a training curve")
    )
    for point in ("$T = 1$ sample", "wiggles", "before clipping", "cannot act", "means nothing"):
        assert point in section, f"06's training-curve section lacks {point!r}"
    assert any(
        c.cell_type == "markdown" and "before and after" in c.source.splitlines()[0]
        for c in nb_cells
    ), "06 shows no held-out problems before and after the runs"


def test_01_warns_that_the_loss_value_means_nothing_before_printing_one():
    nb_cells = cells("01_one_grpo_step")
    first_loss = next(  # the first code cell that prints a loss value
        i for i, c in enumerate(nb_cells) if c.cell_type == "code" and "loss {loss" in c.source
    )
    assert "means nothing" in nb_cells[first_loss - 1].source, "01 prints a loss without a warning"


@pytest.mark.parametrize("theory, practice", CROSS_REFERENCES)
def test_theory_and_practice_point_to_each_other(theory, practice):
    for stem, other in ((theory, practice), (practice, theory)):
        mention = re.compile(rf"\bnotebooks? (?:\d\d(?:,| and| or|–)? )*{other[:2]}\b", re.I)
        assert mention.search(markdown_text(stem)), f"{stem} does not point to notebook {other[:2]}"


GLOSSARY = ROOT / "docs" / "glossary.md"
# issue 24: the glossary defines these, one line each, and resolves these symbol clashes
ISSUE_TERMS = (
    "advantage",
    "baseline",
    "whitening",
    "clip",
    "Pass@1",
    "greedy accuracy",
    "SE",
    "paired difference",
    "t-interval",
    "MDD",
    "power",
    "Bonferroni",
)
# issue 43: and these, which the notebooks use without defining them
ISSUE_43_TERMS = (
    "manipulation check",
    "superiority",
    "sign-flip test",
    "non-inferiority",
    "non-inferior",
    "SGD",
    "Bernoulli",
    "Bessel correction",
    "Beta function",
    "dropout",
    "checkpoint",
)
# typeset as math where the glossary's table does (issue 43 §2)
CLASHING_SYMBOLS = (
    r"$\tau$",
    r"$\theta$",
    r"$\varepsilon$",
    r"$\sigma$",
    r"$\lambda$",
    "k",
    "J",
    "a",
    "B",
)
CLASHING_SYMBOLS += (r"$\alpha$", "E")
# every method the course names is a glossary entry
METHOD_NAMES = ("PPO", "GRPO", "Dr. GRPO", "RLOO", "EBPO", "JSPO", "DAPO", "AGPO")


def glossary_entries() -> set[str]:
    """The glossary's defined terms: its bold spans, lower-cased."""
    return {term.lower() for term in re.findall(r"\*\*([^*]+)\*\*", GLOSSARY.read_text("utf-8"))}


def test_the_glossary_defines_every_term_the_issue_lists():
    terms = ISSUE_TERMS + ISSUE_43_TERMS
    missing = [term for term in terms if term.lower() not in glossary_entries()]
    assert not missing, f"docs/glossary.md does not define {missing}"


def test_the_glossary_resolves_each_symbol_clash():
    rows = re.findall(r"^\| (\S+) \|", GLOSSARY.read_text("utf-8"), re.M)
    missing = [symbol for symbol in CLASHING_SYMBOLS if symbol not in rows]
    assert not missing, f"the glossary's symbol-clash table has no row for {missing}"


@pytest.mark.parametrize("stem", [path.stem for path in NOTEBOOKS])
def test_the_terms_a_first_cell_sends_to_the_glossary_are_defined_there(stem):
    flat = " ".join(line.lstrip("> ").strip() for line in cells(stem)[0].source.splitlines())
    listed = re.search(r"\]\(\.\./docs/glossary\.md\) \(([^;)]*)", flat)
    terms = [t.strip() for t in listed.group(1).split(",")] if listed else []
    missing = [term for term in terms if term.lower() not in glossary_entries()]
    assert not missing, f"{stem} sends the reader to the glossary for {missing}, not defined there"


def test_every_method_the_course_names_is_a_glossary_entry():
    text = "\n".join(markdown_text(stem) for stem in COURSE_NOTEBOOKS)
    named = [m for m in METHOD_NAMES if re.search(rf"(?<![\w.]){re.escape(m)}\b", text)]
    missing = [m for m in named if m.lower() not in glossary_entries()]
    assert not missing, f"the notebooks name {missing}, which the glossary does not define"


def outputs(stem: str) -> str:
    """Everything a notebook's stored outputs printed."""
    return "\n".join(out.get("text", "") for cell in cells(stem) for out in cell.get("outputs", []))


@pytest.mark.parametrize(
    "stem", [path.stem for path in NOTEBOOKS] + [f"results/{p.stem}" for p in RESULTS_NOTEBOOKS]
)
def test_a_notebook_prints_one_count_of_held_out_problems(stem):
    # 06 printed 828 eval problems in one cell and 812 held-out problems in another (its step
    # trainer kept tiny-cpu's eval.num_problems, the default task's 812, on the hard mix's 828)
    counts = set(re.findall(r"(\d+) (?:eval|held-out) problems", outputs(stem)))
    assert len(counts) <= 1, f"{stem} prints {sorted(counts)} held-out problems"


def test_notebooks_01_and_06_print_the_learning_rate_and_promise_only_curves_they_draw():
    from rlkit.config import load_config

    cfg = load_config("tiny-cpu")
    printed = re.search(r"'learning_rate': ([0-9.e+-]+)", outputs("01_one_grpo_step"))
    assert float(printed.group(1)) == cfg.optim.lr  # not 3e-5 rounded to 0.0
    # the runs keep β = 0, so they log no KL (no reference pass) and the figure has no KL panel
    intro = cells("06_one_run_of_each_method")[0].source
    listed = intro[intro.index("with the curves the trainer logs") :].split("\n\n")[0]
    assert cfg.loss.kl_coef == 0 and "KL (" not in listed
