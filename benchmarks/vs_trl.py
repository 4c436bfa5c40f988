"""rlkit vs TRL's ``GRPOTrainer`` on the same work: completions per second, side by side.

Both trainers get the same model directory, the same prompt set (rlkit's arithmetic training
split), the same reward (rlkit's ``exact_match``), G, token budget and sampling (T = 1, no top-k /
top-p), β = 0, one epoch over one mini-batch (P·G completions per optimizer step), token-mean loss
(TRL ``loss_type="dapo"``), ε = 0.2, and the same optimizer (AdamW, lr 3e-5, betas (0.9, 0.999),
no weight decay, constant schedule, grad-norm clip 1.0), float32 on the CPU, no gradient
checkpointing (TRL's defaults, bf16 and checkpointing, are turned off to match).

Each measurement is a fresh Python process (``--child``) that builds its trainer, runs
``--warmup`` untimed steps, then ``--steps`` timed steps; its rate is P·G / (median step time). The
two trainers alternate, the first one switching every repetition, ``--repeats`` times each;
printed: each trainer's median and range, the ratio rlkit / TRL per repetition (median and
range) and the 1-minute load average around every run. ``--variant KEY=VALUE`` adds a third arm in
the same alternation, rlkit with that override on top. The load matters: on a shared machine,
numbers taken while the load exceeds the cores in use are not comparable.

Shapes (``--shape``): ``tiny`` is the built-in default (the shipped 0.2M-param warm start,
32 prompts × G = 8, 8 new tokens); ``llama11m`` is a random 11M-param Llama built locally (no hub)
with rlkit's character tokenizer, 8 prompts × G = 8, 32 new tokens.

    pip install -e '.[bench]'
    python benchmarks/vs_trl.py --shape tiny --repeats 3
    python benchmarks/vs_trl.py --shape llama11m --repeats 3
    python benchmarks/vs_trl.py --shape tiny --variant optim.share_prompt_forward=false  # 3 arms
    python benchmarks/vs_trl.py --smoke        # seconds; checks that every arm runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from timing import clock, load_average, median_range, set_threads, since

LR = 3e-5
EPS = 0.2
SEED = 0


@dataclass
class Shape:
    prompts: int
    group_size: int
    new_tokens: int
    model: str  # "builtin" or "llama11m"


SHAPES = {
    "tiny": Shape(32, 8, 8, "builtin"),
    "llama11m": Shape(8, 8, 32, "llama11m"),
    "smoke": Shape(2, 2, 2, "builtin"),
}


def model_dir(kind: str, cache: Path) -> Path:
    """The model directory for ``kind``: the shipped tiny policy, or a random 11M-param Llama
    (6 layers, width 384, MLP 1024) with the same tokenizer, built once into ``cache``."""
    from rlkit.models.tiny import shipped_tiny_policy

    builtin = shipped_tiny_policy()
    if kind == "builtin":
        return builtin
    path = cache / "llama11m"
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(builtin)
    base = LlamaConfig.from_pretrained(builtin)
    config = LlamaConfig(
        vocab_size=base.vocab_size,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=6,
        max_position_embeddings=256,
        pad_token_id=base.pad_token_id,
        bos_token_id=base.bos_token_id,
        eos_token_id=base.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train_problems():
    from rlkit.config import load_config
    from rlkit.tasks.loader import load_problems

    return load_problems(load_config("tiny-cpu").task)[0]


def rlkit_config(path: Path, shape: Shape, out_dir: Path, overrides=()):
    """rlkit's side of the comparison (``tiny-cpu`` with the shared settings)."""
    from rlkit.config import load_config

    return load_config(
        "tiny-cpu",
        [
            f"model.name_or_path={path}",
            f"output_dir={out_dir}",
            f"seed={SEED}",
            f"rollout.num_prompts={shape.prompts}",
            f"rollout.group_size={shape.group_size}",
            f"rollout.max_new_tokens={shape.new_tokens}",
            "rollout.temperature=1.0",
            "loss.kl_coef=0",
            "loss.loss_agg=token-mean",
            f"loss.eps_low={EPS}",
            f"loss.eps_high={EPS}",
            f"optim.lr={LR}",
            "optim.update_epochs=1",
            "optim.mini_batch_size=0",
            "progress=false",
            "tensorboard=false",
            *overrides,
        ],
    )


def run_rlkit(path: Path, shape: Shape, steps: int, warmup: int, out_dir: Path, overrides) -> list:
    from rlkit.trainer import Trainer

    trainer = Trainer(rlkit_config(path, shape, out_dir, overrides))
    times = []
    try:
        for i in range(warmup + steps):
            start = clock()
            trainer.step()
            if i >= warmup:
                times.append(since(start))
    finally:
        trainer.close()
    return times


