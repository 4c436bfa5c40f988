"""``rlkit sweep`` never loses a run: it replaces only what its own runs wrote, one sweep at a
time per ``out``, each run's status decided again right before it trains, and no worker outlives
a killed sweep (tiny fixture model, runs in this process unless said otherwise)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_sweep import write_spec

from rlkit import rundir, sweep
from rlkit.checkpoint import load_checkpoint
from rlkit.config import load_config
from rlkit.metrics import read_metrics
from rlkit.rundir import RunLock, write_atomically
from rlkit.sweep import run_sweep
from rlkit.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def one_run_spec(tmp_path, model_dir, **changes):
    return write_spec(tmp_path, model_dir, arms={"GRPO": []}, seeds=[0], **changes)


def test_unrelated_run_without_checkpoint_is_refused_and_kept(tmp_path, tiny_model_dir):
    path = one_run_spec(tmp_path, tiny_model_dir)
    slot = tmp_path / "out" / "GRPO" / "G2" / "seed0"
    slot.mkdir(parents=True)
    other = load_config("tiny-cpu", ["optim.lr=0.5", f"output_dir={slot}"])
    (slot / "config.yaml").write_text(yaml.safe_dump(other.to_dict()))
    (slot / "metrics.jsonl").write_text('{"step": 0, "eval/greedy_accuracy": 0.25}\n')
    before = {p.name: p.read_bytes() for p in slot.iterdir()}
    with pytest.raises(ValueError, match=f"run {slot} does not match the sweep spec: .*differs"):
        run_sweep(path, progress=False)
    assert {p.name: p.read_bytes() for p in slot.iterdir()} == before


def test_directory_of_other_files_is_refused(tmp_path, tiny_model_dir):
    path = one_run_spec(tmp_path, tiny_model_dir)
    slot = tmp_path / "out" / "GRPO" / "G2" / "seed0"
    slot.mkdir(parents=True)
    (slot / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=f"run {slot} .*files no run writes \\(notes.txt\\)"):
        run_sweep(path, progress=False)
    assert (slot / "notes.txt").read_text() == "mine"


def test_own_run_killed_before_its_first_checkpoint_restarts(tmp_path, tiny_model_dir, monkeypatch):
    path = one_run_spec(tmp_path, tiny_model_dir)
    slot = tmp_path / "out" / "GRPO" / "G2" / "seed0"
    original_step = Trainer.step

    def killed_in_first_step(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "step", killed_in_first_step)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(path, progress=False)
    assert (slot / "config.yaml").is_file() and load_checkpoint(slot) is None
    monkeypatch.setattr(Trainer, "step", original_step)
    assert run_sweep(path, progress=False)["fresh"] == ["GRPO/G2/seed0"]
    assert [r["step"] for r in read_metrics(slot)] == [0, 1, 2]


def test_second_sweep_on_the_same_out_is_refused(tmp_path, tiny_model_dir):
    path = one_run_spec(tmp_path, tiny_model_dir)
    out = tmp_path / "out"
    with sweep.SweepLock(out):
        with pytest.raises(ValueError, match=f"sweep directory {out} is in use by process"):
            run_sweep(path, progress=False)
    assert not (out / "GRPO").exists()
    assert run_sweep(path, progress=False)["fresh"] == ["GRPO/G2/seed0"]  # released


def test_run_finished_by_another_process_meanwhile_is_not_retrained(
    tmp_path, tiny_model_dir, monkeypatch
):
    path = write_spec(tmp_path, tiny_model_dir, arms={"GRPO": []})
    out = tmp_path / "out" / "GRPO" / "G2"
    original, trained, finished = sweep.train_run, [], []

    def train_run(base, overrides, threads, resume=False, overwrite=False):
        if not trained:  # meanwhile, another process trains seed 1 to its end
            other = [o.replace("seed=0", "seed=1").replace("seed0", "seed1") for o in overrides]
            original(base, other, threads)
            finished.append(load_checkpoint(out / "seed1").run_id)
        trained.append(overrides[-1])
        return original(base, overrides, threads, resume, overwrite)

    monkeypatch.setattr(sweep, "train_run", train_run)
    found = run_sweep(path, progress=False)
    assert found["fresh"] == ["GRPO/G2/seed0", "GRPO/G2/seed1"]  # as found before training
    assert trained == [f"output_dir={out / 'seed0'}"]  # seed 1 was found done: not retrained
    assert [load_checkpoint(out / "seed1").run_id] == finished


def lock_is_free(path: Path) -> bool:
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_sweep_takes_its_worker_down(tmp_path, tiny_model_dir):
    # one long run in a worker process (workers: 1), killed with SIGKILL once it trains
    path = one_run_spec(tmp_path, tiny_model_dir, workers=1)
    spec = yaml.safe_load(path.read_text())
    spec["overrides"] = [o for o in spec["overrides"] if not o.startswith("steps=")]
    path.write_text(yaml.safe_dump(spec | {"overrides": [*spec["overrides"], "steps=100000"]}))
    slot = tmp_path / "out" / "GRPO" / "G2" / "seed0"
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = tmp_path / "sweep.log"
    with log.open("w") as stderr:  # the child keeps its own copy of the file
        sweep_process = subprocess.Popen(
            [sys.executable, "-m", "rlkit.cli", "sweep", str(path)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    worker = None
    try:
        metrics = slot / "metrics.jsonl"

        def trains() -> bool:
            assert sweep_process.poll() is None, f"the sweep ended early: {log.read_text()}"
            return metrics.is_file() and metrics.read_text().count("\n") >= 2

        wait_for(trains, 240, "the run to train")
        worker = int((slot / ".lock").read_text().split()[1])
        assert worker != sweep_process.pid and not lock_is_free(slot / ".lock")
        sweep_process.send_signal(signal.SIGKILL)
        sweep_process.wait(timeout=30)
        wait_for(lambda: lock_is_free(slot / ".lock"), 30, "the worker to release the run lock")
        lines = metrics.read_text().count("\n")
        time.sleep(2)
        assert metrics.read_text().count("\n") == lines  # it stopped training
        with sweep.SweepLock(tmp_path / "out"), RunLock(slot):  # an immediate rerun could start
            pass
    finally:
        sweep_process.kill()
        if worker is not None:
            try:
                os.kill(worker, signal.SIGKILL)  # before the fix, the orphan trains on
            except ProcessLookupError:
                pass


def test_a_write_that_fails_halfway_leaves_the_previous_file(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text("previous")

    def half_then_crash(tmp):
        tmp.write_text("{half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half_then_crash)
    assert path.read_text() == "previous" and [p.name for p in tmp_path.iterdir()] == [path.name]
    write_atomically(path, lambda tmp: tmp.write_text("new"))
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_interrupted_clearing_keeps_the_config_that_says_whose_run_it_was(tmp_path, monkeypatch):
    for name in ("checkpoints", "tensorboard"):
        (tmp_path / name).mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        (tmp_path / name).write_text("x")
    original = rundir.shutil.rmtree

    def killed_at_tensorboard(path, *args, **kwargs):
        if Path(path).name == "tensorboard":
            raise KeyboardInterrupt
        original(path, *args, **kwargs)

    monkeypatch.setattr(rundir.shutil, "rmtree", killed_at_tensorboard)
    with pytest.raises(KeyboardInterrupt):
        rundir.clear_run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "tensorboard"]
