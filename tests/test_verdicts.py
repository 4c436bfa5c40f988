"""``rlkit verdicts``: docs/results.md's table of pre-registered verdicts, rendered from
results/*/summary.json, and the check that ``make notebooks-full`` runs on it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_claims import claims, summary_with
from test_notebook_figures import execute_full

from rlkit import reanalysis, verdicts
from rlkit.claims import judge_claims
from rlkit.cli import main
from rlkit.verdicts import check_stated_verdicts, claim_verdicts

ROOT = Path(__file__).resolve().parents[1]
SUPERIORITY = {"name": "B above A", "test": "superiority", "direction": 1, "margin": 0.01}
HEADER_CELLS = [cell.strip() for cell in verdicts.HEADER.strip("|").split("|")]


def write_summary(
    results: Path, sweep: str, judged: list[dict] | None, rows: list[dict] | None = None
) -> Path:
    """results/<sweep>/summary.json holding these judged claims (None: a summary without) and
    arm rows; its spec is tiny-cpu's, no arm switching a mechanism on."""
    path = results / sweep / "summary.json"
    path.parent.mkdir(parents=True)
    summary = {"name": sweep, "spec": {"base": "tiny-cpu"}, "rows": rows or []}
    summary |= {} if judged is None else {"claims": judged}
    path.write_text(json.dumps(summary))
    return path


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, Path]:
    """A results folder with one sweep of two claims (B − A = +1..+4 points on 4 seeds: B above
    A is reproduced) and one sweep without claims, and a README with empty markers."""
    ends = {"A": [0.5] * 4, "B": [0.51, 0.52, 0.53, 0.54]}
    noninferiority = {"name": "B no worse", "test": "noninferiority", "direction": 1}
    summary = summary_with(ends)
    judged = judge_claims(summary, claims(SUPERIORITY, noninferiority | {"margin": 0.01}))
    results = tmp_path / "results"
    write_summary(results, "s", judged, summary["rows"])
    write_summary(results, "a_old", None)  # sorts first; contributes no row
    readme = tmp_path / "README.md"
    readme.write_text(f"# r\n\ntext\n{verdicts.BEGIN}\n{verdicts.END}\nafter\n")
    return readme, results


def test_render_then_check_passes_and_a_changed_verdict_fails_naming_it(tiny):
    readme, results = tiny
    assert verdicts.stale_line(readme, results) is not None  # the empty block is stale
    assert verdicts.write(readme, results)
    assert verdicts.stale_line(readme, results) is None
    assert not verdicts.write(readme, results)  # already fresh: unchanged
    text = readme.read_text()
    assert text.startswith(f"# r\n\ntext\n{verdicts.BEGIN}\n| claim | sweep |")
    assert text.endswith(f"{verdicts.END}\nafter\n")
    rows = [line for line in text.splitlines() if line.startswith("| B ")]
    assert rows == [
        "| B above A | s | — | superiority (+1) | B − A | greedy_accuracy | 4 | 4 "
        "| +2.5 [+0.4, +4.6] | [+1.0, +4.0] | 1.00 (10%) | no | 0.0625 | 0.0625 / 0.0625 "
        "| — / 2.7 | no check / no rule | **inconclusive** | inconclusive |",
        "| B no worse | s | — | noninferiority (+1) | B − A | greedy_accuracy | 4 | 4 "
        "| +2.5 [+0.4, +4.6] | [+1.0, +4.0] | 1.00 (10%) | no | 0.0625 | — / — | — / 2.7 "
        "| no check / no rule | **non-inferior** | non-inferior |",
    ]
    # a summary regenerated with another verdict: the check names the README's stale line
    path = results / "s" / "summary.json"
    summary = json.loads(path.read_text())
    summary["claims"][1]["verdict"] = "not shown non-inferior"
    path.write_text(json.dumps(summary))
    line = text.splitlines().index(rows[1]) + 1
    stale = verdicts.stale_line(readme, results)
    assert stale.startswith(f"{readme} line {line} reads '| B no worse |")
    assert stale.count("**non-inferior**") == 1 and "**not shown non-inferior**" in stale


