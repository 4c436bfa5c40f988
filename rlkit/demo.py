"""The main job: GRPO vs EBPO vs AGPO on the built-in task, paired seeds, a table and a figure.

Every method starts from the same shipped warm start and trains with the same seeds, so the
per-seed differences are paired. Reported: held-out greedy accuracy and Pass@1 before and after,
each as a mean with a 95% t-interval over seeds, and the paired difference to GRPO.

Runs go to a pool of worker processes, each on one torch thread by default (:mod:`rlkit.pool`
says why); ``threads`` (``rlkit demo --threads 2 --workers 1``) reruns the table at another
thread count.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.config import load_config
from rlkit.intervals import (
    format_interval,
    mean_ci,
    minimum_detectable_difference,
    paired_difference,
)
from rlkit.plotting import plot_runs
from rlkit.pool import default_workers, run_pool, train_run
from rlkit.rundir import check_fresh

# The update schedule, the same for every method: 4 optimizer steps per batch (mini-batches of 64
# of the 32 prompts x G = 8 = 256 rows). With one mini-batch the only update is at the sampling
# policy, where the ratio is 1 and no clip radius, AGPO's adaptive one or GRPO's fixed one, acts
# (docs/algorithms.md §4, "When the clip acts"). The learning rate is GRPO's best for this
# schedule under the rule that sweeps/demo_lr.yaml fixed before it ran: the highest mean end
# greedy accuracy over 3 seeds, 1e-5 (89.0) over 3e-5 (87.6) and 1e-4 (80.8); results/demo_lr.
SCHEDULE = ("optim.mini_batch_size=64", "optim.lr=1.0e-5")
METHODS = {
    "GRPO": ["algo.estimator=grpo"],
    "EBPO": ["algo.estimator=ebpo"],
    "AGPO": ["algo.method=agpo", "algo.estimator=agpo"],
}
METRICS = ("eval/greedy_accuracy", "eval/pass@1")
DEFAULT_SEEDS = (0, 1, 2, 3, 4)


def run_overrides(method: str, seed: int, out_dir: Path, overrides=()) -> list[str]:
    return [
        *SCHEDULE,
        *METHODS[method],
        f"seed={seed}",
        f"output_dir={out_dir / method / f'seed{seed}'}",
        "progress=false",
        "tensorboard=false",
        *overrides,
    ]


def run_demo(
    out_dir: str | Path = "runs/demo",
    seeds: tuple[int, ...] = DEFAULT_SEEDS,
    overrides: tuple[str, ...] = (),
    progress: bool = True,
    workers: int | None = None,
    overwrite: bool = False,
    threads: int = 1,
) -> str:
    """Train every method on every seed under ``out_dir/METHOD/seedN`` (``overwrite``: replace
    the runs of a previous demo there) and return the summary table."""
    out_dir = Path(out_dir)
    jobs = {(m, s): run_overrides(m, s, out_dir, overrides) for m in METHODS for s in seeds}
    for job in jobs.values():
        load_config("tiny-cpu", job)  # every bad override fails here, before any run starts
    if threads < 1 or (workers is not None and workers < 1):
        raise ValueError(f"threads and workers must be >= 1, got {threads} and {workers}")
    for method, seed in jobs:  # a previous demo's runs fail here, before any run starts
        run_dir = out_dir / method / f"seed{seed}"
        if run_dir.is_dir():
            check_fresh(run_dir, overwrite)
    workers = workers or default_workers(len(jobs), threads)
    pool_jobs = {key: ("tiny-cpu", job, threads, False, overwrite) for key, job in jobs.items()}
    evals = run_pool(train_run, pool_jobs, workers, progress, desc="demo runs")
    finished = {key: (rows[0], rows[-1]) for key, rows in evals.items()}
    results = {m: [finished[m, s] for s in seeds] for m in METHODS}
    table = summary_table(results, seeds)
    (out_dir / "summary.md").write_text(table + "\n")
    plot_runs({m: out_dir / m / f"seed{seeds[0]}" for m in METHODS}, out_dir / "curves.png")
    return table


def cell(values, scale: float = 100.0) -> str:
    """``mean [95% CI]`` over seeds, or the single value when there is one (or all are equal)."""
    if len(set(values)) < 2:
        return f"{values[0] * scale:.1f}"
    return format_interval(mean_ci(values), scale)


def summary_table(results: dict[str, list[tuple[dict, dict]]], seeds) -> str:
    """Markdown table: start → end (mean [95% CI]) per metric, and the paired Δ to GRPO."""
    lines = [
        f"Held-out accuracy (%), mean [95% CI] over seeds {list(seeds)}; Δ = end − start per seed;"
        " 'vs GRPO' = paired difference of the end values (same seeds).",
        "",
        "| method | greedy start | greedy end | greedy Δ | greedy vs GRPO "
        "| pass@1 start | pass@1 end | pass@1 Δ | pass@1 vs GRPO |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = results.get("GRPO")
    for method, runs in results.items():
        start = {m: [s[m] for s, _ in runs] for m in METRICS}
        end = {m: [e[m] for _, e in runs] for m in METRICS}
        delta = {m: cell([e - s for e, s in zip(end[m], start[m])]) for m in METRICS}
        vs = {m: "—" for m in METRICS}
        if base is not None and method != "GRPO":
            vs = {
                m: cell([a - b for a, b in zip(end[m], [e[m] for _, e in base])]) for m in METRICS
            }
        row = [method]
        for m in METRICS:
            row += [cell(start[m]), cell(end[m]), delta[m], vs[m]]
        lines.append("| " + " | ".join(row) + " |")
    if base is not None and len(seeds) > 1:
        lines += ["", detectable_differences(results, base, len(seeds))]
    return "\n".join(lines)


def detectable_differences(results, base, num_seeds: int) -> str:
    """The smallest true paired difference to GRPO these seeds would detect (95%, power 0.8),
    from the seed-to-seed spread of each method's differences."""
    parts = []
    for method, runs in results.items():
        if method == "GRPO":
            continue
        mdd = [
            minimum_detectable_difference(
                paired_difference([e[m] for _, e in runs], [e[m] for _, e in base]), num_seeds
            )
            for m in METRICS
        ]
        parts.append(f"{method} {mdd[0] * 100:.1f} greedy / {mdd[1] * 100:.1f} pass@1")
    return (
        f"Minimum detectable paired difference to GRPO (95%, power 0.8, {num_seeds} seeds), "
        f"in points: {'; '.join(parts)}."
    )
