"""Pre-registered claims and manipulation checks (a sweep spec's ``claims`` and ``manipulation``,
:mod:`rlkit.sweep` documents the keys), from the spec to the verdict, in one place:

- :func:`parse_claims` / :func:`parse_manipulation` check them whole and resolve their defaults,
  when ``rlkit sweep`` loads the spec and again when ``rlkit report`` reads the copy in
  ``sweep.json`` (:func:`preregistered`);
- :func:`manipulation_checks` decides from the runs' ``metrics.jsonl`` whether each arm's
  mechanism acted;
- :func:`judge_claims` tests each claim on the summary's per-seed values and gives its verdict
  (:func:`claim_verdict`), and :func:`claims_markdown` / :func:`claim_cells` print it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlkit.intervals import (
    BOUNDS,
    Interval,
    format_points,
    holm,
    mean_ci,
    paired_mdd,
    seed_interval,
    sign_flip_p_greater,
    t_p_greater,
)
from rlkit.metric_names import current_name
from rlkit.metrics import is_logged_number
from rlkit.summary import METRICS, end_by_seed, summary_row

MEASURES = ("end", "shift_dip")  # what a claim tests of its metric (judge_claims)
TESTS = ("superiority", "equivalence", "noninferiority")
HALF_BASELINE_GAIN = "half_baseline_gain"
CLAIM_KEYS = {
    "name": "unique name of the claim",
    "source": "optional free text: where the claim comes from",
    "arm": "the arm the claim is about",
    "vs": "the arm it is compared with (default: baseline)",
    "metric": f"one of {list(METRICS)} (default {METRICS[0]})",
    "measure": f"one of {list(MEASURES)} (default {MEASURES[0]})",
    "test": f"one of {list(TESTS)}",
    "direction": "the claimed sign of arm − vs, +1 or -1; superiority and noninferiority",
    "margin": f"accuracy units > 0 or {HALF_BASELINE_GAIN!r}; equivalence and noninferiority",
    "family": "Holm's correction applies within a family (default: the sweep name)",
    "group_size": "the G compared (required when the sweep has several)",
    "planned_mdd": "optional MDD the seeds were planned for (accuracy units), with planned_from",
    "planned_from": "where planned_mdd comes from (e.g. results/pilot)",
}

ALPHA = 0.05


@dataclass(frozen=True)
class Claim:
    """A pre-registered claim (spec ``claims``) with its defaults resolved; ``margin`` is a number
    or ``half_baseline_gain``, resolved by ``rlkit report`` (:func:`judge_claims`)."""

    name: str
    arm: str
    vs: str
    metric: str
    test: str
    direction: int | None
    margin: float | str | None
    family: str
    group_size: int | None = None
    measure: str = MEASURES[0]
    source: str | None = None
    planned_mdd: float | None = None
    planned_from: str | None = None


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def parse_claims(
    claims, arms, baseline: str | None, group_sizes: list[int] | None, sweep: str
) -> list[Claim]:
    """Check the spec's ``claims`` whole (a ValueError names the claim and the bad key or value)
    and resolve their defaults (``vs``: the baseline; ``metric``: greedy accuracy; ``family``:
    the sweep's name; ``group_size``: the sweep's only G)."""
    if not isinstance(claims, list):
        raise ValueError(f"sweep spec: claims must be a list of mappings, got {claims!r}")
    parsed = []
    for i, claim in enumerate(claims):
        parsed.append(
            _parse_claim(f"sweep spec: claims[{i}]", claim, arms, baseline, group_sizes, sweep)
        )
        if parsed[-1].name in [c.name for c in parsed[:-1]]:
            raise ValueError(f"sweep spec: claims[{i}]: name {parsed[-1].name!r} is used twice")
    return parsed


def _parse_claim(where: str, claim, arms, baseline, group_sizes, sweep) -> Claim:
    if not isinstance(claim, dict):
        raise ValueError(f"{where} must be a mapping, got {claim!r}")
    unknown = sorted(set(claim) - set(CLAIM_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; known: {sorted(CLAIM_KEYS)}")
    name = claim.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: name must be a non-empty string, got {name!r}")
    where += f" ({name})"

    def bad(key: str) -> ValueError:
        return ValueError(f"{where}: {key} {claim.get(key)!r}: must be {CLAIM_KEYS[key]}")

    vs = claim.get("vs", baseline)
    for key, arm in (("arm", claim.get("arm")), ("vs", vs)):
        if not isinstance(arm, str) or arm not in arms:
            raise ValueError(f"{where}: {key} {arm!r} is not an arm; arms: {list(arms)}")
    if vs == claim["arm"]:
        raise ValueError(f"{where}: arm and vs are the same arm {vs!r}")
    metric = claim.get("metric", METRICS[0])
    if metric not in METRICS:
        raise bad("metric")
    measure = claim.get("measure", MEASURES[0])
    if measure not in MEASURES:
        raise bad("measure")
    test = claim.get("test")
    if test not in TESTS:
        raise bad("test")
    direction = claim.get("direction")
    if (test == "equivalence") != (direction is None) or direction not in (None, 1, -1):
        why = "is not used by" if test == "equivalence" else "(+1 or -1) is required by"
        raise ValueError(f"{where}: direction {why} {test} tests, got {direction!r}")
    margin = claim.get("margin")
    if margin is None and test != "superiority":
        raise ValueError(f"{where}: margin is required by {test} tests")
    if margin is not None and margin != HALF_BASELINE_GAIN and not _positive(margin):
        raise bad("margin")
    if margin == HALF_BASELINE_GAIN and measure != "end":
        raise ValueError(
            f"{where}: margin {margin!r} is a share of the end accuracy's gain; measure "
            f"{measure!r} needs a margin in accuracy units"
        )
    family = claim.get("family", sweep)
    if not isinstance(family, str) or not family.strip():
        raise bad("family")
    g = claim.get("group_size")
    if g is None and group_sizes and len(group_sizes) > 1:
        raise ValueError(f"{where}: group_size is required (the sweep has G {group_sizes})")
    if g is not None and (
        isinstance(g, bool) or not isinstance(g, int) or g not in (group_sizes or [g])
    ):
        raise ValueError(f"{where}: group_size {g!r} is not a G of the sweep {group_sizes}")
    source, planned, planned_from = (
        claim.get(k) for k in ("source", "planned_mdd", "planned_from")
    )
    if source is not None and not isinstance(source, str):
        raise bad("source")
    if (planned is None) != (planned_from is None):
        raise ValueError(f"{where}: planned_mdd and planned_from go together")
    if planned is not None and not _positive(planned):
        raise bad("planned_mdd")
    if planned_from is not None and not isinstance(planned_from, str):
        raise bad("planned_from")
    return Claim(
        name=name,
        arm=claim["arm"],
        vs=vs,
        metric=metric,
        test=test,
        direction=direction,
        margin=margin,
        family=family,
        group_size=group_sizes[0] if g is None and group_sizes else g,
        measure=measure,
        source=source,
        planned_mdd=planned,
        planned_from=planned_from,
    )


@dataclass(frozen=True)
class ManipulationCheck:
    """One check that an arm's manipulation acted: the mean over steps and seeds of a
    ``metrics.jsonl`` key compared with a threshold (``acts_if``: ``"> 0.01"``), read from the
    arm's own runs or, with ``of``, from another arm's at the same G (CISPO differs from the
    clipped surrogate only where that surrogate's clip binds, which the surrogate's runs log)."""

    metric: str
    acts_if: str
    of: str | None = None

    @property
    def compare(self) -> tuple[str, float]:
        op, value = ACTS_IF.fullmatch(self.acts_if).group(1, 2)
        return op, float(value)

    def acted(self, mean: float) -> bool:
        op, threshold = self.compare
        return COMPARISONS[op](mean, threshold)


ACTS_IF = re.compile(r"\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*")
COMPARISONS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def parse_manipulation(value, arms) -> dict[str, list[ManipulationCheck]]:
    """Check the spec's ``manipulation`` whole: arm -> list of ``{metric: <metrics.jsonl key>,
    acts_if: "<op> <number>"}`` (op one of > >= < <=), each with an optional ``of: <another
    arm>`` whose runs the metric is read from; a ValueError names the bad entry."""
    if not isinstance(value, dict):
        raise ValueError(f"sweep spec: manipulation must be a mapping arm -> checks, got {value!r}")
    checks = {}
    for arm, items in value.items():
        where = f"sweep spec: manipulation.{arm}"
        if arm not in arms:
            raise ValueError(f"{where}: {arm!r} is not an arm; arms: {list(arms)}")
        if not isinstance(items, list) or not items:
            raise ValueError(f"{where} must be a non-empty list of checks, got {items!r}")
        checks[arm] = []
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not (
                {"metric", "acts_if"} <= set(item) <= {"metric", "acts_if", "of"}
            ):
                raise ValueError(
                    f"{where}[{i}] must be a mapping with metric, acts_if and optionally of, "
                    f"got {item!r}"
                )
            metric, acts_if, of = item["metric"], item["acts_if"], item.get("of")
            if "of" in item and (of not in arms or of == arm):
                raise ValueError(
                    f"{where}[{i}]: of must be another arm, whose runs the metric is read from, "
                    f"got {of!r}; arms: {list(arms)}"
                )
            if not isinstance(metric, str) or not metric.strip():
                raise ValueError(
                    f"{where}[{i}]: metric must be a metrics.jsonl key, got {metric!r}"
                )
            if not isinstance(acts_if, str) or not ACTS_IF.fullmatch(acts_if):
                raise ValueError(
                    f"{where}[{i}]: acts_if must be '<op> <number>' with op one of "
                    f"{list(COMPARISONS)} (e.g. '> 0.01'), got {acts_if!r}"
                )
            # a spec written before a rename names the metric's old key (docs/algorithms.md §5)
            checks[arm].append(ManipulationCheck(current_name(metric), acts_if, of))
    return checks


def preregistered(
    manifest: dict, path: Path
) -> tuple[list[Claim], dict[str, list[ManipulationCheck]]]:
    """The claims and manipulation checks of the spec the sweep ran (``sweep.json``'s copy),
    checked whole as ``rlkit sweep`` checked them (:func:`parse_claims`,
    :func:`parse_manipulation`); none when it has none."""
    spec = manifest["spec"] if isinstance(manifest["spec"], dict) else {}
    arms = list(dict.fromkeys(run["arm"] for run in manifest["runs"]))
    baseline, sizes = manifest.get("baseline"), spec.get("group_sizes")
    try:
        claims = parse_claims(spec.get("claims", []), arms, baseline, sizes, manifest["name"])
        return claims, parse_manipulation(spec.get("manipulation", {}), arms)
    except ValueError as err:
        raise ValueError(f"{path}: {err} (rerun rlkit sweep)") from None


def manipulation_checks(runs: dict, checks: dict[str, list[ManipulationCheck]]) -> list[dict]:
    """Each check of each arm and G (spec ``manipulation``): per seed, the mean of its metric
    over the steps that logged a finite value (in the runs of the check's ``of`` arm at that G
    where it names one, recorded as ``of``); their mean, min and max over seeds; ``acted``:
    that mean passes ``acts_if``. A metric that no step of the arm logged did not act (mean
    None): an arm whose manipulation is switched off does not log its signals. A metric that no
    run of any arm logged is a ValueError naming it and the closest logged names (a misspelt
    check would otherwise read as a mechanism that did not act)."""
    logged = {key for seeds in runs.values() for rows in seeds.values() for r in rows for key in r}
    for arm, arm_checks in checks.items():
        for check in arm_checks:
            if runs and check.metric not in logged:
                close = difflib.get_close_matches(check.metric, sorted(logged), n=3, cutoff=0.5)
                raise ValueError(
                    f"manipulation check of {arm}: no run of the sweep logs {check.metric!r}"
                    f" (closest logged names: {close or 'none'})"
                )
    out = []
    for (arm, g), own in runs.items():
        for check in checks.get(arm, []):
            seeds = own if check.of is None else runs.get((check.of, g), {})
            by_seed = {}
            for seed, rows in sorted(seeds.items()):
                values = [r[check.metric] for r in rows if is_logged_number(r.get(check.metric))]
                if values:
                    by_seed[str(seed)] = float(np.mean(values))
            mean = float(np.mean(list(by_seed.values()))) if by_seed else None
            out.append(
                {
                    "arm": arm,
                    "group_size": g,
                    "metric": check.metric,
                    "acts_if": check.acts_if,
                    "seeds": sorted(seeds),
                    "by_seed": by_seed,
                    "mean": mean,
                    "min": min(by_seed.values(), default=None),
                    "max": max(by_seed.values(), default=None),
                    "acted": mean is not None and check.acted(mean),
                }
                | ({} if check.of is None else {"of": check.of})
            )
    return out


def manipulation_markdown(checks: list[dict]) -> list[str]:
    """summary.md's table of the manipulation checks (:func:`manipulation_checks`)."""
    lines = [
        "Manipulation checks (the spec's `manipulation`): per arm, the mean over steps and seeds "
        "of each named metric, [min, max] of the per-seed means; a claim about an arm whose "
        "manipulation did not act is not testable.",
        "",
        "| arm | G | metric | acts if | mean [min, max] over seeds | seeds logged | acted |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        value = (
            "not logged"
            if c["mean"] is None
            else (f"{c['mean']:.4g} [{c['min']:.4g}, {c['max']:.4g}]")
        )
        of = f" (of {c['of']})" if "of" in c else ""
        lines.append(
            f"| {c['arm']} | {c['group_size']} | {c['metric']}{of} | {c['acts_if']} | {value} "
            f"| {len(c['by_seed'])}/{len(c['seeds'])} | {'yes' if c['acted'] else 'no'} |"
        )
    return lines + [""]


def judge_claims(summary: dict, claims: list[Claim]) -> list[dict]:
    """Each pre-registered claim tested on the per-seed values of its measure in ``summary``'s
    rows (``end``: :func:`rlkit.summary.end_by_seed`, a summary without them is a ValueError naming the file;
    ``shift_dip``: :func:`shift_dip_by_seed`), over the seeds both arms finished: d_s = arm − vs
    (``arm_end``, ``vs_end``: each arm's mean [95% CI] of that measure).

    ``p_t`` / ``p_exact``: the one-sided p of the claim's test by the t-test and by sign flips
    (:func:`rlkit.intervals.sign_flip_p_greater`: exact for n ≤ 20): superiority, H0 "no
    difference" against the claimed direction (``p_exact_other``: against the other one);
    non-inferiority, H0 direction·μ ≤ −margin; equivalence, TOST's larger p of H0 μ ≤ −margin
    and H0 μ ≥ margin. ``p_holm`` / ``p_holm_other``: the sign-flip p's Holm-adjusted over the
    superiority claims of the family that have 2 paired seeds or more. Verdicts (α = 0.05):

    - superiority: ``reproduced`` (p_holm < α), ``contradicted`` (p_holm_other < α), else ``not
      reproduced`` when the equivalence test within the claim's margin passes, else
      ``inconclusive``;
    - equivalence: ``equivalent`` when the 90% t-interval lies inside ±margin (TOST at 5%), else
      ``not shown equivalent``;
    - non-inferiority: ``non-inferior`` when the one-sided 95% lower bound of direction·μ (the
      90% interval's end) lies above −margin, else ``not shown non-inferior``;
    - ``not testable (...)`` under 2 paired seeds (such a claim has no p, so Holm's family
      leaves it out), for an equivalence or non-inferiority claim whose half_baseline_gain margin
      (half of the vs arm's mean end − start gain) is not positive (a superiority claim is then
      judged without the equivalence reading), or when a manipulation check of the arm at that G
      did not act (``summary["manipulation"]``, :func:`manipulation_checks`;
      ``manipulation_acted``: None when the arm has no check). A claim whose manipulation did not
      act still counts in its family's Holm correction: it was pre-registered, and leaving it out
      after the runs would make the family depend on what the runs did.
    """
    results = [_test_claim(summary, claim) for claim in claims]
    for family in dict.fromkeys(r["family"] for r in results):
        tested = [
            r
            for r in results
            if r["family"] == family and r["test"] == "superiority" and r["p_exact"] is not None
        ]
        for key in ("", "_other"):
            for r, p in zip(tested, holm([r[f"p_exact{key}"] for r in tested])):
                r[f"p_holm{key}"] = p
    for r in results:
        checks = [
            c["acted"]
            for c in summary.get("manipulation", [])
            if (c["arm"], c["group_size"]) == (r["arm"], r["group_size"])
        ]
        r["manipulation_acted"] = all(checks) if checks else None
        r["verdict"] = (
            "not testable (manipulation did not act)"
            if r["manipulation_acted"] is False
            else claim_verdict(r)
        )
    return results


def _row_or_none(summary: dict, arm: str, metric: str, group_size: int | None) -> dict | None:
    """The arm's row; None when it has none (none of its runs finished: not testable)."""
    try:
        return summary_row(summary, arm, metric, group_size)
    except KeyError:
        return None


def shift_dip_by_seed(summary: dict, arm: str, metric: str, group_size: int | None = None) -> dict:
    """The per-seed dips at the task shift (:func:`rlkit.report.shift_recovery`) of ``arm``'s row; a
    ValueError naming the summary when the row has no shift (its runs had no ``task.shift``)."""
    row = summary_row(summary, arm, metric, group_size)
    if not row.get("shift"):
        raise ValueError(
            f"{summary['name']}: arm {arm!r}, metric {metric!r} has no task shift, so a claim "
            f"with measure 'shift_dip' cannot be tested (set task.shift in the sweep's overrides)"
        )
    return {seed: v["dip"] for seed, v in row["shift"]["seeds"].items()}


CLAIM_MEASURES = {"end": end_by_seed, "shift_dip": shift_dip_by_seed}  # every measure


def _test_claim(summary: dict, claim: Claim) -> dict:
    where = claim.metric, claim.group_size
    rows = {a: _row_or_none(summary, a, *where) for a in (claim.arm, claim.vs)}
    per_seed = CLAIM_MEASURES[claim.measure]
    arm, vs = ({} if rows[a] is None else per_seed(summary, a, *where) for a in rows)
    seeds = sorted(set(arm) & set(vs), key=int)
    d = np.array([arm[s] - vs[s] for s in seeds])
    margin = claim.margin
    if margin == HALF_BASELINE_GAIN:
        margin = None if rows[claim.vs] is None else rows[claim.vs]["gain"]["mean"] / 2
    result = dataclasses.asdict(claim) | {
        "margin": margin,
        "margin_rule": claim.margin if isinstance(claim.margin, str) else None,
        "group_size": claim.group_size
        if rows[claim.arm] is None
        else rows[claim.arm]["group_size"],
        "seeds": [int(s) for s in seeds],
        "arm_end": seed_interval([arm[s] for s in seeds]).to_json() if seeds else None,
        "vs_end": seed_interval([vs[s] for s in seeds]).to_json() if seeds else None,
        "difference": seed_interval(d.tolist()).to_json() if seeds else None,
        "ci90": None,
        "mdd": paired_mdd(d.tolist()),
        "p_t": None,
        "p_exact": None,
        "p_method": None,
    }
    if claim.test == "superiority":
        result |= {"p_exact_other": None, "p_holm": None, "p_holm_other": None}
    usable = margin is not None and margin > 0
    if len(d) < 2 or (claim.test != "superiority" and not usable):
        return result
    result["ci90"] = mean_ci(d, level=0.90).to_json(BOUNDS)
    if claim.test == "equivalence":
        sides = [d + margin, margin - d]  # H0 μ ≤ −margin, H0 μ ≥ margin
    else:
        sides = [claim.direction * d + (margin if claim.test == "noninferiority" else 0.0)]
    exact = [sign_flip_p_greater(x) for x in sides]
    result |= {
        "p_t": max(t_p_greater(x) for x in sides),
        "p_exact": max(p for p, _ in exact),
        "p_method": exact[0][1],
    }
    if claim.test == "superiority":
        result["p_exact_other"] = sign_flip_p_greater(-sides[0])[0]
    return result


def claim_verdict(r: dict) -> str:
    """The verdict of a judged claim (:func:`judge_claims`) from its p_holm, p_holm_other, 90%
    interval and margin: the rules that judge_claims states."""
    if len(r["seeds"]) < 2:
        return "not testable (fewer than 2 paired seeds)"
    margin, ci90 = r["margin"], r["ci90"] and Interval.from_json(r["ci90"])
    if r["test"] == "superiority":
        if r["p_holm"] < ALPHA:
            return "reproduced"
        if r["p_holm_other"] < ALPHA:
            return "contradicted"
        if margin is not None and margin > 0 and ci90.within(margin):
            return "not reproduced"
        return "inconclusive"
    if ci90 is None:
        return f"not testable (margin {margin * 100:.2f} points is not positive)"
    if r["test"] == "equivalence":
        return "equivalent" if ci90.within(margin) else "not shown equivalent"
    bound = ci90.low if r["direction"] > 0 else -ci90.high
    return "non-inferior" if bound > -margin else "not shown non-inferior"


def _p(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def claim_cells(c: dict) -> dict[str, str]:
    """One judged claim's (:func:`judge_claims`) cells as summary.md and docs/results.md's verdict
    table (:mod:`rlkit.verdicts`) print them: differences and their 90% intervals, margins and MDDs
    in points."""
    margin = "—" if c["margin"] is None else f"{c['margin'] * 100:.2f}"
    if c["margin_rule"]:
        margin += f" ({c['margin_rule']})"
    exact = _p(c["p_exact"]) + (" (MC)" if (c["p_method"] or "").startswith("Monte") else "")
    return {
        "test": c["test"] + ("" if c["direction"] is None else f" ({c['direction']:+d})"),
        "pair": f"{c['arm']} − {c['vs']}",
        "metric": c["metric"].removeprefix("eval/")
        + ("" if c.get("measure", "end") == "end" else f" ({c['measure']})"),
        "seeds": str(len(c["seeds"])),
        "d": "—"
        if c["difference"] is None
        else Interval.from_json(c["difference"]).difference_points(),
        "ci90": "—" if c["ci90"] is None else Interval.from_json(c["ci90"]).bounds_points(),
        "margin": margin,
        "p_exact": exact,
        "p_holm": _p(c.get("p_holm")),
        "mdd": format_points(c["mdd"]),
        "planned_mdd": format_points(c["planned_mdd"]),
    }


def claims_markdown(claims: list[dict]) -> list[str]:
    """summary.md's table of the pre-registered claims (:func:`judge_claims`)."""
    lines = [
        "Pre-registered claims (the spec's `claims`, tested by rlkit report and nothing else): "
        "d = arm − vs per paired seed (points); p = one-sided p of the claim's test "
        "(superiority: in the claimed direction; non-inferiority: against −margin; "
        "equivalence: TOST, the larger of its two) by the t-test and by sign flips (exact over "
        "all 2^n flips; MC: a seeded Monte-Carlo of 100 000); Holm = the sign-flip p "
        "Holm-adjusted over the family's superiority claims, α = 0.05; equivalence and "
        "non-inferiority read the 90% t-interval (TOST at 5%, one-sided 95% bound).",
        "",
        "| claim | family | test | arm − vs | metric | G | seeds | d [95% CI] | 90% CI "
        "| margin | p (t) | p (sign flips) | p (Holm) | MDD (planned) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        cell = claim_cells(c)
        mdd = cell["mdd"]
        if c["planned_mdd"] is not None:
            mdd += f" ({cell['planned_mdd']} from {c['planned_from']})"
        lines.append(
            f"| {c['name']} | {c['family']} | {cell['test']} | {cell['pair']} "
            f"| {cell['metric']} | {c['group_size']} "
            f"| {cell['seeds']} | {cell['d']} | {cell['ci90']} | {cell['margin']} "
            f"| {_p(c['p_t'])} | {cell['p_exact']} | {cell['p_holm']} | {mdd} | {c['verdict']} |"
        )
    sources = [f"- {c['name']}: {c['source']}" for c in claims if c["source"]]
    return lines + [""] + (["Sources:", "", *sources, ""] if sources else [])
