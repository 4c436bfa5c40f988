"""``rlkit verdicts [--check]``: docs/results.md's table of every pre-registered verdict, generated.

Every claim that a committed ``results/<sweep>/summary.json`` holds (its spec's ``claims``, judged
by ``rlkit report``: :func:`rlkit.claims.judge_claims`) is one row, in a stable order (sweeps by
folder name, then the claims in their spec's order). Beside the registered verdict each row shows
issue 42's re-reading (:mod:`rlkit.reanalysis`): the claim's registration flag
(``results/deviations.yaml``), the equivalence reading within its margin and the margin's share
of the control arm's gain, the Holm p over the whole project, the uniform manipulation rule and
the verdict under those rules. The table is written between two markers in a Markdown page
(``--page``, docs/results.md by default; ``--readme`` still names it, from when it was the
README), ``<!-- verdicts:begin -->`` and
``<!-- verdicts:end -->``, and nothing else there is touched. With ``--check`` nothing is written:
it fails, naming the page's first line that differs from a fresh render, so a verdict edited by
hand or a summary regenerated without the page is caught (``make notebooks-full`` runs this check,
notebooks/execute_full.py, and so does tests/test_verdicts.py).

A summary without claims (a spec written before pre-registration existed) contributes no row.

A notebook checks the verdicts its text states against a committed summary and the spec it was
pre-registered in with :func:`check_stated_verdicts` (:func:`claim_verdicts` reads a summary's).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlkit import reanalysis
from rlkit.claims import claim_cells, judge_claims
from rlkit.metric_names import current_metric_fields
from rlkit.paths import check_exists
from rlkit.rundir import write_atomically
from rlkit.sweep import parse_spec

BEGIN = "<!-- verdicts:begin -->"
END = "<!-- verdicts:end -->"
HEADER = (
    "| claim | sweep | registration | test | arm − vs | metric | G | seeds | d [95% CI] | 90% CI "
    "| margin (share of vs's gain) | equivalent within ±margin | p (sign flips) "
    "| Holm p (family / project) | MDD (planned / observed) "
    "| manipulation acted (registered / uniform rule) | verdict (registered) "
    "| re-reading (issue 42) |"
)
ACTED = {True: "yes", False: "no", None: "no check"}
YES = {True: "yes", False: "no", None: "—"}
# the fields of a judged claim (rlkit.claims.judge_claims) the table reads (claim_cells' among them)
CLAIM_FIELDS = (
    "name",
    "test",
    "direction",
    "arm",
    "vs",
    "metric",
    "group_size",
    "seeds",
    "difference",
    "margin",
    "margin_rule",
    "p_exact",
    "p_method",
    "mdd",
    "planned_mdd",
    "planned_from",
    "manipulation_acted",
    "verdict",
    "ci90",  # the re-reading's (rlkit.reanalysis)
)
SUPERIORITY_FIELDS = (
    "p_exact_other",
    "p_holm_other",
)  # the re-reading reads, of superiority claims
RERUN = reanalysis.RERUN


def committed_claims(results: str | Path) -> list[tuple[str, dict, dict]]:
    """(sweep, judged claim, summary) of every ``results/*/summary.json`` with claims
    (:func:`rlkit.reanalysis.committed`). ``results`` must be a folder; a summary that is not
    valid JSON or not of a summary's shape, or a claim without one of :data:`CLAIM_FIELDS` (and
    of :data:`SUPERIORITY_FIELDS` for a superiority claim), is a ValueError naming it."""
    check_exists("--results", results, folder=True)
    claims = reanalysis.committed(results)
    for sweep, claim, _ in claims:
        fields = CLAIM_FIELDS + (SUPERIORITY_FIELDS if claim.get("test") == "superiority" else ())
        missing = [field for field in fields if field not in claim]
        if missing:
            path = Path(results) / sweep / "summary.json"
            number = claim_number(claims, sweep, claim)
            name = f" ({claim['name']!r})" if "name" in claim else ""
            raise ValueError(
                f"{path}: claim {number}{name} lacks the field {missing[0]!r}: {RERUN}"
            )
    return claims


def claim_number(claims: list[tuple[str, dict, dict]], sweep: str, claim: dict) -> int:
    """``claim``'s place (from 1) among its sweep's claims."""
    return [c for s, c, _ in claims if s == sweep].index(claim) + 1


def render(results: str | Path) -> list[str]:
    """The generated block's lines (without the markers): one table row per claim, then the
    project-wide Holm result, the registration flags' evidence and where each planned MDD came
    from. A claim field of the wrong type is a ValueError naming the summary and the claim."""
    claims = committed_claims(results)
    if not claims:
        return [f"No summary in {Path(results).name}/ holds pre-registered claims yet."]
    flags = reanalysis.registration_flags(results, claims)
    project = reanalysis.project_holm(claims)
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    planned = {}
    for sweep, c, summary in claims:
        try:
            lines.append(_row(sweep, c, summary, flags, project))
        except (TypeError, ValueError, KeyError) as err:
            raise ValueError(
                f"{Path(results) / sweep / 'summary.json'}: claim {c['name']!r} has a malformed "
                f"field ({err}): {RERUN}"
            ) from None
        if c["planned_from"]:
            planned.setdefault(sweep, {})[c["planned_from"]] = None
    survivors = reanalysis.surviving(project)
    lines += [
        "",
        f"Project-wide Holm over all {len(project)} superiority claims (α = "
        f"{reanalysis.ALPHA}, both directions): {len(survivors)} survive, "
        + "; ".join(f"{name} ({sweep})" for sweep, name in survivors)
        + ".",
    ]
    entries = reanalysis.deviations(results)
    if entries:
        lines += ["", f"Registration flags ({Path(results).name}/{reanalysis.DEVIATIONS}):"]
        lines += [f"- {e['sweep']}, {e['flag']}: {e['why']}" for e in entries]
    if planned:
        lines += ["", "Planned MDDs from:"]
        lines += [f"- {sweep}: {'; '.join(sources)}" for sweep, sources in planned.items()]
    return lines


def _row(sweep: str, c: dict, summary: dict, flags: dict, project: dict) -> str:
    """One claim's table row: the registered cells (:func:`rlkit.claims.claim_cells`) and the
    re-reading's (:mod:`rlkit.reanalysis`)."""
    cell = claim_cells(c)
    share = reanalysis.gain_share(summary, c)
    margin = cell["margin"] + ("" if share is None else f" ({share:.0%})")
    p_project = project.get((sweep, c["name"]))
    holm = f"{cell['p_holm']} / {'—' if p_project is None else f'{p_project[0]:.4f}'}"
    status, uniform = reanalysis.uniform_check(summary, c)
    registration = ", ".join(flags.get((sweep, c["name"]), [])) or "—"
    return (
        f"| {c['name']} | {sweep} | {registration} | {cell['test']} | {cell['pair']} "
        f"| {cell['metric']} | {c['group_size']} | {cell['seeds']} | {cell['d']} | {cell['ci90']} "
        f"| {margin} | {YES[reanalysis.equivalent(c)]} | {cell['p_exact']} | {holm} "
        f"| {cell['planned_mdd']} / {cell['mdd']} | {ACTED[c['manipulation_acted']]} / {uniform} "
        f"| **{c['verdict']}** | {reanalysis.reread(c, p_project, status)} |"
    )


def _read_page(page: Path) -> str:
    """The page's text; a ValueError names ``--page`` when it is not a file to read."""
    check_exists("--page", page, folder=False)
    return page.read_text()


def _block(lines: list[str], page: Path) -> tuple[int, int]:
    """Indices of the begin and end marker lines in the README's ``lines``; a ValueError naming
    the README when a marker is missing, repeated or out of order."""
    found = {}
    for marker in (BEGIN, END):
        at = [i for i, line in enumerate(lines) if line.strip() == marker]
        if len(at) != 1:
            raise ValueError(
                f"{page} must hold the line {marker!r} exactly once, found {len(at)}: the "
                "generated verdict table goes between the begin and end markers"
            )
        found[marker] = at[0]
    if found[BEGIN] > found[END]:
        raise ValueError(f"{page}: {END!r} comes before {BEGIN!r}")
    return found[BEGIN], found[END]


def stale_line(page: str | Path, results: str | Path) -> str | None:
    """None when the README's block is a fresh render of ``results``; else which line differs
    first: its number in the README, what it reads and what the render gives."""
    page = Path(page)
    lines = _read_page(page).splitlines()
    begin, end = _block(lines, page)
    have, want = lines[begin + 1 : end], render(results)
    for i in range(max(len(have), len(want))):
        got = have[i] if i < len(have) else END
        fresh = want[i] if i < len(want) else END
        if got != fresh:
            return (
                f"{page} line {begin + 2 + i} reads {got!r}, a fresh render of "
                f"{results}/*/summary.json gives {fresh!r} (run rlkit verdicts to regenerate "
                "the table)"
            )
    return None


