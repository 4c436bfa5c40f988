"""``rlkit sweep SPEC.yaml``: a grid of ordinary runs (arms × group sizes × seeds), resumable.

A spec names a base preset (or YAML config), overrides shared by every run, and arms: named lists
of overrides. Every combination of arm, group size G and seed is one normal run directory,
``OUT/ARM/G<g>/seed<s>`` (``rlkit eval`` / ``rlkit plot`` work on it)::

    name: ebpo-vs-grpo          # optional, default: the spec file's name
    base: tiny-cpu              # preset or YAML config
    out: runs/sweeps/ebpo-vs-grpo   # optional, default runs/sweeps/<name>
    overrides: [steps=100, "task.arithmetic={topics: [add, sub, mul, mix]}"]
    arms:
      GRPO: [algo.estimator=grpo]
      EBPO: [algo.estimator=ebpo]
    group_sizes: [4, 8]         # optional, default: the base config's G
    seeds: [0, 1, 2, 3, 4]
    baseline: GRPO              # optional: the arm `rlkit report` compares the others against
    threads: 1                  # torch threads per run (default 1)
    workers: 2                  # runs in parallel (default: cores / threads; 0: in this process)
    token_budget: 300000000     # optional: each run stops at the step whose generated tokens,
                                #   the probe's included, reach it (steps is then a cap)

Token budget (optional, ``token_budget``): every run gets ``token_budget=N``, so the trainer stops
it after the first step at which ``tokens/generated + tokens/probe`` (all of the run's generated
tokens, AGPO's probe groups included) reach N, evaluating and checkpointing that step as it does
a last step; a run may overshoot N by less than one step's tokens. ``steps`` stays the cap and
the span of the learning-rate schedule, so set it above the steps the budget allows. That is the
token-matched protocol of the AGPO authors' commit d6676b8 (a 300M-token budget that charges the
probe's tokens), except that they shorten the last groups so the budget is never exceeded (their
scheduler too spans ``max_steps``). After the runs, ``OUT/token_audit.json`` lists each run's tokens (generated, probe, their sum), its last
step, how far it went past the budget and what stopped it (``token_budget``, ``steps``, or null
while unfinished).

Pre-registered claims (optional), written in the spec before the sweep runs; ``rlkit report``
tests them and nothing else (:func:`rlkit.claims.judge_claims`)::

    claims:
      - name: EntropyMech below GRPO          # unique
        source: "EBPO main table: 49.18 vs 58.72 average Pass@1"   # free text, optional
        arm: ClipCov                          # an arm of the spec
        vs: GRPO                              # another arm (default: baseline)
        metric: eval/greedy_accuracy          # or eval/pass@1 (default eval/greedy_accuracy)
        measure: end                          # end (the last evaluation) or shift_dip
        test: superiority                     # superiority | equivalence | noninferiority
        direction: -1                         # superiority, noninferiority: the claimed sign of
                                              #   arm − vs (+1 above, -1 below)
        margin: 0.012                         # accuracy units (0.012 = 1.2 points), or
                                              #   half_baseline_gain: half of vs's mean end − start
        family: papers_baselines              # Holm within a family (default: the sweep's name)
        group_size: 4                         # required when the sweep has several G
        planned_mdd: 0.012                    # optional: the MDD the seeds were planned for,
        planned_from: results/pilot           #   and where it comes from (both or neither)

Each claim is tested on the paired seeds' values of its measure, d_s = arm − vs: ``end``, the
metric at the run's last evaluation, or ``shift_dip``, how far the metric falls below its value
at the task shift (``task.shift``; :func:`rlkit.report.shift_recovery`; a smaller dip is
better, so a claim that the arm dips less has direction -1): a one-sided t-test and an
exact sign-flip p (all 2^n flips up to 20 seeds, else a seeded Monte-Carlo of 100 000), Holm's
correction of the sign-flip p over the superiority claims of a family, TOST (the 90%
t-interval inside ±margin) for equivalence and the one-sided 95% bound above −margin for
non-inferiority; a superiority claim is ``not reproduced`` only when its equivalence within the
margin passes, ``inconclusive`` otherwise. The verdicts are in :func:`rlkit.claims.judge_claims`.

Manipulation checks (optional): per arm, ``metrics.jsonl`` keys whose mean over steps and seeds
shows that the arm's mechanism acted; the report shows each one's mean [min, max over seeds],
and a claim about an arm whose check failed is ``not testable (manipulation did not act)``::

    manipulation:
      ClipCov: [{metric: clip_cov/pg_clipfrac, acts_if: "> 0"}]
      AGPO:
        - {metric: clip_ratio/region_mean, acts_if: "> 0.01"}
        - {metric: agpo/temperature/max, acts_if: "> 1.05"}
      CISPO: [{metric: clip_ratio/region_mean, acts_if: "> 0.005", of: GRPO}]

``acts_if`` is ``<op> <number>``, op one of ``> >= < <=``. A metric that no step logged did not
act (a switched-off mechanism logs no signals: AGPO's ``agpo/epsilon/*`` only with its adaptive
clip). ``of`` reads the metric from another arm's runs at the same G: CISPO changes the clipped
surrogate's gradient only on the tokens where that surrogate's clip binds, which GRPO's runs log.

The whole spec is checked before any run starts: an unknown key or a bad value (named with its
key; a claim's with the claim's index and name), a bad override (named with its arm), a key the sweep sets itself (``seed``, ``output_dir``,
and ``rollout.group_size`` when ``group_sizes`` is given), a task with no training or held-out
problems, or a run directory whose saved config no longer matches the spec.

Resuming: a run whose latest checkpoint is at its final step is skipped; one with an earlier
checkpoint (a killed run) resumes from it with the trainer's resume; one without a checkpoint
starts afresh. So rerunning the same command after an interruption finishes the grid.

Nothing is lost: a sweep replaces only what its own runs wrote. A run directory that holds another
run (its config.yaml differs from the spec) or files no run writes is refused, naming it, with
or without a checkpoint. One sweep at a time per ``out`` (a lock on ``OUT/.sweep.lock``, dropped
by the kernel when the sweep dies), and each run's status is decided again under its run lock
right before it trains, so a run that another process finished meanwhile is never retrained.

Runs go to :mod:`rlkit.pool`: by default single-thread runs in parallel, one per core. That split
is the faster one on the 2-core machines rlkit's tiny model targets: the tiny model's matrix
products are too small for a second intra-op thread to pay, so two runs side by side beat one
run on two threads.

``OUT/sweep.json`` records the spec, its file's sha256 (:func:`spec_sha256`), the commands and
every run (arm, G, seed, directory) for ``rlkit report OUT``; ``OUT/starts.jsonl`` gets a line each
time a run starts or resumes (its key, ``fresh`` or ``resume``, the UTC time and the spec file's
sha256 then), so that ``rlkit report`` can record when each run started and under which spec: a
claim's pre-registration is then checked from the repository (the spec's commit before the first
start), not from the order of commits alone (issue 42). Relative paths (``out``, the run directories) are relative to the directory
the sweep runs in; run ``rlkit report`` from there too.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rlkit.checkpoint import run_progress
from rlkit.claims import Claim, ManipulationCheck, parse_claims, parse_manipulation
from rlkit.config import TrainConfig, load_config, parse_override, read_yaml
from rlkit.machine import fingerprint
from rlkit.metrics import TOKEN_KEYS, read_metrics, tokens_spent
from rlkit.paths import check_dir, check_link
from rlkit.pool import default_workers, run_pool, train_run
from rlkit.rundir import (
    DirLock,
    RunLock,
    clear_run,
    write_atomically,
)
from rlkit.tasks.loader import check_sizes, load_problems, shifted_train_problems

MANIFEST = "sweep.json"
TOKEN_AUDIT = "token_audit.json"  # each run's tokens against the spec's token_budget
STARTS = "starts.jsonl"  # one line per run start or resume (train_sweep_run)
SPEC_KEYS = {
    "name": "optional sweep name (default: the spec file's name)",
    "base": "preset or YAML config every run starts from",
    "out": "directory of the sweep's runs (default runs/sweeps/<name>)",
    "overrides": "key=value overrides shared by every run",
    "arms": "mapping arm name -> list of key=value overrides",
    "group_sizes": "optional list of group sizes G",
    "seeds": "list of integer seeds",
    "baseline": "optional arm the report compares the others against",
    "threads": "torch threads per run",
    "workers": "runs in parallel",
    "claims": "optional list of pre-registered claims that rlkit report tests",
    "manipulation": "optional mapping arm -> list of {metric, acts_if[, of]} checks that it acted",
    "token_budget": "optional: each run stops once its generated tokens, probe's included, reach it",
}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
SEED_MAX = 2**32 - 1  # numpy's seed range (every run seeds random, numpy and torch)


class SweepLock(DirLock):
    """One ``rlkit sweep`` at a time in a sweep's ``out`` directory."""

    NAME = ".sweep.lock"
    KIND = "sweep directory"
    HINT = "another rlkit sweep is running there; wait for it to finish"


