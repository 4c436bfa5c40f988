"""Figures readable at their saved size, one colour per run, CI-scale figures and runs in a
temporary folder, and no tqdm-widget or bitsandbytes kernels-community notice (issue 17)."""

import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.text
import numpy as np
import pytest
from PIL import Image

from rlkit import BNB_KERNEL_NOTICE
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
    """plot_runs' figure, kept instead of closed."""
    figures = []
    monkeypatch.setattr(rlkit_plotting.plt, "close", figures.append)
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


def test_sweep_report_figure_is_readable_at_its_saved_size(tmp_path, monkeypatch):
    from rlkit import report

    figures = []
    monkeypatch.setattr(rlkit_plotting.plt, "close", figures.append)
    curve = [{"step": s, "eval/greedy_accuracy": 0.5 + 0.01 * s} for s in (0, 5, 10)]
    for i, row in enumerate(curve):
        row["tokens/generated"] = 100 * i
    runs = {(arm, 4): {0: curve, 1: curve} for arm in ("GRPO", "EBPO")}
    out = report.plot_accuracy_vs_tokens(runs, "eval/greedy_accuracy", tmp_path / "a.png")
    (fig,) = figures
    assert Image.open(out).size == tuple(round(v * FIGURE_DPI) for v in fig.get_size_inches())
    assert min(text_heights_px(fig).values()) >= MIN_TEXT_PX


def test_sweep_curves_and_dynamics_are_readable_and_keep_each_arms_colour(tmp_path, monkeypatch):
    from rlkit import report

    figures = []
    monkeypatch.setattr(rlkit_plotting.plt, "close", figures.append)
    evals = [{"step": s, "eval/greedy_accuracy": 0.5, "eval/pass@1": 0.25} for s in (0, 5, 10)]
    run = evals + [{"step": s, "grad_norm": 1.0 + s, "entropy": 0.4} for s in range(1, 11)]
    runs = {(arm, 4): {0: run, 1: run} for arm in ("GRPO", "EBPO")}
    runs["AGPO", 4] = {0: evals, 1: evals}  # logs no training signal: no line in dynamics.png
    arms = ["GRPO", "EBPO", "AGPO"]
    curves = report.plot_learning_curves(
        report.learning_curves(runs, "GRPO"), arms, "GRPO", tmp_path / "c.png"
    )
    dynamics = report.plot_dynamics(report.training_dynamics(runs), arms, tmp_path / "d.png")
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
