"""``rlkit report SWEEP_DIR``: what a sweep (:mod:`rlkit.sweep`) measured, with its uncertainty.

For every arm and group size G, over seeds (95% Student-t intervals, :mod:`rlkit.intervals`):

- held-out greedy accuracy and Pass@1 at the start and the end of training, and the gain (end −
  start, per seed);
- the paired difference of the end values to the baseline arm at the same G (same seeds: same
  warm start, same random streams), and the minimum detectable difference (95%, power 0.8) that
  the paired seed-to-seed spread allows with this many seeds;
- the generated tokens (training + AGPO probe), the cost axis of the figure: held-out accuracy
  against generated tokens, mean over seeds with a 95% band.
- the spec's pre-registered ``claims`` (:mod:`rlkit.sweep`), each tested as written there and
  nothing else (:func:`rlkit.claims.judge_claims`): a summary of a spec without claims is what it was before
  claims existed, byte for byte;
- learning curves with paired bands (:func:`learning_curves`, ``curves.png``): the held-out
  metrics against step, mean over seeds with a 95% t-band, and arm − control paired per seed at
  each evaluation (the control: the baseline, or at a G the baseline did not run at, the arm a
  claim compares the arm with), so a reader sees when a difference appears; only steps every
  (paired) seed evaluated are used, nothing is interpolated; more arms than a panel can keep
  apart are split over several panels (:func:`arm_facets`);
- training dynamics as the EBPO paper shows them (:func:`training_dynamics`, ``dynamics.png``):
  per-step gradient norm (before clipping), KL to the reference (β > 0), policy entropy and clip
  fraction, mean over seeds with a 95% t-band, not smoothed, one colour per arm; a metric an arm
  does not log is listed as not logged, never drawn as 0.
  The numbers behind both figures are ``summary.json["curves"]`` and ``["dynamics"]`` (per arm,
  G and metric: steps and the mean, low and high at each); a summary written before they existed
  renders back to its own files as it was.

Written to ``results/<sweep>/summary.{csv,json,md}``, ``accuracy_vs_tokens.png``, ``curves.png``
and ``dynamics.png`` (when some arm logged a training signal), with the commands that produced
them. Runs that have not finished are listed and left out, each with what
is wrong with it (a damaged metrics line, a null or non-finite first or last evaluation, fewer
steps than the other runs of its cell); a comparison uses the seeds both arms finished. An
interval needs at least 2 seeds: under 2 it reads "n/a", never a zero-width interval.

Nothing half-written, nothing outside ``--results``: ``sweep.json`` is checked whole (its name
must be a plain folder name), every file is built before the first is written, and each is
written atomically.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shlex
from collections import defaultdict
from pathlib import Path

import numpy as np

from rlkit.claims import (
    Claim,
    claims_markdown,
    judge_claims,
    manipulation_checks,
    manipulation_markdown,
    preregistered,
)
from rlkit.intervals import (
    Interval,
    format_points,
    mean_ci,
    paired_mdd,
    paired_stats,
    pooled_mdd,
    seed_interval,
)
from rlkit.metric_names import current_metric_fields
from rlkit.metrics import TOKEN_KEYS, is_logged_number, read_metrics, row_tokens
from rlkit.paths import check_link
from rlkit.rundir import saved_config, write_atomically
from rlkit.summary import METRICS, end_by_seed
from rlkit.sweep import MANIFEST, NAME, STARTS
from rlkit.tasks.loader import load_problems

FIGURE = "accuracy_vs_tokens.png"


def load_sweep(sweep_dir: str | Path) -> dict:
    """The sweep's manifest (``sweep.json``, written by ``rlkit sweep``), checked: a damaged,
    empty or wrong-shaped file is a ValueError naming the file and the bad entry."""
    path = Path(sweep_dir) / MANIFEST
    if not path.is_file():
        raise ValueError(f"{sweep_dir} has no {MANIFEST}: not a sweep directory (run rlkit sweep)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err}): damaged or cut short; rerun rlkit sweep to "
            "rewrite it"
        ) from None
    check_manifest(manifest, path)
    return manifest


def check_manifest(manifest, path: Path) -> None:
    """``sweep.json``'s shape: a ``name`` that is a plain folder name (it names
    ``results/<name>/``: no path separator, no ``..``), string ``command`` and ``spec_file``, an
    optional string ``baseline`` and a non-empty list of runs, each with a string ``arm`` and
    ``dir`` and integer ``group_size`` and ``seed``, no arm, G and seed or directory twice."""

    def bad(key: str, value, want: str) -> ValueError:
        return ValueError(f"{path}: {key} must be {want}, got {value!r} (rerun rlkit sweep)")

    if not isinstance(manifest, dict):
        raise bad("the file", manifest, "a JSON object")
    for key in ("name", "spec_file", "spec", "command", "runs"):
        if key not in manifest:
            raise ValueError(f"{path}: {key} is missing (rerun rlkit sweep)")
    name = manifest["name"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad("name", name, "a plain folder name (letters, digits, _ . + -)")
    for key in ("spec_file", "command"):
        if not isinstance(manifest[key], str):
            raise bad(key, manifest[key], "a string")
    if not isinstance(manifest.get("baseline"), (str, type(None))):
        raise bad("baseline", manifest["baseline"], "an arm name or null")
    runs = manifest["runs"]
    if not isinstance(runs, list) or not runs:
        raise bad("runs", runs, "a non-empty list")
    fields = {"arm": str, "dir": str, "group_size": int, "seed": int}
    seen = {}
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise bad(f"runs[{i}]", run, "an object")
        for key, kind in fields.items():
            value = run.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise bad(
                    f"runs[{i}].{key}", value, f"a{'n' if kind is int else ''} {kind.__name__}"
                )
        for key in ((run["arm"], run["group_size"], run["seed"]), str(Path(run["dir"]))):
            if key in seen:
                raise ValueError(
                    f"{path}: runs[{i}] repeats runs[{seen[key]}] ({key!r}); rerun rlkit sweep"
                )
            seen[key] = i


def preregistration(manifest: dict, sweep_dir: Path) -> dict:
    """What lets a reader check from the repository that the spec came before the runs (issue
    42): the spec file's sha256 as ``rlkit sweep`` last read it (``sweep.json``), and per run the
    UTC time of its last fresh start with the spec's sha256 then (``starts.jsonl``,
    :func:`rlkit.sweep.log_start`; a resume keeps its start). ``spec_changed_after_start``: the
    runs that started under another version of the spec file than the one the sweep.json holds.
    ``machines``: each distinct machine the runs' fresh starts recorded
    (:func:`rlkit.machine.fingerprint`), and ``runs_machine`` each run's index in it (None where
    its start recorded none), for a reader to know where a figure comes back exactly.
    A missing hash or start is None with the reason, never a guess."""
    starts = {}
    path = Path(sweep_dir) / STARTS
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in lines:
        entry = json.loads(line)
        if entry["status"] == "fresh":
            starts[entry["run"]] = entry
    keys = [f"{r['arm']}/G{r['group_size']}/seed{r['seed']}" for r in manifest["runs"]]
    spec_hash = manifest.get("spec_sha256")
    unrecorded = [k for k in keys if k not in starts]
    machines: list[dict] = []
    for key in keys:
        machine = starts.get(key, {}).get("machine")
        if machine is not None and machine not in machines:
            machines.append(machine)
    return {
        "spec_file": manifest["spec_file"],
        "spec_sha256": spec_hash,
        "spec_sha256_from": f"{MANIFEST} (rlkit sweep)" if spec_hash else None,
        "spec_sha256_why": None
        if spec_hash
        else f"{MANIFEST} has no spec_sha256 (written by rlkit sweep before it recorded one)",
        "runs_started": {k: starts[k]["at"] if k in starts else None for k in keys},
        "runs_started_why": None
        if not unrecorded
        else f"{len(unrecorded)} of {len(keys)} runs have no fresh start in {STARTS} (started "
        "before rlkit sweep logged starts, or not by rlkit sweep)",
        "spec_changed_after_start": [
            k for k in keys if k in starts and starts[k]["spec_sha256"] != spec_hash
        ],
        "machines": machines,
        "runs_machine": {
            k: machines.index(starts[k]["machine"]) if starts.get(k, {}).get("machine") else None
            for k in keys
        },
    }


def preregistration_markdown(pre: dict) -> list[str]:
    """summary.md's paragraph on :func:`preregistration`. A committed summary written before it
    existed holds a backfilled block: the spec's sha256 from git, and no start times (None, with
    the reason), so whether the spec changed after a start is not known (None)."""
    spec = (
        f"sha256 `{pre['spec_sha256']}` (from {pre['spec_sha256_from']})"
        if pre["spec_sha256"]
        else f"no sha256 ({pre['spec_sha256_why']})"
    )
    started = sorted(t for t in (pre["runs_started"] or {}).values() if t)
    runs = f"runs started from {started[0]} to {started[-1]} (UTC)" if started else "no run start"
    if pre["runs_started_why"]:
        runs += f": {pre['runs_started_why']}"
    changed = pre["spec_changed_after_start"] or []
    amended = (
        f" The spec file changed after {len(changed)} run(s) had started: {', '.join(changed)}."
        if changed
        else ""
    )
    machines = "".join(
        f" Machine {i}: {m['cpu']}, torch kernels {m['torch_cpu_capability']}, "
        f"{m.get('threads')} thread(s), kernel variables {m.get('kernel_variables') or 'none'}."
        for i, m in enumerate(pre.get("machines") or [])
    )
    return [f"Pre-registration: spec `{pre['spec_file']}`, {spec}; {runs}.{amended}{machines}", ""]


def eval_curve(rows: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(generated tokens incl. probe tokens, ``metric``) at every evaluation row; the step-0 row
    precedes any generation (0 tokens)."""
    points = [(row_tokens(r), r[metric]) for r in rows if r.get(metric) is not None]
    return np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)


