"""The demo's summary (paired differences and their detectable size) and its refusal to overwrite."""

from __future__ import annotations

import pytest
from scipy import stats

from rlkit.config import load_config
from rlkit.demo import METHODS, run_demo, run_overrides, summary_table
from rlkit.methods import build_method
from rlkit.pass_plan import PassPlan


def rows(greedy_start, greedy_end, pass_end):
    start = {"eval/greedy_accuracy": greedy_start, "eval/pass@1": 0.5}
    return start, {"eval/greedy_accuracy": greedy_end, "eval/pass@1": pass_end}


def test_summary_states_the_minimum_detectable_paired_difference():
    grpo = [rows(0.8, e, 0.5) for e in (0.86, 0.88, 0.90)]
    ebpo = [rows(0.8, e, 0.5 + d) for e, d in ((0.87, 0.0), (0.88, 0.01), (0.92, 0.02))]
    table = summary_table({"GRPO": grpo, "EBPO": ebpo}, (0, 1, 2))
    # greedy differences 1, 0, 2 points: SE = 1/sqrt(3); MDD = (t_.975 + t_.8, df 2) * SE
    expected = (stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)) / 3**0.5
    assert f"EBPO {expected:.1f} greedy / {expected:.1f} pass@1" in table
    assert "| EBPO | 80.0 |" in table  # equal values print once, without an interval
    one_seed = summary_table({"GRPO": grpo[:1], "EBPO": ebpo[:1]}, (0,))
    assert "detectable" not in one_seed


def test_demo_refuses_to_replace_a_previous_demo_without_overwrite(tmp_path):
    (tmp_path / "GRPO" / "seed0").mkdir(parents=True)
    (tmp_path / "GRPO" / "seed0" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="--overwrite"):
        run_demo(tmp_path, seeds=(0,), progress=False)


def test_every_method_updates_off_policy_so_agpo_clip_can_act(tmp_path):
    """One schedule for all: 4 optimizer steps per batch at one learning rate, so the update is
    off-policy after the first mini-batch and AGPO's adaptive clip is not inactive."""
    cfgs = {m: load_config("tiny-cpu", run_overrides(m, 0, tmp_path)) for m in METHODS}
    for method, cfg in cfgs.items():
        rows = cfg.rollout.num_prompts * cfg.rollout.group_size
        assert rows // cfg.optim.mini_batch_size == 4, method
        assert cfg.optim.lr == cfgs["GRPO"].optim.lr, method
        plan = PassPlan.from_config(cfg, build_method(cfg))
        assert plan.inactive_clips == (), method
