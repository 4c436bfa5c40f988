"""The notebooks as a course (issue 24): each first cell of a course notebook opens with a
"Start here" box (prerequisites, what you will learn, run time, next notebook) and links the
glossary; every "Try it" exercise has a folded answer; the README gives a reading order that
covers every notebook."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# notebooks that have their Start-here box so far; 04, 05, 06 and 09 are still to do (issue 24)
COURSE_NOTEBOOKS = [
    "00_grpo_from_scratch",
    "01_shrinkage_mse",
    "02_vanishing_gradients",
    "03_entropy_decay",
    "07_ebpo_ablations",
    "08_agpo_ablations",
]
START_HERE_ITEMS = ("**Prerequisites:**", "**You will learn:**", "**Run time:**", "**Next:**")


def cells(stem: str):
    return nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells


@pytest.mark.parametrize("stem", COURSE_NOTEBOOKS)
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
    exercises = [
        i
        for i, cell in enumerate(nb_cells)
        if cell.cell_type == "code" and cell.source.startswith("# Try it")
    ]
    assert exercises, f"{stem} has no Try-it cell"
    for i in exercises:
        following = nb_cells[i + 1 : i + 3]  # the answer comes after at most one check cell
        assert any(
            c.cell_type == "markdown" and "<details><summary>Answer</summary>" in c.source
            for c in following
        ), f"{stem} cell {i}: Try it without a folded answer after it"


def test_the_readme_reading_order_covers_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    order = re.search(r"\*\*Reading order for students:\*\*(.*?)\n\n", readme, re.S)
    assert order, "the README has no reading order for students"
    numbers = set(re.findall(r"\b(\d\d)\b", order.group(1)))
    assert numbers == {path.name[:2] for path in NOTEBOOKS}