def shift_recovery(rows: list[dict], metric: str, shift_step: int) -> dict:
    """One run around its task shift (``task.shift``): ``pre`` = ``metric`` at the last
    evaluation at or before the shift step; ``dip`` = how far the later evaluations fall below
    it (≥ 0); ``steps`` = steps after the shift until an evaluation is back at ``pre`` or above
    (None: not within the run); ``reward_after`` = mean training reward of the shifted steps;
    ``evals`` = every [step, value] of the metric."""
    evals = [(r["step"], r[metric]) for r in rows if r.get(metric) is not None]
    before = [v for step, v in evals if step <= shift_step]
    after = [(step, v) for step, v in evals if step > shift_step]
    if not before or not after:
        raise ValueError(f"{metric}: no evaluation on both sides of the shift at step {shift_step}")
    pre = before[-1]
    rewards = [r["reward"] for r in rows if r.get("reward") is not None and r["step"] > shift_step]
    return {
        "pre": pre,
        "dip": max(0.0, pre - min(v for _, v in after)),
        "steps": next((step - shift_step for step, v in after if v >= pre), None),
        "reward_after": float(np.mean(rewards)) if rewards else None,
        "evals": [list(e) for e in evals],
    }


def check_finished(rows: list[dict], steps: int, token_budget: int = 0) -> None:
    """A finished run: its last evaluation is at its final step (``steps``, or the step whose
    tokens, the probe's included, reached ``token_budget``), and its first and last evaluations
    hold a finite value of every metric. Otherwise a ValueError says what is wrong (a null is
    never replaced by another evaluation's value)."""
    evals = [r for r in rows if any(m in r for m in METRICS)]
    if not evals:
        raise ValueError("no evaluation logged")
    last = evals[-1]
    spent = row_tokens(last) if token_budget else 0
    if last["step"] != steps and not (token_budget and spent >= token_budget):
        budget = f" or token_budget={token_budget} ({spent:.0f} spent)" if token_budget else ""
        raise ValueError(f"not finished: last evaluation at step {last['step']} of {steps}{budget}")
    for row in (evals[0], evals[-1]):
        for metric in METRICS:
            value = row.get(metric)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{metric} at step {row['step']} is {value!r}, not a number")
            if not math.isfinite(value):
                raise ValueError(f"{metric} at step {row['step']} is {value}, not finite")


