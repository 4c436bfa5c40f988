"""The logged row of one step, from its :class:`~rlkit.batch.StepRecord` (docs/algorithms.md §5).

One function, so the names and their order live in one place: DAPO's draw counts, the method's
own signals (AGPO's ``agpo/*``, ending with ``agpo/kl_drift``), the common keys, the update's
statistics, then the estimator's own (EBPO's ``ebpo/*``).
"""

from __future__ import annotations

from rlkit.batch import StepRecord


def step_metrics(record: StepRecord) -> dict:
    rows, adv, seconds = record.rows, record.row_advantages, record.seconds
    rewards = record.rewards
    lengths = rows.lengths.float()
    score_s = seconds.get("score", 0.0)
    return {
        "dapo/gen_batches": record.drawn.gen_batches,
        "dapo/dropped_groups": record.drawn.dropped,
        **record.method_metrics,
        "reward": rewards.mean(),
        "reward_std": rewards.std() if rewards.numel() > 1 else 0.0,
        "frac_reward_zero_std": record.advantages.diagnostics["frac_reward_zero_std"],
        "advantages/mean": adv.mean(),
        "advantages/std": adv.std() if adv.numel() > 1 else 0.0,
        "advantages/abs_max": adv.abs().max(),
        **({"entropy": rows.entropy} if rows.entropy is not None else {}),
        "completions/mean_length": lengths.mean(),
        "completions/max_length": lengths.max(),
        "completions/clipped_ratio": rows.truncated.float().mean(),
        "tokens/generated": record.counters["tokens_generated"],
        "tokens/probe": record.counters["tokens_probe"],
        "rollout/reward_failures": record.drawn.reward_failures,
        "update/nonfinite_skips": record.counters["nonfinite_skips"],
        "learning_rate": record.learning_rate,
        "time/generate": seconds.get("generate", 0.0) - score_s,
        "time/score": score_s,
        "time/update": seconds.get("update", 0.0),
        **record.update.stats,
        **record.estimator_metrics,
    }
