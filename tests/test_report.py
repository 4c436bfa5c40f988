"""``rlkit report``: tables, paired differences, MDD and summary files from synthetic runs."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from scipy import stats

from rlkit.cli import main
from rlkit.config import load_config
from rlkit.intervals import (
    mean_ci,
    minimum_detectable_difference,
    paired_difference,
    paired_stats,
    pooled_mdd,
)
from rlkit.report import (
    arm_table,
    describe_pair,
    eval_curve,
    learning_curves,
    paired_comparison,
    shift_recovery,
    step_band,
    summary_files,
    training_dynamics,
    write_report,
)
from rlkit.summary import summary_row
from rlkit.tasks.loader import load_problems

ROOT = Path(__file__).resolve().parent.parent
SEEDS = [0, 1, 2, 3, 4]
GAIN = {"A": [0.10, 0.12, 0.08, 0.11, 0.09], "B": [0.15, 0.16, 0.12, 0.18, 0.14]}


def fake_run(run_dir, start, end, tokens, steps=4, overrides=()):
    """A finished run: config.yaml with ``steps`` (and ``overrides``) and evaluations at steps 0
    and ``steps``."""
    run_dir.mkdir(parents=True)
    cfg = load_config("tiny-cpu", [f"steps={steps}", f"output_dir={run_dir}", *overrides])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    rows = [{"step": 0, "eval/greedy_accuracy": start, "eval/pass@1": start / 2}]
    for step in range(1, steps + 1):
        row = {"step": step, "reward": 0.5, "tokens/generated": tokens * step, "tokens/probe": 0}
        if step == steps:
            row |= {"eval/greedy_accuracy": end, "eval/pass@1": end / 2}
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def sweep_dir(tmp_path):
    out, runs = tmp_path / "sweep", []
    for arm, gains in GAIN.items():
        for seed, gain in zip(SEEDS, gains):
            start = 0.5 + 0.01 * seed
            run_dir = out / arm / "G4" / f"seed{seed}"
            fake_run(run_dir, start, start + gain, 100 + 10 * seed)
            runs.append({"arm": arm, "group_size": 4, "seed": seed, "dir": str(run_dir)})
    # a killed run: no final evaluation, so it is listed and left out
    killed = out / "B" / "G4" / "seed5"
    fake_run(killed, 0.5, 0.9, 100, steps=4)
    rows = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()][:3]
    (killed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs.append({"arm": "B", "group_size": 4, "seed": 5, "dir": str(killed)})
    manifest = {
        "name": "synthetic",
        "spec_file": "sweeps/synthetic.yaml",
        "spec": {"base": "tiny-cpu"},
        "command": "rlkit sweep sweeps/synthetic.yaml",
        "baseline": "A",
        "runs": runs,
    }
    (out / "sweep.json").write_text(json.dumps(manifest))
    return out


def test_report_tables_paired_differences_and_mdd(tmp_path, sweep_dir, capsys):
    results = tmp_path / "results"
    assert main(["report", str(sweep_dir), "--results", str(results)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((results / "synthetic" / "summary.json").read_text())
    assert summary["commands"] == [
        "rlkit sweep sweeps/synthetic.yaml",
        f"rlkit report {sweep_dir} --results {results}",
    ]
    assert summary["missing"] == [str(sweep_dir / "B" / "G4" / "seed5")]
    rows = {(r["arm"], r["metric"]): r for r in summary["rows"]}

    a, b = rows["A", "eval/greedy_accuracy"], rows["B", "eval/greedy_accuracy"]
    assert a["seeds"] == SEEDS and a["vs_baseline"] is None and a["mdd"] is None
    gain = mean_ci(GAIN["B"])
    assert (b["gain"]["mean"], b["gain"]["low"], b["gain"]["high"]) == pytest.approx(
        (gain.mean, gain.low, gain.high)
    )
    # end values differ by the gains only (same start per seed): a paired difference
    diff = paired_difference(GAIN["B"], GAIN["A"])
    assert b["vs_baseline"]["mean"] == pytest.approx(0.05)
    assert (b["vs_baseline"]["low"], b["vs_baseline"]["high"]) == pytest.approx(
        (diff.low, diff.high)
    )
    assert b["mdd"] == pytest.approx(minimum_detectable_difference(diff, 5))
    assert summary["mdd"]["value"] == pytest.approx(b["mdd"])  # a single comparison
    assert rows["B", "eval/pass@1"]["vs_baseline"]["mean"] == pytest.approx(0.025)
    n = min(len(load_problems(load_config("tiny-cpu").task)[1]), 1024)
    assert b["eval_problems"] == n and n > 500
    assert b["eval_se"] == pytest.approx(np.sqrt(0.67 * 0.33 / n))  # end mean 52 + 15 = 67%
    assert b["tokens_generated"] == pytest.approx(4 * np.mean([100 + 10 * s for s in SEEDS]))

    md = (results / "synthetic" / "summary.md").read_text()
    assert "rlkit sweep sweeps/synthetic.yaml" in md and f"{b['mdd'] * 100:.1f} points" in md
    assert "| B | 4 | greedy_accuracy | 5 |" in md and md in printed
    with (results / "synthetic" / "summary.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4
    assert float(table[2]["vs_baseline_mean"]) == pytest.approx(0.05)
    assert (results / "synthetic" / "accuracy_vs_tokens.png").stat().st_size > 0


def test_eval_curve_counts_probe_tokens():
    rows = [
        {"step": 0, "eval/greedy_accuracy": 0.5},
        {"step": 1, "tokens/generated": 10, "tokens/probe": 5},
        {"step": 2, "tokens/generated": 20, "tokens/probe": 10, "eval/greedy_accuracy": 0.7},
    ]
    x, y = eval_curve(rows, "eval/greedy_accuracy")
    assert x.tolist() == [0, 30] and y.tolist() == [0.5, 0.7]


def test_pooled_mdd_pools_the_variance_of_each_comparison():
    # per-seed differences with variance 1 and 9 about their own means: pooled variance 5
    groups = [[0.0, 1.0, 2.0], [10.0, 13.0, 16.0]]
    t = stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)
    assert pooled_mdd(groups, 3) == pytest.approx(t * np.sqrt(5) / np.sqrt(3))
    assert pooled_mdd([[0.1]], 3) is None


def test_report_refuses_a_directory_without_a_sweep(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


def test_shift_recovery_measures_the_dip_and_the_steps_to_regain():
    rows = [
        {"step": 0, "eval/greedy_accuracy": 0.5},
        {"step": 10, "eval/greedy_accuracy": 0.6, "reward": 0.9},
        {"step": 11, "reward": 0.4},
        {"step": 20, "eval/greedy_accuracy": 0.45, "reward": 0.5},
        {"step": 30, "eval/greedy_accuracy": 0.55, "reward": 0.6},
        {"step": 40, "eval/greedy_accuracy": 0.61},
    ]
    got = shift_recovery(rows, "eval/greedy_accuracy", shift_step=10)
    assert got["pre"] == 0.6 and got["dip"] == pytest.approx(0.15)
    assert got["steps"] == 30  # step 40 is the first evaluation back at 0.6
    assert got["reward_after"] == pytest.approx(0.5)  # steps 11, 20, 30
    assert got["evals"] == [[0, 0.5], [10, 0.6], [20, 0.45], [30, 0.55], [40, 0.61]]
    never = shift_recovery(rows[:5], "eval/greedy_accuracy", shift_step=10)
    assert never["steps"] is None
    with pytest.raises(ValueError, match="both sides of the shift"):
        shift_recovery(rows, "eval/greedy_accuracy", shift_step=40)


def test_arm_table_and_summary_row_read_a_summary():
    row = {
        "arm": "B",
        "group_size": 4,
        "metric": "eval/greedy_accuracy",
        "seeds": [0, 1],
        "end": {"mean": 0.5, "low": 0.4, "high": 0.6},
        "vs_baseline": {"mean": 0.02, "low": 0.01, "high": 0.03},
        "mdd": 0.01,
        "tokens_generated": 100.0,
        "tokens_probe": 0.0,
    }
    base = row | {"arm": "A", "vs_baseline": None, "mdd": None}
    summary = {"name": "s", "baseline": "A", "rows": [base, row]}
    text = arm_table(summary, "eval/greedy_accuracy")
    # a description of the interval, not a verdict (only pre-registered claims are judged)
    assert text.splitlines()[-1].endswith("| +2.0 [+1.0, +3.0] | 1.0 | 100 (0) | above 0")
    assert "better" not in text and "| baseline" in text
    below = row | {"vs_baseline": {"mean": -0.02, "low": -0.03, "high": -0.01}}
    across = row | {"vs_baseline": {"mean": 0.0, "low": -0.01, "high": 0.01}}
    for other, side in ((below, "below 0"), (across, "contains 0")):
        text = arm_table(summary | {"rows": [base, other]}, "eval/greedy_accuracy")
        assert text.splitlines()[-1].endswith(f"| {side}"), side
    assert summary_row(summary, "B", "eval/greedy_accuracy") is row
    with pytest.raises(KeyError, match="no row for arm 'C'"):
        summary_row(summary, "C", "eval/greedy_accuracy")
    # an arm at a G the baseline did not run has no pair: not a second "baseline"
    lone = row | {"arm": "C", "group_size": 8, "vs_baseline": None, "mdd": None}
    text = arm_table(summary | {"rows": [base, row, lone]}, "eval/greedy_accuracy")
    assert text.splitlines()[-1].endswith("| not paired with A")
    text = arm_table(summary | {"baseline": None, "rows": [lone]}, "eval/greedy_accuracy")
    assert text.splitlines()[-1].endswith("| not paired (no baseline)")


def test_paired_comparison_of_any_two_arms():
    def row(arm, values):
        return {
            "arm": arm,
            "group_size": 4,
            "metric": "m",
            "end_by_seed": {str(s): v for s, v in enumerate(values)},
        }

    summary = {"name": "s", "rows": [row("A", [0.5, 0.6, 0.7]), row("B", [0.6, 0.6, 0.9])]}
    got = paired_comparison(summary, "B", "A", "m")
    assert got["mean"] == pytest.approx(0.1) and got["seeds"] == [0, 1, 2]
    assert got["low"] < 0.1 < got["high"] and got["mdd"] > 0
    summary["rows"][1]["end_by_seed"] = {"0": 0.6}
    with pytest.raises(ValueError, match="share 1 seed"):
        paired_comparison(summary, "B", "A", "m")


def test_describe_pair_states_the_difference_and_where_its_interval_lies():
    rows = [
        {"arm": a, "group_size": 4, "metric": "m", "end_by_seed": dict(zip("0123", v))}
        for a, v in (("A", [0.50, 0.52, 0.48, 0.50]), ("B", [0.55, 0.56, 0.54, 0.56]))
    ]
    got = describe_pair({"name": "s", "rows": rows}, "B", "A", metric="m")
    assert got["mean"] == pytest.approx(0.0525) and got["seeds"] == [0, 1, 2, 3]
    assert got["text"].startswith("B − A (m, 4 seeds): +5.3 [")
    assert got["text"].endswith("95% interval above 0") and "verdict" not in got
    back = describe_pair({"name": "s", "rows": rows}, "A", "B", metric="m")
    assert back["text"].endswith("95% interval below 0")


def test_describe_pair_on_a_summary_without_per_seed_values_names_the_file_and_the_key():
    # as an older rlkit report wrote them (before issue 22): no "end_by_seed"
    rows = [{"arm": a, "group_size": 4, "metric": "m", "end": {"mean": 0.5}} for a in "AB"]
    summary = {"name": "07_group_size", "commands": ["rlkit sweep s.yaml", "rlkit report r"]}
    message = (
        r"^07_group_size/summary\.json: the row of arm 'B', metric 'm' has no 'end_by_seed' "
        r".*regenerate it from the runs: rlkit report r$"
    )
    with pytest.raises(ValueError, match=message):
        describe_pair(summary | {"rows": rows}, "B", "A", metric="m")


def test_paired_stats_p_value_is_the_one_sample_t_test():
    diffs = [0.01, 0.03, 0.02, 0.04]
    got = paired_stats(diffs)
    assert got["p"] == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue)
    assert paired_stats([0.0, 0.0])["p"] == 1.0 and paired_stats([0.1, 0.1])["p"] == 0.0


def write_rows(run_dir, rows):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def report(sweep_dir, results, capsys):
    code = main(["report", str(sweep_dir), "--results", str(results)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("name", ["../x", "ABSOLUTE", "a/b", "..", "", 7])
def test_report_writes_only_inside_results(tmp_path, sweep_dir, capsys, name):
    name = str(tmp_path / "x") if name == "ABSOLUTE" else name
    manifest = json.loads((sweep_dir / "sweep.json").read_text()) | {"name": name}
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest))
    code, _, err = report(sweep_dir, tmp_path / "results", capsys)
    assert code == 2 and "name must be a plain folder name" in err and repr(name) in err
    assert not (tmp_path / "x").exists() and not (tmp_path / "results").exists()


def test_report_does_not_follow_a_link_out_of_results(tmp_path, sweep_dir, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "synthetic").symlink_to(elsewhere)
    code, _, err = report(sweep_dir, tmp_path / "results", capsys)
    assert code == 2 and "is a link out of --results" in err and not any(elsewhere.iterdir())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "sweep.json is not valid JSON"),
        ('{"name": "synthetic", "runs": [{"arm"', "sweep.json is not valid JSON"),
        ("[1, 2]", "the file must be a JSON object, got \\[1, 2\\]"),
        ('{"name": "s"}', "spec_file is missing"),
    ],
)
def test_damaged_manifest_is_a_clear_error(tmp_path, sweep_dir, capsys, text, message):
    (sweep_dir / "sweep.json").write_text(text)
    code, _, err = report(sweep_dir, tmp_path / "results", capsys)
    assert code == 2 and re.search(message, err), err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"runs": []}, "runs must be a non-empty list"),
        ({"runs": {"A": 1}}, "runs must be a non-empty list"),
        ({"runs": [{"arm": "A", "group_size": 4, "seed": "0", "dir": "d"}]}, "runs\\[0\\].seed"),
        ({"runs": [{"arm": "A", "group_size": 4, "seed": 0}]}, "runs\\[0\\].dir must be a str"),
        ({"runs": ["A/G4/seed0"]}, "runs\\[0\\] must be an object"),
        ({"baseline": ["A"]}, "baseline must be an arm name or null"),
        (
            {"runs": [{"arm": "A", "group_size": 4, "seed": 0, "dir": d} for d in "ab"]},
            "runs\\[1\\] repeats runs\\[0\\] \\(\\('A', 4, 0\\)\\)",
        ),
        (
            {
                "runs": [
                    {"arm": a, "group_size": 4, "seed": 0, "dir": d}
                    for a, d in [("A", "d"), ("B", "./d")]
                ]
            },
            "runs\\[1\\] repeats runs\\[0\\] \\('d'\\)",
        ),
    ],
)
def test_wrong_shaped_manifest_names_the_entry(tmp_path, sweep_dir, capsys, change, message):
    manifest = json.loads((sweep_dir / "sweep.json").read_text()) | change
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest))
    code, _, err = report(sweep_dir, tmp_path / "results", capsys)
    assert code == 2 and re.search(message, err), err


def summary_of(sweep_dir, results):
    write_report(sweep_dir, results)
    summary = json.loads((results / "synthetic" / "summary.json").read_text())
    rows = {(r["arm"], r["metric"]): r for r in summary["rows"]}
    return summary, rows, (results / "synthetic" / "summary.md").read_text()


def test_runs_of_unequal_length_are_not_averaged(tmp_path, sweep_dir):
    short = sweep_dir / "B" / "G4" / "seed4"
    shutil.rmtree(short)
    fake_run(short, 0.54, 0.68, 140, steps=3)  # finished, but at 3 steps where the others ran 4
    summary, rows, md = summary_of(sweep_dir, tmp_path / "results")
    assert rows["B", "eval/greedy_accuracy"]["seeds"] == [0, 1, 2, 3]
    assert str(short) in summary["missing"]
    assert f"{short} (3 steps, 4 in other runs of B at G=4)" in md


def test_null_final_metric_is_never_replaced_by_the_start_value(tmp_path, sweep_dir):
    run_dir = sweep_dir / "B" / "G4" / "seed1"
    rows = read_rows(run_dir)
    rows[-1]["eval/pass@1"] = None  # a non-finite evaluation is logged as null
    write_rows(run_dir, rows)
    summary, by_arm, md = summary_of(sweep_dir, tmp_path / "results")
    assert by_arm["B", "eval/pass@1"]["seeds"] == [0, 2, 3, 4]
    assert "1" not in by_arm["B", "eval/pass@1"]["end_by_seed"]
    assert f"{run_dir} (eval/pass@1 at step 4 is None, not a number)" in md


def test_nan_in_a_final_evaluation_leaves_the_run_out(tmp_path, sweep_dir):
    run_dir = sweep_dir / "A" / "G4" / "seed2"
    text = (run_dir / "metrics.jsonl").read_text().splitlines()
    text[-1] = text[-1].replace('"eval/greedy_accuracy": 0.6', '"eval/greedy_accuracy": NaN')
    (run_dir / "metrics.jsonl").write_text("\n".join(text) + "\n")
    summary, rows, md = summary_of(sweep_dir, tmp_path / "results")
    assert rows["A", "eval/greedy_accuracy"]["seeds"] == [0, 1, 3, 4]
    assert f"{run_dir} (eval/greedy_accuracy at step 4 is nan, not finite)" in md


def test_non_finite_summary_writes_nothing(tmp_path, sweep_dir, capsys):
    run_dir = sweep_dir / "A" / "G4" / "seed0"
    rows = read_rows(run_dir)
    rows[-1]["tokens/generated"] = float("inf")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = report(sweep_dir, tmp_path / "results", capsys)
    assert code == 2 and "non-finite" in err
    assert not (tmp_path / "results").exists()  # not half of the files: none


def test_damaged_line_or_moved_model_is_named_not_dropped(tmp_path, sweep_dir):
    damaged = sweep_dir / "B" / "G4" / "seed2"
    lines = (damaged / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:10]
    (damaged / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    moved = sweep_dir / "B" / "G4" / "seed3"
    cfg = yaml.safe_load((moved / "config.yaml").read_text())
    cfg["model"]["name_or_path"] = str(tmp_path / "moved" / "model")
    (moved / "config.yaml").write_text(yaml.safe_dump(cfg))
    summary, rows, md = summary_of(sweep_dir, tmp_path / "results")
    assert rows["B", "eval/greedy_accuracy"]["seeds"] == [0, 1, 3, 4]  # the moved model is fine
    assert summary["missing"] == [str(damaged), str(sweep_dir / "B" / "G4" / "seed5")]
    assert f"{damaged / 'metrics.jsonl'} line 3 is damaged" in md


def test_one_seed_gives_no_interval_and_no_verdict(tmp_path, sweep_dir):
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    manifest["runs"] = [r for r in manifest["runs"] if r["arm"] == "A" or r["seed"] == 0]
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest))
    summary, rows, md = summary_of(sweep_dir, tmp_path / "results")
    b = rows["B", "eval/greedy_accuracy"]
    assert b["seeds"] == [0] and b["end"]["low"] is None and b["vs_baseline"]["high"] is None
    assert (
        "| B | 4 | greedy_accuracy | 1 | 50.0 [n/a] | 65.0 [n/a] | 15.0 [n/a] | 5.0 [n/a] |" in md
    )
    table = arm_table(summary, "eval/greedy_accuracy")
    assert "above 0" not in table and "+5.0 [n/a]" in table and "n/a (1 seed)" in table
    assert paired_stats([0.05])["p"] is None


def test_results_that_is_a_file_is_a_clear_error(tmp_path, sweep_dir, capsys):
    (tmp_path / "results").write_text("not a folder")
    code, _, err = report(sweep_dir, tmp_path / "results", capsys)
    assert code == 2 and f"cannot write the report into {tmp_path / 'results' / 'synthetic'}" in err


def test_results_behind_a_symlink_loop_is_a_clear_error(tmp_path, sweep_dir, capsys):
    results = tmp_path / "results"
    results.symlink_to("results")
    code, _, err = report(sweep_dir, results, capsys)
    assert code == 2 and "Traceback" not in err
    assert f"--results {results / 'synthetic'} is under {results}, a symlink loop" in err


def test_shift_without_an_evaluation_before_it_names_the_arm(tmp_path):
    out, runs = tmp_path / "sweep", []
    shift = ["task.shift={step: 2, arithmetic: {topics: [add]}}"]
    for seed in (0, 1):
        run_dir = out / "B" / "G4" / f"seed{seed}"
        fake_run(run_dir, 0.5, 0.6, 100, overrides=shift)
        write_rows(run_dir, read_rows(run_dir)[1:])  # no evaluation at step 0
        runs.append({"arm": "B", "group_size": 4, "seed": seed, "dir": str(run_dir)})
    manifest = {"name": "s", "spec_file": "s.yaml", "spec": {}, "command": "c", "runs": runs}
    (out / "sweep.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="arm B at G=4: eval/greedy_accuracy: no evaluation on"):
        write_report(out, tmp_path / "results")


def test_run_directories_not_found_say_where_they_were_looked_for(
    tmp_path, sweep_dir, capsys, monkeypatch
):
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    for run in manifest["runs"]:  # relative to tmp_path, where the sweep "ran"
        run["dir"] = str(Path(run["dir"]).relative_to(tmp_path))
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = report(sweep_dir, tmp_path / "results", capsys)
    assert code == 2 and f"sweep/A/G4/seed0 (no such directory in {elsewhere}" in err
    assert "run rlkit report from there" in err
    monkeypatch.chdir(tmp_path)
    assert report(sweep_dir, tmp_path / "results", capsys)[0] == 0


def test_left_out_runs_given_with_dot_slash_keep_the_manifest_order(tmp_path, sweep_dir, capsys):
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    for run in manifest["runs"]:
        run["dir"] = "./" + str(Path(run["dir"]).relative_to(tmp_path))
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest))
    shutil.rmtree(sweep_dir / "A" / "G4" / "seed1")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        summary, _, _ = summary_of(sweep_dir, tmp_path / "results")
    assert summary["missing"] == ["sweep/A/G4/seed1", "sweep/B/G4/seed5"]


T_975_2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom (3 seeds)


def test_step_band_by_hand_at_the_steps_every_seed_logged():
    # 3 seeds; seed 1 has no value at step 5, so step 5 is left out (never filled in)
    series = [{0: 0.1, 5: 0.4, 10: 1.0}, {0: 0.2, 10: 2.0}, {0: 0.3, 5: 0.6, 10: 3.0}]
    band = step_band(series)
    assert band["steps"] == [0, 10]
    assert band["mean"] == pytest.approx([0.2, 2.0])
    half = T_975_2 * np.array([0.1, 1.0]) / np.sqrt(3)  # t · sd / √n, sd 0.1 and 1.0
    assert band["low"] == pytest.approx([0.2 - half[0], 2.0 - half[1]])
    assert band["high"] == pytest.approx([0.2 + half[0], 2.0 + half[1]])
    assert step_band(series[:1]) == {"steps": [0, 5, 10], "mean": [0.1, 0.4, 1.0]} | {
        "low": [None] * 3,
        "high": [None] * 3,
    }


def evaluations(greedy: dict) -> list[dict]:
    """Metric rows of one run: greedy accuracy at each step given, Pass@1 half of it."""
    return [
        {"step": st, "eval/greedy_accuracy": v, "eval/pass@1": None if v is None else v / 2}
        for st, v in greedy.items()
    ]


def test_learning_curves_pair_each_seed_at_the_common_steps_only():
    a = [{0: 0.5, 5: 0.625, 10: 0.5}, {0: 0.5, 5: 0.5, 10: 0.5}, {0: 0.5, 5: 0.75, 10: 0.5}]
    # B's seed 1 logged a null at step 5; its seed 3 has no baseline run to pair with
    b = [{0: 0.5, 5: 0.75, 10: 0.75}, {0: 0.5, 5: None, 10: 0.5}, {0: 0.5, 5: 0.75, 10: 0.625}]
    b.append({0: 0.5, 5: 1.0, 10: 1.0})
    runs = {
        ("A", 4): {s: evaluations(v) for s, v in enumerate(a)},
        ("B", 4): {s: evaluations(v) for s, v in enumerate(b)},
    }
    curves = learning_curves(runs, "A")
    series = {(s["arm"], s["metric"]): s for s in curves["series"]}
    assert curves["x"] == "step" and "95% Student-t" in curves["band"]
    greedy = series["B", "eval/greedy_accuracy"]
    assert greedy["seeds"] == [0, 1, 2, 3] and greedy["steps"] == [0, 10]
    assert greedy["mean"] == [0.5, (0.75 + 0.5 + 0.625 + 1.0) / 4]
    paired = greedy["vs_baseline"]
    assert paired["seeds"] == [0, 1, 2] and paired["steps"] == [0, 10]
    # per-seed differences at step 10: 0.25, 0, 0.125 (mean 0.125, sd 0.125)
    half = T_975_2 * 0.125 / np.sqrt(3)
    assert paired["mean"] == [0.0, 0.125]
    assert paired["low"] == pytest.approx([0.0, 0.125 - half])
    assert paired["high"] == pytest.approx([0.0, 0.125 + half])
    assert series["B", "eval/pass@1"]["vs_baseline"]["mean"] == [0.0, 0.0625]
    a_greedy = series["A", "eval/greedy_accuracy"]
    assert a_greedy["steps"] == [0, 5, 10] and a_greedy["vs_baseline"] is None
    assert all(s["vs_baseline"] is None for s in learning_curves(runs, None)["series"])


def test_training_dynamics_leave_out_what_a_run_did_not_log():
    def run(seed, **extra):
        return [{"step": 0, "eval/greedy_accuracy": 0.5}] + [
            {"step": st, "grad_norm": 1.0 + seed + st} | {k: v[st - 1] for k, v in extra.items()}
            for st in (1, 2, 3)
        ]

    runs = {
        ("A", 4): {s: run(s, kl=[0.0, 0.01 * s, 0.02]) for s in range(3)},
        ("B", 4): {0: run(0), 1: run(1, entropy=[0.5, 0.4, 0.3]), 2: run(2)},
    }
    runs["A", 4][0][2]["grad_norm"] = float("nan")  # a skipped step: not a value
    got = training_dynamics(runs)
    series = {(s["arm"], s["metric"]): s for s in got["series"]}
    assert set(series) == {("A", "grad_norm"), ("A", "kl"), ("B", "grad_norm")}
    assert series["A", "grad_norm"]["steps"] == [1, 3]  # step 2 has a NaN in seed 0
    assert series["B", "grad_norm"]["mean"] == [3.0, 4.0, 5.0]  # 1 + mean seed (1) + step
    assert series["A", "kl"]["mean"] == pytest.approx([0.0, 0.01, 0.02])
    not_logged = {(n["arm"], n["metric"]): n["seeds_logged"] for n in got["not_logged"]}
    assert not_logged == {
        ("A", "entropy"): 0,
        ("A", "clip_ratio/region_mean"): 0,
        ("B", "kl"): 0,
        ("B", "entropy"): 1,  # one seed of three: not a band over seeds
        ("B", "clip_ratio/region_mean"): 0,
    }


def test_report_writes_the_curves_and_the_dynamics_with_their_numbers(tmp_path, sweep_dir):
    for arm in ("A", "B"):
        for seed in SEEDS:
            run_dir = sweep_dir / arm / "G4" / f"seed{seed}"
            rows = read_rows(run_dir)
            for r in rows[1:]:
                r["grad_norm"] = 0.5 + seed
                if arm == "B":
                    r["kl"] = 0.01 * r["step"]
            write_rows(run_dir, rows)
    summary, _, md = summary_of(sweep_dir, tmp_path / "results")
    out = tmp_path / "results" / "synthetic"
    curves = {(s["arm"], s["metric"]): s for s in summary["curves"]["series"]}
    b = curves["B", "eval/greedy_accuracy"]
    assert b["steps"] == [0, 4] and b["vs_baseline"]["seeds"] == SEEDS
    assert b["vs_baseline"]["mean"][1] == pytest.approx(0.05)  # the gains' difference
    dynamics = {(s["arm"], s["metric"]): s for s in summary["dynamics"]["series"]}
    assert set(dynamics) == {("A", "grad_norm"), ("B", "grad_norm"), ("B", "kl")}
    assert dynamics["B", "kl"]["mean"] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert "`kl`: A at G = 4 (0/5 seeds)" in md and "not drawn as 0" in md
    assert "![learning curves](curves.png)" in md and "![training dynamics](dynamics.png)" in md
    for name in ("curves.png", "dynamics.png"):
        assert Image.open(out / name).format == "PNG"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary left
    # the summary renders back to its own json (what test_claims checks of committed ones)
    assert summary_files(summary, {})["summary.json"] == (out / "summary.json").read_text()


def test_report_records_the_spec_hash_and_each_runs_start(tmp_path, sweep_dir):
    """Issue 42: summary.json holds the spec file's sha256 that rlkit sweep recorded and each
    run's last fresh start (UTC) from starts.jsonl, a resume keeping its start; a run started
    under another version of the spec file is named; what was not recorded is None with why."""
    from rlkit.machine import fingerprint
    from rlkit.sweep import log_start

    manifest = json.loads((sweep_dir / "sweep.json").read_text()) | {"spec_sha256": "new"}
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest))
    starts = sweep_dir / "starts.jsonl"
    log_start(starts, "A/G4/seed0", "fresh", "old", 1)
    log_start(starts, "A/G4/seed0", "fresh", "new", 1)  # killed before a checkpoint, started again
    log_start(starts, "B/G4/seed1", "fresh", "old", 2)
    log_start(starts, "B/G4/seed1", "resume", "new", 1)  # a resume keeps its start
    lines = [json.loads(line) for line in starts.read_text().splitlines()]
    write_report(sweep_dir, tmp_path / "results")
    summary = json.loads((tmp_path / "results/synthetic/summary.json").read_text())
    pre = summary["preregistration"]
    assert pre["spec_file"] == "sweeps/synthetic.yaml" and pre["spec_sha256"] == "new"
    assert pre["runs_started"]["A/G4/seed0"] == lines[1]["at"]
    assert pre["runs_started"]["B/G4/seed1"] == lines[2]["at"]
    assert pre["runs_started"]["A/G4/seed1"] is None
    assert pre["runs_started_why"].startswith("9 of 11 runs have no fresh start in starts.jsonl")
    assert pre["spec_changed_after_start"] == ["B/G4/seed1"]
    # each fresh start's machine, at its thread count: two machines here
    assert pre["machines"] == [lines[1]["machine"], lines[2]["machine"]]
    assert [m["threads"] for m in pre["machines"]] == [1, 2]
    assert pre["machines"][0]["cpu"] == fingerprint()["cpu"]
    assert pre["runs_machine"]["A/G4/seed0"] == 0 and pre["runs_machine"]["B/G4/seed1"] == 1
    assert pre["runs_machine"]["A/G4/seed1"] is None
    md = (tmp_path / "results/synthetic/summary.md").read_text()
    assert "Pre-registration: spec `sweeps/synthetic.yaml`, sha256 `new` (from sweep.json" in md
    assert "The spec file changed after 1 run(s) had started: B/G4/seed1." in md
    assert f"Machine 1: {fingerprint()['cpu']}, torch kernels " in md
    assert ", 2 thread(s), kernel variables " in md


def test_a_sweep_without_a_spec_hash_or_starts_says_so(tmp_path, sweep_dir):
    write_report(sweep_dir, tmp_path / "results")
    pre = json.loads((tmp_path / "results/synthetic/summary.json").read_text())["preregistration"]
    assert pre["spec_sha256"] is None and "sweep.json has no spec_sha256" in pre["spec_sha256_why"]
    assert set(pre["runs_started"].values()) == {None}
    assert pre["spec_changed_after_start"] == []
    assert pre["machines"] == [] and set(pre["runs_machine"].values()) == {None}


def test_committed_summaries_hold_the_spec_hash_git_gives():
    """Every committed summary.json records its spec's sha256. A sweep run before rlkit sweep
    recorded one has it backfilled from git: the hash of the spec file at the commit it names. A
    sweep run since records it with each run's start: then it is the hash of the spec file as
    committed, every run started under that hash, and the spec file's last commit came before
    the first run (checked here wherever git history is at hand)."""
    import hashlib
    import subprocess
    from datetime import datetime

    root = Path(__file__).resolve().parents[1]

    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)

    recorded = 0
    for path in sorted(root.glob("results/*/summary.json")):
        pre = json.loads(path.read_text())["preregistration"]
        if pre["runs_started"] is None:
            assert pre["runs_started_why"].startswith("not recorded"), path
            commit = re.search(r"`git show ([0-9a-f]{40}):", pre["spec_sha256_from"]).group(1)
            shown = subprocess.run(
                ["git", "-C", str(root), "show", f"{commit}:{pre['spec_file']}"],
                capture_output=True,
            )
            if shown.returncode:  # a copy without the history: nothing to compare
                continue
            assert hashlib.sha256(shown.stdout).hexdigest() == pre["spec_sha256"], path
            continue
        recorded += 1
        assert pre["spec_sha256_from"] == "sweep.json (rlkit sweep)", path
        assert not pre["spec_changed_after_start"] and all(pre["runs_started"].values()), path
        spec = (root / pre["spec_file"]).read_bytes()
        assert hashlib.sha256(spec).hexdigest() == pre["spec_sha256"], path
        last = git("log", "-1", "--format=%cI", "--", pre["spec_file"]).stdout.strip()
        if last:  # a copy with history: the spec was committed before the first run started
            first = min(datetime.fromisoformat(t) for t in pre["runs_started"].values())
            assert datetime.fromisoformat(last) < first, path
    assert recorded >= 1  # results/22_ebpo_hard_32, regenerated under the pinned kernels


def test_an_arm_whose_g_the_baseline_did_not_run_is_paired_with_its_claims_control(
    tmp_path, sweep_dir
):
    # results/22_ebpo_hard_32: the baseline is GRPO_G4, and EBPO_G2's claim is vs GRPO_G2; its
    # curves were paired with nothing (an empty panel titled "arm − GRPO_G4")
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    for arm, gains in (("A2", GAIN["A"]), ("B2", GAIN["B"][::-1])):
        for seed, gain in zip(SEEDS, gains):
            run_dir = sweep_dir / arm / "G2" / f"seed{seed}"
            fake_run(run_dir, 0.5, 0.5 + gain, 100)
            manifest["runs"].append(
                {"arm": arm, "group_size": 2, "seed": seed, "dir": str(run_dir)}
            )
    claim = {"name": "B2 above A2", "arm": "B2", "vs": "A2", "test": "superiority"}
    manifest["spec"]["claims"] = [claim | {"direction": 1, "margin": 0.01}]
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest))
    summary, _, md = summary_of(sweep_dir, tmp_path / "results")
    curves = {(s["arm"], s["metric"]): s for s in summary["curves"]["series"]}
    paired = curves["B2", "eval/greedy_accuracy"]["vs_baseline"]
    assert paired["vs"] == "A2" and paired["seeds"] == SEEDS
    gaps = np.subtract(GAIN["B"][::-1], GAIN["A"])
    assert paired["mean"][-1] == pytest.approx(gaps.mean())
    assert curves["B", "eval/greedy_accuracy"]["vs_baseline"]["vs"] == "A"
    assert curves["A2", "eval/greedy_accuracy"]["vs_baseline"] is None
    assert "where the baseline did not run, as the claims pair them: A2 at G = 2." in md


def test_rlkit_figures_redraws_a_committed_summarys_figures(tmp_path, capsys):
    committed, results = ROOT / "results/07_group_size", tmp_path / "07_group_size"
    results.mkdir()
    shutil.copy(committed / "summary.json", results)
    assert main(["figures", str(results)]) == 0
    assert capsys.readouterr().out.split() == [
        str(results / "curves.png"),
        str(results / "dynamics.png"),
    ]
    assert Image.open(results / "curves.png").size == Image.open(committed / "curves.png").size
    assert main(["figures", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err
