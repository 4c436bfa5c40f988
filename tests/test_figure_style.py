"""Figures readable at their saved size, one colour per run, CI-scale figures and runs in a
temporary folder, and no tqdm-widget or bitsandbytes kernels-community notice (issue 17); no
library import that switches a notebook's backend, no text over another, no empty panel, and
many arms split over panels (issue 43)."""

import logging
import pkgutil
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.text
import numpy as np
import pytest
from figure_checks import empty_panels, notes, overlapping_texts
from PIL import Image

import rlkit
import simulations
from rlkit import BNB_KERNEL_NOTICE, report
from rlkit import plotting as rlkit_plotting
from rlkit.figure_style import FIGURE_DPI
from simulations import plotting, scale

MIN_TEXT_PX = 11  # 8 pt at 100 dpi; the old legends were 6-7 pt at 80 dpi (5-7 px glyphs)


def text_heights_px(fig) -> dict[str, float]:
    """{text: its font size in pixels at the saved resolution} for every visible text of ``fig``."""
    return {
        t.get_text(): t.get_fontsize() * FIGURE_DPI / 72
        for t in fig.findobj(matplotlib.text.Text)
        if t.get_text() and t.get_visible()
    }


def rows(metric: str, n: int = 12) -> list[dict]:
    return [{"step": s, metric: 0.5 + 0.01 * s, "reward": 0.1 * s} for s in range(1, n + 1)]


@pytest.fixture
def drawn(monkeypatch):
    """Every figure rlkit saves (:func:`rlkit.plotting.save_figure`), kept as it is saved."""
    figures, save = [], rlkit_plotting.save_figure

    def keep(fig, out):
        figures.append(fig)
        return save(fig, out)

    monkeypatch.setattr(rlkit_plotting, "save_figure", keep)
    return figures


def test_plot_runs_text_is_readable_and_each_run_keeps_its_colour(tmp_path, drawn):
    runs = {"GRPO": rows("kl"), "EBPO": rows("ebpo/shrinkage_mean"), "AGPO": rows("entropy")}
    out = rlkit_plotting.plot_runs(runs, tmp_path / "curves.png")
    (fig,) = drawn
    assert Image.open(out).size == tuple(round(v * FIGURE_DPI) for v in fig.get_size_inches())
    assert min(text_heights_px(fig).values()) >= MIN_TEXT_PX
    colours = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            colours.setdefault(line.get_label(), set()).add(line.get_color())
    # the EBPO-only and entropy-only panels keep EBPO's and AGPO's colours, not the first one
    assert colours == {"GRPO": {"C0"}, "EBPO": {"C1"}, "AGPO": {"C2"}}


def test_notebook_figures_are_readable_at_their_saved_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLKIT_NB_SCALE", raising=False)
    fig, axes = plotting.figure(ncols=2)
    for ax in axes:
        plotting.band(ax, np.arange(5), np.random.default_rng(0).random((3, 5)), label="GRPO")
        ax.set(xlabel="step", ylabel="success rate", title="a panel")
    axes[0].legend()
    plotting.save(fig, "demo")
    assert min(text_heights_px(fig).values()) >= MIN_TEXT_PX
    assert Image.open(tmp_path / "figures/demo.png").size == (800, 300)


def test_ci_scale_writes_figures_and_runs_to_a_temporary_folder(tmp_path, monkeypatch):
    notebook_dir, tmp = tmp_path / "notebooks", tmp_path / "tmp"
    notebook_dir.mkdir()
    tmp.mkdir()
    monkeypatch.chdir(notebook_dir)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("RLKIT_NB_SCALE", "ci")
    scale._ci_root.cache_clear()
    try:
        fig, _ = plotting.figure()
        plotting.save(fig, "06_curves")
        run_dir = scale.output_dir("runs/06")
    finally:
        scale._ci_root.cache_clear()
    assert not list(notebook_dir.iterdir())  # nothing next to the notebook
    (root,) = tmp.iterdir()
    assert (root / "figures/06_curves.png").is_file()
    assert run_dir == root / "runs/06"
    monkeypatch.setenv("RLKIT_NB_SCALE", "full")
    assert scale.output_dir("runs/06") == Path("runs/06")
    with pytest.raises(ValueError, match="relative to the notebook, got /abs"):
        scale.output_dir("/abs")


