"""Issue 42's re-reading of the committed pre-registered verdicts, beside them, never instead.

Every verdict stays the one ``rlkit report`` gave under its spec's registered test
(:func:`rlkit.claims.judge_claims`). This module adds, from ``results/*/summary.json`` and
``results/deviations.yaml`` alone, what a reviewer needs to weigh it (docs/algorithms.md §7):

1. :func:`registration_flags`: the claims that were not written before their runs
   (``results/deviations.yaml``, with the git evidence), and any claim of a sweep whose spec file
   changed after one of its runs had started (``summary["preregistration"]``, recorded by
   ``rlkit sweep`` since issue 42);
2. :func:`equivalent` and :func:`gain_share`: the equivalence reading (TOST, the 90% interval
   inside ±margin) beside every verdict, and the margin as a share of the control arm's own gain
   (end − start) on that task;
3. :func:`project_holm`: Holm's correction over every superiority claim of the project, not only
   its family (the same hypotheses are re-tested across sweeps with shared control arms);
4. :func:`uniform_check`: one manipulation rule per mechanism (:data:`MECHANISMS`), applied to
   every claim about it, where the registered checks differ from sweep to sweep;
5. :func:`reread`: the verdict under 4 by judge_claims' own rules
   (:func:`rlkit.claims.claim_verdict`), with "below margin" where the effect is real but its
   90% interval lies inside ±margin, and whether it survives 3.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from rlkit.claims import ALPHA, ManipulationCheck, claim_verdict
from rlkit.intervals import Interval, holm
from rlkit.methods import method_switches
from rlkit.metric_names import current_metric_fields
from rlkit.summary import summary_row

DEVIATIONS = "deviations.yaml"
FLAGS = ("confirmation of a known result", "check amended during the runs")
AMENDED = "spec amended during the runs"  # the flag preregistration() data gives by itself
RERUN = "rerun rlkit report on its sweep"


def committed(results: str | Path) -> list[tuple[str, dict, dict]]:
    """(sweep, judged claim, summary) of every ``results/*/summary.json`` with claims: sweeps by
    folder name, claims in their spec's order. A summary that is not valid JSON, not an object,
    or whose claims are not a list of objects is a ValueError naming it."""
    out = []
    for path in sorted(Path(results).glob("*/summary.json")):
        try:
            summary = current_metric_fields(json.loads(path.read_text()))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON ({err}): {RERUN}") from None
        if not isinstance(summary, dict):
            raise ValueError(f"{path} must hold a JSON object, got a {type(summary).__name__}")
        claims = summary.get("claims") or []
        if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
            raise ValueError(f"{path} claims must be a list of objects: {RERUN}")
        out += [(path.parent.name, claim, summary) for claim in claims]
    return out


# ---------------------------------------------------------------- 1. registration flags
def registration_flags(results: str | Path, claims: list[tuple[str, dict, dict]]) -> dict:
    """{(sweep, claim name): [flag, ...]}: the entries of ``results/deviations.yaml``
    (:func:`deviations`), and :data:`AMENDED` for every claim of a sweep whose
    ``preregistration.spec_changed_after_start`` names a run (:func:`rlkit.report.preregistration`).
    A ValueError names an entry whose sweep, claims, flag or evidence is unknown or missing."""
    names, flags = {}, {}
    for sweep, claim, summary in claims:
        names.setdefault(sweep, []).append(claim["name"])
        if (summary.get("preregistration") or {}).get("spec_changed_after_start"):
            flags[sweep, claim["name"]] = [AMENDED]
    for i, entry in enumerate(deviations(results)):
        sweep, chosen = entry.get("sweep"), entry.get("claims")
        chosen = names.get(sweep) if chosen == "all" else chosen
        ok = isinstance(chosen, list) and chosen and set(chosen) <= set(names.get(sweep, []))
        if not ok or entry.get("flag") not in FLAGS or not isinstance(entry.get("why"), str):
            raise ValueError(
                f"{Path(results) / DEVIATIONS}[{i}]: needs a sweep with claims, claims 'all' or "
                f"names of its claims, a flag of {list(FLAGS)} and a 'why' (the evidence); got "
                f"{entry!r}"
            )
        for name in chosen:
            flags.setdefault((sweep, name), []).append(entry["flag"])
    return flags


def deviations(results: str | Path) -> list[dict]:
    """The entries of ``results/deviations.yaml`` (none without the file)."""
    path = Path(results) / DEVIATIONS
    entries = yaml.safe_load(path.read_text()) if path.is_file() else []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{path} must be a list of mappings (sweep, claims, flag, why)")
    return entries