@dataclass(frozen=True)
class Run:
    """One run of the grid: its arm, group size, seed and config (``output_dir`` included)."""

    arm: str
    group_size: int
    seed: int
    overrides: tuple[str, ...]
    cfg: TrainConfig = field(compare=False, repr=False)

    @property
    def dir(self) -> Path:
        return Path(self.cfg.output_dir)

    @property
    def key(self) -> str:
        return f"{self.arm}/G{self.group_size}/seed{self.seed}"


@dataclass
class SweepSpec:
    name: str
    base: str
    out: Path
    overrides: list[str]
    arms: dict[str, list[str]]
    group_sizes: list[int] | None
    seeds: list[int]
    baseline: str | None
    threads: int
    workers: int | None
    claims: list[Claim] = field(default_factory=list)
    manipulation: dict[str, list[ManipulationCheck]] = field(default_factory=dict)
    token_budget: int | None = None


def _string_list(key: str, value) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"sweep spec: {key} must be a list of key=value strings, got {value!r}")
    return value


def _int_list(key: str, value, minimum: int, maximum: int | None = None) -> list[int]:
    ok = isinstance(value, list) and value
    if not ok or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"sweep spec: {key} must be a non-empty list of integers, got {value!r}")
    bad = [v for v in value if v < minimum or (maximum is not None and v > maximum)]
    if len(set(value)) != len(value) or bad:
        limits = f">= {minimum}" + ("" if maximum is None else f" and <= {maximum}")
        raise ValueError(
            f"sweep spec: {key} must be distinct integers {limits}, got {value!r}"
            + (f" ({bad[0]} is out of range)" if bad else "")
        )
    return value


