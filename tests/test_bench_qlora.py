"""The GPU proof script's CPU smoke mode: the same code path on tiny shapes (benchmarks/)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_qlora_8b.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_qlora_8b", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


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


@pytest.mark.slow
def test_tiny_cpu_run_trains_every_lora_matrix_and_writes_the_tables(tmp_path):
    bench = load_bench()
    args = ["--tiny", "--device", "cpu", "--models", "qwen3-8b", "--out", str(tmp_path / "out")]
    bench.main([*args, "--work-dir", str(tmp_path / "models")])
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    result = report["models"]["qwen3-8b"]
    assert result["rows"] == 16 and result["mean_completion_tokens"] > 0
    # LoRA-B starts at 0: at the second step every B and every A matrix has a gradient
    assert result["all_lora_b_nonzero"] and result["all_lora_a_nonzero"]
    assert set(result["lora_grad_norms"]["lora_B"]) == set(bench.PROJECTIONS)
    assert all(v["plan"] > 0 and v["measured"] is None for v in result["phases"].values())
    assert result["generation_tokens_per_s"] > 0 and result["update_s"] > 0
    variants = result["generation_variants"]
    assert set(variants) == {"dynamic", "static", "no_adapter", "static_loop"}
    assert all(v["tokens_per_s"] > 0 for v in variants.values()), variants
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| lora_B |" in table and "plan MiB" in table
    assert not (tmp_path / "models" / "qwen3-8b").exists()  # the random checkpoint is removed
    assert result["mismatch"] == {}  # the HF engine: no sampler correction, no mismatch logged


def test_the_static_engine_reports_its_mismatch(tmp_path):
    bench = load_bench()
    args = ["--tiny", "--device", "cpu", "--models", "qwen3-8b", "--out", str(tmp_path / "out")]
    bench.main([*args, "--engine", "hf_static", "--work-dir", str(tmp_path / "models")])
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    mismatch = report["models"]["qwen3-8b"]["mismatch"]
    assert mismatch["sampling/importance_sampling_ratio/clipped_fraction"] == 0.0
    assert "sampling/sampling_logp_difference/mean" in (tmp_path / "out" / "results.md").read_text()