def run_trl(path: Path, shape: Shape, steps: int, warmup: int, out_dir: Path) -> list:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlkit.rewards import get_reward_fn

    exact_match = get_reward_fn("exact_match")
    problems = train_problems()
    dataset = Dataset.from_dict(
        {"prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems]}
    )

    def reward(completions, answer, **kwargs):
        return [exact_match(c, a) for c, a in zip(completions, answer)]

    rows = shape.prompts * shape.group_size
    args = GRPOConfig(
        output_dir=str(out_dir),
        seed=SEED,
        use_cpu=True,
        bf16=False,  # TRL defaults to bf16 and to gradient checkpointing; rlkit runs float32
        gradient_checkpointing=False,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=shape.group_size,
        max_completion_length=shape.new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        epsilon=EPS,
        scale_rewards="group",
        learning_rate=LR,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        max_steps=warmup + steps,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    ends = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if not ends:
                ends.append(clock())

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(clock())

    trainer = GRPOTrainer(
        model=str(path),
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(path),
        callbacks=[StepClock()],
    )
    trainer.train()
    times = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(ends, ends[1:])]
    return times[warmup:]


def child(args) -> None:
    """One measurement in this (fresh) process; prints one JSON line."""
    set_threads(args.threads)
    shape = SHAPES[args.shape]
    path = model_dir(shape.model, Path(args.cache))
    run = run_rlkit if args.child == "rlkit" else run_trl
    load_before = load_average()
    with tempfile.TemporaryDirectory() as out_dir:
        extra = (args.rlkit,) if args.child == "rlkit" else ()
        times = run(path, shape, args.steps, args.warmup, Path(out_dir), *extra)
    wall, cpu = zip(*times)
    rows = shape.prompts * shape.group_size
    print(
        json.dumps(
            {
                "trainer": args.child,
                "step_s": wall,
                "step_cpu_s": cpu,
                "completions_per_s": rows / statistics.median(wall),
                "completions_per_cpu_s": rows / statistics.median(cpu),
                "load": [load_before, load_average()],
            }
        )
    )


def measure(name: str, args, cache: Path, overrides: list[str]) -> dict:
    command = [sys.executable, __file__, "--child", name, "--shape", args.shape]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    command += ["--threads", str(args.threads), "--cache", str(cache)]
    command += [f"--rlkit={override}" for override in overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{name} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# each rlkit arm's key prefix for its per-repetition ratios to TRL in the result
RATIO_PREFIX = {"rlkit": "ratio", "rlkit+": "ratio_variant"}


def arms(args) -> dict[str, list[str] | None]:
    """The runs to alternate: rlkit (with ``--rlkit`` overrides), TRL, and with ``--variant``
    a second rlkit arm, ``rlkit+``, with those overrides on top."""
    out = {"rlkit": list(args.rlkit), "trl": None}
    if args.variant:
        out["rlkit+"] = [*args.rlkit, *args.variant]
    return out


def compare(args) -> dict:
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    model_dir(SHAPES[args.shape].model, cache)  # build once, before any timed process
    plan = arms(args)
    runs = {name: [] for name in plan}
    names = list(plan)
    for rep in range(args.repeats):
        shift = rep % len(names)  # every arm takes every place in the order in turn
        for name in names[shift:] + names[:shift]:
            overrides = plan[name]
            child = "trl" if overrides is None else "rlkit"
            runs[name].append(measure(child, args, cache, overrides or []))
    result = {"shape": asdict(SHAPES[args.shape]), "runs": runs, "arms": plan}
    for key in ("completions_per_s", "completions_per_cpu_s"):
        rates = {name: [r[key] for r in rs] for name, rs in runs.items()}
        result[key] = rates
        for name in (n for n in names if n != "trl"):
            ratios = [a / b for a, b in zip(rates[name], rates["trl"])]
            result[f"{RATIO_PREFIX[name]}_{key}"] = ratios
    return result


def report(result: dict, args) -> str:
    shape = result["shape"]
    lines = [
        f"shape {args.shape}: {shape['prompts']} prompts × G = {shape['group_size']}, "
        f"{shape['new_tokens']} new tokens, {args.steps} timed steps per run, {args.threads} thread(s)",
        f"{'trainer':8s} {'completions/s (wall)':>24s} {'completions/CPU-s':>24s}   "
        "load per run (start→end); median [range] over runs",
    ]
    for name, runs in result["runs"].items():
        loads = ", ".join(f"{a:.2f}→{b:.2f}" for a, b in (r["load"] for r in runs))
        wall = median_range(result["completions_per_s"][name])
        cpu = median_range(result["completions_per_cpu_s"][name])
        lines.append(f"{name:8s} {wall:>24s} {cpu:>24s}   {loads}")
    for name, prefix in RATIO_PREFIX.items():
        if name in result["runs"]:
            extra = f" ({' '.join(result['arms'][name])})" if result["arms"][name] else ""
            lines.append(
                f"{name} / TRL per repetition{extra}: "
                f"wall {median_range(result[f'{prefix}_completions_per_s'])}, "
                f"CPU time {median_range(result[f'{prefix}_completions_per_cpu_s'])}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per trainer")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per process first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default=os.environ.get("RLKIT_CACHE", ".cache/bench"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, one run each")
    parser.add_argument(
        "--rlkit",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra rlkit config override (repeatable), e.g. optim.skip_redundant_passes=false",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="adds a third arm, rlkit+, with this override on top (repeatable), "
        "e.g. optim.share_prompt_forward=false: measured in the same alternation",
    )
    parser.add_argument("--child", choices=("rlkit", "trl"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.repeats, args.steps, args.warmup = "smoke", 1, 2, 0
        args.variant = args.variant or ["optim.share_prompt_forward=false"]
    if args.child:
        child(args)
        return None
    result = compare(args)
    print(report(result, args))
    return result


if __name__ == "__main__":
    main()
