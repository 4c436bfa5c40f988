"""Re-run one committed run of a sweep and compare its last evaluation with ``summary.json``.

    rlkit reproduce results/22_ebpo_hard_32 --arm EBPO_G2 --seed 16 [--kernels avx2] [--exact]

The run is rebuilt from the spec the summary names (``preregistration.spec_file``, through
:func:`rlkit.sweep.plan`, so its overrides are the sweep's own) and trained in a subprocess in a
temporary directory, on the spec's thread count. Each of the arm's metrics in the summary is then
one of: ``identical`` (the same float as committed), ``within seed noise`` (it differs by no more
than the standard deviation of that arm's values over the sweep's seeds: on another CPU the run
is another draw of the same experiment, docs/tiny-default.md "Across CPUs"), or ``beyond seed
noise`` (something else changed: the code, the spec, the data). The exit status is 1 when a
metric is beyond seed noise, or, with ``--exact``, when one is not identical.

The re-run uses the CPU kernels the sweep's runs recorded (``kernels`` in their machine,
:func:`rlkit.machine.fingerprint`), ``native`` for a sweep made before rlkit pinned them (every
sweep committed before the pins ran on an AMD EPYC's own AVX2 kernels); ``--kernels`` picks a
mode of :data:`rlkit.machine.KERNEL_MODES` instead: ``avx2`` limits PyTorch's, MKL's and oneDNN's
CPU kernels to AVX2, the closest an Intel CPU with AVX-512 comes to those runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlkit.machine import KERNEL_MODES, KERNEL_VARIABLES, MODE_VARIABLE
from rlkit.metric_names import current_metric_fields
from rlkit.metrics import read_metrics
from rlkit.paths import check_exists


@dataclass
class Comparison:
    """One metric of the re-run against the committed value of the same seed."""

    metric: str
    committed: float
    rerun: float
    seed_sd: float  # standard deviation of the arm's committed values over the sweep's seeds

    @property
    def status(self) -> str:
        if self.rerun == self.committed:
            return "identical"
        if abs(self.rerun - self.committed) <= self.seed_sd:
            return "within seed noise"
        return "beyond seed noise"


def committed_run(results: str | Path, arm: str, seed: int, group_size: int | None = None):
    """(summary, the spec (:class:`rlkit.sweep.SweepSpec`), its :class:`rlkit.sweep.Run` of
    ``arm``/``seed``/``group_size``, and a note when the spec file is not the one the summary was
    made from). A ValueError names what does not exist: the summary, its spec file, the arm, seed
    or group size."""
    from rlkit.sweep import parse_spec, plan, spec_sha256

    results = Path(results)
    check_exists("results folder", results, folder=True)
    check_exists("summary", results / "summary.json", folder=False)
    summary = current_metric_fields(json.loads((results / "summary.json").read_text()))
    pre = summary.get("preregistration") or {}
    spec_file = pre.get("spec_file")
    if not spec_file:
        raise ValueError(f"{results}/summary.json names no spec file (preregistration.spec_file)")
    check_exists(f"spec of {results.name}", spec_file, folder=False)
    spec = parse_spec(spec_file)
    runs = [
        r
        for r in plan(spec)
        if r.arm == arm and r.seed == seed and group_size in (None, r.group_size)
    ]
    if len(runs) != 1:
        arms = sorted({row["arm"] for row in summary["rows"]})
        what = "no run" if not runs else f"{len(runs)} runs (name --group-size)"
        raise ValueError(
            f"{spec_file} has {what} for arm {arm!r}, seed {seed}"
            f"{'' if group_size is None else f', G = {group_size}'}; arms: {arms}"
        )
    recorded = pre.get("spec_sha256")
    changed = (
        f"{spec_file} has changed since the summary was made (sha256 {recorded[:12]}…)"
        if recorded and spec_sha256(spec_file) != recorded
        else None
    )
    return summary, spec, runs[0], changed


def compare(summary: dict, arm: str, seed: int, group_size: int, rows: list[dict]):
    """Each of ``arm``'s summary metrics at ``group_size``: the committed value of ``seed``
    against the last evaluation in ``rows`` (the re-run's ``metrics.jsonl``)."""
    out = []
    for row in summary["rows"]:
        if row["arm"] != arm or row["group_size"] != group_size:
            continue
        values = [r[row["metric"]] for r in rows if r.get(row["metric"]) is not None]
        if not values:
            raise ValueError(f"the re-run logged no {row['metric']}")
        seeds = np.array(list(row["end_by_seed"].values()), float)
        sd = float(seeds.std(ddof=1)) if len(seeds) > 1 else 0.0
        out.append(Comparison(row["metric"], row["end_by_seed"][str(seed)], values[-1], sd))
    return out


def recorded_kernels(summary: dict) -> str:
    """The kernel mode the sweep's runs recorded (one for all), else ``native``: runs recorded
    before the mode was (``machines`` without ``kernels``) or a summary without machines."""
    machines = (summary.get("preregistration") or {}).get("machines") or []
    modes = {m.get("kernels", "native") for m in machines}
    if len(modes) > 1:
        raise ValueError(
            f"the sweep's runs recorded several kernel modes {sorted(modes)}: name one"
        )
    return modes.pop() if modes else "native"


def rerun(base: str, overrides: tuple[str, ...], threads: int, kernels: str, out: Path) -> list:
    """Train ``base`` + ``overrides`` into ``out`` in a subprocess on ``threads`` threads with
    the kernel variables of ``kernels`` (set before torch starts); its metrics rows."""
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env |= KERNEL_MODES[kernels] | {MODE_VARIABLE: kernels}
    overrides = tuple(o for o in overrides if not o.startswith("output_dir="))
    command = [sys.executable, "-m", "rlkit", "train", "--config", base, *overrides]
    subprocess.run([*command, f"output_dir={out}"], env=env, check=True)
    return read_metrics(out)


def reproduce(
    results: str | Path,
    arm: str,
    seed: int,
    group_size: int | None = None,
    kernels: str | None = None,
    exact: bool = False,
) -> int:
    """Re-run and compare (see the module's docstring); prints the table, returns the status."""
    if kernels is not None and kernels not in KERNEL_MODES:
        raise ValueError(f"--kernels must be one of {sorted(KERNEL_MODES)}, got {kernels!r}")
    summary, spec, run, changed = committed_run(results, arm, seed, group_size)
    kernels = kernels or recorded_kernels(summary)
    if changed:
        print(f"warning: {changed}; the re-run uses the file as it is now", flush=True)
    with tempfile.TemporaryDirectory(prefix="rlkit-reproduce-") as tmp:
        rows = rerun(spec.base, run.overrides, spec.threads, kernels, Path(tmp) / "run")
    table = compare(summary, arm, seed, run.group_size, rows)
    print(f"{Path(results).name} {arm} G = {run.group_size} seed {seed}, kernels {kernels}:")
    for c in table:
        print(
            f"  {c.metric}: committed {c.committed:.6f}, re-run {c.rerun:.6f}, "
            f"difference {c.rerun - c.committed:+.6f} (seed sd {c.seed_sd:.4f}): {c.status}"
        )
    bad = [
        c for c in table if c.status != "identical" and (exact or c.status != "within seed noise")
    ]
    return 1 if bad else 0
