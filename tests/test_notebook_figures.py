"""notebooks/execute_full.py: the check that docs/course.md's figures are quoted from notebook
outputs; the committed report figures (results/*/curves.png, dynamics.png) drawn whole from their
summary.json."""

import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import nbformat
import pytest
from figure_checks import empty_panels, overlapping_texts
from PIL import Image

from rlkit import plotting, report

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("execute_full", ROOT / "notebooks/execute_full.py")
execute_full = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute_full)


def _notebook(folder: Path, stem: str, printed: str) -> None:
    cell = nbformat.v4.new_code_cell("print(x)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / f"{stem}.ipynb")


def _readme(folder: Path, quotes: str) -> Path:
    readme = folder / "README.md"
    readme.write_text(
        f"| notebook | claim | what we find |\n|---|---|---|\n| `01_demo` | a claim | {quotes} |\n"
    )
    return readme


def test_check_readme_flags_a_figure_missing_from_the_outputs(tmp_path):
    _notebook(tmp_path, "01_demo", "gap: -0.0121 [-0.0167, -0.0074]\n")
    readme = _readme(tmp_path, "gap `gap: … -0.0121 [-0.0167, -0.0074]`, other `other … 0.5`")
    quotes = ["gap: … -0.0121 [-0.0167, -0.0074]", "other … 0.5"]
    assert execute_full.quoted_figures(readme) == {"01_demo": quotes}
    assert execute_full.check_readme(readme, tmp_path) == ["01_demo: other … 0.5"]


def test_a_figure_that_moved_to_another_arm_fails_though_it_is_still_in_the_outputs(tmp_path):
    # the case: the README's figure is now printed for arm B, not A. The old check (the
    # figure anywhere in the outputs) passed it; anchored to its label it fails.
    _notebook(
        tmp_path,
        "01_demo",
        "A − base: +0.1 [-0.5, +0.7] points\nB − base: +1.9 [+0.7, +3.1] points\n",
    )
    readme = _readme(tmp_path, "`A − base: … +1.9 [+0.7, +3.1]`")
    assert "+1.9 [+0.7, +3.1]" in execute_full.output_text(tmp_path / "01_demo.ipynb")
    assert execute_full.check_readme(readme, tmp_path) == ["01_demo: A − base: … +1.9 [+0.7, +3.1]"]
    assert (
        execute_full.check_readme(_readme(tmp_path, "`B − base: … +1.9 [+0.7, +3.1]`"), tmp_path)
        == []
    )


@pytest.mark.parametrize(
    "quote, found",
    [
        ("2 … 0.700", True),  # runs of spaces in the output count as one
        ("4 … 0.700", False),  # the figure is on G = 2's line only
        ("2 … 0.70", False),  # parts are whole words: 0.70 is not 0.700
        ("0.700 … 2", False),  # parts in order
        ("4 … 0.4571", True),
        ("4 … 0.457", False),  # not inside a longer number
        ("Beta 4 … 0.4292 0.4286", True),
    ],
)
def test_quote_parts_are_whole_words_in_order_on_one_line(tmp_path, quote, found):
    _notebook(tmp_path, "01_demo", " 2   0.6001     0.700\nBeta 4   0.4292  0.4286  0.4571\n")
    missing = execute_full.check_readme(_readme(tmp_path, f"`{quote}`"), tmp_path)
    assert missing == ([] if found else [f"01_demo: {quote}"])


def test_a_quote_without_a_label_is_refused(tmp_path):
    _notebook(tmp_path, "01_demo", "gap: 0.5\n")
    for quote in ("0.5", "gap: … ", " … 0.5"):
        missing = execute_full.check_readme(_readme(tmp_path, f"`{quote}`"), tmp_path)
        assert missing == [f"01_demo: {quote} (no label: quote it as `label … figure`)"]


def test_the_committed_readme_matches_the_committed_notebooks():
    assert execute_full.PAGES == (ROOT / "docs" / "course.md", ROOT / "docs" / "results.md")
    for page in execute_full.PAGES:
        assert execute_full.quoted_figures(page), f"{page.name}'s notebooks table quotes no figure"
    assert execute_full.check_readme() == []


def test_every_notebook_row_that_quotes_is_checked():
    """A notebook name with digits after its number (10_smollm2_…) was once skipped unread; a
    results notebook's row (`results/synthesis`) names its folder."""
    rows = [
        line
        for page in execute_full.PAGES
        for line in page.read_text().splitlines()
        if line.startswith("| `")
    ]
    quoting = {line.split("`")[1] for line in rows if line.count("`") > 2}
    assert {"11_smollm2_word_problems", "results/synthesis"} <= quoting
    assert quoting <= set(execute_full.quoted_figures())
    for name in quoting:  # every row names a committed notebook
        assert (ROOT / "notebooks" / f"{name}.ipynb").is_file(), name


SUMMARIES = sorted((ROOT / "results").glob("*/summary.json"))


@pytest.mark.parametrize("summary_json", SUMMARIES, ids=lambda p: p.parent.name)
def test_each_committed_figure_draws_every_series_and_no_text_over_another(
    summary_json, tmp_path, monkeypatch
):
    """curves.png and dynamics.png, redrawn from the committed summary.json as `rlkit figures`
    draws them: every series the summary holds is a line, a panel is empty only where the summary
    has nothing for it (and says so), no text runs into another, and the committed PNG has the
    redrawn figure's size (it was redrawn after the last change of layout)."""
    figures, save = {}, plotting.save_figure

    def keep(fig, out):
        figures[Path(out).name] = fig
        return save(fig, out)

    monkeypatch.setattr(plotting, "save_figure", keep)
    summary = json.loads(summary_json.read_text())
    report.draw_summary_figures(summary, tmp_path)
    lines = {
        name: Counter(
            (ax.get_title(), line.get_label())
            for ax in fig.axes
            for line in ax.get_lines()
            if not line.get_label().startswith("_")
        )
        for name, fig in figures.items()
    }
    curves = summary["curves"]["series"]
    drawn = lines[report.CURVES_FIGURE]
    for s in curves:
        name, g = s["metric"].removeprefix("eval/"), s["group_size"]
        assert any(t.startswith(f"{name}, G = {g}") and arm == s["arm"] for t, arm in drawn), s
    differences = sum(n for (title, _), n in drawn.items() if title.startswith("arm − "))
    assert differences == sum(bool(s["vs_baseline"]) for s in curves)
    if report.DYNAMICS_FIGURE in lines:  # a control leads each panel of arms: once per G
        panels = {
            (re.sub(r" \(\d+/\d+\)$", "", t), arm) for t, arm in lines[report.DYNAMICS_FIGURE]
        }
        assert len(panels) == len(summary["dynamics"]["series"])
    for name, fig in figures.items():
        assert empty_panels(fig) == [], name
        assert overlapping_texts(fig) == [], name
        committed = Image.open(summary_json.parent / name).size
        assert committed == Image.open(tmp_path / name).size, (
            f"{name}: rlkit figures {summary_json.parent}"
        )
