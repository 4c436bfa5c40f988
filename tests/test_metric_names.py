"""The one metric naming scheme (docs/algorithms.md §5, "Names") and the renames that read older
runs, fixtures, specs and summaries under it (:mod:`rlkit.metric_names`)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from rlkit.claims import parse_manipulation
from rlkit.metric_names import RENAMED, current_metric_fields, current_name, current_names
from rlkit.metrics import MetricsLogger, read_metrics
from rlkit.plotting import plot_runs

GOLDEN = Path(__file__).parent / "golden"
# the last commit whose golden files logged the old names (issue 44 §5 renamed the keys after it)
BEFORE_RENAME = "6962c54ff383a103057639b8fb40b5e25a61d5e2"
# TRL's keys without a component prefix (GRPOTrainer's, and the step every logger writes)
TRL_FLAT = {
    "step",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "entropy",
    "kl",
    "grad_norm",
    "learning_rate",
    "loss",
}
SCHEME = re.compile(r"[a-z_]+(/[a-z0-9_@]+)+")  # <component>/<quantity>[/<statistic>]


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=GOLDEN, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip(f"`git {' '.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout


def renamed_text(text: str) -> str:
    return "".join(json.dumps(current_names(json.loads(line))) + "\n" for line in text.splitlines())


def golden_names() -> list[str]:
    return sorted(p.name for p in GOLDEN.glob("*.jsonl"))


@pytest.mark.parametrize("name", golden_names())
def test_the_rename_changed_the_golden_keys_only(name):
    """The golden file as the rename wrote it is the file before it with the old keys renamed:
    every value bit for bit, the keys in the same order. Later commits that rewrite a golden file
    on purpose leave this comparison alone: it reads the first version after the rename."""
    if git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip("a shallow clone lacks the commit before the rename")
    before = git("show", f"{BEFORE_RENAME}:tests/golden/{name}")
    after_commits = git("log", "--reverse", "--format=%H", f"{BEFORE_RENAME}..HEAD", "--", name)
    first = after_commits.split()[0] if after_commits.strip() else None
    after = git("show", f"{first}:tests/golden/{name}") if first else (GOLDEN / name).read_text()
    assert after == renamed_text(before)


@pytest.mark.parametrize("name", golden_names())
def test_every_logged_key_follows_the_scheme(name):
    rows = [json.loads(line) for line in (GOLDEN / name).read_text().splitlines()]
    keys = {key for row in rows for key in row}
    assert not keys & set(RENAMED), f"{name} logs old names {sorted(keys & set(RENAMED))}"
    off = sorted(k for k in keys if k not in TRL_FLAT and not SCHEME.fullmatch(k))
    assert not off, f"{name}: keys outside the scheme {off}"


def test_the_renames_are_to_names_of_the_scheme_and_never_chain():
    for old, new in RENAMED.items():
        assert new not in RENAMED, f"{old} -> {new} is renamed again"
        assert new in TRL_FLAT or SCHEME.fullmatch(new), new
    assert len(set(RENAMED.values())) == len(RENAMED)


def test_a_row_keeps_its_order_and_values_under_the_new_names():
    row = {"step": 1, "agpo/H": 0.5, "reward": 1.0, "critic/vf_loss": 2.0, "beta": 0.1}
    assert list(current_names(row).items()) == [
        ("step", 1),
        ("agpo/entropy_mean", 0.5),
        ("reward", 1.0),
        ("loss/value_avg", 2.0),
        ("dpo/beta", 0.1),
    ]
    today = {"step": 1, "reward": 1.0}
    assert current_names(today) is today
    assert current_name("eval/greedy_accuracy") == "eval/greedy_accuracy"


def old_run(run_dir: Path) -> Path:
    """A run directory whose ``metrics.jsonl`` was logged before the rename."""
    run_dir.mkdir()
    rows = [{"step": s, "reward": 0.1 * s, "agpo/H": 1.0 + s, "nonfinite_skips": 0} for s in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_a_run_logged_before_the_rename_reads_and_plots_under_the_new_names(tmp_path):
    run = old_run(tmp_path / "old")
    rows = read_metrics(run)
    assert [list(r) for r in rows] == [
        ["step", "reward", "agpo/entropy_mean", "update/nonfinite_skips"]
    ] * 2
    assert plot_runs({"old": run}, tmp_path / "curves.png").is_file()
    old_rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert plot_runs({"rows": old_rows}, tmp_path / "rows.png").is_file()


def test_a_resumed_run_keeps_its_earlier_rows_under_the_new_names(tmp_path):
    """Resuming truncates ``metrics.jsonl`` to the checkpoint's step and writes the rows it keeps
    under today's names, so a run checkpointed before the rename continues as one scheme."""
    run = old_run(tmp_path / "old")
    MetricsLogger(run, tensorboard=False, resume_step=1)
    kept = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert kept == [
        {"step": 1, "reward": 0.1, "agpo/entropy_mean": 2.0, "update/nonfinite_skips": 0}
    ]


def test_a_preregistered_check_naming_an_old_key_reads_the_new_one():
    """Sweep specs are hashed pre-registrations, never edited: their ``metric:`` resolves."""
    checks = parse_manipulation(
        {"PPO": [{"metric": "critic/vf_clipfrac", "acts_if": "> 0"}]}, ["PPO"]
    )
    assert checks["PPO"][0].metric == "val/clipfrac_avg"


def test_a_committed_summary_reads_under_the_new_names_unchanged_on_disk():
    summary = {
        "manipulation": [{"arm": "A", "metric": "trace/js_lambda", "mean": 0.3}],
        "dynamics": {"series": [{"metric": "grad_norm", "mean": [1.0]}]},
        "spec": {"manipulation": {"A": [{"metric": "agpo/U", "acts_if": "> 0"}]}},
    }
    read = current_metric_fields(summary)
    assert read["manipulation"][0] == {"arm": "A", "metric": "jspo/lambda_mean", "mean": 0.3}
    assert read["dynamics"]["series"][0]["metric"] == "grad_norm"
    assert read["spec"]["manipulation"]["A"][0]["metric"] == "agpo/uncertainty_mean"
    assert summary["manipulation"][0]["metric"] == "trace/js_lambda"  # the input is left alone
