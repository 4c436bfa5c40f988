"""``rlkit`` command line: train, eval, plot, demo, presets.

rlkit train                                   # the tiny-cpu preset: no GPU, no download
rlkit train --config qwen3-8b-qlora algo.estimator=ebpo rollout.group_size=4
rlkit train --config my.yaml --resume         # continue from the run's latest checkpoint
rlkit eval --config tiny-cpu [--checkpoint runs/tiny-cpu]
rlkit plot runs/tiny-cpu [runs/other ...] --out curves.png
rlkit demo                                    # GRPO vs EBPO vs AGPO on the built-in task
rlkit build-tiny --out DIR                    # regenerate the shipped tiny warm start
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _train(args) -> None:
    from rlkit.config import load_config
    from rlkit.trainer import Trainer

    cfg = load_config(args.config, args.overrides)
    evals = Trainer(cfg, resume=args.resume).train()
    for row in evals:
        print(json.dumps(row))
    print(f"run saved in {cfg.output_dir}")


def _eval(args) -> None:
    from rlkit.checkpoint import latest_checkpoint
    from rlkit.config import load_config
    from rlkit.trainer import Trainer

    config = args.config
    if args.checkpoint:
        if latest_checkpoint(Path(args.checkpoint)) is None:
            raise ValueError(f"no checkpoint in {args.checkpoint}")
        config = config or str(Path(args.checkpoint) / "config.yaml")
    overrides = [*args.overrides, "tensorboard=false"]
    if args.checkpoint:
        overrides.append(f"output_dir={args.checkpoint}")
    trainer = Trainer(load_config(config or "tiny-cpu", overrides), resume=bool(args.checkpoint))
    print(json.dumps({"step": trainer.step_count, **trainer.evaluate()}))


def _plot(args) -> None:
    from rlkit.plotting import plot_runs

    out = args.out or str(Path(args.run_dirs[0]) / "curves.png")
    print(plot_runs({Path(d).name: d for d in args.run_dirs}, out))


def _demo(args) -> None:
    from rlkit.demo import run_demo

    print(run_demo(args.out, tuple(args.seeds), tuple(args.overrides), workers=args.workers))
    print(f"figure and table in {args.out}")


def _build_tiny(args) -> None:
    from rlkit.models.tiny import build_tiny_policy, weights_digest

    path = build_tiny_policy(out_dir=args.out)
    print(f"{path}  weights sha256 {weights_digest(path)}")


def _presets(args) -> None:
    from rlkit.config import preset_names

    print("\n".join(preset_names()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlkit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")

    train = sub.add_parser("train", help="train a policy")
    train.add_argument(
        "--config", default="tiny-cpu", help="preset name or YAML path (default tiny-cpu)"
    )
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    train.add_argument("overrides", nargs="*", help="key=value overrides, e.g. algo.estimator=ebpo")
    train.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="evaluate a policy (optionally a run's latest checkpoint)")
    ev.add_argument(
        "--config", help="preset or YAML (default: the run's config.yaml, else tiny-cpu)"
    )
    ev.add_argument("--checkpoint", help="run directory whose latest checkpoint to evaluate")
    ev.add_argument("overrides", nargs="*")
    ev.set_defaults(func=_eval)

    plot = sub.add_parser("plot", help="standard curves of one or more runs")
    plot.add_argument("run_dirs", nargs="+")
    plot.add_argument("--out", help="PNG path (default RUN_DIR/curves.png)")
    plot.set_defaults(func=_plot)

    demo = sub.add_parser("demo", help="GRPO vs EBPO vs AGPO on the built-in task (CPU, minutes)")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    demo.add_argument(
        "--workers", type=int, help="parallel single-thread runs (default: one per CPU core)"
    )
    demo.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    demo.set_defaults(func=_demo)

    build = sub.add_parser(
        "build-tiny", help="regenerate the built-in tiny policy (SFT warm start, about a minute)"
    )
    build.add_argument("--out", required=True, help="directory to write (must not exist)")
    build.set_defaults(func=_build_tiny)

    presets = sub.add_parser("presets", help="list the shipped config presets")
    presets.set_defaults(func=_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        args.func(args)
    except ValueError as err:
        print(f"rlkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