def finished_runs(manifest: dict) -> tuple[dict, dict, dict[str, str]]:
    """{(arm, G): {seed: metric rows}} of the finished runs (:func:`check_finished`),
    {(arm, G): (number of held-out problems, task.shift step or None)} and {directory: why it
    is left out} of the others, in the manifest's order. The runs of a cell have one length: a
    run with fewer steps than the longest of its cell is left out, named (never averaged in).
    A run's config is read without checking its paths: a moved model does not matter here."""
    runs, sizes, lengths, why = defaultdict(dict), {}, defaultdict(dict), {}
    for run in manifest["runs"]:
        run_dir, cell = Path(run["dir"]), (run["arm"], run["group_size"])
        try:
            if not run_dir.is_dir():
                where = "" if run_dir.is_absolute() else f" in {Path.cwd()}"
                raise ValueError(
                    f"no such directory{where} (sweep.json's relative paths are relative to the "
                    "directory rlkit sweep ran in: run rlkit report from there)"
                )
            rows = read_metrics(run_dir)
            cfg = saved_config(run_dir, check_paths=False)
            check_finished(rows, cfg.steps, cfg.token_budget)
            if cell not in sizes:
                problems = min(len(load_problems(cfg.task)[1]), cfg.eval.num_problems)
                sizes[cell] = (problems, cfg.task.shift.get("step"))
        except ValueError as err:
            why[str(run_dir)] = str(err)
            continue
        runs[cell][run["seed"]], lengths[cell][run["seed"]] = rows, (cfg.steps, str(run_dir))
    for (arm, g), seeds in lengths.items():
        longest = max(steps for steps, _ in seeds.values())
        for seed, (steps, run_dir) in seeds.items():
            if steps < longest:
                why[run_dir] = f"{steps} steps, {longest} in other runs of {arm} at G={g}"
                del runs[arm, g][seed]
    order = [str(Path(run["dir"])) for run in manifest["runs"]]
    return dict(runs), sizes, {d: why[d] for d in sorted(why, key=order.index)}


def _shift_summary(seeds: dict, base: dict, metric: str, shift_step: int) -> dict:
    """:func:`shift_recovery` of every seed of one arm, the mean [95% CI] of its dip and reward
    after the shift, and their paired differences to ``base`` (the baseline's runs of the same
    seeds; empty for the baseline itself)."""
    per_seed = {sd: shift_recovery(rs, metric, shift_step) for sd, rs in seeds.items()}
    shift = {"step": shift_step, "seeds": {str(sd): v for sd, v in per_seed.items()}}
    base_rec = {sd: shift_recovery(rs, metric, shift_step) for sd, rs in base.items()}
    for key in ("dip", "reward_after"):
        shift[key] = seed_interval([v[key] for v in per_seed.values()]).to_json()
        if base_rec:
            pairs = [per_seed[sd][key] - rec[key] for sd, rec in base_rec.items()]
            shift[f"{key}_vs_baseline"] = paired_stats(pairs)
    return shift


def summarize(manifest: dict, runs: dict, eval_sizes: dict) -> list[dict]:
    """One row per (arm, G, metric): start, end, gain, paired difference to the baseline, MDD,
    and the eval noise: the binomial SE √(p(1 − p)/N) of one run's end accuracy p on N held-out
    problems (for Pass@1, averaged over k samples per problem, an upper bound)."""
    baseline, rows = manifest.get("baseline"), []
    for (arm, g), seeds in runs.items():
        base = runs.get((baseline, g), {}) if baseline and arm != baseline else {}
        n, shift_step = eval_sizes[arm, g]
        for name in METRICS:
            start = {s: eval_curve(rs, name)[1][0] for s, rs in seeds.items()}
            end = {s: eval_curve(rs, name)[1][-1] for s, rs in seeds.items()}
            common = sorted(set(end) & set(base))
            diff = [end[s] - eval_curve(base[s], name)[1][-1] for s in common]
            last = {s: rs[-1] for s, rs in seeds.items()}
            p = float(np.mean(list(end.values())))
            shift = None
            if shift_step is not None:
                try:
                    shift = _shift_summary(seeds, {sd: base[sd] for sd in common}, name, shift_step)
                except ValueError as err:
                    raise ValueError(f"arm {arm} at G={g}: {err}") from None
            rows.append(
                {
                    "arm": arm,
                    "group_size": g,
                    "metric": name,
                    "seeds": sorted(seeds),
                    "start": seed_interval(list(start.values())).to_json(),
                    "end": seed_interval(list(end.values())).to_json(),
                    "end_by_seed": {str(sd): float(v) for sd, v in sorted(end.items())},
                    "gain": seed_interval([end[s] - start[s] for s in seeds]).to_json(),
                    "vs_baseline": seed_interval(diff).to_json() if diff else None,
                    "vs_baseline_seeds": common,
                    "mdd": paired_mdd(diff),
                    "eval_problems": n,
                    "eval_se": math.sqrt(p * (1 - p) / n),
                    "tokens_generated": float(
                        np.mean([r.get(TOKEN_KEYS[0]) or 0 for r in last.values()])
                    ),
                    "tokens_probe": float(
                        np.mean([r.get(TOKEN_KEYS[1]) or 0 for r in last.values()])
                    ),
                    "shift": shift,
                    "_diff": diff,
                }
            )
    return rows


