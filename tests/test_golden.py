"""The golden runs of tests/golden/make_golden.py reproduce byte for byte (``time/*`` aside).

Each case's ``metrics.jsonl`` under today's code must equal the stored file, which the recorded
code wrote. Float results depend on the CPU's kernels and the library versions, so a stored file
is the reference where this process runs the kernels recorded for its case
(tests/golden/fingerprint.json, :func:`rlkit.machine.same_kernels`): under the default portable
kernels, on any x86-64 CPU with AVX2 and the same library versions, which makes this also the
test that a seeded run gives the same floats on another CPU. Elsewhere (other versions,
``RLKIT_CPU_KERNELS=native``) the reference is regenerated here by the code of the commit that
last wrote each golden file (``git archive`` of it, run in a subprocess), so the test neither
passes silently nor fails spuriously; without that history (a shallow clone, no git) it is
skipped, saying why.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from rlkit.machine import same_kernels
from rlkit.metric_names import current_names

GOLDEN = Path(__file__).parent / "golden"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
make_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_golden)
NAMES = [*make_golden.CASES, "resume"]


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=GOLDEN, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip(f"golden reference: `git {' '.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout.strip()


def recorded_commits(names=NAMES) -> dict[str, list[str]]:
    """Commit → the golden cases (of ``names``) it last wrote (their reference code)."""
    if git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("golden reference: a shallow clone lacks the commits that wrote the goldens")
    if git("status", "--porcelain", "--", "*.jsonl", make_golden.FIXTURE):
        pytest.skip("golden reference: golden files with uncommitted changes; commit them first")
    commits: dict[str, list[str]] = {}
    for name in names:
        commit = git("log", "-1", "--format=%H", "--", f"{name}.jsonl")
        if not commit:
            pytest.skip(f"golden reference: {name}.jsonl was never committed")
        commits.setdefault(commit, []).append(name)
    return commits


def regenerate(work: Path, names=NAMES) -> dict[str, str]:
    """Each case run by the code of the commit that last wrote its golden file, on this machine."""
    out, root = {}, git("rev-parse", "--show-toplevel")
    for commit, cases in recorded_commits(names).items():
        source = work / commit[:12]
        source.mkdir()
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        (work / "src.tar").write_bytes(archive)
        with tarfile.open(work / "src.tar") as tar:
            tar.extractall(source, filter="data")
        env = os.environ | {"PYTHONPATH": str(source), "OMP_NUM_THREADS": "1"}
        script = source / "tests" / "golden" / "make_golden.py"
        ref = work / f"ref-{commit[:12]}"
        args = [sys.executable, str(script), "--only", ",".join(cases), "--out", str(ref)]
        run = subprocess.run(args, env=env, cwd=source, capture_output=True, text=True)
        if run.returncode != 0:
            pytest.fail(f"regenerating the goldens at {commit[:12]} failed:\n{run.stderr[-3000:]}")
        out |= {name: (ref / f"{name}.jsonl").read_text() for name in cases}
    return out


def made_here() -> list[str]:
    """The cases whose stored file was made with this process's kernels (fingerprint.json)."""
    recorded = json.loads((GOLDEN / make_golden.FINGERPRINT).read_text())
    here = make_golden.fingerprint()
    return [name for name in NAMES if same_kernels(recorded.get(name, {}), here)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, str]:
    """Each case's stored file where it was made on a machine like this, else its file as the
    code of the commit that last wrote it writes it here."""
    here = made_here()
    stored = {name: (GOLDEN / f"{name}.jsonl").read_text() for name in here}
    elsewhere = [name for name in NAMES if name not in here]
    if not elsewhere:
        return stored
    return stored | regenerate(tmp_path_factory.mktemp("golden-reference"), elsewhere)


def first_difference(got: str, want: str) -> str:
    for got_row, want_row in zip(got.splitlines(), want.splitlines(), strict=False):
        if got_row != want_row:
            a, b = json.loads(got_row), json.loads(want_row)
            if list(a) != list(b):
                return f"step {b.get('step')}: keys {list(a)} != {list(b)}"
            key = next(k for k in b if a[k] != b[k])
            return f"step {b['step']}: {key} = {a[key]!r}, golden {b[key]!r}"
    return f"{len(got.splitlines())} rows, golden {len(want.splitlines())}"


@pytest.mark.parametrize("name", NAMES)
def test_golden_run_is_reproduced_byte_for_byte(name, reference, tmp_path):
    got = make_golden.run_case(name, tmp_path)
    assert got == reference[name], f"{name}: {first_difference(got, reference[name])}"


def test_the_fixture_resumes_into_the_uninterrupted_run():
    """The resume golden is the uninterrupted 4-step run (make_golden --fixture checked it when
    it wrote the fixture); the fixture holds that run's rows up to its checkpoint. The fixture
    predates the metric renames (docs/algorithms.md §5), so it is also the run checkpointed
    before them: resuming keeps its rows under today's names."""
    fixture = make_golden.cleaned(GOLDEN / make_golden.FIXTURE / "metrics.jsonl")
    renamed = "".join(json.dumps(current_names(json.loads(r))) + "\n" for r in fixture.splitlines())
    resumed = (GOLDEN / "resume.jsonl").read_text()
    assert resumed.startswith(renamed) and len(fixture.splitlines()) == 2


def test_the_reference_can_be_regenerated_from_history(tmp_path):
    """The path another CPU takes: the recorded commit's code, run from git history, writes the
    golden file again (here, on the recording machine, byte for byte the stored one)."""
    here = made_here()
    if not here:
        pytest.skip("another machine: test_golden_run_is_reproduced_byte_for_byte regenerates")
    name = here[0]
    assert regenerate(tmp_path, [name]) == {name: (GOLDEN / f"{name}.jsonl").read_text()}


def test_every_golden_case_records_the_machine_its_file_was_made_on():
    recorded = json.loads((GOLDEN / make_golden.FINGERPRINT).read_text())
    assert sorted(recorded) == sorted(NAMES)
