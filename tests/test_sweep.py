"""``rlkit sweep``: spec checks before any run, the grid of run directories, skip-finished and
resume-after-kill (tiny fixture model, 2 steps, 2 seeds, runs in this process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlkit import pool
from rlkit.checkpoint import load_checkpoint
from rlkit.cli import main
from rlkit.metrics import read_metrics
from rlkit.sweep import parse_spec, plan, run_sweep
from rlkit.tasks.loader import load_problems, subset
from rlkit.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "steps=2",
    "rollout.num_prompts=2",
    "rollout.max_new_tokens=4",
    "task.num_train=32",
    "task.num_eval=4",
    "eval.num_problems=4",
    "eval.k=1",
    "checkpoint_every=1",
]


def write_spec(tmp_path, model_dir, **changes):
    spec = {
        "name": "t",
        "base": "tiny-cpu",
        "out": str(tmp_path / "out"),
        "overrides": [f"model.name_or_path={model_dir}", *SMALL],
        "arms": {"GRPO": ["algo.estimator=grpo"], "EBPO": ["algo.estimator=ebpo"]},
        "group_sizes": [2],
        "seeds": [0, 1],
        "baseline": "GRPO",
        "workers": 0,
    } | changes
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arm": {"x": []}}, "unknown key 'arm'"),
        ({"arms": {"GRPO": [], "EBPO": ["algo.estimator=nope"]}}, "arm EBPO: algo.estimator"),
        (
            {"arms": {"GRPO": [], "EBPO": ["rollout.nope=1"]}},
            "arm EBPO: unknown config key rollout.nope",
        ),
        ({"overrides": ["seed=3"]}, "overrides: seed is set by the sweep"),
        (
            {"arms": {"GRPO": [], "A": ["rollout.group_size=4"]}},
            "A: rollout.group_size is set by the sweep",
        ),
        ({"baseline": "PPO"}, "baseline 'PPO' is not an arm"),
        ({"seeds": [0, 0]}, "seeds must be distinct"),
        ({"arms": {"GRPO": [], "a/b": []}}, "arm name 'a/b'"),
        (
            {"seeds": [0, 2**32]},
            "<= 4294967295, got \\[0, 4294967296\\] \\(4294967296 is out of range\\)",
        ),
        ({"seeds": [-1]}, "-1 is out of range"),
        ({"token_budget": 0}, "token_budget must be an integer >= 1, got 0"),
        ({"token_budget": "300M"}, "token_budget must be an integer >= 1, got '300M'"),
        (
            {"token_budget": 100, "arms": {"GRPO": [], "A": ["token_budget=5"]}},
            "A: token_budget is set by the sweep",
        ),
        ({"seeds": [0, "1"]}, "seeds must be a non-empty list of integers"),
        ({"seeds": 3}, "seeds must be a non-empty list of integers"),
        ({"out": 5}, "out must be a directory path"),
        ({"out": ["a"]}, "out must be a directory path"),
        ({"baseline": ["GRPO"]}, "baseline \\['GRPO'\\] is not an arm"),
        ({"baseline": 1}, "baseline 1 is not an arm"),
        (
            {"arms": {"GRPO": [], "EBPO": ["task.arithmetic={train_size: 0}"]}},
            "arm EBPO: the training split of task.name=arithmetic is empty with "
            "task.arithmetic.train_size=0",
        ),
        (
            {"arms": {"GRPO": [], "EBPO": ["task.arithmetic={eval_size: 0}"]}},
            "arm EBPO: the eval split of task.name=arithmetic is empty",
        ),
        (
            {"arms": {"GRPO": [], "EBPO": ["eval.num_problems=100000", "task.num_eval=100000"]}},
            "arm EBPO: eval.num_problems=100000 .* asks for more problems than the eval split",
        ),
    ],
)
def test_bad_specs_fail_before_any_run(tmp_path, tiny_model_dir, change, message):
    path = write_spec(tmp_path, tiny_model_dir, **change)
    with pytest.raises(ValueError, match=message):
        run_sweep(path, progress=False)
    assert not (tmp_path / "out").exists()


SUPERIORITY = {"name": "c", "arm": "EBPO", "test": "superiority", "direction": 1}


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"name": "c"}, r"claims must be a list of mappings, got \{'name': 'c'\}"),
        (["c"], r"claims\[0\] must be a mapping, got 'c'"),
        ([SUPERIORITY | {"dirction": 1}], r"claims\[0\]: unknown key 'dirction'; known: "),
        ([SUPERIORITY | {"name": ""}], r"claims\[0\]: name must be a non-empty string"),
        ([SUPERIORITY, dict(SUPERIORITY)], r"claims\[1\]: name 'c' is used twice"),
        ([SUPERIORITY | {"arm": "PPO"}], r"claims\[0\] \(c\): arm 'PPO' is not an arm"),
        ([SUPERIORITY | {"vs": "EBPO"}], r"\(c\): arm and vs are the same arm 'EBPO'"),
        ([SUPERIORITY | {"metric": "reward"}], r"\(c\): metric 'reward': must be one of"),
        ([SUPERIORITY | {"test": "better"}], r"\(c\): test 'better': must be one of"),
        ([SUPERIORITY | {"measure": "dip"}], r"\(c\): measure 'dip': must be one of"),
        (
            [
                SUPERIORITY
                | {"test": "equivalence", "direction": None, "measure": "shift_dip"}
                | {"margin": "half_baseline_gain"}
            ],
            r"\(c\): margin 'half_baseline_gain' is a share of the end accuracy's gain; "
            r"measure 'shift_dip' needs a margin in accuracy units",
        ),
        (
            [SUPERIORITY | {"direction": 0}],
            r"direction \(\+1 or -1\) is required by superiority tests, got 0",
        ),
        (
            [SUPERIORITY | {"test": "equivalence", "margin": 0.01}],
            r"\(c\): direction is not used by equivalence tests, got 1",
        ),
        (
            [SUPERIORITY | {"test": "noninferiority"}],
            r"\(c\): margin is required by noninferiority tests",
        ),
        ([SUPERIORITY | {"margin": -0.01}], r"\(c\): margin -0.01: must be accuracy units > 0"),
        ([SUPERIORITY | {"margin": "half"}], r"\(c\): margin 'half': must be"),
        ([SUPERIORITY | {"family": ""}], r"\(c\): family '': must be"),
        ([SUPERIORITY | {"group_size": 8}], r"\(c\): group_size 8 is not a G of the sweep \[2\]"),
        ([SUPERIORITY | {"planned_mdd": 0.01}], r"planned_mdd and planned_from go together"),
        (
            [SUPERIORITY | {"planned_mdd": "1", "planned_from": "pilot"}],
            r"\(c\): planned_mdd '1': must be",
        ),
    ],
)
def test_bad_claims_are_named_when_the_spec_is_loaded(tmp_path, claims, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_spec(write_spec(tmp_path, "unused", claims=claims))
    assert str(err.value).startswith("sweep spec: ")


def test_claims_defaults_are_resolved_when_the_spec_is_loaded(tmp_path):
    spec = parse_spec(write_spec(tmp_path, "unused", claims=[SUPERIORITY]))
    (claim,) = spec.claims
    assert (claim.vs, claim.metric, claim.family, claim.group_size) == (
        "GRPO",
        "eval/greedy_accuracy",
        "t",
        2,
    )
    with pytest.raises(ValueError, match=r"\(c\): group_size is required \(the sweep has G"):
        parse_spec(write_spec(tmp_path, "unused", claims=[SUPERIORITY], group_sizes=[2, 4]))
    assert parse_spec(write_spec(tmp_path, "unused")).claims == []


@pytest.mark.parametrize(
    ("manipulation", "message"),
    [
        ([], r"manipulation must be a mapping arm -> checks, got \[\]"),
        ({"PPO": [{"metric": "m", "acts_if": "> 0"}]}, r"manipulation.PPO: 'PPO' is not an arm"),
        ({"EBPO": []}, r"manipulation.EBPO must be a non-empty list of checks"),
        ({"EBPO": [{"metric": "m"}]}, r"manipulation.EBPO\[0\] must be a mapping with metric"),
        (
            {"EBPO": [{"metric": "m", "acts_if": "> 0", "by": "GRPO"}]},
            r"manipulation.EBPO\[0\] must be a mapping with metric, acts_if and optionally of",
        ),
        (
            {"EBPO": [{"metric": "m", "acts_if": "> 0", "of": "PPO"}]},
            r"EBPO\[0\]: of must be another arm, .* got 'PPO'; arms: \['GRPO', 'EBPO'\]",
        ),
        ({"EBPO": [{"metric": "m", "acts_if": "> 0", "of": "EBPO"}]}, r"of must be another arm"),
        ({"EBPO": [{"metric": "", "acts_if": "> 0"}]}, r"EBPO\[0\]: metric must be a metrics"),
        (
            {"EBPO": [{"metric": "m", "acts_if": "0.01"}]},
            r"EBPO\[0\]: acts_if must be '<op> <number>' .* got '0.01'",
        ),
        ({"EBPO": [{"metric": "m", "acts_if": "== 1"}]}, r"acts_if must be .* got '== 1'"),
    ],
)
def test_bad_manipulation_checks_are_named_when_the_spec_is_loaded(tmp_path, manipulation, message):
    with pytest.raises(ValueError, match="sweep spec: .*" + message):
        parse_spec(write_spec(tmp_path, "unused", manipulation=manipulation))


def test_manipulation_checks_compare_the_mean_with_acts_if(tmp_path):
    checks = {
        "EBPO": [{"metric": "m", "acts_if": op} for op in ("> 0.01", ">=1e-2", "<-1", "<= .5")]
    }
    spec = parse_spec(write_spec(tmp_path, "unused", manipulation=checks))
    gt, ge, lt, le = spec.manipulation["EBPO"]
    assert (gt.acted(0.01), ge.acted(0.01), lt.acted(-1.0), le.acted(0.5)) == (
        False,
        True,
        False,
        True,
    )
    assert gt.acted(0.011) and lt.acted(-1.5) and not le.acted(0.51)


def test_a_shift_dip_claim_needs_a_task_shift_in_both_arms(tmp_path, tiny_model_dir):
    claim = SUPERIORITY | {"measure": "shift_dip", "direction": -1}
    shift = "task.shift={step: 1, arithmetic: {topics: [mul]}}"
    one_arm = {"arms": {"GRPO": ["algo.estimator=grpo"], "EBPO": ["algo.estimator=ebpo", shift]}}
    spec = parse_spec(write_spec(tmp_path, tiny_model_dir, claims=[claim], **one_arm))
    with pytest.raises(ValueError, match="claim 'c' has measure 'shift_dip', but arm GRPO's runs"):
        plan(spec)
    overrides = [f"model.name_or_path={tiny_model_dir}", *SMALL, shift]
    spec = parse_spec(write_spec(tmp_path, tiny_model_dir, claims=[claim], overrides=overrides))
    assert {r.cfg.task.shift["step"] for r in plan(spec)} == {1}


def test_plan_is_arms_by_group_sizes_by_seeds(tmp_path, tiny_model_dir):
    spec = parse_spec(write_spec(tmp_path, tiny_model_dir, group_sizes=[2, 4]))
    runs = plan(spec)
    assert [r.key for r in runs] == [
        f"{a}/G{g}/seed{s}" for a in ("GRPO", "EBPO") for g in (2, 4) for s in (0, 1)
    ]
    run = runs[-1]
    assert run.cfg.rollout.group_size == 4 and run.cfg.seed == 1
    assert run.cfg.algo.estimator == "ebpo" and run.cfg.steps == 2
    assert run.dir == tmp_path / "out" / "EBPO" / "G4" / "seed1"


def test_sweep_trains_seed_by_seed(tmp_path, tiny_model_dir, monkeypatch):
    """A sweep stopped part-way leaves whole paired seeds: every arm and G of a seed is handed to
    the pool before the next seed's (the grid itself stays arms x G x seeds)."""
    path = write_spec(tmp_path, tiny_model_dir, group_sizes=[2, 4], seeds=[3, 1])
    handed = []
    monkeypatch.setattr(
        "rlkit.sweep.run_pool", lambda fn, jobs, *args, **kwargs: handed.extend(jobs)
    )
    run_sweep(path, progress=False)
    assert handed == [f"{a}/G{g}/seed{s}" for s in (3, 1) for a in ("GRPO", "EBPO") for g in (2, 4)]