def plot_accuracy_vs_tokens(
    runs: dict, metric: str, facets: dict[int, list[list[str]]], out: Path, points: int = 50
) -> Path:
    """One panel per G and facet (:func:`arm_facets`), four to a row: ``metric`` against
    generated tokens per arm, mean over seeds with a 95% band (each seed's curve interpolated onto
    the token range every seed reached), in the shared figure style (:mod:`rlkit.figure_style`);
    tokens in thousands, so that six-digit tick labels do not run into each other."""
    from matplotlib.ticker import EngFormatter

    from rlkit.plotting import new_figure, save_figure

    panels = [(g, k, facet) for g, parts in facets.items() for k, facet in enumerate(parts)]
    cols = min(4, len(panels))
    fig, axes = new_figure(-(-len(panels) // cols), cols, (4.2, 3.2))
    with _style():
        for ax, (g, k, facet) in zip(axes.flat, panels):
            for arm in facet:
                curves = [eval_curve(rows, metric) for rows in runs[arm, g].values()]
                grid = np.linspace(0, min(x[-1] for x, _ in curves), points)
                ys = np.array([np.interp(grid, x, y) for x, y in curves]) * 100
                ax.plot(grid, ys.mean(0), label=arm, color=_colour(facet, arm))
                if len(ys) > 1:
                    band = mean_ci(ys)
                    ax.fill_between(grid, band.low, band.high, color=_colour(facet, arm), alpha=0.2)
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            ax.set_title(f"G = {g}{_part(k, facets[g])}")
            ax.set_xlabel("generated tokens (incl. probe)")
            ax.set_ylabel(f"{metric} (%)")
            ax.legend()
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
    return save_figure(fig, out)


# ---------------------------------------------------------------- curves and dynamics over seeds
CURVES_FIGURE = "curves.png"
DYNAMICS_FIGURE = "dynamics.png"
# per-step training signals as the EBPO paper shows them (rlkit/update.py's names): the gradient
# norm before clipping (clip_grad_norm_ returns the total norm it clipped from), the k3 KL to the
# reference (logged only when there is one: β > 0), the policy entropy (log_entropy), and the share
# of tokens whose ratio the clip bound (below or above)
DYNAMICS = ("grad_norm", "kl", "entropy", "clip_ratio/region_mean")
BAND = "mean over seeds with a 95% Student-t band, per step, not smoothed"


def by_step(rows: list[dict], metric: str) -> dict[int, float]:
    """{step: value} of every row of one run that logged a finite ``metric``."""
    return {r["step"]: float(r[metric]) for r in rows if is_logged_number(r.get(metric))}


def step_band(series: list[dict[int, float]]) -> dict:
    """The steps every series (one per seed) has a value at, and at each of them the mean, low
    and high of a 95% t-interval over the series (:func:`_ci`: low = high = None under 2 seeds).
    A step some seed did not log is left out, never filled in from another step."""
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    bands = [seed_interval([s[step] for s in series]).to_json() for step in steps]
    return {"steps": steps} | {key: [b[key] for b in bands] for key in ("mean", "low", "high")}


def paired_control(runs: dict, arm: str, g: int, baseline: str | None, claims=()) -> str | None:
    """The arm that ``arm``'s curves at G are paired with: the baseline where it ran at G, else
    the ``vs`` of a claim on ``arm`` at G (a sweep that names its arms by G, GRPO_G2 and GRPO_G4
    with the baseline GRPO_G4, pairs EBPO_G2 with GRPO_G2 in its claims); None for the control
    itself, or where no control ran at G."""
    candidates = [baseline] + [c.vs for c in claims if c.arm == arm and c.group_size in (None, g)]
    return next((c for c in candidates if c and c != arm and (c, g) in runs), None)


def learning_curves(runs: dict, baseline: str | None, claims: list[Claim] = ()) -> dict:
    """Per arm, G and held-out metric: the evaluations over the arm's seeds (:func:`step_band`),
    and ``vs_baseline``: arm − its control (:func:`paired_control`, named in ``vs``) paired per
    seed (the seeds both finished at this G) at the steps every one of those seeds evaluated in
    both arms, mean and 95% t-band of the per-seed differences (None for a control itself, or
    without one)."""
    series = []
    for (arm, g), seeds in runs.items():
        control = paired_control(runs, arm, g, baseline, claims)
        base = runs[control, g] if control else {}
        common = sorted(set(seeds) & set(base))
        for metric in METRICS:
            own = {seed: by_step(rows, metric) for seed, rows in sorted(seeds.items())}
            paired = None
            if common:
                diffs = []
                for seed in common:
                    b = by_step(base[seed], metric)
                    diffs.append({st: own[seed][st] - b[st] for st in own[seed].keys() & b.keys()})
                paired = {"vs": control, "seeds": common} | step_band(diffs)
            series.append(
                {"arm": arm, "group_size": g, "metric": metric, "seeds": sorted(seeds)}
                | step_band(list(own.values()))
                | {"vs_baseline": paired}
            )
    return {"x": "step", "band": BAND, "series": series}


def training_dynamics(runs: dict) -> dict:
    """Per arm, G and :data:`DYNAMICS` metric: :func:`step_band` over the arm's seeds. A metric
    that not every seed logged at a common step (an arm with β = 0 logs no ``kl``, DPO no clip
    fraction) is not drawn: it goes to ``not_logged`` with how many seeds logged it at all."""
    series, not_logged = [], []
    for (arm, g), seeds in runs.items():
        for metric in DYNAMICS:
            values = [by_step(rows, metric) for _, rows in sorted(seeds.items())]
            band = step_band(values)
            where = {"arm": arm, "group_size": g, "metric": metric, "seeds": sorted(seeds)}
            if band["steps"]:
                series.append(where | band)
            else:
                not_logged.append(where | {"seeds_logged": sum(bool(v) for v in values)})
    return {"x": "step", "band": BAND, "series": series, "not_logged": not_logged}


MAX_ARMS_PER_PANEL = 6  # more lines than this in one panel cannot be told apart


def arm_facets(curves: dict, baseline: str | None) -> dict[int, list[list[str]]]:
    """{G: the arms of each panel of G}, from :func:`learning_curves`: the arms that ran at G in
    the sweep's order, in one panel up to :data:`MAX_ARMS_PER_PANEL`; beyond, split over panels
    of that many, each led by the controls the others are paired with, so that every panel shows
    its comparison. Every figure of a report draws the same panels, one colour per place in a
    panel (:func:`_colour`)."""
    arms, controls = defaultdict(list), defaultdict(list)
    for s in curves["series"]:
        g, paired = s["group_size"], s["vs_baseline"]
        arms[g] += [s["arm"]] if s["arm"] not in arms[g] else []
        vs = paired and paired.get("vs", baseline)  # a summary before "vs": the baseline
        controls[g] += [vs] if vs and vs not in controls[g] else []
    facets = {}
    for g in sorted(arms):
        others = [a for a in arms[g] if a not in controls[g]]
        width = max(1, MAX_ARMS_PER_PANEL - len(controls[g]))
        facets[g] = (
            [arms[g]]
            if len(arms[g]) <= MAX_ARMS_PER_PANEL
            else [controls[g] + others[i : i + width] for i in range(0, len(others), width)]
        )
    return facets


def _colour(facet: list[str], arm: str) -> str:
    """One colour per place in a panel's arms (at most :data:`MAX_ARMS_PER_PANEL`, all distinct
    in matplotlib's cycle)."""
    return f"C{facet.index(arm)}"


def _part(k: int, facets: list[list[str]]) -> str:
    """`` (k/n)`` after the title of the k-th of n panels of one G; nothing for a single one."""
    return f" ({k + 1}/{len(facets)})" if len(facets) > 1 else ""


def _style():
    import matplotlib

    from rlkit.figure_style import STYLE

    return matplotlib.rc_context(STYLE)


def _no_data(ax, title: str, why: str) -> None:
    """A panel with nothing to draw: its title and why, no empty axes."""
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)


def _draw_band(ax, entry: dict, colour: str, label: str | None, scale: float = 1.0) -> None:
    steps, mean = np.array(entry["steps"]), np.array(entry["mean"]) * scale
    ax.plot(steps, mean, color=colour, label=label, marker="o" if len(steps) < 30 else None)
    if entry["low"] and entry["low"][0] is not None:
        low, high = np.array(entry["low"]) * scale, np.array(entry["high"]) * scale
        ax.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)