def test_a_deviation_flags_its_claims_and_its_evidence_is_listed(tiny):
    """results/deviations.yaml: the claims written after their results, or whose check changed
    while they ran, are flagged in the table's registration column (issue 42)."""
    readme, results = tiny
    (results / "deviations.yaml").write_text(
        "- {sweep: s, claims: [B no worse], flag: check amended during the runs, why: commit x}\n"
        "- {sweep: s, claims: all, flag: confirmation of a known result, why: commit y}\n"
    )
    lines = verdicts.render(results)
    flagged = {line.split(" | ")[0]: line.split(" | ")[2] for line in lines if "| s |" in line}
    assert flagged == {
        "| B above A": "confirmation of a known result",
        "| B no worse": "check amended during the runs, confirmation of a known result",
    }
    assert "- s, check amended during the runs: commit x" in lines
    (results / "deviations.yaml").write_text("- {sweep: s, claims: [C], flag: x, why: y}\n")
    with pytest.raises(ValueError, match=r"deviations.yaml\[0\]: needs a sweep with claims"):
        verdicts.render(results)


def test_a_spec_changed_after_a_run_started_flags_every_claim_of_its_sweep(tiny):
    _, results = tiny
    path = results / "s" / "summary.json"
    summary = json.loads(path.read_text())
    summary["preregistration"] = {"spec_changed_after_start": ["B/G4/seed0"]}
    path.write_text(json.dumps(summary))
    rows = [line for line in verdicts.render(results) if "| s |" in line]
    assert all(row.split(" | ")[2] == reanalysis.AMENDED for row in rows) and len(rows) == 2


def reread_row(results: Path, sweep: str) -> list[str]:
    """The cells of the table's row of ``sweep``'s only claim."""
    (row,) = [line for line in verdicts.render(results) if f"| {sweep} |" in line]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_a_small_real_effect_reads_reproduced_below_margin_with_its_equivalence(tmp_path):
    """+0.3 points on every seed: reproduced (exact p 1/256 over 8 seeds), and its 90% interval
    inside ±1 point: equivalent within the margin, so "reproduced, below margin"; the margin is
    stated as a share of the control's gain (1 point of 4: 25%)."""
    summary = summary_with({"A": [0.5] * 8, "B": [0.503 + 0.0001 * s for s in range(8)]})
    summary["rows"][0]["gain"] = {"mean": 0.04}
    superiority = SUPERIORITY | {"margin": 0.01}
    judged = judge_claims(summary, claims(superiority))
    write_summary(tmp_path, "s", judged, summary["rows"])
    cells = reread_row(tmp_path, "s")
    assert cells[HEADER_CELLS.index("margin (share of vs's gain)")] == "1.00 (25%)"
    assert cells[HEADER_CELLS.index("equivalent within ±margin")] == "yes"
    assert cells[HEADER_CELLS.index("verdict (registered)")] == "**reproduced**"
    assert cells[-1] == "reproduced, below margin"


def test_holm_over_the_whole_project_and_who_survives_it(tmp_path):
    """Three sweeps, one superiority claim each, all + on 8 seeds (p = 1/256 each, Holm within
    its family: the same); over the project Holm multiplies the smallest by 3: 3/256 < 0.05, so
    all survive; a fourth, 4 seeds (p = 1/16), does not, and its row says so."""
    for sweep, n in (("a", 8), ("b", 8), ("c", 8), ("d", 4)):
        summary = summary_with({"A": [0.5] * n, "B": [0.52 + 0.001 * s for s in range(n)]})
        write_summary(tmp_path, sweep, judge_claims(summary, claims(SUPERIORITY)), summary["rows"])
    holm_cell = HEADER_CELLS.index("Holm p (family / project)")
    assert reread_row(tmp_path, "a")[holm_cell] == "0.0039 / 0.0156"
    assert reread_row(tmp_path, "d")[holm_cell] == "0.0625 / 0.0625"
    assert reread_row(tmp_path, "d")[-1] == "inconclusive"
    lines = verdicts.render(tmp_path)
    assert (
        "Project-wide Holm over all 4 superiority claims (α = 0.05, both directions): 3 survive, "
        "B above A (a); B above A (b); B above A (c)." in lines
    )


