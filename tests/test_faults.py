"""Faults and attacks on a run directory: planted checkpoints, pointers out of the run, two
processes, a fresh run over an old one, resume with another config, damaged checkpoints, crashes
mid-write, a diverging update. Each either recovers exactly or stops with one clear line."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_trainer import PatternScorer, make_config, without_timings

import rlkit.checkpoint as checkpoint_module
import rlkit.collect as collect_module
import rlkit.trainer as trainer_module
from rlkit.checkpoint import latest_checkpoint, save_checkpoint
from rlkit.cli import main
from rlkit.config import load_config
from rlkit.metrics import read_metrics
from rlkit.rundir import check_resume_config
from rlkit.trainer import Trainer
from rlkit.update import NonFiniteError, PolicyUpdate


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 2-step run with checkpoints at steps 1 and 2 (copy it before changing it)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    Trainer(make_config(run, tiny_model_dir, "checkpoint_every=1")).train()
    return run


@pytest.fixture
def run(trained_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    return copy


def last_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no error message"
    return err[-1]


def rewrite_manifest(step_dir: Path) -> None:
    """What an attacker with write access does: make the checksums match the planted files."""
    manifest_path = step_dir / checkpoint_module.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    for name in manifest["files"]:
        manifest["files"][name] = hashlib.sha256((step_dir / name).read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))


def tamper_state(run: Path, change) -> Path:
    """``change(state)`` on the latest checkpoint's trainer state, saved back with its manifest
    rehashed (so only the state's own invariants can catch it); returns the checkpoint folder."""
    step_dir = latest_checkpoint(run)
    file = step_dir / checkpoint_module.TRAINER_STATE
    state = torch.load(file, weights_only=True)
    change(state)
    torch.save(state, file)
    rewrite_manifest(step_dir)
    return step_dir


class Payload:
    """Unpickling this runs code: it creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


# --------------------------------------------------------------------------- security
@pytest.mark.parametrize("command", ["eval", "resume"])
def test_planted_pickle_in_a_checkpoint_never_runs(run, tmp_path, capsys, command):
    marker = tmp_path / "payload-ran"
    step_dir = run / "checkpoints" / "step_000002"
    torch.save({"step": 2, "evil": Payload(marker)}, step_dir / "trainer_state.pt")
    rewrite_manifest(step_dir)
    args = ["eval", "--checkpoint", str(run)] if command == "eval" else ["train", "--resume"]
    if command == "resume":
        args += [f"output_dir={run}", "steps=3"]
    with pytest.warns(UserWarning, match="refusing to load"):  # falls back to step 1, warns
        assert main(args) == 0
    assert not marker.exists()


def test_planted_pickle_in_the_only_checkpoint_is_a_clear_error(run, tmp_path, capsys):
    marker = tmp_path / "payload-ran"
    shutil.rmtree(run / "checkpoints" / "step_000001")
    step_dir = run / "checkpoints" / "step_000002"
    torch.save({"evil": Payload(marker)}, step_dir / "trainer_state.pt")
    rewrite_manifest(step_dir)
    assert main(["eval", "--checkpoint", str(run)]) == 2
    line = last_error_line(capsys)
    assert "trainer_state.pt" in line and "refusing to load" in line
    assert not marker.exists()


def test_trainer_state_holds_only_plain_values(run):
    """Every checkpoint (with AGPO state, curriculum and numpy RNG) loads with weights_only."""
    state = torch.load(run / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 2 and isinstance(state["rng"]["numpy"][1], torch.Tensor)


def test_agpo_previous_probe_state_loads_with_weights_only(tmp_path, tiny_model_dir):
    agpo = ("algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=previous")
    cfg = make_config(tmp_path / "agpo", tiny_model_dir, *agpo)
    Trainer(cfg).train()
    resumed = Trainer(make_config(tmp_path / "agpo", tiny_model_dir, *agpo), resume=True)
    assert resumed.step_count == 2 and "__batch__" in resumed.method.previous_stats
    resumed.close()


def test_latest_pointing_outside_the_run_is_refused(run, trained_run, capsys):
    elsewhere = run.parent / "elsewhere"
    shutil.copytree(trained_run, elsewhere)
    (run / "checkpoints" / "latest").write_text("../../elsewhere/checkpoints/step_000002")
    assert main(["eval", "--checkpoint", str(run)]) == 2
    assert "not a checkpoint folder of this run" in last_error_line(capsys)


def test_checkpoint_symlinked_out_of_the_run_is_refused(run, trained_run, capsys):
    elsewhere = run.parent / "elsewhere"
    shutil.copytree(trained_run, elsewhere)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(elsewhere / "checkpoints")
    assert main(["train", "--resume", f"output_dir={run}", "steps=3"]) == 2
    assert "outside the run directory" in last_error_line(capsys)


def test_eval_never_takes_trust_remote_code_from_the_run_dir(run, monkeypatch):
    saved = run / "config.yaml"
    saved.write_text(
        saved.read_text().replace("trust_remote_code: false", "trust_remote_code: true")
    )
    specs = []
    real = trainer_module.load_policy

    def recording(spec, **kwargs):
        specs.append(spec)
        return real(spec, **kwargs)

    monkeypatch.setattr(trainer_module, "load_policy", recording)
    assert main(["eval", "--checkpoint", str(run), "eval.k=1"]) == 0
    assert specs[-1].trust_remote_code is False
    assert main(["eval", "--checkpoint", str(run), "eval.k=1", "model.trust_remote_code=true"]) == 0
    assert specs[-1].trust_remote_code is True  # the command line may turn it on


def test_eval_writes_nothing_into_the_run(run):
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["eval", "--checkpoint", str(run), "eval.k=1"]) == 0
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


# ------------------------------------------------------------------------ data safety
def test_fresh_run_into_a_used_dir_refuses_then_overwrites(run, capsys):
    metrics = (run / "metrics.jsonl").read_text()
    args = ["train", "--config", str(run / "config.yaml")]
    assert main([*args, f"output_dir={run}"]) == 2
    assert "is not empty" in last_error_line(capsys)
    assert (run / "metrics.jsonl").read_text() == metrics
    (run / "notes.txt").write_text("mine")
    assert main([*args, "--overwrite", f"output_dir={run}", "steps=1"]) == 0
    assert [r["step"] for r in read_metrics(run)] == [0, 1]
    assert latest_checkpoint(run).name == "step_000001"
    assert not (run / "checkpoints" / "step_000002").exists()
    assert (run / "notes.txt").read_text() == "mine"  # only the run's own files are replaced


class FakePolicy:
    def save(self, path, state_dict=None):
        Path(path).mkdir(parents=True)
        (Path(path) / "weights.safetensors").write_bytes(b"w")


def test_rotation_deletes_only_older_checkpoints_of_its_own_run(tmp_path):
    save_checkpoint(tmp_path, 100, FakePolicy(), {"step": 100}, keep=1, run_id="old")
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, FakePolicy(), {"step": step}, keep=2, run_id="new")
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_000002", "step_000003", "step_000100"]
    assert latest_checkpoint(tmp_path).name == "step_000003"


LOCK_HOLDER = textwrap.dedent(
    """
    import sys, time
    from rlkit.rundir import RunLock
    lock = RunLock(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
    """
)


def test_second_process_is_refused_and_a_dead_ones_lock_is_not_in_the_way(run, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["train", "--resume", f"output_dir={run}", "steps=3"]) == 2
        line = last_error_line(capsys)
        assert f"in use by process {holder.pid}" in line
    finally:
        holder.kill()  # like kill -9: the lock file stays behind, the lock itself is gone
        holder.wait()
    assert (run / ".lock").exists()
    assert main(["train", "--resume", f"output_dir={run}", "steps=3"]) == 0
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3]


def test_resume_keeps_the_saved_config(run, capsys, tiny_model_dir):
    assert main(["train", "--resume", f"output_dir={run}", "algo.estimator=ebpo"]) == 2
    assert "resume: algo.estimator='ebpo' differs" in last_error_line(capsys)
    with pytest.raises(ValueError, match="rollout.group_size"):
        Trainer(make_config(run, tiny_model_dir, "rollout.group_size=2"), resume=True)
    assert main(["train", "--resume", f"output_dir={run}", "steps=3", "eval.every=1"]) == 0
    assert "steps: 3" in (run / "config.yaml").read_text()  # config.yaml describes the run
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3]


def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(run, tmp_path, tiny_model_dir):
    state = run / "checkpoints" / "step_000002" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated
    with pytest.warns(UserWarning, match="step_000002 is unusable.*resuming from step_000001"):
        Trainer(make_config(run, tiny_model_dir, "steps=3"), resume=True).train()
    straight = tmp_path / "straight"
    Trainer(make_config(straight, tiny_model_dir, "steps=3", "checkpoint_every=1")).train()
    assert without_timings(read_metrics(run)) == without_timings(read_metrics(straight))


def test_no_intact_checkpoint_is_a_clear_error_naming_the_file(run, capsys):
    for step in ("step_000001", "step_000002"):
        (run / "checkpoints" / step / "policy" / "model.safetensors").write_bytes(b"junk")
    assert main(["train", "--resume", f"output_dir={run}", "steps=3"]) == 2
    line = last_error_line(capsys)
    assert "no intact checkpoint" in line and "step_000002/policy/model.safetensors" in line


@pytest.mark.parametrize("fault", ["killed", "disk full"])
def test_crash_while_writing_a_checkpoint_resumes_to_the_identical_run(
    tmp_path, tiny_model_dir, monkeypatch, fault
):
    """A crash (or ENOSPC) half-way through writing step 2's checkpoint leaves step 1 as the
    latest; resuming from it reproduces the uninterrupted run row for row."""
    common = ("steps=3", "checkpoint_every=1", "algo.estimator=ebpo")
    straight = tmp_path / "straight"
    Trainer(make_config(straight, tiny_model_dir, *common)).train()

    real_save = torch.save

    def failing_save(obj, path, *args, **kwargs):
        if obj.get("step") == 2:
            Path(path).write_bytes(b"partial")
            raise KeyboardInterrupt if fault == "killed" else OSError(errno.ENOSPC, "No space")
        return real_save(obj, path, *args, **kwargs)

    crashed = tmp_path / "crashed"
    monkeypatch.setattr(checkpoint_module.torch, "save", failing_save)
    with pytest.raises(KeyboardInterrupt if fault == "killed" else OSError):
        Trainer(make_config(crashed, tiny_model_dir, *common)).train()
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)
    assert latest_checkpoint(crashed).name == "step_000001"
    Trainer(make_config(crashed, tiny_model_dir, *common), resume=True).train()
    assert without_timings(read_metrics(crashed)) == without_timings(read_metrics(straight))


def test_metrics_line_cut_by_a_crash_is_dropped_on_resume(run, tiny_model_dir):
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')  # killed mid-write
    Trainer(make_config(run, tiny_model_dir, "steps=3"), resume=True).train()
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2, 3]


def test_every_logged_step_is_an_integer(trained_run):
    rows = read_metrics(trained_run)
    assert all(type(r["step"]) is int for r in rows)
    assert "eval/greedy_accuracy" in rows[-1]


# --------------------------------------------------------------------------- numerics
@pytest.mark.parametrize(
    "method",
    [[], ["algo.estimator=agpo", "agpo.enabled=true", "agpo.probe=previous"]],
    ids=["grpo", "agpo"],  # AGPO's step-KL pass checks the final weights' log-probs
)
def test_update_that_breaks_the_policy_stops_with_nonfinite_error(tmp_path, tiny_model_dir, method):
    trainer = Trainer(make_config(tmp_path, tiny_model_dir, "optim.lr=1e30", "steps=3", *method))
    trainer.collector.scorer = PatternScorer()
    with pytest.raises(NonFiniteError, match="non-finite log-probabilities; lower optim.lr"):
        trainer.train()


def test_a_broken_policy_that_passes_the_update_check_stops_at_sampling(
    tmp_path, tiny_model_dir, monkeypatch
):
    # finite but huge weights can give finite log-probs on the update's one probe row: the
    # sampling of the next step is where torch.multinomial would then fail with a bare error
    monkeypatch.setattr(PolicyUpdate, "check_finite", lambda self, step, batch, rows: None)
    cfg = make_config(tmp_path, tiny_model_dir, "optim.lr=1e30", "steps=3", "checkpoint_every=1")
    trainer = Trainer(cfg)
    trainer.collector.scorer = PatternScorer()
    with pytest.raises(
        NonFiniteError,
        match=r"sampling after step 1 met non-finite next-token scores .*lower optim.lr",
    ):
        trainer.train()
    assert latest_checkpoint(tmp_path).name == "step_000001"
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1]


def test_cli_reports_a_broken_update_in_one_line(trained_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(collect_module, "RewardScorer", lambda *args, **kwargs: PatternScorer())
    config = str(trained_run / "config.yaml")
    assert (
        main(["train", "--config", config, f"output_dir={tmp_path / 'run'}", "optim.lr=1e30"]) == 2
    )
    assert "lower optim.lr (now 1e+30)" in last_error_line(capsys)


def test_eval_of_the_starting_policy_leaves_the_configs_run_alone(run, capsys):
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    args = ["eval", "--config", str(run / "config.yaml"), f"output_dir={run}", "eval.k=1"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 0
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_resume_and_overwrite_exclude_each_other(run, capsys):
    assert main(["train", "--resume", "--overwrite", f"output_dir={run}"]) == 2
    assert "--resume and --overwrite exclude each other" in last_error_line(capsys)


def test_file_planted_into_a_checkpoint_makes_it_unusable(run, tiny_model_dir):
    planted = run / "checkpoints" / "step_000002" / "policy" / "extra.safetensors"
    shutil.copy(run / "checkpoints" / "step_000002" / "policy" / "model.safetensors", planted)
    with pytest.warns(UserWarning, match="extra.safetensors is not listed in"):
        trainer = Trainer(make_config(run, tiny_model_dir, "steps=3"), resume=True)
    assert trainer.step_count == 1
    trainer.close()


def test_eval_of_another_models_checkpoint_names_both_models(run, capsys):
    # the run trained the test's tiny Llama; the tiny-cpu preset's model is the built-in one
    assert main(["eval", "--checkpoint", str(run), "--config", "tiny-cpu", "eval.k=1"]) == 2
    error = last_error_line(capsys)
    assert (
        f"{run / 'checkpoints' / 'step_000002' / 'policy'} holds weights of another model" in error
    )
    assert "model.name_or_path=builtin:tiny (full)" in error
    assert "size mismatch for model.embed_tokens.weight" in error
    assert "the run's config.yaml names model " in error and "tiny-llama" in error


def test_eval_of_a_checkpoint_in_another_mode_names_both(run, capsys):
    assert main(["eval", "--checkpoint", str(run), "model.mode=lora", "eval.k=1"]) == 2
    error = last_error_line(capsys)
    assert "holds weights of another model than model.name_or_path=" in error
    assert "(lora): No such file or directory" in error and error.endswith("(full)")


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 1-step PPO run: its checkpoint holds the value head (copy it to change it)."""
    run = tmp_path_factory.mktemp("ppo") / "run"
    Trainer(make_config(run, tiny_model_dir, "algo.estimator=ppo", "steps=1")).train()
    return run


def test_eval_of_a_checkpoint_without_a_value_head_names_it(run, capsys):
    assert main(["eval", "--checkpoint", str(run), "algo.estimator=ppo", "eval.k=1"]) == 2
    error = last_error_line(capsys)
    head = run / "checkpoints" / "step_000002" / "policy" / "value_head.safetensors"
    assert error.startswith(f"rlkit eval: error: PPO's value head {head} is missing"), error
    assert "holds weights of another model" not in error


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"weight": torch.zeros(1, 7), "bias": torch.zeros(1)},
            "PPO's value head {head} does not fit the policy's: size mismatch for weight: copying "
            "a param with shape torch.Size([1, 7]) from checkpoint, the shape in current model is "
            "torch.Size([1, 32]) (a damaged checkpoint, or one of another model)",
        ),
        (b"garbage", "{head} is not a readable safetensors file (Error while deserializing header"),
    ],
    ids=["other-shape", "garbled"],
)
def test_a_value_head_that_passes_the_manifest_but_does_not_load_is_named(
    ppo_run, tmp_path, capsys, content, message
):
    from safetensors.torch import save_file

    run = tmp_path / "run"
    shutil.copytree(ppo_run, run)
    step_dir = latest_checkpoint(run)
    head = step_dir / "policy" / "value_head.safetensors"
    if isinstance(content, dict):
        save_file(content, head)
    else:
        head.write_bytes(content)
    rewrite_manifest(step_dir)
    assert main(["eval", "--checkpoint", str(run), "eval.k=1"]) == 2
    error = last_error_line(capsys)
    assert error.startswith(f"rlkit eval: error: {message.format(head=head)}"), error
    assert "holds weights of another model" not in error


