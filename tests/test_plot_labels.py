"""``rlkit plot`` labels each run by a path end no other run shares: runs of two sweeps that end
in the same ``…/G4/seed0`` stay two curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit import plotting
from rlkit.cli import main
from rlkit.plotting import unique_labels


def test_labels_are_the_shortest_unique_path_ends():
    dirs = ["runs/a/GRPO/G4/seed0", "runs/b/GRPO/G4/seed0", "runs/tiny", "GRPO/G4/seed1"]
    assert unique_labels(dirs) == {
        "a/GRPO/G4/seed0": Path(dirs[0]),
        "b/GRPO/G4/seed0": Path(dirs[1]),
        "tiny": Path(dirs[2]),
        "seed1": Path(dirs[3]),
    }
    # one path is the end of another: the shorter is labelled whole, the longer one more
    assert list(unique_labels(["G4/seed0", "x/G4/seed0"])) == ["G4/seed0", "x/G4/seed0"]
    with pytest.raises(
        ValueError, match="run directory ./a/seed0 is given twice \\(also as a/seed0\\)"
    ):
        unique_labels(["a/seed0", "./a/seed0"])


def test_plot_draws_runs_sharing_a_directory_name_apart(tmp_path, monkeypatch, capsys):
    run_dirs = []
    for sweep in ("sweep1", "sweep2"):
        run_dir = tmp_path / sweep / "GRPO" / "G4" / "seed0"
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
        run_dirs.append(str(run_dir))
    drawn = []
    original = plotting.plot_runs

    def plot_runs(runs, out):
        drawn.append(dict(runs))
        return original(runs, out)

    monkeypatch.setattr(plotting, "plot_runs", plot_runs)
    out = tmp_path / "curves.png"
    assert main(["plot", *run_dirs, "--out", str(out)]) == 0
    assert list(drawn[0]) == ["sweep1/GRPO/G4/seed0", "sweep2/GRPO/G4/seed0"]
    assert out.stat().st_size > 0