GSPO_PAPER = [
    "loss.loss_mode=gspo",
    "loss.eps_low=3.0e-4",
    "loss.eps_high=4.0e-4",
]  # not clip-higher


def mechanism_summary(arm: list[str], manipulation: list[dict], clip: float | None) -> dict:
    """A judged summary of B above A where B has the overrides ``arm``, these registered
    manipulation checks and a clip fraction of ``clip`` at every step (None: not logged)."""
    summary = summary_with({"A": [0.5] * 8, "B": [0.52 + 0.001 * s for s in range(8)]})
    summary["spec"] = {"base": "tiny-cpu", "arms": {"A": [], "B": arm}}
    summary["manipulation"] = [
        {"arm": "B", "group_size": 4, "acts_if": "> 0"} | m for m in manipulation
    ]
    series = (
        []
        if clip is None
        else [
            {"arm": "B", "group_size": 4, "metric": "clip_ratio/region_mean", "mean": [clip, clip]}
        ]
    )
    summary["dynamics"] = {"series": series}
    summary["claims"] = judge_claims(summary, claims(SUPERIORITY))
    return summary


@pytest.mark.parametrize(
    ("arm", "manipulation", "clip", "status", "text"),
    [
        # EBPO: the rule is the shrinkage, not the regime the registered check tested
        (
            ["algo.estimator=ebpo"],
            [
                {"metric": "frac_reward_zero_std", "mean": 0.05, "acted": False},
                {"metric": "ebpo/shrinkage_mean", "mean": 0.3, "acted": True},
            ],
            0.0,
            "acted",
            "yes",
        ),
        (
            ["algo.estimator=ebpo"],
            [{"metric": "ebpo/shrinkage_mean", "mean": 0.01, "acted": True}],
            0.0,
            "did not act",
            "no (EBPO's shrinkage: ebpo/shrinkage_mean 0.01, needs > 0.05)",
        ),
        # AGPO whole: its temperature moved, but its clip binds on 0.07% of tokens
        (
            ["algo.estimator=agpo", "agpo.enabled=true"],
            [
                {"metric": "agpo/temperature/max", "mean": 1.1, "acted": True},
                {"metric": "agpo/temperature/min", "mean": 0.9, "acted": True},
            ],
            0.0007,
            "did not act",
            "no (AGPO's adaptive clip: clip_ratio/region_mean 0.0007, needs > 0.005)",
        ),
        (
            ["algo.estimator=dr_grpo"],
            [],
            0.0,
            "not checkable",
            "not checkable (Dr. GRPO's normalisation: no logged signal)",
        ),
        (
            ["loss.eps_high=0.28"],
            [],
            None,
            "not checkable",
            "not checkable (clip_ratio/region_mean not in the summary)",
        ),
        (GSPO_PAPER, [], 0.12, "acted", "yes"),
        (
            GSPO_PAPER,
            [],
            0.0,
            "did not act",
            "no (GSPO's sequence clip: clip_ratio/region_mean 0, needs > 0.005)",
        ),
        (
            ["algo.estimator=spo"],
            [{"metric": "spo/tracked_prompts", "mean": 0.0, "acted": False}],
            0.0,
            "did not act",
            "no (SPO's value tracker: spo/tracked_prompts 0, needs > 0)",
        ),
        ([], [], 0.0, "no mechanism", "no rule"),
    ],
)
def test_one_manipulation_rule_per_mechanism(arm, manipulation, clip, status, text):
    summary = mechanism_summary(arm, manipulation, clip)
    (claim,) = summary["claims"]
    assert reanalysis.uniform_check(summary, claim) == (status, text)