def write(page: str | Path, results: str | Path) -> bool:
    """Replace the README's block by a fresh render; True when that changed the file."""
    page = Path(page)
    text = _read_page(page)
    lines = text.splitlines(keepends=True)
    begin, end = _block(lines, page)
    new = "".join(lines[: begin + 1] + [line + "\n" for line in render(results)] + lines[end:])
    if new == text:
        return False
    write_atomically(page, lambda tmp: tmp.write_text(new))
    return True


def claim_verdicts(path: str | Path) -> dict[str, str]:
    """{claim name: verdict} of a committed ``summary.json``'s pre-registered claims, as
    ``rlkit report`` judged them (:func:`rlkit.claims.judge_claims`), for a notebook to assert the verdicts
    its text states. A ValueError names the file when it has no claims (a sweep without
    ``claims`` in its spec, or a summary an older report wrote), and the claim when one is not
    an object with a ``name`` and a ``verdict``."""
    claims = json.loads(Path(path).read_text()).get("claims")
    if not claims:
        raise ValueError(f"{path} has no pre-registered claims (the spec's claims: rlkit report)")
    for number, claim in enumerate(claims, 1):
        missing = [k for k in ("name", "verdict") if not isinstance(claim, dict) or k not in claim]
        if missing:
            raise ValueError(
                f"{path}: claim {number} lacks the field {missing[0]!r} (rlkit report writes "
                "each claim's name and verdict; run it again on the sweep's runs)"
            )
    return {c["name"]: c["verdict"] for c in claims}