def _count(key: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"sweep spec: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def parse_spec(path: str | Path) -> SweepSpec:
    """Read and check a spec file's own keys (the runs' overrides are checked by :func:`plan`)."""
    path = Path(path)
    check_link("sweep spec", path)
    if not path.is_file():
        raise ValueError(f"sweep spec not found: {path}")
    data = read_yaml(str(path))
    unknown = sorted(set(data) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"sweep spec: unknown key {unknown[0]!r}; known keys: {sorted(SPEC_KEYS)}")
    for key in ("base", "arms", "seeds"):
        if key not in data:
            raise ValueError(f"sweep spec: {key} is required ({SPEC_KEYS[key]})")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"sweep spec: name must be letters, digits, _ . + -, got {name!r}")
    arms = data["arms"]
    if not isinstance(arms, dict) or not arms:
        raise ValueError(f"sweep spec: arms must be a non-empty mapping, got {arms!r}")
    for arm, overrides in arms.items():
        if not isinstance(arm, str) or not NAME.fullmatch(arm):
            raise ValueError(f"sweep spec: arm name {arm!r} must be letters, digits, _ . + -")
        _string_list(f"arms.{arm}", overrides if overrides is not None else [])
    baseline = data.get("baseline")
    if baseline is not None and (not isinstance(baseline, str) or baseline not in arms):
        raise ValueError(f"sweep spec: baseline {baseline!r} is not an arm; arms: {list(arms)}")
    if not isinstance(data["base"], str):
        raise ValueError(f"sweep spec: base must be a preset name or path, got {data['base']!r}")
    out = data.get("out", f"runs/sweeps/{name}")
    if not isinstance(out, str) or not out.strip():
        raise ValueError(f"sweep spec: out must be a directory path (a string), got {out!r}")
    sizes = data.get("group_sizes")
    sizes = None if sizes is None else _int_list("group_sizes", sizes, 1)
    workers = data.get("workers")
    budget = data.get("token_budget")
    return SweepSpec(
        name=name,
        base=data["base"],
        out=Path(out),
        overrides=_string_list("overrides", data.get("overrides", [])),
        arms={arm: list(o or []) for arm, o in arms.items()},
        group_sizes=sizes,
        seeds=_int_list("seeds", data["seeds"], 0, SEED_MAX),
        baseline=baseline,
        threads=_count("threads", data.get("threads", 1), 1),
        workers=None if workers is None else _count("workers", workers, 0),
        claims=parse_claims(data.get("claims", []), arms, baseline, sizes, name),
        manipulation=parse_manipulation(data.get("manipulation", {}), arms),
        token_budget=None if budget is None else _count("token_budget", budget, 1),
    )


def _owned_keys(spec: SweepSpec) -> set[str]:
    owned = {"seed", "output_dir"} | ({"rollout.group_size"} if spec.group_sizes else set())
    return owned | ({"token_budget"} if spec.token_budget else set())


