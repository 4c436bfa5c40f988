"""Step time of each method as a ratio to GRPO, measured side by side in one process.

Arms: GRPO, EBPO, AGPO with each probe (``full`` | ``reuse`` | ``previous``, docs/algorithms.md §3)
and DAPO (clip-higher, dynamic sampling, overlong shaping; docs/algorithms.md §4). Every arm runs
the same ``tiny-cpu`` configuration (same model, seed, prompts per step, G and token budget), so
the differences are what each method adds: a probe's generation, dynamic sampling's extra
batches, AGPO's step-KL forward, the estimators' arithmetic.

One trainer per arm lives in the process. A repetition runs ``--steps`` steps of every arm, the
arms in a rotated order (so a change of machine load does not always hit the same arm); each
arm's time is the median wall time of its steps in that repetition, divided by GRPO's in the same
repetition (wall time, and the process's CPU time, which a busy machine disturbs less). Printed:
the median and range of each ratio over ``--repeats`` repetitions, the tokens trained on (+ probe)
per step as a ratio to GRPO, the generation rounds per step, and the load average during each
repetition. The first ``--warmup`` steps of every arm are not timed.

    python benchmarks/method_overhead.py                    # 5 repetitions × 4 steps
    python benchmarks/method_overhead.py --smoke            # seconds; checks the script runs
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from timing import clock, load_average, median_range, set_threads, since

from rlkit.config import load_config
from rlkit.trainer import Trainer

AGPO = ["algo.method=agpo", "algo.estimator=agpo"]
ARMS = {
    "GRPO": ["algo.estimator=grpo"],
    "EBPO": ["algo.estimator=ebpo"],
    "AGPO probe=full": [*AGPO, "agpo.probe=full"],
    "AGPO probe=reuse": [*AGPO, "agpo.probe=reuse"],
    "AGPO probe=previous": [*AGPO, "agpo.probe=previous"],
    "DAPO": [
        "loss.eps_high=0.28",
        "rollout.dynamic_sampling=true",
        "rollout.overlong_buffer=2",
    ],
}
SMOKE = [
    "rollout.num_prompts=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=3",  # DAPO's overlong buffer (2) must fit
    "task.num_train=16",
    "task.num_eval=4",
]


def build(arm: list[str], run_dir: Path, overrides: list[str]) -> Trainer:
    cfg = load_config(
        "tiny-cpu",
        [
            *arm,
            *overrides,
            f"output_dir={run_dir}",
            "progress=false",
            "tensorboard=false",
        ],
    )
    return Trainer(cfg)


def timed_steps(trainer: Trainer, steps: int) -> tuple[float, float, float, float]:
    """Median wall and CPU seconds of ``steps`` steps, the tokens trained on (plus AGPO's probe
    tokens) per step, and the generation rounds per step (DAPO's dynamic sampling draws more
    rounds; the groups it drops are not counted as tokens)."""
    before = trainer.counters["tokens_generated"] + trainer.counters["tokens_probe"]
    times, rounds = [], []
    for _ in range(steps):
        start = clock()
        metrics = trainer.step()
        times.append(since(start))
        rounds.append(metrics["dapo/gen_batches"])
    after = trainer.counters["tokens_generated"] + trainer.counters["tokens_probe"]
    wall, cpu = zip(*times)
    median = statistics.median
    return median(wall), median(cpu), (after - before) / steps, sum(rounds) / steps


def run(steps: int, repeats: int, warmup: int, overrides: list[str]) -> dict[str, dict]:
    """Per arm: the ratio to GRPO of each repetition, its tokens ratio, and the loads seen."""
    keys = ("seconds", "ratio", "cpu_ratio", "tokens", "rounds")
    results = {name: {k: [] for k in keys} for name in ARMS}
    loads = []
    with tempfile.TemporaryDirectory() as root:
        trainers = {
            name: build(arm, Path(root) / str(i), overrides)
            for i, (name, arm) in enumerate(ARMS.items())
        }
        try:
            for trainer in trainers.values():
                for _ in range(warmup):
                    trainer.step()
            names = list(ARMS)
            for rep in range(repeats):
                shift = rep % len(names)
                measured = {}
                load_before = load_average()
                for name in names[shift:] + names[:shift]:
                    measured[name] = timed_steps(trainers[name], steps)
                loads.append((load_before, load_average()))
                base_s, base_cpu, base_tokens, _ = measured["GRPO"]
                for name, (seconds, cpu, tokens, rounds) in measured.items():
                    results[name]["seconds"].append(seconds)
                    results[name]["ratio"].append(seconds / base_s)
                    results[name]["cpu_ratio"].append(cpu / base_cpu)
                    results[name]["tokens"].append(tokens / max(base_tokens, 1.0))
                    results[name]["rounds"].append(rounds)
        finally:
            for trainer in trainers.values():
                trainer.close()
    return {"arms": results, "loads": loads}


def report(result: dict) -> str:
    lines = [
        f"{'arm':22s} {'wall s/step':>22s} {'wall × GRPO':>22s} {'CPU time × GRPO':>22s} "
        f"{'tokens × GRPO':>14s} {'rounds/step':>12s}   (median [range] over repetitions)"
    ]
    for name, r in result["arms"].items():
        lines.append(
            f"{name:22s} {median_range(r['seconds']):>22s} {median_range(r['ratio']):>22s} "
            f"{median_range(r['cpu_ratio']):>22s} {statistics.median(r['tokens']):14.2f} "
            f"{statistics.mean(r['rounds']):12.2f}"
        )
    loads = ", ".join(f"{a:.2f}→{b:.2f}" for a, b in result["loads"])
    lines.append(f"1-min load average per repetition (start→end): {loads}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps per arm and repetition")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per arm first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, 1 step: checks it runs")
    parser.add_argument("overrides", nargs="*", help="config overrides for every arm (key=value)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    overrides = list(args.overrides)
    if args.smoke:
        args.steps, args.repeats, args.warmup = 1, 2, 0
        overrides = SMOKE + overrides
    result = run(args.steps, args.repeats, args.warmup, overrides)
    print(f"threads={args.threads} steps={args.steps} repeats={args.repeats} overrides={overrides}")
    print(report(result))
    return result


if __name__ == "__main__":
    main()
