"""Pre-registered claims (a sweep spec's ``claims``) as ``rlkit report`` tests them: the exact
sign-flip p, Holm's correction, TOST and non-inferiority, worked by hand on small paired seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import test_report
from scipy import stats

from rlkit.claims import CLAIM_MEASURES, MEASURES, claim_cells, judge_claims, parse_claims
from rlkit.intervals import holm, sign_flip_p_greater, t_p_greater
from rlkit.report import summary_files, write_report

ROOT = Path(__file__).resolve().parents[1]
sweep_dir = test_report.sweep_dir  # the synthetic sweep (a fixture)
M = "eval/greedy_accuracy"


def summary_with(ends: dict[str, list[float]], gains: dict[str, float] | None = None) -> dict:
    """A summary whose arm rows hold these per-seed end values (seeds 0..n−1) and mean gains."""
    rows = [
        {
            "arm": arm,
            "group_size": 4,
            "metric": M,
            "end_by_seed": {str(s): v for s, v in enumerate(values)},
            "gain": {"mean": (gains or {}).get(arm, 0.1)},
        }
        for arm, values in ends.items()
    ]
    return {"name": "s", "rows": rows}


def claims(*specs: dict) -> list:
    arms = ["A", "B", "C", "D"]
    return parse_claims([{"arm": "B"} | c for c in specs], arms, "A", [4], "s")


def judged(differences, *specs: dict, gains=None) -> list[dict]:
    """The claims judged on arm B − baseline A = ``differences`` (A at 0.5 on every seed)."""
    base = [0.5] * len(differences)
    ends = {"A": base, "B": [0.5 + d for d in differences]}
    return judge_claims(summary_with(ends, gains), claims(*specs))


def test_exact_sign_flip_p_by_hand():
    # the 16 flips of ±1 ±2 ±3 ±4 (points): a sum ≥ 1 + 2 + 3 − 4 = 2 when the flipped values
    # sum to at most 4 ({}, {1}, {2}, {3}, {1, 2}, {4}, {1, 3}): 7 of 16
    assert sign_flip_p_greater([0.01, 0.02, 0.03, -0.04]) == (7 / 16, "exact, all 2^4 sign flips")
    # all positive: only the observed flip reaches it, whatever the t-test says
    assert sign_flip_p_greater([0.01, 0.02, 0.03, 0.04])[0] == 1 / 16
    assert t_p_greater([0.01, 0.02, 0.03, 0.04]) < 0.05
    assert sign_flip_p_greater([0.0, 0.0])[0] == 1.0  # every flip ties the observed 0


def test_sign_flip_p_above_20_seeds_is_a_seeded_monte_carlo():
    d = np.linspace(-0.5, 1.0, 21)
    p, method = sign_flip_p_greater(d)
    assert method == "Monte-Carlo, 100000 sign flips (seed 0)"
    assert sign_flip_p_greater(d) == (p, method)  # seeded: the same p every time
    sums = np.zeros(1)
    for value in d:
        sums = np.concatenate([sums + value, sums - value])
    exact = np.mean(sums >= d.sum() - 1e-9)
    assert abs(p - exact) < 5 * np.sqrt(exact * (1 - exact) / 100_000)  # 5 binomial SEs


def test_t_p_greater_is_scipys_one_sided_t_test():
    x = [0.01, -0.02, 0.03, 0.02]
    assert t_p_greater(x) == stats.ttest_1samp(x, 0.0, alternative="greater").pvalue
    assert t_p_greater([0.1, 0.1]) == 0.0 and t_p_greater([0.0, 0.0]) == 1.0


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 → 3·0.01, 2·0.03, max(0.06, 1·0.04); in the input order
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6, 0.01]) == pytest.approx([1.0, 1.0, 0.03])  # capped at 1
    assert holm([]) == []


# d = [0, 1, 2, 1] points: mean 1, SD √(2/3), 90% t-interval 1 ± t(0.95, 3)·SD/2
D = [0.00, 0.01, 0.02, 0.01]
HALF = stats.t.ppf(0.95, 3) * np.sqrt(2 / 3) / 2 * 0.01  # 0.961 points
EQUIVALENCE = {"name": "eq", "test": "equivalence"}


def test_tost_decision_flips_at_the_interval_end():
    end = 0.01 + HALF  # 1.961 points: the 90% interval's far end
    inside, outside = (judged(D, EQUIVALENCE | {"margin": end + d})[0] for d in (1e-4, -1e-4))
    assert inside["ci90"]["high"] == pytest.approx(end)
    assert inside["verdict"] == "equivalent" and outside["verdict"] == "not shown equivalent"
    assert inside["p_t"] < 0.05 < outside["p_t"]  # TOST's p agrees with the interval
    assert "p_holm" not in inside  # Holm adjusts the superiority claims only


@pytest.mark.parametrize("direction", [1, -1])
def test_noninferiority_decision_flips_at_the_one_sided_bound(direction):
    # the arm is worse by 1 point on average in the claimed direction: bound −1.961 points
    d = [-direction * x for x in D]
    claim = {"name": "ni", "test": "noninferiority", "direction": direction}
    inside, outside = (judged(d, claim | {"margin": 0.01 + HALF + e})[0] for e in (1e-4, -1e-4))
    assert inside["verdict"] == "non-inferior" and outside["verdict"] == "not shown non-inferior"
    assert inside["p_t"] < 0.05 < outside["p_t"]


def test_half_baseline_gain_margin_is_half_the_vs_arms_mean_gain():
    claim = EQUIVALENCE | {"margin": "half_baseline_gain"}
    wide, narrow = (judged(D, claim, gains={"A": 2 * (0.01 + HALF + e)})[0] for e in (1e-4, -1e-4))
    assert wide["margin"] == pytest.approx(0.01 + HALF + 1e-4)
    assert wide["margin_rule"] == "half_baseline_gain"
    assert wide["verdict"] == "equivalent" and narrow["verdict"] == "not shown equivalent"
    no_gain = judged(D, claim, gains={"A": -0.01})[0]
    assert no_gain["verdict"] == "not testable (margin -0.50 points is not positive)"


def test_superiority_uses_the_exact_p_holm_adjusted_within_its_family():
    up = [0.01, 0.02, 0.03, 0.04, 0.05]  # exact one-sided p = 1/32; the t-test's is far lower
    superiority = {"test": "superiority", "direction": 1}
    alone = judged(up, superiority | {"name": "alone"})[0]
    assert alone["p_exact"] == 1 / 32 and alone["p_holm"] == 1 / 32
    assert alone["p_method"] == "exact, all 2^5 sign flips"
    assert alone["verdict"] == "reproduced"
    three = judged(up, *(superiority | {"name": f"c{i}", "family": "f"} for i in range(3)))
    assert [c["p_holm"] for c in three] == [3 / 32] * 3  # Holm over 3: none significant
    assert {c["verdict"] for c in three} == {"inconclusive"}
    # another family does not count
    mixed = judged(up, superiority | {"name": "a", "family": "f"}, superiority | {"name": "b"})
    assert [c["verdict"] for c in mixed] == ["reproduced", "reproduced"]


def test_superiority_verdicts_contradicted_not_reproduced_inconclusive():
    down = [-0.01, -0.02, -0.03, -0.04, -0.05]
    claim = {"name": "c", "test": "superiority", "direction": 1}
    assert judged(down, claim)[0]["verdict"] == "contradicted"
    assert judged(down, claim | {"direction": -1})[0]["verdict"] == "reproduced"
    # four seeds all on the claimed side: t-test p < 0.05 but the exact p is 1/16
    four = judged([0.01, 0.02, 0.03, 0.04], claim)[0]
    assert four["p_t"] < 0.05 and four["p_exact"] == 1 / 16 and four["verdict"] == "inconclusive"
    # no effect: "not reproduced" only when equivalence within the margin holds
    flat = [0.001, -0.001, 0.002, -0.002, 0.0]
    assert judged(flat, claim | {"margin": 0.01})[0]["verdict"] == "not reproduced"
    assert judged(flat, claim | {"margin": 0.001})[0]["verdict"] == "inconclusive"
    assert judged(flat, claim)[0]["verdict"] == "inconclusive"


def test_one_paired_seed_is_not_testable():
    got = judged([0.05], {"name": "c", "test": "superiority", "direction": 1})[0]
    assert got["verdict"] == "not testable (fewer than 2 paired seeds)" and got["p_exact"] is None


def test_a_claim_about_an_arm_without_finished_runs_is_not_testable():
    summary = summary_with({"A": [0.5, 0.6]})  # B has no row: none of its runs finished
    specs = [{"name": "c", "test": "equivalence", "margin": "half_baseline_gain"}]
    (got,) = judge_claims(summary, claims(*specs))
    assert got["seeds"] == [] and got["margin"] == 0.05 and got["group_size"] == 4
    assert got["verdict"] == "not testable (fewer than 2 paired seeds)"


def test_planned_mdd_is_recorded_beside_the_observed_one():
    claim = {"name": "c", "test": "superiority", "direction": 1}
    got = judged(D, claim | {"planned_mdd": 0.012, "planned_from": "results/pilot"})[0]
    assert got["planned_mdd"] == 0.012 and got["planned_from"] == "results/pilot"
    assert got["mdd"] > 0


def test_a_shift_dip_claim_is_tested_on_the_dips_not_the_end_values():
    summary = summary_with({"A": [0.5] * 5, "B": [0.5] * 5})  # equal end values
    dips = {"A": [0.03, 0.04, 0.05, 0.03, 0.04], "B": [0.01, 0.02, 0.02, 0.01, 0.01]}
    for row in summary["rows"]:
        row["shift"] = {
            "step": 50,
            "seeds": {str(s): {"dip": v} for s, v in enumerate(dips[row["arm"]])},
        }
    spec = {"name": "c", "test": "superiority", "direction": -1, "measure": "shift_dip"}
    (got,) = judge_claims(summary, claims(spec))
    assert got["measure"] == "shift_dip"
    assert got["difference"]["mean"] == pytest.approx(-0.024)  # B dips 2.4 points less
    assert got["p_exact"] == 1 / 32 and got["verdict"] == "reproduced"
    assert claim_cells(got)["metric"] == "greedy_accuracy (shift_dip)"
    (end,) = judge_claims(summary, claims(spec | {"measure": "end"}))
    assert end["difference"]["mean"] == 0.0 and end["verdict"] == "inconclusive"
    del summary["rows"][1]["shift"]
    with pytest.raises(ValueError, match="^s: arm 'B', metric 'eval/greedy_accuracy' has no task"):
        judge_claims(summary, claims(spec))


def test_every_measure_a_spec_may_name_has_its_per_seed_values_in_the_report():
    assert set(CLAIM_MEASURES) == set(MEASURES)


def test_claims_on_a_summary_without_per_seed_values_name_the_file():
    summary = {
        "name": "07_group_size",
        "commands": ["rlkit report r"],
        "rows": [{"arm": a, "group_size": 4, "metric": M} for a in "AB"],
    }
    with pytest.raises(ValueError, match="^07_group_size/summary.json: the row of arm 'B'"):
        judge_claims(summary, claims({"name": "c", "test": "superiority", "direction": 1}))


def with_spec(sweep_dir, **keys):
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    manifest["spec"] = manifest["spec"] | keys
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest))


def read_summary(results):
    out = results / "synthetic"
    files = {n: (out / n).read_text() for n in ("summary.md", "summary.json", "summary.csv")}
    return json.loads(files["summary.json"]), files


def test_report_writes_the_claims_and_changes_nothing_else(tmp_path, sweep_dir):
    write_report(sweep_dir, tmp_path / "results")
    _, before = read_summary(tmp_path / "results")
    specs = [
        {"name": "B above A", "arm": "B", "test": "superiority", "direction": 1, "source": "x"},
        {"name": "B near A", "arm": "B", "test": "equivalence", "margin": "half_baseline_gain"},
    ]
    with_spec(sweep_dir, claims=specs)
    write_report(sweep_dir, tmp_path / "results")  # the same command, the same files
    summary, after = read_summary(tmp_path / "results")
    above, near = summary["claims"]
    # B − A = the gains' difference: 5 seeds all positive, exact p = 1/32
    assert above["p_exact"] == 1 / 32 and above["verdict"] == "reproduced"
    assert near["margin"] == pytest.approx(np.mean([0.10, 0.12, 0.08, 0.11, 0.09]) / 2)
    assert near["verdict"] == "not shown equivalent"
    assert (
        "| B above A | synthetic | superiority (+1) | B − A | greedy_accuracy | 4 | 5 |"
        in (after["summary.md"])
    )
    assert "- B above A: x" in after["summary.md"]
    # nothing else changed: the table, the rows, the csv
    table = after["summary.md"].index("Pre-registered claims")
    left_out = after["summary.md"].index("Left out")
    assert after["summary.md"][:table] + after["summary.md"][left_out:] == before["summary.md"]
    claims_json = summary.pop("claims")
    assert json.loads(before["summary.json"]) == summary | {"spec": {"base": "tiny-cpu"}}
    assert summary["spec"]["claims"] == specs and len(claims_json) == 2
    assert after["summary.csv"] == before["summary.csv"]


def test_report_refuses_bad_claims_in_the_manifest(tmp_path, sweep_dir):
    with_spec(sweep_dir, claims=[{"name": "c", "arm": "Z", "test": "superiority", "direction": 1}])
    with pytest.raises(ValueError, match=r"sweep.json: sweep spec: claims\[0\] \(c\): arm 'Z'"):
        write_report(sweep_dir, tmp_path / "results")
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "path", sorted(ROOT.glob("results/*/summary.json")), ids=lambda p: p.parent.name
)
def test_committed_summaries_render_back_byte_for_byte(path):
    """Every committed summary was written by today's report (per-seed values, no run left out)
    and renders back to its own files: a summary without claims is what it was before claims."""
    summary = json.loads(path.read_text())
    assert all("end_by_seed" in row for row in summary["rows"]), "no per-seed values"
    assert not summary["missing"], summary["missing"]
    for name, text in summary_files(summary, {}).items():
        with open(path.parent / name, newline="") as f:
            assert text == f.read(), name


def test_a_check_of_another_arm_reads_that_arms_runs(tmp_path, sweep_dir):
    """CISPO's check reads GRPO's clip: B's check ``of: A`` is A's mean (seed 0 logs 0.1 at one
    step: 0.1 over the seeds that logged it), recorded under B with ``of``, and decides B's claim."""
    log_in_arm_a(sweep_dir, "agpo/epsilon/mean")  # logged by A only
    manipulation = {"B": [{"metric": "agpo/epsilon/mean", "acts_if": "> 0.2", "of": "A"}]}
    claim = {"name": "c", "arm": "B", "test": "superiority", "direction": 1}
    with_spec(sweep_dir, manipulation=manipulation, claims=[claim])
    write_report(sweep_dir, tmp_path / "results")
    summary, files = read_summary(tmp_path / "results")
    (check,) = summary["manipulation"]
    assert (check["arm"], check["of"], check["by_seed"]) == ("B", "A", {"0": 0.1})
    assert check["acted"] is False
    (judged,) = summary["claims"]
    assert judged["verdict"] == "not testable (manipulation did not act)"
    assert (
        "| B | 4 | agpo/epsilon/mean (of A) | > 0.2 | 0.1 [0.1, 0.1] | 1/5 | no |"
        in (files["summary.md"])
    )


