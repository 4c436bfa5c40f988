"""rlkit pins the CPU kernels so a seeded run repeats on another CPU (rlkit.machine).

Each check runs a fresh interpreter: a kernel mode is fixed by a process's first tensor
operation. The stored golden files, made under the portable kernels, are the cross-CPU test
proper (tests/test_golden.py compares against them on any x86-64 CPU with AVX2); here, on one
machine, a seeded run must come out the same when MKL is told the CPU has no AVX-512 (as on an
AMD EPYC or an older Intel CPU), at one and at two threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.machine import KERNEL_VARIABLES, MODE_VARIABLE, PORTABLE_KERNELS, _cpu, same_kernels

HAS_AVX2 = "avx2" in _cpu()[1]


def python(code: str, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (*KERNEL_VARIABLES, MODE_VARIABLE)}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env | variables, capture_output=True, text=True
    )
    return run


def fingerprint_of(**variables: str) -> dict:
    code = "import rlkit, json; from rlkit.machine import fingerprint as f; print(json.dumps(f(1)))"
    run = python(code, **variables)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.skipif(not HAS_AVX2, reason="the portable kernels need a CPU with AVX2")
def test_importing_rlkit_pins_the_portable_kernels():
    machine = fingerprint_of()
    assert machine["torch_cpu_capability"] == "AVX2"
    assert machine["kernels"] == "portable"
    assert machine["kernel_variables"] == PORTABLE_KERNELS


def test_native_leaves_each_library_its_own_choice():
    machine = fingerprint_of(RLKIT_CPU_KERNELS="native")
    run = python("import torch; print(torch.backends.cpu.get_cpu_capability())")
    assert machine["torch_cpu_capability"] == run.stdout.strip()
    assert machine["kernels"] == "native" and machine["kernel_variables"] == {}


def test_a_variable_set_by_hand_is_kept_and_the_mode_called_custom():
    machine = fingerprint_of(MKL_CBWR="AVX2")
    assert machine["kernel_variables"]["MKL_CBWR"] == "AVX2"
    assert machine["kernels"] == "custom"


def test_an_unknown_mode_is_named():
    run = python("import rlkit", RLKIT_CPU_KERNELS="fast")
    assert run.returncode != 0
    assert "RLKIT_CPU_KERNELS='fast': expected one of ['avx2', 'native', 'portable']" in run.stderr


@pytest.mark.skipif(not HAS_AVX2, reason="the portable kernels need a CPU with AVX2")
def test_pins_set_after_torch_chose_its_kernels_are_reported():
    code = (
        "import torch; torch.ones(64).exp().sum()\n"
        "import rlkit; from rlkit.machine import unpinned, kernels_in_effect\n"
        "print(kernels_in_effect()); print(unpinned())"
    )
    run = python(code)
    assert run.returncode == 0, run.stderr
    chosen = python("import torch; print(torch.backends.cpu.get_cpu_capability())").stdout
    if chosen.strip() == "AVX2":
        pytest.skip("this CPU's own kernels are AVX2: nothing to report")
    mode, why = run.stdout.splitlines()
    assert mode == "custom"
    assert "a tensor operation ran before rlkit was imported" in why


def test_portable_records_ignore_the_cpu_model_and_nothing_else():
    a = {"cpu": "Intel Xeon", "isa": ["avx2", "avx512f"], "kernels": "portable"}
    a |= {"torch_cpu_capability": "AVX2", "torch": "2.13.0"}
    b = a | {"cpu": "AMD EPYC", "isa": ["avx2"]}
    assert same_kernels(a, b)
    assert not same_kernels(a, b | {"torch": "2.14.0"})
    assert not same_kernels(a | {"kernels": "native"}, b | {"kernels": "native"})


def train(out: Path, threads: int, **variables: str) -> list[dict]:
    """A 3-step EBPO run of the tiny default in a fresh process; its metrics, time/* aside."""
    overrides = ["steps=3", "rollout.num_prompts=8", "eval.every=3", "eval.num_problems=32"]
    overrides += ["checkpoint_every=0", "algo.estimator=ebpo", f"output_dir={out}"]
    code = f"from rlkit.cli import main; raise SystemExit(main(['train', *{overrides!r}]))"
    run = python(code, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **variables)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


@pytest.mark.skipif(not HAS_AVX2, reason="the portable kernels need a CPU with AVX2")
@pytest.mark.parametrize("threads", [1, 2])
def test_a_seeded_run_repeats_when_mkl_sees_no_avx512(threads, tmp_path):
    """Three EBPO steps of the tiny default under the portable kernels, with MKL free to use
    this CPU's widest code and with MKL limited to AVX2: the same metrics, at one thread and at
    two. Under the native kernels on a CPU with AVX-512 the two differ from step 1 (MKL's sgemm
    changes its vector width; measured on an Intel Xeon, docs/tiny-default.md "Across CPUs")."""
    full = train(tmp_path / "a", threads)
    limited = train(tmp_path / "b", threads, MKL_ENABLE_INSTRUCTIONS="AVX2")
    assert full == limited