def plan(spec: SweepSpec) -> list[Run]:
    """Every run of the grid with its validated config; a bad override is a ValueError naming
    its arm (or ``overrides`` when shared), an ``out`` that cannot hold the runs names ``out``."""
    check_dir("sweep spec: out", spec.out)
    owned = _owned_keys(spec)
    for where, overrides in [("overrides", spec.overrides), *spec.arms.items()]:
        for text in overrides:
            key = ".".join(parse_override(text)[0])
            if key in owned:
                raise ValueError(
                    f"sweep spec: {where}: {key} is set by the sweep itself "
                    f"(seeds, group_sizes, token_budget and out decide it)"
                )
    runs = []
    for arm, arm_overrides in spec.arms.items():
        for g in spec.group_sizes or [None]:
            for seed in spec.seeds:
                common = ["progress=false", "tensorboard=false", *spec.overrides, *arm_overrides]
                common += [f"seed={seed}"] + ([f"rollout.group_size={g}"] if g else [])
                common += [f"token_budget={spec.token_budget}"] if spec.token_budget else []
                try:
                    cfg = load_config(spec.base, common)
                except ValueError as err:
                    raise ValueError(f"sweep spec: arm {arm}: {err}") from None
                g_run = cfg.rollout.group_size
                where = f"output_dir={spec.out / arm / f'G{g_run}' / f'seed{seed}'}"
                overrides = (*common, where)
                runs.append(Run(arm, g_run, seed, overrides, load_config(spec.base, overrides)))
    keys = [r.key for r in runs]
    if len(set(keys)) != len(keys):
        raise ValueError("sweep spec: two runs share a directory")
    check_problems(runs)
    check_shift_claims(spec.claims, runs)
    return runs


def check_shift_claims(claims: list[Claim], runs: list[Run]) -> None:
    """A claim with measure ``shift_dip`` needs a task shift in every run of its two arms: a
    ValueError names the claim and the arm whose runs have no ``task.shift``."""
    for claim in claims:
        if claim.measure != "shift_dip":
            continue
        for arm in (claim.arm, claim.vs):
            if not all(r.cfg.task.shift for r in runs if r.arm == arm):
                raise ValueError(
                    f"sweep spec: claim {claim.name!r} has measure 'shift_dip', but arm {arm}'s "
                    f"runs have no task.shift"
                )


def check_problems(runs: list[Run]) -> None:
    """Every run's problems cover what its config asks of them (the trainer's own check,
    :func:`rlkit.tasks.loader.check_sizes`: training problems, also after its ``task.shift``,
    and held-out ones), so no run fails on its task after others trained; a ValueError names
    the arm."""
    checked = set()
    for run in runs:
        cfg = run.cfg
        key = repr((cfg.task, cfg.rollout.num_prompts, cfg.eval.num_problems))
        if key in checked:
            continue
        checked.add(key)
        train, evaluation = load_problems(cfg.task)
        shifted = shifted_train_problems(cfg.task) if cfg.task.shift else None
        try:
            check_sizes(cfg, evaluation, train, shifted)
        except ValueError as err:
            raise ValueError(f"sweep spec: arm {run.arm}: {err}") from None


def run_status(cfg: TrainConfig) -> str:
    """:func:`rlkit.checkpoint.run_progress` of a grid run: ``done``, ``resume`` or ``fresh``. A
    directory that holds another run is a ValueError naming it: the sweep never replaces what it
    did not write."""
    try:
        return run_progress(cfg)
    except ValueError as err:
        raise ValueError(
            f"run {cfg.output_dir} does not match the sweep spec: {err}. Nothing was changed; "
            "move it away or set another out in the spec"
        ) from None


def spec_sha256(path: str | Path) -> str:
    """The sha256 of a spec file's bytes: what ``sweep.json`` and ``starts.jsonl`` record, and
    what ``git show <commit>:<spec>`` of the pre-registration commit must hash to."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def log_start(starts: Path, key: str, status: str, spec_hash: str, threads: int) -> None:
    """Append one line to the sweep's ``starts.jsonl``: run ``key`` starts (``fresh``) or resumes
    now (UTC), under the spec file with sha256 ``spec_hash``, on the machine
    :func:`rlkit.machine.fingerprint` describes at ``threads`` torch threads (a figure comes back
    exactly only where that matches). One ``write`` of one line in append mode, so the pool's
    workers do not interleave their lines."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    entry = {"run": key, "status": status, "at": now, "spec_sha256": spec_hash}
    line = json.dumps(entry | {"machine": fingerprint(threads)})
    with open(starts, "a") as f:
        f.write(line + "\n")