def test_sweep_runs_skips_finished_and_resumes_killed(tmp_path, tiny_model_dir, monkeypatch):
    path = write_spec(tmp_path, tiny_model_dir)
    out = tmp_path / "out"

    # the first run of the grid is killed after its first step's checkpoint
    original_step, calls = Trainer.step, []

    def dies_once_at_step_2(self):
        if self.step_count == 1 and not calls:
            calls.append(self.run_dir)
            raise KeyboardInterrupt  # what a killed process leaves: a checkpoint at step 1
        return original_step(self)

    monkeypatch.setattr(Trainer, "step", dies_once_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(path, progress=False)
    killed = out / "GRPO" / "G2" / "seed0"
    assert calls == [killed] and load_checkpoint(killed).step == 1
    run_id = load_checkpoint(killed).run_id

    found = run_sweep(path, progress=False)
    assert found == {
        "done": [],
        "resume": ["GRPO/G2/seed0"],
        "fresh": ["GRPO/G2/seed1", "EBPO/G2/seed0", "EBPO/G2/seed1"],
    }
    checkpoint = load_checkpoint(killed)
    assert checkpoint.step == 2 and checkpoint.run_id == run_id  # resumed, not restarted
    assert [r["step"] for r in read_metrics(killed)] == [0, 1, 2]
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["baseline"] == "GRPO" and len(manifest["runs"]) == 4
    assert manifest["command"] == f"rlkit sweep {path}"

    # everything finished: a rerun trains nothing
    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(pool, "train_run", no_training)
    monkeypatch.setattr(Trainer, "__init__", no_training)
    assert run_sweep(path, progress=False)["done"] == [
        "GRPO/G2/seed0",
        "GRPO/G2/seed1",
        "EBPO/G2/seed0",
        "EBPO/G2/seed1",
    ]


def test_changed_spec_is_refused_for_existing_runs(tmp_path, tiny_model_dir, capsys):
    path = write_spec(tmp_path, tiny_model_dir, arms={"GRPO": []}, seeds=[0])
    assert main(["sweep", str(path)]) == 0
    assert "0 done, 0 resume, 1 fresh" in capsys.readouterr().out
    # more steps: the finished run resumes; another learning rate: refused, naming the key
    write_spec(tmp_path, tiny_model_dir, arms={"GRPO": ["steps=3"]}, seeds=[0])
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert "resume GRPO/G2/seed0" in capsys.readouterr().out
    write_spec(tmp_path, tiny_model_dir, arms={"GRPO": ["optim.lr=1e-3"]}, seeds=[0])
    assert main(["sweep", str(path)]) == 2
    assert "optim.lr" in capsys.readouterr().err


def test_pool_runs_jobs_in_worker_processes_and_names_failures():
    # builtins: a spawned worker unpickles them without importing this test module
    assert pool.run_pool(pow, {"a": (2, 2), "b": (3, 2)}, 2, progress=False) == {"a": 4, "b": 9}
    with pytest.raises(RuntimeError, match="1 of 2 runs failed: x; first error \\(x\\): invalid"):
        pool.run_pool(int, {"x": ("bad",), "y": ("7",)}, 1, progress=False)


@pytest.mark.parametrize("spec", sorted(ROOT.glob("sweeps/*.yaml")), ids=lambda p: p.stem)
def test_shipped_specs_are_valid(spec):
    runs = plan(parse_spec(spec))
    assert runs and len({r.dir for r in runs}) == len(runs)


@pytest.mark.parametrize("spec", sorted(ROOT.glob("sweeps/*.yaml")), ids=lambda p: p.stem)
def test_shipped_specs_evaluate_the_problems_of_their_committed_results(spec):
    """Rerunning a shipped spec evaluates as many held-out problems as its committed summary
    reports, whatever the base preset's eval.num_problems says now (the spec pins it). Arms
    added after the committed run (no row yet) have nothing to match; every committed arm must
    still be in the spec."""
    summary = ROOT / "results" / spec.stem / "summary.json"
    if not summary.is_file():
        pytest.skip(f"no committed results for {spec.stem}")
    rows = json.loads(summary.read_text())["rows"]
    committed = {(r["arm"], r["group_size"]): r["eval_problems"] for r in rows}
    splits = {}
    runs = plan(parse_spec(spec))
    assert set(committed) <= {(r.arm, r.group_size) for r in runs}
    for run in runs:
        if (run.arm, run.group_size) not in committed:
            continue
        task = run.cfg.task
        if repr(task) not in splits:
            splits[repr(task)] = load_problems(task)[1]
        evaluated = len(subset(splits[repr(task)], run.cfg.eval.num_problems))
        assert evaluated == committed[run.arm, run.group_size], (
            f"{spec.name}: {run.key} would evaluate {evaluated} problems, "
            f"{summary.relative_to(ROOT)} has {committed[run.arm, run.group_size]}"
        )


def test_the_manifest_records_the_spec_files_sha256(tmp_path):
    """sweep.json holds the sha256 of the spec file's bytes (issue 42): what git show of the
    pre-registration commit must hash to."""
    import hashlib

    from rlkit.sweep import write_manifest

    path = ROOT / "sweeps/22_ebpo.yaml"
    spec = parse_spec(path)
    spec.out = tmp_path / "out"
    manifest = json.loads(write_manifest(spec, path, []).read_text())
    assert manifest["spec_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_token_budget_stops_each_run_counting_the_probe_and_audits_it(tmp_path, tiny_model_dir):
    """``token_budget`` (the AGPO authors' token-matched protocol, commit d6676b8): each run
    stops at the first step whose generated tokens, the probe's included, reach the budget; that
    step is evaluated and checkpointed as a last step, the report takes the run as finished,
    ``token_audit.json`` records its count, and a rerun finds it done."""
    from rlkit.report import check_finished
    from rlkit.sweep import TOKEN_AUDIT

    arms = {"GRPO": ["algo.estimator=grpo"], "AGPO": ["agpo.enabled=true"]}
    budget = 20  # 2 prompts × G 2 × at most 4 new tokens: ≤ 16 a step, more with AGPO's probe
    overrides = [f"model.name_or_path={tiny_model_dir}", *SMALL, "steps=5"]  # steps: a cap
    path = write_spec(
        tmp_path, tiny_model_dir, arms=arms, seeds=[0], token_budget=budget, overrides=overrides
    )
    assert [r.cfg.token_budget for r in plan(parse_spec(path))] == [budget] * 2
    run_sweep(path, progress=False)
    audit = {a["run"]: a for a in json.loads((tmp_path / "out" / TOKEN_AUDIT).read_text())}
    assert list(audit) == ["GRPO/G2/seed0", "AGPO/G2/seed0"]
    for entry in audit.values():
        rows = read_metrics(entry["dir"])
        last, before = rows[-1], rows[-2]
        spent = entry["tokens_generated"] + entry["tokens_probe"]
        assert entry["stopped_by"] == "token_budget" and entry["step"] == last["step"] < 5
        assert entry["tokens_total"] == spent >= budget
        assert entry["over_budget"] == spent - budget
        # the step before had not reached it (step 0: no tokens yet)
        assert (before.get("tokens/generated") or 0) + (before.get("tokens/probe") or 0) < budget
        assert "eval/greedy_accuracy" in last and load_checkpoint(entry["dir"]).step == last["step"]
        check_finished(rows, 5, budget)
    assert audit["GRPO/G2/seed0"]["tokens_probe"] == 0
    agpo = audit["AGPO/G2/seed0"]
    assert agpo["tokens_probe"] > 0 and agpo["tokens_generated"] < budget  # the probe counted
    assert agpo["step"] < audit["GRPO/G2/seed0"]["step"]
    with pytest.raises(ValueError, match="not finished: .* or token_budget=1000"):
        check_finished(read_metrics(agpo["dir"]), 5, 1000)
    assert run_sweep(path, progress=False)["done"] == list(audit)
