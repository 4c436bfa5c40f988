"""The command line: presets, clear config errors, plotting a run, evaluation of a checkpoint."""

from __future__ import annotations

import json

import pytest

from rlkit.cli import main


def test_presets_listed(capsys):
    assert main(["presets"]) == 0
    assert "tiny-cpu" in capsys.readouterr().out.split()


def test_bad_override_fails_before_any_work(capsys, tmp_path):
    code = main(["train", f"output_dir={tmp_path / 'run'}", "rollout.grup_size=4"])
    assert code == 2
    assert "unknown config key rollout.grup_size" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_train_eval_and_plot_a_run(capsys, tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    common = [
        f"model.name_or_path={tiny_model_dir}",
        f"output_dir={run}",
        "rollout.num_prompts=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "task.num_train=16",
        "task.num_eval=4",
        "eval.num_problems=4",
        "eval.k=2",
        "tensorboard=true",
        "progress=false",
    ]
    assert main(["train", "steps=2", *common]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.splitlines()[-2])["step"] == 2
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))

    assert main(["eval", "--checkpoint", str(run), "eval.k=2"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["step"] == 2 and 0.0 <= row["eval/greedy_accuracy"] <= 1.0

    assert main(["plot", str(run), "--out", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_overrides_may_come_before_and_after_flags(capsys, tmp_path):
    code = main(["train", "rollout.grup_size=4", "--overwrite", "steps=2"])
    assert code == 2
    assert "unknown config key rollout.grup_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--overwrite", "--no-such-flag"])


def test_demo_refuses_a_repeated_seed(capsys, tmp_path):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--seeds", "0", "1", "0"]) == 2
    assert "rlkit demo: error: --seeds lists seed 0 more than once" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_demo_with_failed_runs_ends_in_one_line(monkeypatch, tmp_path):
    import rlkit.demo

    def failing(*args, **kwargs):
        raise RuntimeError("1 of 15 runs failed: ('GRPO', 0); first error: boom")

    monkeypatch.setattr(rlkit.demo, "run_demo", failing)
    with pytest.raises(SystemExit, match=r"^rlkit demo: error: 1 of 15 runs failed"):
        main(["demo", "--out", str(tmp_path / "demo")])


def test_demo_out_expands_home(monkeypatch, tmp_path, capsys):
    import rlkit.demo

    seen = {}
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(
        rlkit.demo, "run_demo", lambda out, *args, **kwargs: seen.setdefault("out", out)
    )
    assert main(["demo", "--out=~/demo"]) == 0  # the shell leaves ~ after --out= alone
    assert seen["out"] == str(tmp_path / "demo")
    assert f"figure and table in {tmp_path / 'demo'}" in capsys.readouterr().out


def test_command_warnings_name_no_source_file():
    """The commands print a warning as one line without the file and line it came from (the
    install path of this machine), e.g. the trainer's notice that a configured clip cannot act."""
    import subprocess
    import sys

    code = (
        "import warnings; from rlkit import show_warnings_plainly; show_warnings_plainly(); "
        "warnings.warn('agpo.adaptive_clip=true cannot act')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr == "warning: UserWarning: agpo.adaptive_clip=true cannot act\n"
