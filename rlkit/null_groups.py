"""Null-group share per group size G before training: how many groups carry no GRPO signal.

A group of G completions whose rewards are all equal (all fail or all pass) gets zero GRPO
advantage everywhere (docs/algorithms.md §1); EBPO's shrinkage gives an all-fail group a nonzero
advantage (§2). How often that happens at the warm start decides whether EBPO's mechanism can show.

One sample of k completions per prompt serves every G ≤ k: with c successes among the k, a
G-subset drawn without replacement is all-fail with probability C(k − c, G) / C(k, G) and
all-pass with probability C(c, G) / C(k, G), the unbiased estimates of (1 − p)^G and p^G.

    python -m rlkit.null_groups                                   # the default task
    python -m rlkit.null_groups "task.arithmetic={topics: [add, sub, mul, mix]}"   # hard mix
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from math import comb

import numpy as np

from rlkit.config import TrainConfig, load_config
from rlkit.evaluation import sampled_pass_rates

GROUP_SIZES = (2, 4, 8, 16)
HARD_MIX = "task.arithmetic={topics: [add, sub, mul, mix]}"


def subset_success_weights(successes: Sequence[int], k: int, group_size: int) -> np.ndarray:
    """[G + 1] float64: the chance that a G-subset of one prompt's k samples, drawn without
    replacement, has s successes (hypergeometric: C(c, s)·C(k − c, G − s) / C(k, G) for a prompt
    with c), averaged over the prompts (``successes`` = each prompt's count among its k)."""
    counts = np.asarray(successes, dtype=int)
    if counts.size == 0 or counts.min() < 0 or counts.max() > k:
        raise ValueError(f"successes must be counts in [0, {k}] for at least one prompt")
    if not 1 <= group_size <= k:
        raise ValueError(f"group size {group_size} needs 1 <= G <= k={k} samples per prompt")
    total = comb(k, group_size) * counts.size
    return np.array(
        [
            sum(comb(c, s) * comb(k - c, group_size - s) for c in counts.tolist()) / total
            for s in range(group_size + 1)
        ]
    )


def null_group_shares(successes: Sequence[int], k: int, group_sizes=GROUP_SIZES) -> dict:
    """{G: {"all_fail", "all_pass", "null"}}: expected shares of G-groups with identical rewards,
    from each prompt's number of successes among k samples (G ≤ k): the s = 0 and s = G terms
    of `subset_success_weights`."""
    out = {}
    for g in group_sizes:
        w = subset_success_weights(successes, k, g)
        fail, win = float(w[0]), float(w[g])
        out[g] = {"all_fail": fail, "all_pass": win, "null": fail + win}
    return out


def sampled_successes(cfg: TrainConfig, k: int, num_prompts: int = 512, seed: int = 0) -> list[int]:
    """Successes among k samples at the rollout temperature of ``cfg``'s starting policy, for each
    of ``num_prompts`` of its training prompts (a random subset fixed by ``seed``)."""
    from rlkit.trainer import Trainer

    trainer = Trainer(cfg, read_only=True)  # the run's own policy, task and scorer; writes nothing
    try:
        problems = trainer.train_problems
        problems = random.Random(seed).sample(problems, min(num_prompts, len(problems)))
        rates = sampled_pass_rates(
            trainer.policy.model,
            trainer.policy.tokenizer,
            problems,
            trainer.collector.scorer,
            k=k,
            temperature=cfg.rollout.temperature,
            max_new_tokens=cfg.rollout.max_new_tokens,
        )
    finally:
        trainer.close()
    return (rates * k).round().int().tolist()


def measure(
    cfg: TrainConfig, group_sizes=GROUP_SIZES, num_prompts: int = 512, seed: int = 0
) -> dict:
    """Null-group shares of ``cfg``'s starting policy on ``num_prompts`` of its training prompts
    (a fixed random subset), k = max(group_sizes) samples each at the rollout temperature."""
    k = max(group_sizes)
    return null_group_shares(sampled_successes(cfg, k, num_prompts, seed), k, group_sizes)


def format_table(shares: dict, title: str = "") -> str:
    lines = [title] if title else []
    lines += ["|  G | all-fail | all-pass | null (no GRPO signal) |", "|---|---|---|---|"]
    for g, s in shares.items():
        lines.append(f"| {g:2d} | {s['all_fail']:.1%} | {s['all_pass']:.1%} | {s['null']:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tiny-cpu", help="preset or YAML (default tiny-cpu)")
    parser.add_argument("--prompts", type=int, default=512, help="training prompts sampled")
    parser.add_argument("--group-sizes", type=int, nargs="+", default=list(GROUP_SIZES))
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, [*args.overrides, "tensorboard=false"])
    shares = measure(cfg, tuple(args.group_sizes), args.prompts)
    print(format_table(shares, f"{args.config} {' '.join(args.overrides)}".strip()))


if __name__ == "__main__":
    main()