def train_sweep_run(
    base: str, overrides: list[str], threads: int, key: str, starts: str, spec_hash: str
) -> list[dict]:
    """One run of the grid (a pool job): its status decided again under its run lock, right
    before it trains (another process may have finished or started it since the sweep looked),
    then nothing (done), a resume, or a fresh start that first clears what this run left; a
    start or resume is logged to ``starts`` (:func:`log_start`)."""
    cfg = load_config(base, overrides)
    with RunLock(Path(cfg.output_dir)):
        status = run_status(cfg)
        if status == "fresh":
            clear_run(Path(cfg.output_dir))
    if status == "done":
        return []
    log_start(Path(starts), key, status, spec_hash, threads)
    # no overwrite: if another process wrote there since the lock was released, training refuses
    return train_run(base, overrides, threads, resume=status == "resume")


def write_manifest(spec: SweepSpec, spec_path: Path, runs: list[Run]) -> Path:
    spec.out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "name": spec.name,
        "spec_file": str(spec_path),
        "spec": read_yaml(str(spec_path)),
        "spec_sha256": spec_sha256(spec_path),
        "command": f"rlkit sweep {shlex.quote(str(spec_path))}",
        "baseline": spec.baseline,
        "runs": [
            {"arm": r.arm, "group_size": r.group_size, "seed": r.seed, "dir": str(r.dir)}
            for r in runs
        ],
    }
    path = spec.out / MANIFEST
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"))
    return path


def token_audit(spec: SweepSpec, runs: list[Run]) -> list[dict]:
    """Each run's token count as its ``metrics.jsonl`` logs it at its last step: generated
    (trained on, and discarded by dynamic sampling), probe, their sum, the budget, how far past
    it, and what stopped the run (``token_budget``, ``steps``, or None: unfinished)."""
    audit = []
    for run in runs:
        rows = read_metrics(run.dir) if (run.dir / "metrics.jsonl").is_file() else []
        last = rows[-1] if rows else {"step": 0}
        generated, probe = (int(last.get(key) or 0) for key in TOKEN_KEYS)
        total = tokens_spent(generated, probe)
        stopped = None
        if spec.token_budget and total >= spec.token_budget:
            stopped = "token_budget"
        elif last["step"] == run.cfg.steps:
            stopped = "steps"
        audit.append(
            {
                "run": run.key,
                "dir": str(run.dir),
                "token_budget": spec.token_budget,
                "step": last["step"],
                "tokens_generated": generated,
                "tokens_probe": probe,
                "tokens_total": total,
                "over_budget": total - spec.token_budget if stopped == "token_budget" else 0,
                "stopped_by": stopped,
            }
        )
    return audit


def write_token_audit(spec: SweepSpec, runs: list[Run]) -> Path:
    path = spec.out / TOKEN_AUDIT
    text = json.dumps(token_audit(spec, runs), indent=1) + "\n"
    write_atomically(path, lambda tmp: tmp.write_text(text))
    return path


def run_sweep(
    spec_path: str | Path, progress: bool = True, dry_run: bool = False, workers: int | None = None
) -> dict[str, list[str]]:
    """Check the spec and every run directory, then train what is not finished. Returns the run
    keys by status (``done``, ``resume``, ``fresh``) as found before training."""
    spec_path = Path(spec_path)
    spec = parse_spec(spec_path)
    runs = plan(spec)
    if dry_run:
        return _by_status(runs)
    with SweepLock(spec.out):
        by_status = _by_status(runs)
        write_manifest(spec, spec_path, runs)
        # Seed by seed (every arm and G of a seed before the next seed), so that a sweep stopped
        # part-way leaves complete paired seeds rather than some arms with all seeds and others
        # with none.
        todo = sorted(
            (run for run in runs if run.key not in by_status["done"]),
            key=lambda run: spec.seeds.index(run.seed),
        )
        workers = spec.workers if workers is None else workers
        if workers is None:
            workers = default_workers(len(todo), spec.threads)
        starts, spec_hash = str(spec.out / STARTS), spec_sha256(spec_path)
        run_pool(
            train_sweep_run,
            {
                run.key: (spec.base, list(run.overrides), spec.threads, run.key, starts, spec_hash)
                for run in todo
            },
            workers,
            progress,
            desc=f"sweep {spec.name}",
            initial=len(runs) - len(todo),
            total=len(runs),
        )
        if spec.token_budget:
            write_token_audit(spec, runs)
    return by_status


def _by_status(runs: list[Run]) -> dict[str, list[str]]:
    status = {run.key: run_status(run.cfg) for run in runs}
    return {s: [k for k, v in status.items() if v == s] for s in ("done", "resume", "fresh")}
