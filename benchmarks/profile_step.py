"""Where an rlkit step spends its time: torch.profiler over a few steps at a vs_trl shape.

Prints the operators by total CPU time, with the step's phases (``rlkit.phases``: ``PHASE_generate``
with ``PHASE_score`` inside, ``PHASE_update`` with ``PHASE_old``, ``PHASE_reference``,
``PHASE_train``, ``PHASE_check_finite`` and, with AGPO, ``PHASE_step_kl`` inside) as labelled
ranges, through a phase hook, so the per-phase split and per-operator call counts can be read off
one table.

    python benchmarks/profile_step.py --shape tiny
    python benchmarks/profile_step.py --shape llama11m --steps 1 algo.method=agpo algo.estimator=agpo
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from timing import set_threads
from torch.profiler import ProfilerActivity, profile, record_function
from vs_trl import SHAPES, model_dir, rlkit_config

from rlkit.trainer import Trainer


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=40, help="operators printed")
    parser.add_argument("--cache", default=os.environ.get("RLKIT_CACHE", ".cache/bench"))
    parser.add_argument("overrides", nargs="*", help="rlkit config overrides (key=value)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    shape = SHAPES[args.shape]
    path = model_dir(shape.model, Path(args.cache))
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = Trainer(rlkit_config(path, shape, Path(out_dir), args.overrides))
        trainer.phases.add_hook(lambda name: record_function(f"PHASE_{name}"))
        try:
            for _ in range(args.warmup):
                trainer.step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    trainer.step()
        finally:
            trainer.close()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=args.rows)
    print(f"shape {args.shape}, {args.steps} profiled step(s), {args.threads} thread(s)")
    print(table)
    return table


if __name__ == "__main__":
    main()
