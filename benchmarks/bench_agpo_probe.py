"""Cost of AGPO's probe modes against plain GRPO, measured side by side in one run.

AGPO as published (``probe: full``) samples a whole extra group per prompt before the training
group; ``previous`` reuses the prompt's last training statistics (no extra generation) and
``reuse`` trains on the probe where τ_t = τ_base (docs/algorithms.md §3). For each arm this runs the same
``tiny-cpu`` steps (same seed, same prompts) and prints the median step time, the tokens generated
per step (training + probe) and both as ratios to GRPO.

    python benchmarks/bench_agpo_probe.py --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from rlkit.config import load_config
from rlkit.trainer import Trainer

ARMS = {
    "GRPO (no probe)": ["algo.estimator=grpo"],
    "AGPO probe=full": ["algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=full"],
    "AGPO probe=reuse": ["algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=reuse"],
    "AGPO probe=previous": ["algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=previous"],
}


def measure(overrides: list[str], steps: int) -> tuple[float, float]:
    """Median seconds per step and mean tokens generated per step (training + probe)."""
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = load_config(
            "tiny-cpu",
            [
                *overrides,
                f"output_dir={run_dir}",
                "progress=false",
                "tensorboard=false",
                f"steps={steps}",
            ],
        )
        trainer = Trainer(cfg)
        times = []
        for _ in range(steps):
            m = trainer.step()
            times.append(m["time/generate"] + m["time/score"] + m["time/update"])
        tokens = trainer.counters["tokens_generated"] + trainer.counters["tokens_probe"]
        return statistics.median(times), tokens / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    results = {name: measure(overrides, args.steps) for name, overrides in ARMS.items()}
    base_time, base_tokens = results["GRPO (no probe)"]
    print(f"{'arm':22s} {'s/step':>8s} {'× GRPO':>7s} {'tokens/step':>12s} {'× GRPO':>7s}")
    for name, (seconds, tokens) in results.items():
        print(
            f"{name:22s} {seconds:8.3f} {seconds / base_time:7.2f} {tokens:12.0f} {tokens / base_tokens:7.2f}"
        )


if __name__ == "__main__":
    main()