def log_in_arm_a(sweep_dir, metric):
    """Arm A's seed 0 logs ``metric`` (0.1) at step 1."""
    path = sweep_dir / "A" / "G4" / "seed0" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1][metric] = 0.1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_check_of_a_metric_no_run_logs_names_it(tmp_path, sweep_dir):
    """A misspelt metric is an error naming it and the closest logged names, not a mechanism
    that did not act."""
    with_spec(sweep_dir, manipulation={"B": [{"metric": "tokens/generatd", "acts_if": "> 0"}]})
    with pytest.raises(
        ValueError, match=r"no run of the sweep logs 'tokens/generatd'.*tokens/generated"
    ):
        write_report(sweep_dir, tmp_path / "results")


def test_manipulation_checks_per_arm_and_claims_on_an_arm_that_did_not_act(tmp_path, sweep_dir):
    # every run logs tokens/generated = (100 + 10·seed)·step at steps 1..4: per-seed mean
    # 2.5·(100 + 10·seed), so 250 .. 350 over seeds 0..4, mean 300
    manipulation = {
        "A": [{"metric": "reward", "acts_if": "> 0.4"}],
        "B": [
            {"metric": "tokens/generated", "acts_if": ">= 300"},
            {"metric": "agpo/epsilon/mean", "acts_if": "> 0"},  # never logged
        ],
    }
    claim = {"name": "c", "arm": "B", "test": "superiority", "direction": 1}
    log_in_arm_a(sweep_dir, "agpo/epsilon/mean")  # logged by the sweep, never by B
    with_spec(
        sweep_dir,
        manipulation=manipulation,
        claims=[claim, claim | {"name": "A", "arm": "A", "vs": "B"}],
    )
    write_report(sweep_dir, tmp_path / "results")
    summary, files = read_summary(tmp_path / "results")
    reward, tokens, epsilon = summary["manipulation"]
    assert reward["acted"] and reward["mean"] == 0.5 and reward["by_seed"]["4"] == 0.5
    assert tokens["by_seed"] == {str(s): 2.5 * (100 + 10 * s) for s in range(5)}
    assert (tokens["mean"], tokens["min"], tokens["max"]) == (300, 250, 350)
    assert tokens["acted"] and tokens["seeds"] == [0, 1, 2, 3, 4]
    assert epsilon["mean"] is None and not epsilon["acted"]
    b_claim, a_claim = summary["claims"]
    assert b_claim["manipulation_acted"] is False
    assert b_claim["verdict"] == "not testable (manipulation did not act)"
    assert b_claim["p_exact"] == 1 / 32  # still computed and reported
    assert a_claim["manipulation_acted"] is True
    # the untestable claim still counts in its family's Holm correction (pre-registered): 2 × 1/32
    assert a_claim["p_holm_other"] == 2 / 32 and a_claim["verdict"] == "inconclusive"
    md = files["summary.md"]
    assert "| B | 4 | tokens/generated | >= 300 | 300 [250, 350] | 5/5 | yes |" in md
    assert "| B | 4 | agpo/epsilon/mean | > 0 | not logged | 0/5 | no |" in md
    assert md.index("Manipulation checks") < md.index("Pre-registered claims")