def plot_learning_curves(
    curves: dict, facets: dict[int, list[list[str]]], baseline: str | None, out: Path
) -> Path:
    """``curves.png`` from :func:`learning_curves`: one row per G, panel of arms
    (:func:`arm_facets`) and metric; left, each arm's held-out value against step (mean over
    seeds, 95% t-band); right (when some arm is paired), arm − its control paired per seed, 0
    dashed, titled with the controls it shows (a summary before ``vs``: the baseline). A control
    that leads several panels of G is drawn in each on the left, its own difference (a control
    paired in a claim of its own) once, in the first."""
    from rlkit.plotting import new_figure, save_figure

    series = {(s["arm"], s["group_size"], s["metric"]): s for s in curves["series"]}
    metrics = list(dict.fromkeys(metric for _, _, metric in series))
    rows = [
        (g, k, facet, metric)
        for g, parts in facets.items()
        for k, facet in enumerate(parts)
        for metric in metrics
    ]
    paired = any(s["vs_baseline"] for s in series.values())
    fig, axes = new_figure(len(rows), 1 + paired, (4.6, 3.0))
    differenced = set()  # the (arm, G, metric) whose difference a panel has drawn
    with _style():
        for (g, k, facet, metric), (left, *right) in zip(rows, axes):
            name = metric.removeprefix("eval/")
            drawn = [series[arm, g, metric] for arm in facet if (arm, g, metric) in series]
            for s in drawn:
                _draw_band(left, s, _colour(facet, s["arm"]), s["arm"], scale=100.0)
            left.set(title=f"{name}, G = {g}{_part(k, facets[g])}", xlabel="step")
            left.set_ylabel(f"{name} (%)")
            left.legend()
            if right:
                new = [
                    s
                    for s in drawn
                    if s["vs_baseline"] and (s["arm"], g, metric) not in differenced
                ]
                differenced |= {(s["arm"], g, metric) for s in new}
                _draw_differences(right[0], new, facet, baseline)
        fig.suptitle(f"held-out {curves['band']}")
    return save_figure(fig, out)


def _draw_differences(ax, drawn: list[dict], facet: list[str], baseline: str | None) -> None:
    """The right panel of a row of ``curves.png``: each paired arm's difference to its control."""
    if not drawn:
        return _no_data(ax, "arm − control", "no arm here is paired per seed\nwith a control")
    for s in drawn:
        _draw_band(ax, s["vs_baseline"], _colour(facet, s["arm"]), s["arm"], scale=100.0)
    controls = ", ".join(dict.fromkeys(s["vs_baseline"].get("vs", baseline) for s in drawn))
    ax.axhline(0.0, color="0.4", linestyle="--", linewidth=0.8)
    ax.set(title=f"arm − {controls}, paired per seed", xlabel="step")
    ax.set_ylabel("difference (points)")


