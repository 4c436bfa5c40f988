"""``rlkit reproduce``: one committed run re-run from its sweep's spec and compared with
summary.json, figure by figure (identical / within seed noise / beyond seed noise)."""

from __future__ import annotations

import json

import pytest
from test_sweep import write_spec

from rlkit.cli import main
from rlkit.report import write_report
from rlkit.reproduce import Comparison, recorded_kernels
from rlkit.sweep import run_sweep


@pytest.fixture(scope="module")
def committed(tmp_path_factory, tiny_model_dir):
    """A two-arm, two-seed sweep of the tiny model, reported into results/t."""
    tmp = tmp_path_factory.mktemp("reproduce")
    spec = write_spec(tmp, tiny_model_dir)
    run_sweep(spec, progress=False)
    write_report(tmp / "out", tmp / "results")
    return tmp / "results" / "t"


def edited(results, tmp_path, change: float):
    """A copy of ``results`` whose EBPO seed-0 greedy accuracy is moved by ``change``."""
    summary = json.loads((results / "summary.json").read_text())
    for row in summary["rows"]:
        if row["arm"] == "EBPO" and row["metric"] == "eval/greedy_accuracy":
            row["end_by_seed"]["0"] += change
    out = tmp_path / "t"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def test_a_committed_run_comes_back_identical_on_the_same_machine(committed, capsys):
    assert main(["reproduce", str(committed), "--arm", "EBPO", "--seed", "0", "--exact"]) == 0
    out = capsys.readouterr().out
    assert "t EBPO G = 2 seed 0, kernels portable:" in out  # the kernels its runs recorded
    assert "eval/greedy_accuracy: committed" in out and out.count(": identical") >= 2


def test_the_re_run_takes_the_kernels_the_runs_recorded():
    machines = {"preregistration": {"machines": [{"kernels": "portable"}, {"kernels": "portable"}]}}
    assert recorded_kernels(machines) == "portable"
    assert recorded_kernels({"preregistration": {"machines": [{"cpu": "AMD EPYC"}]}}) == "native"
    assert recorded_kernels({"preregistration": {}}) == "native"  # swept before machines were
    mixed = {"preregistration": {"machines": [{"kernels": "portable"}, {"kernels": "native"}]}}
    with pytest.raises(ValueError, match=r"several kernel modes \['native', 'portable'\]"):
        recorded_kernels(mixed)


def test_a_figure_moved_beyond_the_seeds_spread_fails(committed, tmp_path, capsys):
    results = edited(committed, tmp_path, 2.0)  # accuracies lie in [0, 1]: beyond any spread
    with pytest.raises(SystemExit, match="differs by more than the seeds' spread"):
        main(["reproduce", str(results), "--arm", "EBPO", "--seed", "0"])
    out = capsys.readouterr().out
    assert "eval/greedy_accuracy: committed" in out and "beyond seed noise" in out


def test_the_three_readings_of_a_difference():
    assert Comparison("m", 0.5, 0.5, 0.0).status == "identical"
    assert Comparison("m", 0.5, 0.51, 0.02).status == "within seed noise"
    assert Comparison("m", 0.5, 0.53, 0.02).status == "beyond seed noise"
    assert Comparison("m", 0.5, 0.47, 0.02).status == "beyond seed noise"


def test_unknown_arm_seed_or_results_are_named(committed, tmp_path, capsys):
    assert main(["reproduce", str(committed), "--arm", "PPO", "--seed", "0"]) == 2
    assert "has no run for arm 'PPO', seed 0; arms: ['EBPO', 'GRPO']" in capsys.readouterr().err
    assert main(["reproduce", str(committed), "--arm", "EBPO", "--seed", "9"]) == 2
    assert "has no run for arm 'EBPO', seed 9" in capsys.readouterr().err
    assert main(["reproduce", str(tmp_path / "none"), "--arm", "EBPO", "--seed", "0"]) == 2
    assert f"results folder {tmp_path / 'none'} does not exist" in capsys.readouterr().err


def test_notebooks_full_re_runs_the_committed_headline_runs(monkeypatch, tmp_path):
    """``make notebooks-full`` re-runs one committed seed of each headline arm, each of them a
    run of its committed summary: exactly under the kernels its sweep recorded where they were
    pinned, within the seeds' spread under AVX2 kernels where they were not (``native``); it
    fails naming a run that does not come back."""
    from pathlib import Path

    from test_notebook_figures import execute_full

    from rlkit.reproduce import recorded_kernels

    root = Path(__file__).resolve().parents[1]
    expected = []
    for name, arm, seed in execute_full.HEADLINE_RUNS:
        summary = json.loads((root / "results" / name / "summary.json").read_text())
        assert any(r["arm"] == arm and str(seed) in r["end_by_seed"] for r in summary["rows"])
        pinned = recorded_kernels(summary) != "native"
        expected.append((name, arm, seed, None if pinned else "avx2", pinned))
    calls = []

    def fake(results, arm, seed, kernels, exact):
        calls.append((results.name, arm, seed, kernels, exact, Path.cwd()))
        return int(arm == "GRPO")

    monkeypatch.setattr("rlkit.reproduce.reproduce", fake)
    assert execute_full.reproduce_headline_runs() == ["22_ebpo GRPO seed 0"]
    assert [c[:5] for c in calls] == expected
    assert {c[5] for c in calls} == {root}


def test_a_sweep_of_pinned_kernels_is_compared_exactly(monkeypatch, tmp_path):
    """A results folder whose runs recorded the portable kernels is re-run with them and
    compared exactly; one made before the pins, under AVX2 kernels within the seeds' spread."""
    from test_notebook_figures import execute_full

    for name, kernels in (("pinned", "portable"), ("old", None)):
        machine = {"cpu": "x86"} | ({"kernels": kernels} if kernels else {})
        (tmp_path / name).mkdir()
        summary = {"preregistration": {"machines": [machine]}}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    calls = []
    monkeypatch.setattr(execute_full, "RESULTS", tmp_path)
    monkeypatch.setattr(execute_full, "HEADLINE_RUNS", [("pinned", "A", 0), ("old", "A", 0)])
    monkeypatch.setattr(
        "rlkit.reproduce.reproduce",
        lambda results, arm, seed, kernels, exact: calls.append((results.name, kernels, exact)),
    )
    assert execute_full.reproduce_headline_runs() == []
    assert calls == [("pinned", None, True), ("old", "avx2", False)]
