"""``rlkit verdicts``: the README's table of pre-registered verdicts, rendered from
results/*/summary.json, and the check that ``make notebooks-full`` runs on it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_claims import claims, summary_with
from test_notebook_figures import execute_full

from rlkit import verdicts
from rlkit.cli import main
from rlkit.report import check_stated_verdicts, claim_verdicts, judge_claims

ROOT = Path(__file__).resolve().parents[1]
SUPERIORITY = {"name": "B above A", "test": "superiority", "direction": 1, "margin": 0.01}


def write_summary(results: Path, sweep: str, judged: list[dict] | None) -> Path:
    """results/<sweep>/summary.json holding these judged claims (None: a summary without)."""
    path = results / sweep / "summary.json"
    path.parent.mkdir(parents=True)
    summary = {"name": sweep, "rows": []} | ({} if judged is None else {"claims": judged})
    path.write_text(json.dumps(summary))
    return path


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, Path]:
    """A results folder with one sweep of two claims (B − A = +1..+4 points on 4 seeds: B above
    A is reproduced) and one sweep without claims, and a README with empty markers."""
    ends = {"A": [0.5] * 4, "B": [0.51, 0.52, 0.53, 0.54]}
    noninferiority = {"name": "B no worse", "test": "noninferiority", "direction": 1}
    judged = judge_claims(
        summary_with(ends), claims(SUPERIORITY, noninferiority | {"margin": 0.01})
    )
    results = tmp_path / "results"
    write_summary(results, "s", judged)
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
        "| B above A | s | superiority (+1) | B − A | greedy_accuracy | 4 | 4 | +2.5 [+0.4, +4.6] "
        "| 1.00 | 0.0625 | 0.0625 | — / 2.7 | no check | **inconclusive** |",
        "| B no worse | s | noninferiority (+1) | B − A | greedy_accuracy | 4 | 4 "
        "| +2.5 [+0.4, +4.6] | 1.00 | 0.0625 | — | — / 2.7 | no check | **non-inferior** |",
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
    kept = (*verdicts.CLAIM_FIELDS, "p_holm", "measure")
    claims = verdicts.committed_claims(results)
    path = results / "s" / "summary.json"
    summary = json.loads(path.read_text())
    summary["claims"] = [{k: c[k] for k in kept if k in c} for _, c in claims]
    before = verdicts.render(results)
    path.write_text(json.dumps(summary))
    assert verdicts.render(results) == before


def test_readme_or_results_that_cannot_be_used_are_named(tiny, capsys):
    readme, results = tiny
    loop, missing = readme.parent / "loop", readme.parent / "missing"
    loop.symlink_to("loop")
    text = readme.read_text()
    cases = [
        (loop / "R.md", results, f"--readme {loop / 'R.md'} is under {loop}, a symlink loop"),
        (missing, results, f"--readme {missing} does not exist"),
        (results, results, f"--readme {results} is a directory, not a file"),
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
    monkeypatch.setattr(execute_full, "README", readme)
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


def test_the_committed_readme_table_is_fresh():
    assert verdicts.stale_line(ROOT / "README.md", ROOT / "results") is None