@pytest.mark.parametrize(
    ("clip_of_a", "registered", "status", "text"),
    [
        (0.009, False, "acted", "yes"),
        (
            0.0,
            False,
            "did not act",
            "no (CISPO's kept gradients: clip_ratio/region_mean of A 0, needs > 0.005)",
        ),
        # the registered check of B read from A's runs (``of``) is A's value, not B's
        (0.02, True, "acted", "yes"),
    ],
)
def test_cispos_rule_reads_the_clip_of_the_arm_it_is_compared_with(
    clip_of_a, registered, status, text
):
    """CISPO (B) changes the gradient only where the clipped surrogate's clip binds, which A's
    runs log; B's own clip fraction (CISPO's weight cap, here 0) is not the rule."""
    cispo = ["loss.loss_mode=cispo", "loss.eps_low=1.0", "loss.eps_high=4.0"]
    manipulation = (
        [{"metric": "clip_ratio/region_mean", "of": "A", "mean": clip_of_a, "acted": True}]
        if registered
        else []
    )
    summary = mechanism_summary(cispo, manipulation, 0.0)
    if not registered:
        summary["dynamics"]["series"].append(
            {
                "arm": "A",
                "group_size": 4,
                "metric": "clip_ratio/region_mean",
                "mean": [clip_of_a] * 2,
            }
        )
    (claim,) = summary["claims"]
    assert reanalysis.uniform_check(summary, claim) == (status, text)


def test_the_uniform_rule_tests_a_claim_the_registered_check_set_aside(tmp_path):
    """EBPO at G = 8 on the default task: the registered check (the regime) failed, the
    shrinkage acted: the re-reading judges it (here reproduced, 8 seeds all +2 points)."""
    summary = mechanism_summary(
        ["algo.estimator=ebpo"],
        [
            {"metric": "frac_reward_zero_std", "mean": 0.05, "acted": False},
            {"metric": "ebpo/shrinkage_mean", "mean": 0.3, "acted": True},
        ],
        0.0,
    )
    (claim,) = summary["claims"]
    assert claim["verdict"] == "not testable (manipulation did not act)"
    write_summary(tmp_path, "s", summary["claims"], summary["rows"])
    path = tmp_path / "s" / "summary.json"
    path.write_text(json.dumps(summary))
    assert reread_row(tmp_path, "s")[-1] == "reproduced"


