"""What rlkit's portable CPU kernels cost: a short run of a preset under each kernel mode.

A kernel mode (:data:`rlkit.machine.KERNEL_MODES`) is fixed when a process first runs a tensor
operation, so each run is a fresh ``rlkit train`` process (``RLKIT_CPU_KERNELS`` set, the other
kernel variables cleared). A repetition runs every mode once, in a rotated order; each mode's
CPU seconds (user + system of the finished child, start-up and model loading included) are
divided by ``native``'s in the same repetition. Printed: the median and range of each ratio over
``--repeats`` repetitions, the absolute CPU seconds, the load average, and whether the modes'
metrics came out identical (``time/*`` aside) — on a CPU with AVX-512, ``native`` differs.

    python benchmarks/cpu_kernels.py                 # 5 repetitions × 12 steps, one thread
    python benchmarks/cpu_kernels.py --smoke         # seconds; checks the script runs
    python benchmarks/cpu_kernels.py --config smollm2-cpu --modes portable --steps 1 ...

``--config`` names another preset (a real model: ``smollm2-cpu``), ``--modes`` the modes timed
beside ``native`` (comma-separated), and any ``key=value`` after the options overrides every run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import load_average, median_range

from rlkit.machine import KERNEL_MODES, KERNEL_VARIABLES, MODE_VARIABLE

MODES = ["native", "portable", "avx2"]


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train(
    mode: str, config: str, steps: int, problems: int, extra: list[str], out: Path
) -> tuple[float, list[dict]]:
    """CPU seconds of one ``rlkit train --config config`` run under ``mode`` (``extra``: more
    overrides), and its metrics without time/*."""
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    env |= {MODE_VARIABLE: mode, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    overrides = [
        f"steps={steps}",
        f"eval.every={steps}",
        f"eval.num_problems={problems}",
        "checkpoint_every=0",
        f"output_dir={out}",
        *extra,
    ]
    before = child_cpu()
    command = [sys.executable, "-m", "rlkit", "train", "--config", config, "--overwrite"]
    command += overrides
    subprocess.run(command, env=env, check=True, capture_output=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    kept = [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]
    return child_cpu() - before, kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--problems", type=int, default=128, help="evaluation problems")
    parser.add_argument("--config", default="tiny-cpu", help="preset or YAML file")
    parser.add_argument(
        "--modes",
        type=lambda text: text.split(","),
        default=MODES,
        help=f"comma-separated, of {','.join(MODES)} (native is always timed)",
    )
    parser.add_argument("--smoke", action="store_true", help="1 repetition of 2 steps")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of every run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.steps, args.problems = 1, 2, 16
    assert set(MODES) == set(KERNEL_MODES)
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; known: {MODES}")
    modes = ["native", *(m for m in MODES if m in args.modes and m != "native")]
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    ratios: dict[str, list[float]] = {m: [] for m in modes if m != "native"}
    metrics: dict[str, list[dict]] = {}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            seconds = {}
            for mode in order:
                seconds[mode], metrics[mode] = train(
                    mode, args.config, args.steps, args.problems, args.overrides, Path(tmp) / mode
                )
                cpu[mode].append(seconds[mode])
            for mode in ratios:
                ratios[mode].append(seconds[mode] / seconds["native"])
            loads.append(load_average())
    print(
        f"{' '.join([args.config, *args.overrides])}, {args.steps} steps, "
        f"{args.problems} eval problems, one thread, "
        f"{args.repeats} repetitions; load average {median_range(loads)}"
    )
    for mode in modes:
        print(f"  {mode:9s} CPU s {median_range(cpu[mode])}")
    for mode, values in ratios.items():
        same = "identical" if metrics[mode] == metrics["native"] else "different"
        print(f"  {mode}/native CPU time {median_range(values)}; metrics {same} to native's")
        print(f"  median ratio {mode}/native: {statistics.median(values):.3f}")
    if {"portable", "avx2"} <= set(modes):
        same = metrics["portable"] == metrics["avx2"]
        print(f"  portable vs avx2 metrics: {'identical' if same else 'different'}")


if __name__ == "__main__":
    main()