def plot_dynamics(dynamics: dict, facets: dict[int, list[list[str]]], out: Path) -> Path:
    """``dynamics.png`` from :func:`training_dynamics`: one row per G and panel of arms
    (:func:`arm_facets`), one panel per metric that some arm logged, one colour per place in the
    panel; a metric an arm did not log has no line for it, and a panel none of its arms logged
    says so."""
    from rlkit.plotting import STANDARD_CURVES, new_figure, save_figure

    titles = STANDARD_CURVES | {
        "grad_norm": "grad norm (before clipping)",
        "clip_ratio/region_mean": "clip fraction (tokens)",
    }
    series = {(s["arm"], s["group_size"], s["metric"]): s for s in dynamics["series"]}
    metrics = [m for m in DYNAMICS if any(key[2] == m for key in series)]
    rows = [(g, k, facet) for g, parts in facets.items() for k, facet in enumerate(parts)]
    fig, axes = new_figure(len(rows), len(metrics), (3.8, 3.0))
    with _style():
        for (g, k, facet), row in zip(rows, axes):
            for metric, ax in zip(metrics, row):
                title = f"{titles[metric]}, G = {g}{_part(k, facets[g])}"
                drawn = [series[arm, g, metric] for arm in facet if (arm, g, metric) in series]
                if not drawn:
                    _no_data(ax, title, "not logged by these arms")
                    continue
                for s in drawn:
                    _draw_band(ax, s, _colour(facet, s["arm"]), s["arm"])
                ax.set(title=title, xlabel="step")
                ax.legend()
        fig.suptitle(f"training dynamics: {dynamics['band']}")
    return save_figure(fig, out)


def draw_summary_figures(summary: dict, out: Path) -> list[Path]:
    """``curves.png`` and (when some arm logged a training signal) ``dynamics.png`` of a summary,
    into the folder ``out``: what ``rlkit report`` draws, and ``rlkit figures`` redraws from a
    committed summary.json (``accuracy_vs_tokens.png`` needs the runs)."""
    facets = arm_facets(summary["curves"], summary["baseline"])
    drawn = [
        plot_learning_curves(summary["curves"], facets, summary["baseline"], out / CURVES_FIGURE)
    ]
    if summary["dynamics"]["series"]:
        drawn.append(plot_dynamics(summary["dynamics"], facets, out / DYNAMICS_FIGURE))
    return drawn