def test_the_committed_table_flags_the_post_hoc_claims_and_marks_the_three_survivors():
    """Issue 42 on the committed results: the 6 claims of 07_group_size and 07_baselines and the
    3 AGPO claims of 07_papers_baselines are flagged; of the 59 superiority claims three survive
    Holm over the project, the two EBPO G = 2 greedy claims and GSPO above GRPO, contradicted
    (22_field_baselines, issue 45); EBPO at G = 8 (22_ebpo_group_size),
    set aside by its regime check, is real but below margin; the 8 claims on AGPO as a whole
    and its shift recovery are not testable under the uniform clip rule."""
    lines = verdicts.render(ROOT / "results")
    rows = {
        (cells[1], cells[0]): cells
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)
        if len(cells) == len(HEADER_CELLS) and cells[0] not in ("claim", "---")
    }
    assert len(rows) == 68
    flagged = {key: cells[2] for key, cells in rows.items() if cells[2] != "—"}
    assert (
        sorted(flagged.values())
        == ["check amended during the runs"] * 3 + ["confirmation of a known result"] * 6
    )
    assert {sweep for sweep, _ in flagged} == {
        "07_group_size",
        "07_baselines",
        "07_papers_baselines",
    }
    assert (
        "Project-wide Holm over all 59 superiority claims (α = 0.05, both directions): 3 survive, "
        "EBPO above GRPO at G = 2 (greedy) (22_ebpo); EBPO above GRPO at G = 2 on the hard mix "
        "(seeds 16-47) (22_ebpo_hard_32); GSPO above GRPO at 4 mini-batches (22_field_baselines)."
        in lines
    )
    g8 = rows["22_ebpo_group_size", "EBPO above GRPO at G = 8"]
    assert g8[-2] == "**not testable (manipulation did not act)**"
    assert g8[-1] == "reproduced, below margin; not after project-wide Holm"
    pass1 = rows["22_ebpo", "EBPO above GRPO at G = 2 (Pass@1)"]
    assert pass1[-1] == "reproduced, below margin; not after project-wide Holm"
    agpo = [
        cells
        for (sweep, name), cells in rows.items()
        if sweep in ("07_papers_baselines", "22_papers_baselines", "22_agpo_shift")
        and name.startswith(("AGPO above", "AGPO dips"))
    ]
    assert len(agpo) == 8
    assert all(c[-1] == "not testable (uniform rule: manipulation did not act)" for c in agpo)
    assert all(
        "AGPO's adaptive clip"
        in c[HEADER_CELLS.index("manipulation acted (registered / uniform rule)")]
        for c in agpo
    )
    drgrpo = [cells for (_, name), cells in rows.items() if name.startswith("Dr. GRPO")]
    assert len(drgrpo) == 5 and all("not checkable" in c[-1] for c in drgrpo)


def test_cli_check_exits_non_zero_on_a_stale_table(tiny, capsys):
    readme, results = tiny
    args = ["--readme", str(readme), "--results", str(results)]
    with pytest.raises(SystemExit, match=r"rlkit verdicts: stale: .*README.md line 5 reads"):
        main(["verdicts", "--check", *args])
    assert main(["verdicts", *args]) == 0
    assert main(["verdicts", "--check", *args]) == 0
    assert "matches" in capsys.readouterr().out


def test_markers_missing_or_repeated_are_named(tiny):
    readme, results = tiny
    readme.write_text(f"{verdicts.BEGIN}\nno end\n")
    with pytest.raises(
        ValueError, match=r"must hold the line '<!-- verdicts:end -->' exactly once"
    ):
        verdicts.stale_line(readme, results)
    readme.write_text(f"{verdicts.END}\n{verdicts.BEGIN}\n")
    with pytest.raises(ValueError, match="comes before"):
        verdicts.write(readme, results)


def verdicts_error(capsys, readme: Path, results: Path, *args: str) -> str:
    """The one line ``rlkit verdicts`` (and with ``--check``) answers, the same for both."""
    lines = []
    for check in ([], ["--check"]):
        assert main(["verdicts", *check, "--readme", str(readme), "--results", str(results)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        lines.append(err.strip())
    assert lines[0] == lines[1]
    return lines[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda claim: claim.pop("margin"), "claim 2 ('B no worse') lacks the field 'margin'"),
        (lambda claim: claim.pop("name"), "claim 2 lacks the field 'name'"),
        (lambda claim: claim.pop("verdict"), "claim 2 ('B no worse') lacks the field 'verdict'"),
        (
            lambda claim: claim.update(margin="1%"),
            "claim 'B no worse' has a malformed field (Unknown format code 'f'",
        ),
    ],
    ids=["no-margin", "no-name", "no-verdict", "text-margin"],
)
def test_a_malformed_claim_names_its_summary_and_field(tiny, capsys, change, message):
    readme, results = tiny
    path = results / "s" / "summary.json"
    summary = json.loads(path.read_text())
    change(summary["claims"][1])
    path.write_text(json.dumps(summary))
    text = readme.read_text()
    error = verdicts_error(capsys, readme, results)
    assert error.startswith(f"rlkit verdicts: error: {path}: {message}")
    assert error.endswith("rerun rlkit report on its sweep")
    assert readme.read_text() == text


