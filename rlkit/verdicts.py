"""``rlkit verdicts [--check]``: the README's table of every pre-registered verdict, generated.

Every claim that a committed ``results/<sweep>/summary.json`` holds (its spec's ``claims``, judged
by ``rlkit report``: :func:`rlkit.report.judge_claims`) is one row, in a stable order (sweeps by
folder name, then the claims in their spec's order). The table is written between two markers in
the README, ``<!-- verdicts:begin -->`` and ``<!-- verdicts:end -->``, and nothing else there is
touched. With ``--check`` nothing is written: it fails, naming the README's first line that
differs from a fresh render, so a verdict edited by hand or a summary regenerated without the
README is caught (``make notebooks-full`` runs this check, notebooks/execute_full.py).

A summary without claims (a spec written before pre-registration existed) contributes no row.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlkit.paths import check_exists
from rlkit.report import claim_cells
from rlkit.rundir import write_atomically

BEGIN = "<!-- verdicts:begin -->"
END = "<!-- verdicts:end -->"
HEADER = (
    "| claim | sweep | test | arm − vs | metric | G | seeds | d [95% CI] | margin "
    "| p (sign flips) | Holm p | MDD (planned / observed) | manipulation acted | verdict |"
)
ACTED = {True: "yes", False: "no", None: "no check"}
# the fields of a judged claim (rlkit.report.judge_claims) the table reads (claim_cells' among them)
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
)
RERUN = "rerun rlkit report on its sweep"


def committed_claims(results: str | Path) -> list[tuple[str, dict]]:
    """(sweep, judged claim) of every ``results/*/summary.json`` with claims: sweeps by folder
    name, claims in their spec's order. ``results`` must be a folder; a summary that is not
    valid JSON, or a claim without one of :data:`CLAIM_FIELDS`, is a ValueError naming it."""
    check_exists("--results", results, folder=True)
    out = []
    for path in sorted(Path(results).glob("*/summary.json")):
        out += [(path.parent.name, claim) for claim in _summary_claims(path)]
    return out


def _summary_claims(path: Path) -> list[dict]:
    """The judged claims of one summary.json (none when it has none), each checked to hold
    every field the table reads."""
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}): {RERUN}") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path} must hold a JSON object, got a {type(summary).__name__}")
    claims = summary.get("claims") or []
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise ValueError(f"{path} claims must be a list of objects: {RERUN}")
    for number, claim in enumerate(claims, 1):
        missing = [field for field in CLAIM_FIELDS if field not in claim]
        if missing:
            name = f" ({claim['name']!r})" if "name" in claim else ""
            raise ValueError(
                f"{path}: claim {number}{name} lacks the field {missing[0]!r}: {RERUN}"
            )
    return claims


def _row(sweep: str, c: dict) -> str:
    """The table row of one judged claim."""
    cell = claim_cells(c)
    return (
        f"| {c['name']} | {sweep} | {cell['test']} | {cell['pair']} | {cell['metric']} "
        f"| {c['group_size']} | {cell['seeds']} | {cell['d']} | {cell['margin']} "
        f"| {cell['p_exact']} | {cell['p_holm']} | {cell['planned_mdd']} / {cell['mdd']} "
        f"| {ACTED[c['manipulation_acted']]} | **{c['verdict']}** |"
    )


def render(results: str | Path) -> list[str]:
    """The generated block's lines (without the markers): one table row per claim, then where
    each planned MDD came from. A claim field of the wrong type is a ValueError naming the
    summary and the claim."""
    claims = committed_claims(results)
    if not claims:
        return [f"No summary in {Path(results).name}/ holds pre-registered claims yet."]
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    planned = {}
    for sweep, c in claims:
        try:
            lines.append(_row(sweep, c))
        except (TypeError, ValueError, KeyError) as err:
            raise ValueError(
                f"{Path(results) / sweep / 'summary.json'}: claim {c['name']!r} has a malformed "
                f"field ({err}): {RERUN}"
            ) from None
        if c["planned_from"]:
            planned.setdefault(sweep, {})[c["planned_from"]] = None
    if planned:
        lines += ["", "Planned MDDs from:"]
        lines += [f"- {sweep}: {'; '.join(sources)}" for sweep, sources in planned.items()]
    return lines


def _read_readme(readme: Path) -> str:
    """The README's text; a ValueError names ``--readme`` when it is not a file to read."""
    check_exists("--readme", readme, folder=False)
    return readme.read_text()


def _block(lines: list[str], readme: Path) -> tuple[int, int]:
    """Indices of the begin and end marker lines in the README's ``lines``; a ValueError naming
    the README when a marker is missing, repeated or out of order."""
    found = {}
    for marker in (BEGIN, END):
        at = [i for i, line in enumerate(lines) if line.strip() == marker]
        if len(at) != 1:
            raise ValueError(
                f"{readme} must hold the line {marker!r} exactly once, found {len(at)}: the "
                "generated verdict table goes between the begin and end markers"
            )
        found[marker] = at[0]
    if found[BEGIN] > found[END]:
        raise ValueError(f"{readme}: {END!r} comes before {BEGIN!r}")
    return found[BEGIN], found[END]


def stale_line(readme: str | Path, results: str | Path) -> str | None:
    """None when the README's block is a fresh render of ``results``; else which line differs
    first: its number in the README, what it reads and what the render gives."""
    readme = Path(readme)
    lines = _read_readme(readme).splitlines()
    begin, end = _block(lines, readme)
    have, want = lines[begin + 1 : end], render(results)
    for i in range(max(len(have), len(want))):
        got = have[i] if i < len(have) else END
        fresh = want[i] if i < len(want) else END
        if got != fresh:
            return (
                f"{readme} line {begin + 2 + i} reads {got!r}, a fresh render of "
                f"{results}/*/summary.json gives {fresh!r} (run rlkit verdicts to regenerate "
                "the table)"
            )
    return None


def write(readme: str | Path, results: str | Path) -> bool:
    """Replace the README's block by a fresh render; True when that changed the file."""
    readme = Path(readme)
    text = _read_readme(readme)
    lines = text.splitlines(keepends=True)
    begin, end = _block(lines, readme)
    new = "".join(lines[: begin + 1] + [line + "\n" for line in render(results)] + lines[end:])
    if new == text:
        return False
    write_atomically(readme, lambda tmp: tmp.write_text(new))
    return True
