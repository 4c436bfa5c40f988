"""The benchmark scripts run (smoke mode): they are never timed here, only exercised."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_method_overhead_smoke(capsys):
    import method_overhead

    result = method_overhead.main(["--smoke"])
    assert set(result["arms"]) == set(method_overhead.ARMS)
    grpo = result["arms"]["GRPO"]
    assert grpo["ratio"] == [1.0, 1.0]  # GRPO is the baseline of every repetition
    for arm in result["arms"].values():
        assert len(arm["ratio"]) == 2 and all(math.isfinite(r) and r > 0 for r in arm["ratio"])
    # probe=full generates a probe group on top of the training group
    assert result["arms"]["AGPO probe=full"]["tokens"][0] > 1.0
    out = capsys.readouterr().out
    assert "AGPO probe=previous" in out and "load average" in out