def _same_names(names, others, what: str, other: str) -> None:
    """A ValueError naming the claims ``what`` has and ``other`` has not, and the reverse."""
    extra, missing = sorted(set(names) - set(others)), sorted(set(others) - set(names))
    if extra or missing:
        parts = [f"has {extra}, which {other} has not"] * bool(extra)
        parts += [f"leaves out {missing}, which {other} has"] * bool(missing)
        raise ValueError(f"{what} " + " and ".join(parts))


def check_stated_verdicts(
    summary_path: str | Path, spec_path: str | Path, stated: dict[str, str]
) -> list[dict]:
    """A notebook's check of the verdicts its text states (``stated``: {claim name: verdict})
    against a committed ``summary.json`` and the committed spec it was pre-registered in.

    Three things must hold, else a ValueError names the file and the claim: the summary's
    verdicts are what :func:`rlkit.claims.judge_claims` gives again from ``spec_path``'s claims and the
    summary's per-seed values alone (nothing else decided them); ``stated`` names every claim of
    the summary and no other (none is left unstated); and each stated verdict is the report's.
    Returns the claims judged again, for the notebook to print or check further."""
    summary = current_metric_fields(json.loads(Path(summary_path).read_text()))
    reported = claim_verdicts(summary_path)
    again = judge_claims(
        {k: v for k, v in summary.items() if k != "claims"}, parse_spec(spec_path).claims
    )
    _same_names(reported, {c["name"] for c in again}, str(summary_path), str(spec_path))
    for claim in again:
        if reported[claim["name"]] != claim["verdict"]:
            raise ValueError(
                f"{summary_path}: {claim['name']!r} is {reported[claim['name']]!r} there, but "
                f"{spec_path}'s claim judged again gives {claim['verdict']!r}"
            )
    _same_names(stated, reported, "the text", str(summary_path))
    for name, verdict in stated.items():
        if verdict != reported[name]:
            raise ValueError(
                f"{summary_path}: {name!r}: the text says {verdict!r}, the report {reported[name]!r}"
            )
    return again
