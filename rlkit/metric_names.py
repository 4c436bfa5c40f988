"""Metric names: the renames that read rows logged before the one naming scheme (docs/algorithms.md
§5, "Names") under today's names.

The scheme: TRL's name where TRL logs the quantity (GRPO's ``reward``, ``kl``, ``clip_ratio/*``
...; DPO's ``rewards/*`` and ``logps/*``; PPO's ``objective/*``, ``loss/value_avg`` and
``val/clipfrac_avg``); every other key is ``<component>/<quantity>`` with a lower_snake_case
quantity, the component being the method or mechanism that makes it (``agpo``, ``ebpo``,
``jspo``, ``ppo``, ``dpo``, ``dapo`` ...) or the part of the step (``rollout``, ``update``,
``tokens``, ``eval``). Runs, fixtures and pre-registered specs written before the scheme keep
their old keys; every reader passes them through :func:`current_names` / :func:`current_name`.
"""

from __future__ import annotations

# old key -> today's key; values were never changed, only the keys
RENAMED: dict[str, str] = {
    # AGPO (§3): readable names for the paper's symbols
    "agpo/U": "agpo/uncertainty_mean",
    "agpo/U_bar": "agpo/uncertainty_ema",
    "agpo/H": "agpo/entropy_mean",
    "agpo/H_ref": "agpo/entropy_ref",
    # JSPO (§2b): JSPO-Official's trace/* under the method's prefix
    "trace/js_lambda": "jspo/lambda_mean",
    "trace/v_square": "jspo/v_square_mean",
    "trace/s_square": "jspo/s_square_mean",
    # PPO (§4c): verl's actor/* and critic/* -> TRL PPOTrainer's names, else the ppo/ prefix
    "actor/reward_kl_penalty": "ppo/reward_kl_penalty",
    "actor/reward_kl_penalty_coeff": "objective/kl_coef",
    "critic/score/mean": "objective/scores",
    "critic/rewards/mean": "objective/rlhf_reward",
    "critic/advantages/mean": "ppo/advantages_mean",
    "critic/returns/mean": "ppo/returns_mean",
    "critic/values/mean": "ppo/values_mean",
    "critic/vf_loss": "loss/value_avg",
    "critic/vf_clipfrac": "val/clipfrac_avg",
    # DPO (§4d)
    "beta": "dpo/beta",
    # the step's own counters, under the part of the step that counts them
    "reward_failures": "rollout/reward_failures",
    "nonfinite_skips": "update/nonfinite_skips",
    "optimizer_steps": "update/optimizer_steps",
}


def current_name(name: str) -> str:
    """Today's name of metric ``name`` (itself unless it was renamed)."""
    return RENAMED.get(name, name)


def current_names(row: dict) -> dict:
    """``row`` (a ``metrics.jsonl`` row, or any mapping keyed by metric names) with its old keys
    renamed, in the same order; the row itself when it has none."""
    if not any(key in RENAMED for key in row):
        return row
    return {current_name(key): value for key, value in row.items()}


def current_metric_fields(value):
    """``value`` (a loaded ``summary.json``, or any part of one) with every ``metric`` field
    holding an old name renamed, so committed summaries read under today's names unrewritten."""
    if isinstance(value, list):
        return [current_metric_fields(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: current_metric_fields(v) for k, v in value.items()}
    if isinstance(out.get("metric"), str):
        out["metric"] = current_name(out["metric"])
    return out