def redraw_figures(results_dir: str | Path) -> list[Path]:
    """:func:`draw_summary_figures` of ``results_dir/summary.json`` (``rlkit figures``)."""
    path = Path(results_dir) / "summary.json"
    try:
        summary = current_metric_fields(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read {path}: {err}") from None
    if "curves" not in summary:
        raise ValueError(f"{path} has no curves (written before rlkit report drew them)")
    return draw_summary_figures(summary, path.parent)


def curves_markdown(summary: dict) -> list[str]:
    """summary.md's paragraphs on ``curves.png`` and ``dynamics.png``: what the bands are, and
    which metrics which arms did not log (left out, not drawn as 0)."""
    baseline = summary["baseline"]
    paired = (
        f" Right: arm − {baseline} paired per seed (the seeds both finished), mean and 95% "
        "t-band of the per-seed differences, only at steps every one of those seeds evaluated in "
        "both arms."
        if baseline
        else ""
    )
    others = {
        (s["group_size"], s["vs_baseline"]["vs"])
        for s in summary["curves"]["series"]
        if s["vs_baseline"] and s["vs_baseline"].get("vs", baseline) != baseline
    }
    if others:  # paired_control: at a G without the baseline, a claim's comparison arm
        paired += " The control where the baseline did not run, as the claims pair them: " + (
            ", ".join(f"{vs} at G = {g}" for g, vs in sorted(others)) + "."
        )
    lines = [
        f"Learning curves (`{CURVES_FIGURE}`): held-out greedy accuracy and Pass@1 against step, "
        f"{summary['curves']['band']}, at the steps every seed of the arm evaluated.{paired} "
        'The numbers are in summary.json["curves"].',
        "",
        f"![learning curves]({CURVES_FIGURE})",
        "",
    ]
    dynamics = summary["dynamics"]
    absent = defaultdict(list)
    for n in dynamics["not_logged"]:
        absent[n["metric"]].append(
            f"{n['arm']} at G = {n['group_size']} ({n['seeds_logged']}/{len(n['seeds'])} seeds)"
        )
    note = "; ".join(f"`{m}`: {', '.join(where)}" for m, where in absent.items())
    lines.append(
        f"Training dynamics (`{DYNAMICS_FIGURE}`): "
        + ", ".join(f"`{m}`" for m in DYNAMICS)
        + f" (gradient norm before clipping; KL only with β > 0), {dynamics['band']}; "
        'the numbers are in summary.json["dynamics"].'
        + (f" Not logged by every seed, so left out (not drawn as 0): {note}." if note else "")
    )
    if dynamics["series"]:
        lines += ["", f"![training dynamics]({DYNAMICS_FIGURE})"]
    return lines + [""]


def _points(ci: dict | None) -> str:
    """A summary's interval (its JSON form) in points, ``—`` where there is none."""
    return "—" if ci is None else Interval.from_json(ci).points()


def markdown(summary: dict, missing: dict[str, str]) -> str:
    """summary.md: the arms table, the MDD, the task shift's table, the pre-registered claims
    (when the spec has any) and the runs left out, with why."""
    baseline, rows, commands = summary["baseline"], summary["rows"], summary["commands"]
    lines = [
        f"# Sweep `{summary['name']}`",
        "",
        "Produced by:",
        "",
        "```",
        *commands,
        "```",
        "",
        "Held-out accuracy (%), mean [95% CI] over seeds; gain = end − start per seed; "
        f"'vs {baseline or 'baseline'}' = paired difference of the end values (same seeds, same "
        "G); MDD = minimum detectable difference of that comparison (95%, power 0.8); eval SE = "
        "binomial SE of one run's end value on N held-out problems (eval noise; a paired "
        "difference on the same problems cancels the part both arms share).",
        "",
        "| arm | G | metric | seeds | start | end | gain | vs baseline | MDD | eval SE (N) "
        "| tokens (probe) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['group_size']} | {r['metric'].removeprefix('eval/')} "
            f"| {len(r['seeds'])} | {_points(r['start'])} | {_points(r['end'])} | {_points(r['gain'])} "
            f"| {_points(r['vs_baseline'])} | {format_points(r['mdd'])} | {format_points(r['eval_se'])} ({r['eval_problems']}) "
            f"| {r['tokens_generated']:.0f} ({r['tokens_probe']:.0f}) |"
        )
    lines += ["", mdd_sentence(summary["mdd"]), ""]
    shifted = [r for r in rows if r["shift"]]
    if shifted:
        lines += [
            f"Task shift at step {shifted[0]['shift']['step']} (task.shift): pre = held-out "
            "value at the last evaluation before it; dip = how far later evaluations fall below "
            "pre; regained = seeds back at pre or above within the run, median steps after the "
            "shift; reward after = mean training reward of the shifted steps.",
            "",
            "| arm | G | metric | dip | dip vs baseline | regained (median steps) | reward after "
            "| reward after vs baseline |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in shifted:
            sh = r["shift"]
            steps = [v["steps"] for v in sh["seeds"].values() if v["steps"] is not None]
            regained = f"{len(steps)}/{len(sh['seeds'])}"
            if steps:
                regained += f" ({float(np.median(steps)):.0f})"
            vs_dip, vs_reward = sh.get("dip_vs_baseline"), sh.get("reward_after_vs_baseline")
            lines.append(
                f"| {r['arm']} | {r['group_size']} | {r['metric'].removeprefix('eval/')} "
                f"| {_points(sh['dip'])} | {_points(vs_dip)} | {regained} "
                f"| {_points(sh['reward_after'])} | {_points(vs_reward)} |"
            )
        lines.append("")
    if "preregistration" in summary:
        lines += preregistration_markdown(summary["preregistration"])
    if "manipulation" in summary:
        lines += manipulation_markdown(summary["manipulation"])
    if "claims" in summary:
        lines += claims_markdown(summary["claims"])
    if missing:
        left_out = "; ".join(f"{run_dir} ({why})" for run_dir, why in missing.items())
        lines += [f"Left out (not finished or not readable): {left_out}", ""]
    lines += [f"![accuracy vs generated tokens]({FIGURE})", ""]
    if "curves" in summary:  # a summary written before the curves renders as it was
        lines += curves_markdown(summary)
    return "\n".join(lines)


def mdd_sentence(mdd: dict) -> str:
    if mdd["value"] is None:
        return "Minimum detectable difference: not available (needs a baseline and ≥ 2 seeds)."
    return (
        f"Minimum detectable difference (95%, power 0.8) of {mdd['metric']} with "
        f"{mdd['seeds']} paired seeds, from the pooled seed-to-seed SD of the paired differences "
        f"to the baseline: {mdd['value'] * 100:.1f} points."
    )


def write_report(
    sweep_dir: str | Path, results: str | Path = "results", metric: str = METRICS[0]
) -> str:
    """Write ``results/<sweep>/summary.{csv,json,md}`` and the figure; return the markdown."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
    manifest = load_sweep(sweep_dir)
    runs, eval_sizes, missing = finished_runs(manifest)
    if not runs:
        why = "; ".join(f"{run_dir} ({reason})" for run_dir, reason in missing.items())
        raise ValueError(
            f"no finished run in {sweep_dir} (rlkit sweep {manifest['spec_file']}): {why}"
        )
    claims, manipulation = preregistered(manifest, Path(sweep_dir) / MANIFEST)
    rows = summarize(manifest, runs, eval_sizes)
    compared = [r for r in rows if r["metric"] == metric and r["vs_baseline"]]
    seeds = max((len(r["vs_baseline_seeds"]) for r in compared), default=0)
    mdd = {
        "metric": metric,
        "seeds": seeds,
        "value": pooled_mdd([r["_diff"] for r in compared], seeds),
    }
    out = Path(results) / manifest["name"]  # a plain folder name (check_manifest)
    check_link("--results", out)
    if not out.resolve().is_relative_to(Path(results).resolve()):
        raise ValueError(f"{out} is a link out of --results {results} (to {out.resolve()})")
    report = ["rlkit", "report", str(sweep_dir)]
    if str(results) != "results":
        report += ["--results", str(results)]
    if metric != METRICS[0]:
        report += ["--metric", metric]
    commands = [manifest["command"], shlex.join(report)]
    for r in rows:
        del r["_diff"]
    summary = {
        "name": manifest["name"],
        "commands": commands,
        "baseline": manifest.get("baseline"),
        "spec": manifest["spec"],
        "preregistration": preregistration(manifest, Path(sweep_dir)),
        "mdd": mdd,
        "missing": list(missing),
        "rows": rows,
    }
    # a spec without manipulation checks or claims: the summary as before they existed
    if manipulation:
        summary["manipulation"] = manipulation_checks(runs, manipulation)
    if claims:
        summary["claims"] = judge_claims(summary, claims)
    summary["curves"] = learning_curves(runs, summary["baseline"], claims)
    summary["dynamics"] = training_dynamics(runs)
    try:  # every file is built before the first is written
        files = summary_files(summary, missing)
    except ValueError as err:
        raise ValueError(f"{sweep_dir}: the summary holds a non-finite number ({err})") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        facets = arm_facets(summary["curves"], summary["baseline"])
        plot_accuracy_vs_tokens(runs, metric, facets, out / FIGURE)
        draw_summary_figures(summary, out)
        for name, text in files.items():
            write_atomically(out / name, lambda tmp, text=text: tmp.write_text(text, newline=""))
    except OSError as err:
        raise ValueError(f"cannot write the report into {out}: {err}") from None
    return files["summary.md"] + f"\nwritten to {out}/"


def summary_files(summary: dict, missing: dict[str, str]) -> dict[str, str]:
    """The text of summary.md, summary.json and summary.csv of a summary (a committed
    summary.json renders back to its own files byte for byte); a ValueError on a non-finite
    number."""
    return {
        "summary.md": markdown(summary, missing),
        "summary.json": json.dumps(summary, indent=1, allow_nan=False) + "\n",
        "summary.csv": summary_csv(summary["rows"]),
    }


def summary_csv(rows: list[dict]) -> str:
    """The summary rows as CSV text (an empty cell for a missing value)."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    columns = ("start", "end", "gain", "vs_baseline")
    writer.writerow(
        ["arm", "group_size", "metric", "seeds"]
        + [f"{s}_{p}" for s in columns for p in ("mean", "low", "high")]
        + ["mdd", "eval_problems", "eval_se", "tokens_generated", "tokens_probe"]
    )
    for r in rows:
        cells = [r["arm"], r["group_size"], r["metric"], len(r["seeds"])]
        for s in columns:
            cells += [r[s][p] if r[s] else "" for p in ("mean", "low", "high")]
        mdd_cell = "" if r["mdd"] is None else r["mdd"]
        cells += [mdd_cell, r["eval_problems"], r["eval_se"]]
        writer.writerow(cells + [r["tokens_generated"], r["tokens_probe"]])
    return buffer.getvalue()


# ---------------------------------------------------------------- reading a summary (notebooks)
def arm_table(summary: dict, metric: str, group_size: int | None = None) -> str:
    """The summary's arms for one metric (and G) as text: end value, paired difference to the
    baseline, its MDD, generated tokens (probe tokens in parentheses) and where the difference's
    95% interval lies against 0. A description, not a verdict: only a spec's pre-registered
    claims are tested (:func:`rlkit.claims.judge_claims`)."""
    baseline = summary["baseline"]
    rows = [
        r
        for r in summary["rows"]
        if r["metric"] == metric and group_size in (None, r["group_size"])
    ]
    lines = [f"{metric}: arm | seeds | end | vs {baseline} | MDD | tokens (probe) | CI vs 0"]
    for r in rows:
        vs = r["vs_baseline"] and Interval.from_json(r["vs_baseline"])
        lines.append(
            f"  {r['arm']:18} | {len(r['seeds'])} | {_points(r['end'])} | "
            f"{'—' if vs is None else vs.difference_points()} | {format_points(r['mdd'])} | "
            f"{r['tokens_generated']:.0f} ({r['tokens_probe']:.0f}) | "
            f"{_no_pair(r['arm'], baseline) if vs is None else _interval_side(vs)}"
        )
    return "\n".join(lines)


def _interval_side(vs: Interval) -> str:
    """Where a paired difference's 95% interval lies against 0 (n/a without an interval)."""
    if vs.low is None:
        return "n/a (1 seed)"
    if vs.low > 0:
        return "above 0"
    return "below 0" if vs.high < 0 else "contains 0"


def _no_pair(arm: str, baseline: str | None) -> str:
    """What an arm without a paired difference is: the baseline, or an arm that shares no seed
    with the baseline at its G (a sweep with a G of its own per arm, or no baseline at all)."""
    if arm == baseline:
        return "baseline"
    return f"not paired with {baseline}" if baseline else "not paired (no baseline)"


def paired_comparison(
    summary: dict, arm: str, other: str, metric: str, group_size: int | None = None
) -> dict:
    """``arm − other`` on the end values of their common seeds: mean, 95% interval and MDD
    (any two arms of a sweep, not only against its baseline)."""
    a = end_by_seed(summary, arm, metric, group_size)
    b = end_by_seed(summary, other, metric, group_size)
    common = sorted(set(a) & set(b), key=int)
    if len(common) < 2:
        raise ValueError(f"{arm} and {other} share {len(common)} seed(s); a comparison needs 2")
    return paired_stats([a[s] - b[s] for s in common]) | {"seeds": [int(s) for s in common]}


def describe_pair(
    summary: dict, arm: str, other: str, metric: str = METRICS[0], group_size: int | None = None
) -> dict:
    """:func:`paired_comparison` of ``arm − other`` and a one-line ``text`` of it (points of
    held-out accuracy) that says where its 95% interval lies against 0: a description, not a
    verdict (only a spec's pre-registered claims are tested: :func:`rlkit.claims.judge_claims`)."""
    vs = paired_comparison(summary, arm, other, metric, group_size)
    ci = Interval.from_json(vs)
    text = (
        f"{arm} − {other} ({metric}, {len(vs['seeds'])} seeds): {ci.difference_points()} points, "
        f"MDD {format_points(vs['mdd'])}, p = {vs['p']:.3f}, 95% interval {_interval_side(ci)}"
    )
    return vs | {"text": text}
