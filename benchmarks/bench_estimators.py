"""Micro-benchmark: every advantage estimator on 100,000 groups × G = 8 on the CPU.

Times each registered estimator (plus EBPO with per-cluster priors and AGPO with the robust
dispersions) on the same Bernoulli reward tensor and prints the median wall time over several
repeats after warm-up (rounds interleaved), next to the ratio to a plain
``torch.mean(rewards, dim=1)`` over the same tensor measured in the same rounds. Run from the repository root::

    python benchmarks/bench_estimators.py [--prompts 100000] [--group-size 8] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from rlkit.advantages import ESTIMATORS, get_estimator


def median_ms(
    calls: dict[str, Callable[[], object]], repeats: int, warmup: int
) -> dict[str, float]:
    """Median wall-clock milliseconds of each call over ``repeats`` rounds after ``warmup`` rounds.

    Rounds are interleaved (every call once per round) so that a change in machine load during
    the run affects every call, and their ratios, alike.
    """
    times: dict[str, list[float]] = {label: [] for label in calls}
    for round_ in tqdm(range(warmup + repeats), desc="rounds"):
        for label, call in calls.items():
            start = time.perf_counter()
            call()
            if round_ >= warmup:
                times[label].append(time.perf_counter() - start)
    return {label: 1e3 * statistics.median(t) for label, t in times.items()}


def cases(num_prompts: int, num_clusters: int, seed: int) -> list[tuple[str, Callable]]:
    """(label, estimator call) for every registered estimator and the notable options."""
    g = torch.Generator().manual_seed(seed)
    cluster_ids = torch.randint(0, num_clusters, (num_prompts,), generator=g)
    out = []
    for name in sorted(ESTIMATORS):
        est = get_estimator(name)
        out.append((name, lambda r, est=est: est(r)))
    for kind in ("mad", "iqr"):
        est = get_estimator("agpo", dispersion=kind)
        out.append((f"agpo (dispersion={kind})", lambda r, est=est: est(r)))
    est = get_estimator("ebpo", prior="batch")
    out.append(("ebpo (prior=batch)", lambda r, est=est: est(r)))
    est = get_estimator("ebpo")
    out.append((f"ebpo ({num_clusters} clusters)", lambda r, est=est: est(r, cluster_ids)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100_000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--clusters", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(args.seed)
    success_rate = torch.rand(args.prompts, 1, generator=g)
    rewards = torch.bernoulli(success_rate.expand(args.prompts, args.group_size), generator=g)

    calls = {"torch.mean(rewards, dim=1)": lambda: torch.mean(rewards, dim=1)}
    for label, call in cases(args.prompts, args.clusters, args.seed):
        calls[label] = lambda call=call: call(rewards)
    ms = median_ms(calls, args.repeats, args.warmup)
    baseline = ms["torch.mean(rewards, dim=1)"]

    print(
        f"\n{args.prompts:,} groups × G = {args.group_size} (float32 Bernoulli rewards), "
        f"{torch.get_num_threads()} CPU threads, torch {torch.__version__}, "
        f"median of {args.repeats} after {args.warmup} warm-up runs\n"
    )
    width = max(len(label) for label in ms)
    print(f"{'estimator':<{width}}  {'ms':>9}  {'× torch.mean':>12}")
    for label, value in ms.items():
        print(f"{label:<{width}}  {value:9.2f}  {value / baseline:12.1f}")


if __name__ == "__main__":
    main()