@pytest.mark.parametrize(
    ("summary", "message"),
    [
        ([1, 2], "must hold a JSON object, got a list"),
        ({"claims": {"B above A": {}}}, "claims must be a list of objects"),
        ({"claims": ["B above A"]}, "claims must be a list of objects"),
    ],
)
def test_a_summary_of_the_wrong_shape_is_named(tiny, capsys, summary, message):
    readme, results = tiny
    path = results / "s" / "summary.json"
    path.write_text(json.dumps(summary))
    assert f"{path} {message}" in verdicts_error(capsys, readme, results)


def test_the_table_reads_only_the_claim_fields_it_checks(tiny):
    """What committed_claims checks is all render reads (a claim reduced to those fields, and
    to the two it reads with a default, renders the same row)."""
    _, results = tiny
    kept = (*verdicts.CLAIM_FIELDS, *verdicts.SUPERIORITY_FIELDS, "p_holm", "measure")
    claims = verdicts.committed_claims(results)
    path = results / "s" / "summary.json"
    summary = json.loads(path.read_text())
    summary["claims"] = [{k: c[k] for k in kept if k in c} for _, c, _ in claims]
    before = verdicts.render(results)
    path.write_text(json.dumps(summary))
    assert verdicts.render(results) == before


def test_readme_or_results_that_cannot_be_used_are_named(tiny, capsys):
    readme, results = tiny
    loop, missing = readme.parent / "loop", readme.parent / "missing"
    loop.symlink_to("loop")
    text = readme.read_text()
    cases = [
        (loop / "R.md", results, f"--page {loop / 'R.md'} is under {loop}, a symlink loop"),
        (missing, results, f"--page {missing} does not exist"),
        (results, results, f"--page {results} is a directory, not a file"),
        (readme, loop, f"--results {loop} is a symlink loop"),
        (readme, missing, f"--results {missing} does not exist"),
        (readme, readme, f"--results {readme} is a file, not a directory"),
    ]
    for readme_arg, results_arg, message in cases:
        assert message in verdicts_error(capsys, readme_arg, results_arg)
    assert readme.read_text() == text


def test_no_claims_anywhere_says_so(tmp_path):
    write_summary(tmp_path / "results", "old", None)
    assert verdicts.render(tmp_path / "results") == [
        "No summary in results/ holds pre-registered claims yet."
    ]


def test_execute_full_fails_on_a_stale_verdict_table(tiny, monkeypatch, capsys):
    """``make notebooks-full`` (and its --check-only) runs the verdict check."""
    readme, results = tiny
    monkeypatch.setattr(execute_full, "check_readme", lambda: [])  # the quotes: tested elsewhere
    monkeypatch.setattr(execute_full, "VERDICTS", readme)
    monkeypatch.setattr(execute_full, "RESULTS", results)
    assert execute_full.main(["--check-only"]) == 1
    assert f"verdict table is stale: {readme} line 5" in capsys.readouterr().out
    verdicts.write(readme, results)
    assert execute_full.main(["--check-only"]) == 0


def test_claim_verdicts_reads_a_summarys_claims(tiny, tmp_path):
    _, results = tiny
    assert claim_verdicts(results / "s" / "summary.json") == {
        "B above A": "inconclusive",
        "B no worse": "non-inferior",
    }
    with pytest.raises(ValueError, match=r"a_old/summary.json has no pre-registered claims"):
        claim_verdicts(results / "a_old" / "summary.json")


def test_claim_verdicts_names_a_claim_without_its_verdict(tmp_path):
    """A claim missing its name or verdict (or not an object) is named, not a KeyError."""
    summary = json.loads(EBPO_SUMMARY.read_text())
    path = tmp_path / "summary.json"
    for broken, field in [
        ({"name": "x"}, "verdict"),
        ({"verdict": "reproduced"}, "name"),
        ([], "name"),
    ]:
        summary["claims"][1] = broken
        path.write_text(json.dumps(summary))
        with pytest.raises(ValueError, match=rf"summary.json: claim 2 lacks the field '{field}'"):
            claim_verdicts(path)