def test_garbled_weights_that_pass_the_manifest_are_named(run, capsys):
    step_dir = run / "checkpoints" / "step_000002"
    weights = step_dir / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    rewrite_manifest(step_dir)
    assert main(["eval", "--checkpoint", str(run), "eval.k=1"]) == 2
    error = last_error_line(capsys)
    assert error.startswith(f"rlkit eval: error: {weights} is not a readable safetensors file")


def test_eval_of_a_broken_policy_is_one_line(run, monkeypatch, capsys):
    from rlkit.rollout import NonFiniteScoresError

    def broken(*args, **kwargs):
        raise NonFiniteScoresError("non-finite next-token scores after 5 tokens")

    monkeypatch.setattr(trainer_module, "score_problems", broken)
    assert main(["eval", "--checkpoint", str(run), "eval.k=1"]) == 2
    assert last_error_line(capsys).startswith(
        "rlkit eval: error: sampling after step 2 met non-finite next-token scores after 5 tokens"
    )


def test_eval_checkpoint_path_expands_home(run, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(run.parent))
    assert main(["eval", "--checkpoint=~/run", "eval.k=1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 2


def test_a_run_saved_under_an_old_default_is_told_how_to_continue():
    """A run saved before optim.share_prompt_forward's default became auto, met again under the
    new default (a sweep rerun over its old directories), is refused with the override that
    keeps its saved value; a value the user chose gets no such hint."""
    wanted = load_config("tiny-cpu")
    for saved_value, hinted in ((False, True), (True, False)):
        saved = load_config("tiny-cpu", [f"optim.share_prompt_forward={saved_value}"])
        with pytest.raises(ValueError, match="share_prompt_forward='auto' differs") as err:
            check_resume_config(saved, wanted)
        hint = "changed from False to 'auto' on 2026-12-01: set optim.share_prompt_forward=false"
        assert (hint in str(err.value)) is hinted


@pytest.fixture(scope="module")
def ebpo_agpo_run(tmp_path_factory, tiny_model_dir) -> Path:
    """A finished 2-step EBPO + AGPO run with checkpoints at steps 1 and 2."""
    run = tmp_path_factory.mktemp("ebpo_agpo") / "run"
    overrides = ("checkpoint_every=1", "algo.estimator=ebpo", "agpo.enabled=true")
    Trainer(make_config(run, tiny_model_dir, *overrides)).train()
    return run


def _set(path: tuple, value):
    """A change that puts ``value`` at the nested key ``path`` of the trainer state."""

    def change(state):
        for key in path[:-1]:
            state = state[key]
        state[path[-1]] = value(state[path[-1]]) if callable(value) else value

    return change


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("sampler", "position"), 10**6, "the prompt sampler's saved place (epoch 0, position"),
        (("sampler", "epoch"), -1, "the prompt sampler's saved place (epoch -1"),
        ("m2", lambda t: t - 1.0, "running moments: a negative count or M2"),
        ("mean", lambda t: t * float("nan"), "running moments: a count, mean or M2 is not finite"),
        ("count", lambda t: t[:0], "running moments: count, mean, M2 of shapes"),
        ("u_bar", float("nan"), "AGPO's running uncertainty Ū must be finite and >= 0, got nan"),
        ("value", float("inf"), "EMA value must be finite, got inf"),
        ("cluster_slots", {0: 5, 1: 5}, "EBPO's cluster slots [5, 5] are not distinct slots"),
    ],
)
def test_running_statistics_that_break_their_invariants_are_refused_on_resume(
    ebpo_agpo_run, tmp_path, capsys, where, value, message
):
    """Issue 42 §3: a checkpoint rehashed after its sampler place, EBPO's history or AGPO's
    running statistics were changed to values no run produces is refused, naming the file."""
    run = tmp_path / "run"
    shutil.copytree(ebpo_agpo_run, run)

    def change(state):
        if isinstance(where, tuple):
            return _set(where, value)(state)
        found = find_key(state, where)
        assert found is not None, f"no {where!r} in the trainer state"
        _set((where,), value)(found)

    step_dir = tamper_state(run, change)
    assert main(["train", "--resume", f"output_dir={run}", "steps=3"]) == 2
    line = last_error_line(capsys)
    assert f"{step_dir / 'trainer_state.pt'} is inconsistent: " in line
    assert message in line


def find_key(state, key):
    """The first dict (depth first) in ``state`` holding ``key``."""
    if isinstance(state, dict):
        if key in state:
            return state
        for value in state.values():
            found = find_key(value, key)
            if found is not None:
                return found
    return None
