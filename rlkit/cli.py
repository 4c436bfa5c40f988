"""``rlkit`` command line: train, eval, plot, demo, presets.

rlkit train                                   # the tiny-cpu preset: no GPU, no download
rlkit train --config qwen3-8b-qlora algo.estimator=ebpo rollout.group_size=4
rlkit train algo.method=ppo                   # the method: grpo (default) | agpo | ppo | dpo
rlkit train --resume output_dir=runs/my-run    # continue from the run's latest checkpoint
rlkit train --config my.yaml --overwrite       # replace the run in my.yaml's output_dir
rlkit eval --config tiny-cpu [--checkpoint runs/tiny-cpu]
rlkit plan --config qwen3-8b-qlora --gpu-mem 24   # peak GPU memory per phase, without loading
rlkit plot runs/tiny-cpu [runs/other ...] --out curves.png
rlkit demo                                    # GRPO vs EBPO vs AGPO on the built-in task
rlkit sweep sweeps/SPEC.yaml                  # a resumable grid of runs (rlkit/sweep.py)
rlkit report runs/sweeps/NAME                 # tables, figures, results/NAME/summary.*
rlkit figures results/NAME [...]              # redraw curves.png, dynamics.png from summary.json
rlkit verdicts [--check]                      # docs/results.md's pre-registered verdicts table
rlkit reproduce results/NAME --arm A --seed S # re-run one committed run, compare its figures
rlkit build-tiny --out DIR                    # regenerate the shipped tiny warm start
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlkit import show_warnings_plainly


def _train(args) -> None:
    from rlkit.config import load_config
    from rlkit.rundir import saved_config
    from rlkit.tis import SamplerDivergenceError
    from rlkit.trainer import Trainer
    from rlkit.update import NonFiniteError

    if args.resume and args.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    cfg = load_config(args.config or "tiny-cpu", args.overrides)
    if args.resume and args.config is None:  # the run's own config.yaml, plus the overrides
        cfg = saved_config(Path(cfg.output_dir), args.overrides)
    _check_gpu_memory(cfg)
    try:
        trainer = Trainer(cfg, resume=args.resume, overwrite=args.overwrite)
        evals = trainer.train()
    except (NonFiniteError, SamplerDivergenceError) as err:  # a clear stop, not a crash
        raise ValueError(str(err)) from None
    if trainer.dist.rank:  # several processes (torchrun): rank 0 reports
        return
    for row in evals:
        print(json.dumps(row))
    print(f"run saved in {cfg.output_dir}")


def _check_gpu_memory(cfg) -> None:
    """On a CUDA device, refuse a config whose memory plan does not fit the GPU (nothing is
    loaded yet)."""
    import torch

    from rlkit.config import BUILTIN_MODEL

    if cfg.model.name_or_path == BUILTIN_MODEL or cfg.model.torch_device.type != "cuda":
        return
    from rlkit.dist import launched_world
    from rlkit.plan import build_plan, check_fits, resolve_for_device

    device = cfg.model.torch_device
    world = launched_world()  # torchrun: each process's share
    sized, _ = resolve_for_device(cfg, world)  # auto batch sizes as the trainer resolves them
    check_fits(
        build_plan(sized, world=world), torch.cuda.get_device_properties(device).total_memory
    )


def _plan(args) -> None:
    from rlkit.config import load_config
    from rlkit.dist import check_world
    from rlkit.plan import (
        DEFAULT_HEADROOM,
        GIB,
        build_plan,
        check_gpu_mem,
        format_plan,
        resolve_batch_sizes,
    )

    if args.headroom is not None and args.gpu_mem is None:
        raise ValueError("--headroom needs --gpu-mem (it is the share of that memory kept free)")
    headroom = DEFAULT_HEADROOM if args.headroom is None else args.headroom
    gpu_bytes = None
    if args.gpu_mem is not None:
        check_gpu_mem(args.gpu_mem)
        gpu_bytes = args.gpu_mem * GIB
    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
    cfg = load_config(args.config, args.overrides)
    check_world(cfg, args.nproc)
    cfg, notes = resolve_batch_sizes(cfg, gpu_bytes, args.prompt_tokens, headroom, args.nproc)
    for note in notes:
        print(note)
    plan = build_plan(cfg, args.prompt_tokens, args.nproc)
    print(format_plan(plan, args.gpu_mem, headroom))


def _eval(args) -> None:
    from rlkit.checkpoint import latest_checkpoint
    from rlkit.config import expand_path, load_config
    from rlkit.paths import check_link
    from rlkit.rundir import saved_config
    from rlkit.trainer import Trainer
    from rlkit.update import NonFiniteError

    overrides = [*args.overrides, "tensorboard=false"]
    run_dir = Path(expand_path("--checkpoint", args.checkpoint)) if args.checkpoint else None
    if run_dir is not None:
        check_link("--checkpoint", run_dir)
        if latest_checkpoint(run_dir) is None:
            raise ValueError(f"no checkpoint in {run_dir}")
    if run_dir is not None and not args.config:
        cfg = saved_config(run_dir, overrides)  # trust_remote_code only from the command line
    else:
        where = [f"output_dir={run_dir}"] if run_dir is not None else []
        cfg = load_config(args.config or "tiny-cpu", [*overrides, *where])
    trainer = Trainer(cfg, resume=run_dir is not None, read_only=True)
    try:
        print(json.dumps({"step": trainer.step_count, **trainer.evaluate()}))
    except NonFiniteError as err:  # a broken policy: one clear line, as in train
        raise ValueError(str(err)) from None
    finally:
        trainer.close()


def _plot(args) -> None:
    from rlkit.paths import check_file
    from rlkit.plotting import plot_runs, unique_labels

    labels = unique_labels(args.run_dirs)
    out = args.out or str(Path(args.run_dirs[0]) / "curves.png")
    check_file("--out" if args.out else "--out (default)", out)
    print(plot_runs(labels, out))


def _demo(args) -> None:
    from rlkit.config import expand_path
    from rlkit.demo import run_demo
    from rlkit.paths import check_dir

    repeated = sorted({s for s in args.seeds if args.seeds.count(s) > 1})
    if repeated:  # one run directory per seed: a repeat would count one run twice
        raise ValueError(f"--seeds lists seed {repeated[0]} more than once")
    out = expand_path("--out", args.out)
    check_dir("--out", out)
    try:
        table = run_demo(
            out,
            tuple(args.seeds),
            tuple(args.overrides),
            workers=args.workers,
            overwrite=args.overwrite,
            threads=args.threads,
        )
    except RuntimeError as err:  # some runs failed; the others finished and are kept
        raise SystemExit(f"rlkit demo: error: {err}") from None
    print(table)
    print(f"figure and table in {out}")


def _sweep(args) -> None:
    from rlkit.sweep import run_sweep

    try:
        found = run_sweep(args.spec, dry_run=args.dry_run, workers=args.workers)
    except RuntimeError as err:  # some runs failed; the others finished and are kept
        raise SystemExit(f"rlkit sweep: error: {err}\n(rerun the same command to resume)") from None
    print(", ".join(f"{len(keys)} {status}" for status, keys in found.items()))
    if args.dry_run:
        for status, keys in found.items():
            print("\n".join(f"{status:6} {key}" for key in keys))


def _report(args) -> None:
    from rlkit.report import write_report

    print(write_report(args.sweep_dir, args.results, args.metric))


def _figures(args) -> None:
    from rlkit.report import redraw_figures

    for results_dir in args.results_dirs:
        print("\n".join(str(path) for path in redraw_figures(results_dir)))


def _verdicts(args) -> None:
    from rlkit.verdicts import stale_line, write

    if args.check:
        stale = stale_line(args.page, args.results)
        if stale:
            raise SystemExit(f"rlkit verdicts: stale: {stale}")
        print(f"{args.page}: the verdict table matches {args.results}/*/summary.json")
    elif write(args.page, args.results):
        print(f"{args.page}: verdict table regenerated from {args.results}/*/summary.json")
    else:
        print(f"{args.page}: verdict table already up to date")


def _reproduce(args) -> None:
    from rlkit.reproduce import reproduce

    status = reproduce(
        args.results_dir, args.arm, args.seed, args.group_size, args.kernels, args.exact
    )
    if status:
        raise SystemExit(
            "rlkit reproduce: a figure differs "
            + ("from the committed one" if args.exact else "by more than the seeds' spread")
        )


def _build_tiny(args) -> None:
    from rlkit.models.tiny import build_tiny_policy, weights_digest
    from rlkit.paths import check_dir

    check_dir("--out", args.out)
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
        "--config",
        help="preset name or YAML path (default tiny-cpu; with --resume, the run's config.yaml)",
    )
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in output_dir from its latest intact checkpoint, with its saved "
        "config (only steps, checkpoint/eval cadence and logging may change)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a non-empty output_dir, replacing the previous run's files",
    )
    train.add_argument(
        "overrides",
        nargs="*",
        help="key=value overrides, e.g. algo.method=agpo algo.estimator=ebpo",
    )
    train.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="evaluate a policy (optionally a run's latest checkpoint)")
    ev.add_argument(
        "--config", help="preset or YAML (default: the run's config.yaml, else tiny-cpu)"
    )
    ev.add_argument("--checkpoint", help="run directory whose latest checkpoint to evaluate")
    ev.add_argument("overrides", nargs="*")
    ev.set_defaults(func=_eval)

    plan = sub.add_parser("plan", help="peak GPU memory of each phase, without loading weights")
    plan.add_argument("--config", default="qwen3-8b-qlora", help="preset name or YAML path")
    plan.add_argument("--gpu-mem", type=float, help="GPU memory in GiB: print the largest chunks")
    plan.add_argument("--prompt-tokens", type=int, default=512, help="assumed prompt length")
    plan.add_argument(
        "--nproc", type=int, default=1, help="processes (torchrun): plan one process's share"
    )
    plan.add_argument(
        "--headroom", type=float, help="fraction of --gpu-mem kept free, in [0, 1) (default 0.1)"
    )
    plan.add_argument("overrides", nargs="*", help="key=value overrides")
    plan.set_defaults(func=_plan)

    plot = sub.add_parser("plot", help="standard curves of one or more runs")
    plot.add_argument("run_dirs", nargs="+")
    plot.add_argument("--out", help="PNG path (default RUN_DIR/curves.png)")
    plot.set_defaults(func=_plot)

    demo = sub.add_parser("demo", help="GRPO vs EBPO vs AGPO on the built-in task (CPU, minutes)")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    demo.add_argument("--workers", type=int, help="runs in parallel (default: CPU cores / threads)")
    demo.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    demo.add_argument("--overwrite", action="store_true", help="replace a previous demo's runs")
    demo.add_argument("overrides", nargs="*", help="key=value overrides applied to every run")
    demo.set_defaults(func=_demo)

    sweep = sub.add_parser("sweep", help="run (or finish) a grid of runs from a spec file")
    sweep.add_argument("spec", help="sweep spec YAML (see rlkit/sweep.py)")
    sweep.add_argument("--dry-run", action="store_true", help="check the spec, list run status")
    sweep.add_argument("--workers", type=int, help="runs in parallel (default: the spec's)")
    sweep.set_defaults(func=_sweep)

    report = sub.add_parser("report", help="tables and figures of a sweep (rlkit/report.py)")
    report.add_argument("sweep_dir", help="the sweep's out directory (holds sweep.json)")
    report.add_argument("--results", default="results", help="where results/<sweep>/ goes")
    report.add_argument(
        "--metric", default="eval/greedy_accuracy", help="metric of the MDD and the figure"
    )
    report.set_defaults(func=_report)

    figures = sub.add_parser(
        "figures", help="redraw curves.png and dynamics.png of results/<sweep>/ from summary.json"
    )
    figures.add_argument("results_dirs", nargs="+", help="folders of summary.json (results/NAME)")
    figures.set_defaults(func=_figures)

    verdicts = sub.add_parser(
        "verdicts",
        help="write docs/results.md's table of pre-registered verdicts (rlkit/verdicts.py)",
    )
    verdicts.add_argument("--results", default="results", help="folder of <sweep>/summary.json")
    verdicts.add_argument(
        "--page",
        "--readme",
        dest="page",
        default="docs/results.md",
        help="file with the table's markers (--readme: its former name)",
    )
    verdicts.add_argument(
        "--check", action="store_true", help="write nothing; fail if the table is stale"
    )
    verdicts.set_defaults(func=_verdicts)

    rep = sub.add_parser(
        "reproduce", help="re-run one committed run of a sweep and compare it with summary.json"
    )
    rep.add_argument("results_dir", help="results/NAME (its summary.json names the spec)")
    rep.add_argument("--arm", required=True)
    rep.add_argument("--seed", type=int, required=True)
    rep.add_argument("--group-size", type=int, help="needed where the sweep has several")
    rep.add_argument(
        "--kernels",
        choices=["native", "avx2", "portable"],
        help="the CPU kernels of the re-run (rlkit.machine.KERNEL_MODES; default: those the "
        "sweep's runs recorded, native before they recorded any); avx2: PyTorch's, MKL's and "
        "oneDNN's limited to AVX2",
    )
    rep.add_argument("--exact", action="store_true", help="fail unless every figure is identical")
    rep.set_defaults(func=_reproduce)

    build = sub.add_parser(
        "build-tiny", help="regenerate the built-in tiny policy (SFT warm start, about a minute)"
    )
    build.add_argument(
        "--out", required=True, help="directory to write (a finished build there is kept)"
    )
    build.set_defaults(func=_build_tiny)

    presets = sub.add_parser("presets", help="list the shipped config presets")
    presets.set_defaults(func=_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    show_warnings_plainly()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow a flag (`train --overwrite steps=2 … output_dir=x --resume`)
    if extra and hasattr(args, "overrides") and all("=" in a and a[0] != "-" for a in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
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