def test_the_bitsandbytes_kernels_notice_is_dropped_and_nothing_else(caplog):
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        # bitsandbytes 0.50.2's message (backends/cpu/ops.py), then an unrelated one
        logger.warning(
            BNB_KERNEL_NOTICE + ": %s. Please make sure you already `pip install kernels`",
            "No module named 'kernels'",
        )
        logger.warning("another bitsandbytes warning")
    assert [r.getMessage() for r in caplog.records] == ["another bitsandbytes warning"]


TQDM_NOTICE_SCRIPT = """
import warnings
import rlkit.models.loading  # imports peft, hence bitsandbytes (its notice on AVX512-BF16 CPUs)
from tqdm import TqdmWarning
for message in (  # tqdm 4.70's message (tqdm/autonotebook.py in a Jupyter kernel), another one
    "IProgress not found. Please update jupyter and ipywidgets. See https://ipywidgets",
    "another tqdm warning",
):
    warnings.warn_explicit(message, TqdmWarning, "tqdm/auto.py", 21, module="tqdm.auto")
"""


def test_importing_rlkit_drops_the_two_notices_and_nothing_else():
    # a fresh interpreter: pytest resets warning filters around collection
    err = subprocess.run(
        [sys.executable, "-c", TQDM_NOTICE_SCRIPT], capture_output=True, text=True, check=True
    ).stderr
    assert "kernels-community" not in err and "IProgress" not in err
    assert "another tqdm warning" in err


def token_curve(tokens_per_eval: int) -> list[dict]:
    curve = [{"step": s, "eval/greedy_accuracy": 0.5 + 0.01 * s} for s in (0, 5, 10)]
    for i, row in enumerate(curve):
        row["tokens/generated"] = tokens_per_eval * i
    return curve


def test_sweep_report_figure_is_readable_at_its_saved_size(tmp_path, drawn):
    runs = {(arm, 4): {0: token_curve(100), 1: token_curve(100)} for arm in ("GRPO", "EBPO")}
    facets = {4: [["GRPO", "EBPO"]]}
    out = report.plot_accuracy_vs_tokens(runs, "eval/greedy_accuracy", facets, tmp_path / "a.png")
    (fig,) = drawn
    assert Image.open(out).size == tuple(round(v * FIGURE_DPI) for v in fig.get_size_inches())
    assert min(text_heights_px(fig).values()) >= MIN_TEXT_PX


def test_sweep_curves_and_dynamics_are_readable_and_keep_each_arms_colour(tmp_path, drawn):
    figures = drawn
    evals = [{"step": s, "eval/greedy_accuracy": 0.5, "eval/pass@1": 0.25} for s in (0, 5, 10)]
    run = evals + [{"step": s, "grad_norm": 1.0 + s, "entropy": 0.4} for s in range(1, 11)]
    runs = {(arm, 4): {0: run, 1: run} for arm in ("GRPO", "EBPO")}
    runs["AGPO", 4] = {0: evals, 1: evals}  # logs no training signal: no line in dynamics.png
    learning = report.learning_curves(runs, "GRPO")
    facets = report.arm_facets(learning, "GRPO")
    assert facets == {4: [["GRPO", "EBPO", "AGPO"]]}
    curves = report.plot_learning_curves(learning, facets, "GRPO", tmp_path / "c.png")
    dynamics = report.plot_dynamics(report.training_dynamics(runs), facets, tmp_path / "d.png")
    for out, fig in zip((curves, dynamics), figures, strict=True):
        assert Image.open(out).size == tuple(round(v * FIGURE_DPI) for v in fig.get_size_inches())
        assert min(text_heights_px(fig).values()) >= MIN_TEXT_PX
    colours = {}
    for fig in figures:
        for ax in fig.axes:
            for line in ax.get_lines():
                if not line.get_label().startswith("_"):
                    colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert colours == {"GRPO": {"C0"}, "EBPO": {"C1"}, "AGPO": {"C2"}}
    assert [ax.get_title() for ax in figures[1].axes] == [
        "grad norm (before clipping), G = 4",
        "policy entropy (nats/token), G = 4",
    ]


BACKEND_SCRIPT = """
import importlib, pkgutil, sys
import matplotlib
matplotlib.use("svg")  # what a notebook has: a backend of its own, not Agg
import matplotlib.pyplot  # notebook 11 imports pyplot before rlkit.demo
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:  # an optional integration (vLLM, verl) not installed here
        continue
    assert matplotlib.get_backend() == "svg", f"importing {name} set the backend to " + (
        matplotlib.get_backend()
    )
"""


