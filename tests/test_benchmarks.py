"""The benchmark scripts run (smoke mode): they are never timed here, only exercised."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_method_overhead_smoke(capsys):
    import method_overhead

    result = method_overhead.main(["--smoke"])
    assert set(result["arms"]) == set(method_overhead.ARMS)
    grpo = result["arms"]["GRPO"]
    assert grpo["ratio"] == grpo["cpu_ratio"] == [1.0, 1.0]  # GRPO is every repetition's baseline
    for arm in result["arms"].values():
        assert len(arm["ratio"]) == 2 and all(math.isfinite(r) and r > 0 for r in arm["ratio"])
    # probe=full generates a probe group on top of the training group
    assert result["arms"]["AGPO probe=full"]["tokens"][0] > 1.0
    out = capsys.readouterr().out
    assert "AGPO probe=previous" in out and "load average" in out


@pytest.mark.slow
def test_vs_trl_smoke(capsys):
    """Both trainers run in fresh processes on the same tiny shape (the `bench` extra)."""
    pytest.importorskip(
        "trl", reason="TRL is the optional `bench` extra: pip install -e '.[bench]'"
    )
    import vs_trl

    result = vs_trl.main(["--smoke"])
    assert result["arms"]["rlkit+"] == ["optim.share_prompt_forward=false"]
    for name in ("rlkit", "trl", "rlkit+"):
        (run,) = result["runs"][name]
        assert len(run["step_s"]) == 2 and all(t > 0 for t in run["step_s"])
        assert len(run["load"]) == 2
        assert len(run["step_cpu_s"]) == 2 and all(t > 0 for t in run["step_cpu_s"])
    rates = result["completions_per_s"]
    (ratio,) = result["ratio_completions_per_s"]
    assert ratio == pytest.approx(rates["rlkit"][0] / rates["trl"][0])
    (variant,) = result["ratio_variant_completions_per_s"]
    assert variant == pytest.approx(rates["rlkit+"][0] / rates["trl"][0])
    out = capsys.readouterr().out
    assert "rlkit / TRL" in out and "rlkit+ / TRL" in out


def test_random_llama_shape_has_10_to_30m_parameters(tmp_path):
    """The second shape of vs_trl: a locally built random Llama of ~11M parameters."""
    import vs_trl
    from transformers import LlamaForCausalLM

    path = vs_trl.model_dir("llama11m", tmp_path)
    model = LlamaForCausalLM.from_pretrained(path)
    assert 10e6 <= sum(p.numel() for p in model.parameters()) <= 30e6
    assert vs_trl.model_dir("llama11m", tmp_path) == path  # built once, then reused


def test_profile_step_labels_every_phase():
    import profile_step

    table = profile_step.main(["--shape", "smoke", "--steps", "1", "--warmup", "0"])
    for phase in ("PHASE_generate", "PHASE_update", "PHASE_check_finite"):
        assert phase in table


def test_cpu_kernels_times_each_mode_asked_for(capsys):
    import cpu_kernels

    cpu_kernels.main(["--smoke", "--modes", "portable", "seed=3"])
    out = capsys.readouterr().out
    assert out.startswith("tiny-cpu seed=3, 2 steps, 16 eval problems, one thread")
    assert "portable/native CPU time" in out and "avx2" not in out
