"""Golden runs: short tiny trainings whose ``metrics.jsonl`` a refactor must reproduce byte for byte.

Each case is a 3-step run of the built-in tiny policy (a 4-bit 64-wide Llama for ``qlora``) on the
arithmetic task at one thread, one case per training path (every estimator and method: GRPO,
Dr. GRPO, RLOO, EBPO's priors, JSPO and JSPO++, PPO and its adaptive KL, DPO online and offline;
DAPO, Clip-Cov and KL-Cov, AGPO's probes, stale rollouts, the pass options, the task shift, the
curriculum). ``resume`` continues the checkpoint
fixture in ``resume_fixture/`` (written by the recorded code at step 2 of a 4-step LoRA run with
EBPO clusters and AGPO's ``previous`` probe, so every piece of trainer state is non-trivial) and
must equal the uninterrupted run. A stored file is the run's ``metrics.jsonl`` with the ``time/*``
keys removed, everything else (values and key order) as written.

Float results depend on the CPU's kernels, so ``fingerprint.json`` records, case by case, the
machine, its kernel mode and the library versions each file was made with. Under rlkit's default
``portable`` kernels (:mod:`rlkit.machine`) a file is the reference on any x86-64 CPU with AVX2
with the same libraries, so tests/test_golden.py compares against it there (this is the test that
a seeded run repeats on another CPU); elsewhere (other library versions, other kernels) it
regenerates the reference with the code of the commit that last wrote the file.

    python tests/golden/make_golden.py                # every case into tests/golden/
    python tests/golden/make_golden.py --only grpo,rloo --out /tmp/ref
    python tests/golden/make_golden.py --fixture      # rewrite the checkpoint fixture as well

Only interfaces that predate the golden files are used (``load_config``, ``Trainer``,
``saved_config``, ``one_torch_thread``), so the script also runs against older code on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from rlkit.machine import fingerprint
from rlkit.models.tiny import one_torch_thread

GOLDEN_DIR = Path(__file__).resolve().parent
FIXTURE = "resume_fixture"
FINGERPRINT = "fingerprint.json"

# The base overrides repeat tests/test_trainer.make_config's (with their own steps and prompts)
# deliberately instead of importing them: the golden files must not move when that helper changes.
COMMON = (
    "steps=3",
    "rollout.num_prompts=8",
    "rollout.group_size=4",
    "task.num_train=64",
    "task.num_eval=8",
    "eval.num_problems=8",
    "eval.k=2",
    "eval.every=0",
    "checkpoint_every=0",
    "tensorboard=false",
    "progress=false",
)
AGPO = ("algo.estimator=agpo", "agpo.enabled=true")
FOUR_MINI_BATCHES = ("optim.mini_batch_size=8",)  # 8 prompts x 4 completions = 32 rows
QLORA_MODEL = "{qlora_model}"  # filled in with a freshly built 4-bit-compatible Llama

CASES: dict[str, tuple[str, ...]] = {
    "grpo": (),
    "dr_grpo": ("algo.estimator=dr_grpo",),
    "rloo": ("algo.estimator=rloo",),
    "ebpo_history_topic": (
        "algo.estimator=ebpo",
        "algo.options={prior: history}",
        "algo.cluster_key=topic",
        "rollout.order=topic",
    ),
    "ebpo_batch_center": ("algo.estimator=ebpo", "algo.options={prior: batch, whitening: center}"),
    "dapo": (
        "rollout.dynamic_sampling=true",
        "rollout.overlong_buffer=4",
        "loss.eps_high=0.28",
        *FOUR_MINI_BATCHES,
    ),
    "agpo_full": (*AGPO, "agpo.probe=full", *FOUR_MINI_BATCHES),
    "agpo_previous": (*AGPO, "agpo.probe=previous", *FOUR_MINI_BATCHES),
    "agpo_reuse": (*AGPO, "agpo.probe=reuse", *FOUR_MINI_BATCHES),
    "agpo_reuse_fixed_tau": (
        *AGPO,
        "agpo.probe=reuse",
        "agpo.adaptive_temperature=false",
        *FOUR_MINI_BATCHES,
    ),
    "agpo_two_epochs": (*AGPO, "optim.update_epochs=2"),
    "plain_forward": ("optim.share_prompt_forward=false",),  # the default shares prompts
    "every_pass_kl": ("optim.skip_redundant_passes=false", "loss.kl_coef=0.1"),
    "task_shift": ("task.shift={step: 2, arithmetic: {topics: [mul]}}",),
    "difficulty_order": ("rollout.order=difficulty",),
    "ppo": ("algo.estimator=ppo", *FOUR_MINI_BATCHES),
    "ppo_adaptive_kl": ("algo.estimator=ppo", "ppo.adaptive_kl=true"),
    "dpo": ("algo.estimator=dpo",),
    "dpo_offline": ("algo.estimator=dpo", "dpo.mode=offline"),
    "jspo": ("algo.estimator=jspo",),
    "jspo_plus_plus": ("algo.estimator=jspo_plus_plus",),
    "clip_cov": ("loss.loss_mode=clip_cov", *FOUR_MINI_BATCHES),
    "kl_cov": ("loss.loss_mode=kl_cov", *FOUR_MINI_BATCHES),
    "stale": ("rollout.lag=1", "algo.estimator=ebpo"),
    "qlora": (
        f"model.name_or_path={QLORA_MODEL}",
        "model.mode=qlora",
        "model.lora_r=8",
        "model.lora_alpha=16",
        "model.gradient_checkpointing=true",
        "model.device=cpu",
    ),
}
# The checkpoint fixture's run: 4 steps, a checkpoint at step 2 (the fixture), LoRA adapters so
# the fixture stays small, and every stateful component in use.
RESUME = (
    "steps=4",
    "checkpoint_every=2",
    "keep_checkpoints=2",
    "eval.at_start=false",
    "model.mode=lora",
    "algo.estimator=ebpo",
    "algo.cluster_key=topic",
    "rollout.order=topic",
    "agpo.enabled=true",
    "agpo.probe=previous",
    *FOUR_MINI_BATCHES,
)


def cleaned(metrics_file: Path) -> str:
    """``metrics.jsonl`` without the ``time/*`` keys (wall-clock), every other byte as written."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    return "".join(
        json.dumps({k: v for k, v in row.items() if not k.startswith("time/")}) + "\n"
        for row in rows
    )


def build_qlora_model(path: Path) -> str:
    """The 64-wide tiny Llama of tests/test_qlora.py (bitsandbytes' CPU 4-bit kernels need widths
    that are multiples of 64), built from a fixed seed with rlkit's character tokenizer."""
    # tests/conftest.py by its path: under pytest, the module named "conftest" can be another
    # folder's (notebooks/conftest.py when the whole suite runs)
    spec = importlib.util.spec_from_file_location(
        "rlkit_tests_conftest", GOLDEN_DIR.parent / "conftest.py"
    )
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    from rlkit.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer(fixtures.CHARACTERS)
    fixtures.build_tiny_llama(len(tokenizer), hidden_size=64).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def train(run_dir: Path, overrides: tuple[str, ...]) -> None:
    from rlkit.config import load_config
    from rlkit.trainer import Trainer

    cfg = load_config("tiny-cpu", [*COMMON, f"output_dir={run_dir}", *overrides])
    Trainer(cfg).train()


def resume(fixture: Path, run_dir: Path) -> str:
    """Continue the fixture's step-2 checkpoint (in a copy) to the end; its cleaned metrics."""
    from rlkit.rundir import saved_config
    from rlkit.trainer import Trainer

    shutil.copytree(fixture, run_dir)
    Trainer(saved_config(run_dir), resume=True).train()
    return cleaned(run_dir / "metrics.jsonl")


def run_case(name: str, work: Path, fixture: Path = GOLDEN_DIR / FIXTURE) -> str:
    """Case ``name``'s cleaned ``metrics.jsonl``, run at one thread under ``work``."""
    with one_torch_thread():  # golden files are made and compared at one thread
        if name == "resume":
            return resume(fixture, work / "resume")
        overrides = CASES[name]
        if name == "qlora":
            model = build_qlora_model(work / "qlora-model")
            overrides = tuple(o.format(qlora_model=model) for o in overrides)
        train(work / name, overrides)
        return cleaned(work / name / "metrics.jsonl")


def write_fixture(work: Path, fixture: Path) -> str:
    """Run the 4-step resume case without interruption and keep its run directory as it stood
    at step 2 (config, metrics up to step 2, the step-2 checkpoint) as the fixture; return the
    full run's metrics."""
    run = work / "straight"
    with one_torch_thread():  # golden files are made and compared at one thread
        train(run, RESUME)
    shutil.rmtree(fixture, ignore_errors=True)
    shutil.copytree(run, fixture, ignore=shutil.ignore_patterns("*.lock", ".*", "step_000004"))
    (fixture / "checkpoints" / "latest").write_text("step_000002")
    rows = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (fixture / "metrics.jsonl").write_text("".join(r for r in rows if json.loads(r)["step"] <= 2))
    return cleaned(run / "metrics.jsonl")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR)
    parser.add_argument("--only", default="", help="comma-separated cases (default: all)")
    parser.add_argument("--fixture", action="store_true", help="rewrite the checkpoint fixture")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else [*CASES, "resume"]
    unknown = set(names) - {*CASES, "resume"}
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; known: {[*CASES, 'resume']}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.fixture:
            straight = write_fixture(work / "fixture", args.out / FIXTURE)
            resumed = run_case("resume", work / "check", args.out / FIXTURE)
            if resumed != straight:
                raise SystemExit("the resumed fixture run differs from the uninterrupted run")
        for name in names:
            text = run_case(name, work, GOLDEN_DIR / FIXTURE)
            (args.out / f"{name}.jsonl").write_text(text)
            print(f"{name}: {len(text.splitlines())} rows", flush=True)
    if args.out == GOLDEN_DIR:
        record_fingerprint(args.out / FINGERPRINT, names)


def record_fingerprint(path: Path, names: list[str]) -> None:
    """Set this machine's :func:`fingerprint` as the one ``names``' stored files were made on,
    keeping the other cases' (each case is compared where its own file was made)."""
    recorded = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(recorded | dict.fromkeys(names, fingerprint()), indent=2) + "\n")


if __name__ == "__main__":
    main()