def test_importing_rlkit_leaves_the_plotting_backend_alone():
    # the bug: rlkit.demo imported rlkit.plotting, whose matplotlib.use("Agg") switched
    # notebook 11's inline backend off, so its training-reward plot never showed
    modules = [
        m.name
        for package in (rlkit, simulations)
        for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    ]
    assert "rlkit.demo" in modules and "rlkit.plotting" in modules
    run = subprocess.run(
        [sys.executable, "-c", BACKEND_SCRIPT, *modules], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]


def group_size_curves(sizes=(2, 4, 8, 16), arms=("GRPO", "EBPO"), baseline="GRPO") -> dict:
    """:func:`rlkit.report.learning_curves` of ``arms`` at each G, two seeds, three evaluations."""
    run = [{"step": s, "eval/greedy_accuracy": 0.4, "eval/pass@1": 0.3} for s in (0, 50, 100)]
    return report.learning_curves(
        {(arm, g): {0: run, 1: run} for g in sizes for arm in arms}, baseline
    )


def test_no_text_of_a_report_figure_runs_into_another(tmp_path, drawn):
    # results/07_group_size: the suptitle over the first row's titles (8 rows), and the tokens
    # axis's tick labels at G = 16 run together ("140000160000")
    learning = group_size_curves()
    facets = report.arm_facets(learning, "GRPO")
    report.plot_learning_curves(learning, facets, "GRPO", tmp_path / "c.png")
    runs = {
        (arm, g): {0: token_curve(5000 * g), 1: token_curve(5000 * g)}
        for g in (2, 4, 8, 16)
        for arm in ("GRPO", "EBPO")
    }
    report.plot_accuracy_vs_tokens(runs, "eval/greedy_accuracy", facets, tmp_path / "a.png")
    curves, tokens = drawn
    assert overlapping_texts(curves) == []
    assert overlapping_texts(tokens) == []


def test_many_arms_are_split_over_panels_each_with_its_control(tmp_path, drawn):
    arms = [f"arm{i}" for i in range(13)]
    learning = group_size_curves(sizes=(4,), arms=arms, baseline="arm0")
    facets = report.arm_facets(learning, "arm0")
    assert facets == {
        4: [["arm0", *arms[1:6]], ["arm0", *arms[6:11]], ["arm0", *arms[11:]]],
    }
    report.plot_learning_curves(learning, facets, "arm0", tmp_path / "c.png")
    (fig,) = drawn
    for ax in fig.axes:
        labels = [line.get_label() for line in ax.get_lines() if line.get_label()[0] != "_"]
        assert len(labels) <= report.MAX_ARMS_PER_PANEL and len(set(labels)) == len(labels)
        colours = [line.get_color() for line in ax.get_lines() if line.get_label()[0] != "_"]
        assert len(set(colours)) == len(colours)  # no two lines of a panel share a colour
    assert fig.axes[0].get_title() == "greedy_accuracy, G = 4 (1/3)"
    assert overlapping_texts(fig) == [] and empty_panels(fig) == []


def test_a_difference_panel_without_a_paired_arm_says_so(tmp_path, drawn):
    # a summary written before the curves named each arm's control: GRPO_G4 the baseline, so
    # the G = 2 arms have no paired difference; the panel says so instead of empty axes
    learning = report.learning_curves(
        {
            (arm, g): {0: run, 1: run}
            for arm, g in (("GRPO_G2", 2), ("EBPO_G2", 2), ("GRPO_G4", 4), ("EBPO_G4", 4))
            for run in [
                [{"step": s, "eval/greedy_accuracy": 0.4, "eval/pass@1": 0.3} for s in (0, 10)]
            ]
        },
        "GRPO_G4",
    )
    report.plot_learning_curves(
        learning, report.arm_facets(learning, "GRPO_G4"), "GRPO_G4", tmp_path / "c.png"
    )
    (fig,) = drawn
    assert empty_panels(fig) == []
    assert notes(fig) == {"arm − control": "no arm here is paired per seed\nwith a control"}
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[1::2] == ["arm − control"] * 2 + ["arm − GRPO_G4, paired per seed"] * 2