# ---------------------------------------------------------------- 2. equivalence and margins
def equivalent(claim: dict) -> bool | None:
    """TOST at 5% within the claim's margin: its 90% t-interval inside ±margin (None without an
    interval or a positive margin) — the reading judge_claims gives equivalence claims, here
    beside every verdict."""
    margin, ci90 = claim["margin"], claim["ci90"]
    if ci90 is None or margin is None or margin <= 0:
        return None
    return Interval.from_json(ci90).within(margin)


def gain_share(summary: dict, claim: dict) -> float | None:
    """The claim's margin as a share of the ``vs`` arm's mean gain (end − start) on that task
    and G (twice what half_baseline_gain would make it); None for a shift_dip claim, whose
    measure is not an end value, or a gain that is not positive."""
    if claim.get("measure", "end") != "end" or claim["margin"] is None:
        return None
    gain = summary_row(summary, claim["vs"], claim["metric"], claim["group_size"])["gain"]["mean"]
    return claim["margin"] / gain if gain > 0 else None


# ---------------------------------------------------------------- 3. project-wide multiplicity
def project_holm(claims: list[tuple[str, dict, dict]]) -> dict:
    """{(sweep, claim name): (p, p_other)}: the sign-flip p's of every superiority claim with a
    p, in the claimed direction and the other, Holm-adjusted over all of them at once."""
    tested = [
        (s, c) for s, c, _ in claims if c["test"] == "superiority" and c["p_exact"] is not None
    ]
    adjusted = [holm([c[f"p_exact{key}"] for _, c in tested]) for key in ("", "_other")]
    return {(s, c["name"]): ps for (s, c), ps in zip(tested, zip(*adjusted))}


# ---------------------------------------------------------------- 4. one rule per mechanism
@dataclass(frozen=True)
class Mechanism:
    """A mechanism an arm's config switches on, and the logged signals that show it acted (all
    must pass; none: no committed metric shows it, so a claim about it is not checkable), read
    from the claim's arm or, with ``read_from_vs``, from its ``vs`` arm (CISPO acts where the
    clipped surrogate's clip binds, which only the surrogate's runs log)."""

    name: str
    on: object  # TrainConfig -> bool
    checks: tuple[ManipulationCheck, ...]
    read_from_vs: bool = False


CLIP_BINDS = ManipulationCheck("clip_ratio/region_mean", "> 0.005")  # > 0.5% of tokens
SEQUENCE = ("gspo", "cispo")  # the sequence-level losses (docs/algorithms.md §4f)
MECHANISMS = (
    Mechanism(
        "EBPO's shrinkage",
        lambda cfg: method_switches(cfg)["ebpo"],
        (ManipulationCheck("ebpo/shrinkage_mean", "> 0.05"),),
    ),
    Mechanism(
        "AGPO's adaptive clip",
        lambda cfg: method_switches(cfg)["agpo_adaptive_clip"],
        (CLIP_BINDS,),
    ),
    Mechanism(
        "AGPO's temperature",
        lambda cfg: method_switches(cfg)["agpo_adaptive_temperature"],
        (
            ManipulationCheck("agpo/temperature/max", "> 1.01"),
            ManipulationCheck("agpo/temperature/min", "< 0.99"),
        ),
    ),
    Mechanism(  # GSPO's and CISPO's ε bound a sequence ratio and a weight (§4f), not a token clip
        "clip-higher",
        lambda cfg: cfg.loss.eps_high > cfg.loss.eps_low and cfg.loss.loss_mode not in SEQUENCE,
        (CLIP_BINDS,),
    ),
    Mechanism(
        "dynamic sampling",
        lambda cfg: cfg.rollout.dynamic_sampling,
        (ManipulationCheck("dapo/dropped_groups", "> 3.2"),),
    ),
    Mechanism("Dr. GRPO's normalisation", lambda cfg: method_switches(cfg)["dr_grpo"], ()),
    Mechanism(
        "Clip-Cov",
        lambda cfg: cfg.loss.loss_mode == "clip_cov",
        (ManipulationCheck("clip_cov/pg_clipfrac", "> 0"),),
    ),
    Mechanism(
        "KL-Cov",
        lambda cfg: cfg.loss.loss_mode == "kl_cov",
        (ManipulationCheck("kl_cov/ppo_kl", "> 0"),),
    ),
    Mechanism("GSPO's sequence clip", lambda cfg: cfg.loss.loss_mode == "gspo", (CLIP_BINDS,)),
    Mechanism(
        "CISPO's kept gradients",
        lambda cfg: cfg.loss.loss_mode == "cispo",
        (CLIP_BINDS,),
        read_from_vs=True,
    ),
    Mechanism(
        "SPO's value tracker",
        lambda cfg: method_switches(cfg)["spo"],
        (ManipulationCheck("spo/tracked_prompts", "> 0"),),
    ),
)


