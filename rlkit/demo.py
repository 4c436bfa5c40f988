"""The main job: GRPO vs EBPO vs AGPO on the built-in task, paired seeds, a table and a figure.

Every method starts from the same shipped warm start and trains with the same seeds, so the
per-seed differences are paired. Reported: held-out greedy accuracy and Pass@1 before and after,
each as a mean with a 95% t-interval over seeds, and the paired difference to GRPO.

Runs go to a pool of worker processes, each on one torch thread: one thread fixes the order of
every float reduction, so the table is the same whatever thread count the machine would pick, and
two single-thread runs side by side use two cores better than one run on two threads.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tqdm.auto import tqdm

from rlkit.config import load_config
from rlkit.intervals import format_interval, mean_ci
from rlkit.plotting import plot_runs

METHODS = {
    "GRPO": ["algo.estimator=grpo"],
    "EBPO": ["algo.estimator=ebpo"],
    "AGPO": ["algo.estimator=agpo", "agpo.enabled=true"],
}
METRICS = ("eval/greedy_accuracy", "eval/pass@1")
DEFAULT_SEEDS = (0, 1, 2, 3, 4)


def run_overrides(method: str, seed: int, out_dir: Path, overrides=()) -> list[str]:
    return [
        *METHODS[method],
        f"seed={seed}",
        f"output_dir={out_dir / method / f'seed{seed}'}",
        "progress=false",
        "tensorboard=false",
        *overrides,
    ]


def train_one(overrides: list[str], overwrite: bool = False) -> tuple[dict, dict]:
    """One ``tiny-cpu`` run on one torch thread; (first, last) evaluation rows."""
    import torch

    from rlkit.trainer import Trainer

    torch.set_num_threads(1)
    evals = Trainer(load_config("tiny-cpu", overrides), overwrite=overwrite).train()
    return evals[0], evals[-1]


def run_demo(
    out_dir: str | Path = "runs/demo",
    seeds: tuple[int, ...] = DEFAULT_SEEDS,
    overrides: tuple[str, ...] = (),
    progress: bool = True,
    workers: int | None = None,
    overwrite: bool = False,
) -> str:
    """Train every method on every seed under ``out_dir/METHOD/seedN`` (``overwrite``: replace
    the runs of a previous demo there) and return the summary table."""
    out_dir = Path(out_dir)
    jobs = {(m, s): run_overrides(m, s, out_dir, overrides) for m in METHODS for s in seeds}
    for job in jobs.values():
        load_config("tiny-cpu", job)  # every bad override fails here, before any run starts
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    finished: dict[tuple[str, int], tuple[dict, dict]] = {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(train_one, job, overwrite): key for key, job in jobs.items()}
        bar = tqdm(total=len(futures), desc="demo runs", disable=not progress)
        for future in as_completed(futures):
            finished[futures[future]] = future.result()
            bar.update(1)
        bar.close()
    results = {m: [finished[m, s] for s in seeds] for m in METHODS}
    table = summary_table(results, seeds)
    (out_dir / "summary.md").write_text(table + "\n")
    plot_runs({m: out_dir / m / f"seed{seeds[0]}" for m in METHODS}, out_dir / "curves.png")
    return table


def cell(values, scale: float = 100.0) -> str:
    """``mean [95% CI]`` over seeds, or the single value when there is one seed."""
    if len(values) < 2:
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
    return "\n".join(lines)