EBPO_SUMMARY = ROOT / "results/22_ebpo/summary.json"
EBPO_SPEC = ROOT / "sweeps/22_ebpo.yaml"


def test_check_stated_verdicts_passes_the_reports_own_verdicts():
    stated = claim_verdicts(EBPO_SUMMARY)
    again = check_stated_verdicts(EBPO_SUMMARY, EBPO_SPEC, stated)
    assert [c["name"] for c in again] == list(stated)


def test_check_stated_verdicts_names_a_verdict_the_text_gets_wrong():
    stated = claim_verdicts(EBPO_SUMMARY) | {"the difficulty curriculum helps EBPO": "reproduced"}
    with pytest.raises(
        ValueError,
        match=r"'the difficulty curriculum helps EBPO': the text says 'reproduced', the report "
        r"'not reproduced'",
    ):
        check_stated_verdicts(EBPO_SUMMARY, EBPO_SPEC, stated)


def test_check_stated_verdicts_refuses_a_claim_left_unstated_or_made_up():
    stated = claim_verdicts(EBPO_SUMMARY)
    stated.pop("EBPO above GRPO at G = 2 (Pass@1)")
    with pytest.raises(
        ValueError,
        match=r"the text leaves out \['EBPO above GRPO at G = 2 \(Pass@1\)'\], which .*summary.json has$",
    ):
        check_stated_verdicts(EBPO_SUMMARY, EBPO_SPEC, stated)
    with pytest.raises(
        ValueError, match=r"the text has \['EBPO wins'\], which .*summary.json has not$"
    ):
        check_stated_verdicts(
            EBPO_SUMMARY, EBPO_SPEC, claim_verdicts(EBPO_SUMMARY) | {"EBPO wins": "reproduced"}
        )


def test_check_stated_verdicts_refuses_a_summary_whose_claims_are_not_the_specs(tmp_path):
    """A summary with a claim its spec lacks, or without one the spec has, fails naming it."""
    summary = json.loads(EBPO_SUMMARY.read_text())
    dropped = summary["claims"].pop(1)["name"]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    with pytest.raises(
        ValueError,
        match=rf"summary.json leaves out \[{re.escape(repr(dropped))}\], which .*22_ebpo.yaml has$",
    ):
        check_stated_verdicts(path, EBPO_SPEC, claim_verdicts(path))
    summary["claims"].insert(1, summary["claims"][0] | {"name": dropped})
    summary["claims"].append(summary["claims"][0] | {"name": "made up"})
    path.write_text(json.dumps(summary))
    with pytest.raises(
        ValueError, match=r"summary.json has \['made up'\], which .*22_ebpo.yaml has not$"
    ):
        check_stated_verdicts(path, EBPO_SPEC, claim_verdicts(path))


def test_check_stated_verdicts_refuses_a_summary_whose_verdict_was_edited(tmp_path):
    """A verdict that the spec's claims and the per-seed values do not give (edited by hand, or
    judged by another rule) fails, whatever the text states."""
    summary = json.loads(EBPO_SUMMARY.read_text())
    summary["claims"][3]["verdict"] = "reproduced"
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    with pytest.raises(
        ValueError, match=r"'the difficulty curriculum helps EBPO' is 'reproduced' there, but"
    ):
        check_stated_verdicts(path, EBPO_SPEC, claim_verdicts(path))


def test_the_committed_verdict_table_is_fresh():
    """docs/results.md's table (the README's until issue 43), where `rlkit verdicts` writes it."""
    assert verdicts.stale_line(ROOT / "docs" / "results.md", ROOT / "results") is None
    assert verdicts.BEGIN not in (ROOT / "README.md").read_text(encoding="utf-8")