@cache
def _arm_config(base: str, overrides: tuple[str, ...]):
    from rlkit.config import load_config

    return load_config(base, list(overrides))


def arm_mechanisms(summary: dict, arm: str) -> list[Mechanism]:
    """The :data:`MECHANISMS` that ``arm``'s config (the spec's base, shared and arm overrides,
    as ``summary["spec"]`` holds them) switches on."""
    spec = summary["spec"]
    overrides = (*spec.get("overrides", []), *(spec.get("arms", {}).get(arm) or []))
    cfg = _arm_config(spec["base"], overrides)
    return [m for m in MECHANISMS if m.on(cfg)]


def claim_mechanisms(summary: dict, claim: dict) -> list[Mechanism]:
    """What a claim is about: the mechanisms its arm has and its ``vs`` arm has not (AGPO
    against PPO: AGPO's clip and temperature; against clip-only AGPO: its temperature), or, when
    the two share all of them (a variant of one method: AGPO's dispersion, EBPO's prior), those
    of the arm."""
    arm = arm_mechanisms(summary, claim["arm"])
    vs = arm_mechanisms(summary, claim["vs"])
    return [m for m in arm if m not in vs] or arm


def logged_mean(summary: dict, arm: str, group_size: int, metric: str) -> float | None:
    """The mean over steps and seeds of ``metric`` for the arm at G: the registered check's
    mean (``summary["manipulation"]``) where the spec checked that metric, else the mean over
    steps of the per-step means over seeds (``summary["dynamics"]``: every seed logs every step,
    so the two agree); None when neither holds it (not checkable from the committed results).
    A registered check read from another arm's runs (its ``of``) counts as that arm's."""
    where = (arm, group_size, metric)
    for check in summary.get("manipulation", []):
        if (check.get("of", check["arm"]), check["group_size"], check["metric"]) == where:
            return check["mean"]
    for series in (summary.get("dynamics") or {}).get("series", []):
        if (series["arm"], series["group_size"], series["metric"]) == where:
            return sum(series["mean"]) / len(series["mean"])
    return None


def uniform_check(summary: dict, claim: dict) -> tuple[str, str]:
    """(status, text) of the claim's mechanisms (:func:`claim_mechanisms`) on its arm at its G:
    ``acted`` when every check of every one passes; ``did not act`` naming the first that fails
    (value and rule, and the arm it was read from when that is ``vs``); ``not checkable`` when a
    mechanism has no check or its metric is not in the committed summary; ``no mechanism`` when
    the arm switches none on."""
    mechanisms = claim_mechanisms(summary, claim)
    if not mechanisms:
        return "no mechanism", "no rule"
    for m in mechanisms:
        if not m.checks:
            return "not checkable", f"not checkable ({m.name}: no logged signal)"
        read_from = claim["vs"] if m.read_from_vs else claim["arm"]
        for check in m.checks:
            value = logged_mean(summary, read_from, claim["group_size"], check.metric)
            if value is None:
                return "not checkable", f"not checkable ({check.metric} not in the summary)"
            if not check.acted(value):
                of = f" of {read_from}" if m.read_from_vs else ""
                return (
                    "did not act",
                    f"no ({m.name}: {check.metric}{of} {value:.2g}, needs {check.acts_if})",
                )
    return "acted", "yes"


# ---------------------------------------------------------------- 5. the re-reading
def reread(claim: dict, project: tuple[float, float] | None, uniform: str) -> str:
    """The claim's verdict by judge_claims' rules (:func:`rlkit.claims.claim_verdict`, Holm
    within its family) under the uniform manipulation rule (``uniform``:
    :func:`uniform_check`'s status) instead of the registered checks; a reproduced or
    contradicted effect whose 90% interval lies inside ±margin is "…, below margin", and one
    that does not survive Holm over the whole project (``project``: :func:`project_holm`'s p's)
    says so; "(manipulation not checkable)" where the uniform rule cannot be checked."""
    if uniform == "did not act":
        return "not testable (uniform rule: manipulation did not act)"
    testable = len(claim["seeds"]) >= 2 and (claim["test"] == "superiority" or claim["ci90"])
    verdict = claim_verdict(claim) if testable else claim["verdict"]
    if verdict in ("reproduced", "contradicted"):
        if equivalent(claim):
            verdict += ", below margin"
        if project[verdict.startswith("contradicted")] >= ALPHA:
            verdict += "; not after project-wide Holm"
    return verdict + (" (manipulation not checkable)" if uniform == "not checkable" else "")


def surviving(project: dict) -> list[tuple[str, str]]:
    """The (sweep, claim) whose project-wide Holm p (either direction) is below α."""
    return [key for key, (p, other) in project.items() if min(p, other) < ALPHA]
