"""The GPU proof script's CPU smoke mode: the same code path on tiny shapes (benchmarks/), its
correctness gate against a broken engine, and its arm logic (parsing, skipping, the time budget)
without a model."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch

import rlkit.static_decode

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_qlora_8b.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_qlora_8b", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclass looks its module up
    spec.loader.exec_module(bench)
    return bench


def tiny_args(tmp_path, *arms: str, budget: float = 600) -> list[str]:
    args = ["--tiny", "--device", "cpu", "--out", str(tmp_path / "out")]
    args += ["--work-dir", str(tmp_path / "models"), "--budget-s", str(budget)]
    return [*args, *(a for arm in arms for a in ("--arm", arm))]


def test_a_phase_called_inside_another_is_not_measured_on_its_own():
    # the update checks the log-probs of one row under no_grad after each optimizer step:
    # measuring that inner pass would reset CUDA's peak counter and hide the update's own peak
    meter = load_bench().PhaseMeter(cuda=False)
    with meter("train"), meter("old"), meter("check_finite"):
        pass
    assert set(meter.records) == {"update"}
    with meter("old"), meter("score"):
        pass
    assert len(meter.records["logprob"]) == 1 and "score" not in meter.records


def test_an_arm_is_one_line_of_overrides_and_the_benchmarks_own_keys(monkeypatch):
    bench = load_bench()
    arm = bench.Arm.parse("rows=128 memory_gib=24 steps=2 rollout.engine=hf_static a.b=true")
    assert (arm.rows, arm.memory_gib, arm.steps, arm.engine) == (128, 24.0, 2, "hf_static")
    assert arm.overrides == ("rollout.engine=hf_static", "a.b=true")
    plain = bench.Arm.parse("optim.share_prompt_forward=false")
    assert (plain.rows, plain.memory_gib, plain.steps, plain.engine) == (16, None, None, "hf")
    with pytest.raises(ValueError, match="'rows' is not key=value"):
        bench.Arm.parse("rows rollout.engine=hf")
    assert all(bench.Arm.parse(line).rows % 8 == 0 for line in bench.ARMS)
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name: None)
    assert "vLLM is not importable" in bench.Arm.parse("rollout.engine=vllm").unavailable()
    assert bench.Arm.parse("rollout.engine=hf_static").unavailable() is None


def test_arms_past_the_time_budget_are_skipped_and_the_table_still_written(tmp_path):
    bench = load_bench()
    arms = ("rows=16 rollout.engine=hf", "rows=16 rollout.engine=vllm")
    report = bench.main(tiny_args(tmp_path, *arms, budget=1))
    assert [e["status"] for e in report["arms"]] == ["skipped", "skipped"]
    assert report["arms"][0]["reason"].startswith("time budget: about")
    assert not (tmp_path / "models" / "qwen3-8b").exists()  # nothing was built
    table = (tmp_path / "out" / "results.md").read_text()
    assert "`rows=16 rollout.engine=hf` | skipped: time budget" in table
    assert "16 rows: step_s ≤ 25: not measured" in table
    assert (tmp_path / "out" / f"{bench.dated_name(report)}.md").read_text() == table


def test_an_arm_running_past_the_budget_is_cut_off_and_none_starts_after(tmp_path, monkeypatch):
    bench = load_bench()
    monkeypatch.setattr(bench, "PRIORS", {"decode_s": {"hf": 0.0}, "row_s": 0.0, "load_s": 0.0})
    monkeypatch.setattr(bench, "save_random_model", lambda *args: tmp_path)
    monkeypatch.setattr(bench, "run_arm", lambda *args: time.sleep(60))
    start = time.perf_counter()
    arms = ("rows=16 rollout.engine=hf", "rows=16 rollout.engine=hf_static")
    report = bench.main(tiny_args(tmp_path, *arms, budget=1))
    assert time.perf_counter() - start < 10
    assert [e["status"] for e in report["arms"]] == ["cut off"]
    assert "cut off: the time budget ran out" in (tmp_path / "out" / "results.md").read_text()


def test_engines_side_by_side_with_their_gate_and_mismatch(tmp_path):
    """Every engine passes its correctness gate, reports its sampler/trainer mismatch
    (loss.tis_cap on for every arm) and its ratio to the HF arm beside it."""
    bench = load_bench()
    arms = ("rows=16 rollout.engine=hf", "rows=16 rollout.engine=hf_static")
    bench.main(tiny_args(tmp_path, *arms))
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    hf, static = report["arms"]
    assert hf["status"] == static["status"] == "done"
    assert hf["gate"]["differences"] == []  # the reference against itself
    for entry in (hf, static):
        assert entry["gate"]["passed"] and entry["gate"]["tolerance_nats"] > 0
        assert entry["gate"]["logp_difference"]["max"] >= entry["gate"]["logp_difference"]["mean"]
        assert entry["mismatch"][bench.CLIPPED] == 0.0
        assert entry["mismatch"][bench.DIFFERENCE] >= 0.0
    assert bench.baseline(report, static) is bench.baseline(report, hf) is not None
    table = (tmp_path / "out" / "results.md").read_text()
    row = next(
        line for line in table.splitlines() if "`rows=16 rollout.engine=hf_static` |" in line
    )
    speedup = row.split(" | ")[8]  # generation tokens/s × hf
    assert float(speedup) > 0
    assert "`rows=16 rollout.engine=hf` | done | equal (8 rows × 32 tokens) |" in table
    assert "TIS clips < 1% of tokens, `rows=16 rollout.engine=hf`: 0.00%, met" in table


def test_an_engine_whose_tokens_come_one_position_late_is_wrong_and_not_timed(
    tmp_path, monkeypatch
):
    """A static decode loop that returns each row's tokens one position late (its first token
    twice), as a KV cache written one column off would derail them, fails its gate: the arm is
    recorded wrong with the rows that differ, none of its steps runs, and the script exits
    non-zero."""
    bench = load_bench()
    decode = rlkit.static_decode.static_generate

    def one_late(*args, **kwargs):
        tokens, logp = decode(*args, **kwargs)
        return torch.cat([tokens[:, :1], tokens[:, :-1]], dim=1), logp

    monkeypatch.setattr(rlkit.static_decode, "static_generate", one_late)
    with pytest.raises(SystemExit, match="wrong .*: rows=16 rollout.engine=hf_static$"):
        bench.main(tiny_args(tmp_path, "rows=16 rollout.engine=hf_static"))
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    (static,) = report["arms"]
    assert static["status"] == "wrong" and not static["gate"]["passed"]
    assert "step_s" not in static and "mismatch" not in static  # not timed
    assert static["reason"].startswith("differs in ")
    leads = [d["hf_lead_nats"] for d in static["gate"]["differences"]]
    assert max(leads) > static["gate"]["tolerance_nats"]
    table = (tmp_path / "out" / "results.md").read_text()
    assert "`rows=16 rollout.engine=hf_static` | wrong: not timed | differs in " in table
    assert "## `rows=16 rollout.engine=hf_static` (qwen3-8b): wrong, not timed" in table


@pytest.mark.slow
def test_tiny_cpu_run_trains_every_lora_matrix_and_writes_the_tables(tmp_path):
    bench = load_bench()
    arms = ("rows=16 steps=2 rollout.engine=hf", "rows=32 memory_gib=24 rollout.engine=hf_static")
    bench.main(tiny_args(tmp_path, *arms))
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    first, budgeted = report["arms"]
    assert first["rows"] == 16 and first["mean_completion_tokens"] > 0
    # LoRA-B starts at 0: at the second step every B and every A matrix has a gradient
    assert first["all_lora_b_nonzero"] and first["all_lora_a_nonzero"]
    assert budgeted["all_lora_a_nonzero"] is None  # one step: A has no gradient yet
    assert set(first["lora_grad_norms"]["lora_B"]) == set(bench.PROJECTIONS)
    assert all(v["plan"] > 0 and v["measured"] is None for v in first["phases"].values())
    assert first["generation_tokens_per_s"] > 0 and first["update_s"] > 0
    variants = first["generation_variants"]  # HF's generate options, on the first arm only
    assert set(variants) == {"dynamic", "static", "no_adapter", "static_loop"}
    assert all(v["tokens_per_s"] > 0 for v in variants.values()), variants
    assert budgeted["generation_variants"] == {}
    # 24 GiB sizes the batches (tiny: every row fits one call); the CPU enforces no budget
    assert (budgeted["memory_gib"], budgeted["generate_calls"]) == (24.0, 1)
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| lora_B |" in table and "plan MiB" in table and "24 GiB budget" in table
    assert not (tmp_path / "models" / "qwen3-8b").exists()  # the random checkpoint is removed
    assert not list((tmp_path / "models").glob("qwen3-8b-run-*"))  # and the arms' run dirs
