"""World-size-invariant sampling (``rollout.sampling_stream=prompt``, docs/scaling-out.md).

Each prompt's group is drawn from a stream keyed by (seed, step, the prompt's index in the
global batch) and generated as a batch of its own, and evaluation generates each problem alone
under a seed keyed by its index. So the tokens sampled do not depend on how many processes run
or which rank holds a prompt: one, two and four processes (torchrun over gloo, in float64 so the
weights agree to rounding, tests/dp_worker.py) draw the same completions, rewards and
evaluations, for GRPO, EBPO with DAPO's refill and AGPO (probe, τ and clip acting); a run
checkpointed by two processes and resumed by one (or the other way round) is the uninterrupted
run; and the default ``rank`` stream, for contrast, samples other tokens with two processes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from dp_worker import BASE
from test_data_parallel import FLOAT64, WORKER, assert_close, metrics, run

from rlkit.config import load_config
from rlkit.dist import Local, share_bounds
from rlkit.evaluation import EVAL_SEED, generate_and_score
from rlkit.sampling import PromptSampler
from rlkit.trainer import Trainer

PROMPT = "rollout.sampling_stream=prompt"
# one launch per world size trains each of these runs in turn (two steps; checkpoints only
# where the resume needs one)
CASES = {
    "grpo": [PROMPT, "checkpoint_every=1"],
    # EBPO with per-topic priors; DAPO drops uniform groups and refills from the next prompts
    "ebpo_dapo": [
        PROMPT,
        "algo.estimator=ebpo",
        "algo.cluster_key=topic",
        "rollout.dynamic_sampling=true",
        "rollout.max_gen_batches=3",
    ],
    # AGPO's probe sets τ per prompt and ε per prompt; two epochs, so the clip acts
    "agpo": [PROMPT, "agpo.enabled=true", "optim.update_epochs=2"],
    # the probe group trained on where τ_t = τ_base, fresh groups for the other prompts
    "agpo_reuse": [PROMPT, "agpo.enabled=true", "agpo.probe=reuse"],
    "rank": [],  # the default stream, for contrast
}
COMMON = [FLOAT64, "steps=2"]
# four processes, one prompt each (the rank stream and the resumes are tested at two)
FOUR = ["grpo", "ebpo_dapo", "agpo", "agpo_reuse"]


# --------------------------------------------------------------------------- one process
class SecondHalf(Local):
    """Rank 1 of 2 as far as sharding goes (a collective that gathers nothing: only for
    drawing prompts, whose groups the methods without cross-rank statistics sample alone)."""

    rank, world = 1, 2

    def shard(self, items, even=True):
        start, end = share_bounds(len(items), self.rank, self.world, even)
        return list(items[start:end])


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    out = tmp_path_factory.mktemp("keyed")
    cfg = load_config("tiny-cpu", [*BASE, f"output_dir={out}", PROMPT])
    trainer = Trainer(cfg, overwrite=True)
    yield trainer
    trainer.close()


def draw(trainer: Trainer, batch: int, dist=None):
    """The groups of the run's batch ``batch`` from a fresh prompt order (the run's first
    prompts), as rank ``dist`` draws them (None: one process)."""
    collector = trainer.collector
    sampler = PromptSampler(trainer.train_problems, "shuffle", trainer.cfg.seed)
    collector.dist = dist or Local()
    try:
        return collector.draw(sampler, trainer.method, batch)[0]
    finally:
        collector.dist = trainer.dist


@pytest.mark.parametrize("engine", ["hf", "hf_static"])
def test_a_prompts_group_is_the_same_whatever_batch_holds_it(trainer, monkeypatch, engine):
    """Global prompts 2 and 3 of batch 5: drawn by one process among four prompts, or by the
    second of two processes alone, the same completions and rewards, bit for bit (HF's
    ``generate`` and the static decode loop)."""
    monkeypatch.setattr(trainer.collector.engine, "name", engine)
    whole, half = draw(trainer, 5), draw(trainer, 5, SecondHalf())
    g = trainer.cfg.rollout.group_size
    assert [p.id for p in half.problems] == [p.id for p in whole.problems[2:]]
    assert half.rollouts.completion_texts == whole.rollouts.completion_texts[2 * g :]
    assert torch.equal(half.rewards, whole.rewards[2:])
    assert torch.equal(half.rollouts.lengths, whole.rollouts.lengths[2 * g :])
    assert whole.rewards.std() > 0  # the shipped policy solves some, not all
    # the step enters the key: the same prompts at another step draw other completions
    assert draw(trainer, 6).rollouts.completion_texts != whole.rollouts.completion_texts


def test_a_group_not_drawn_by_the_collector_is_refused(trainer):
    temps = torch.ones(1)
    with pytest.raises(ValueError, match="was not drawn by Collector.draw"):
        trainer.collector(trainer.train_problems[:1], temps)


def test_keyed_evaluation_samples_a_problem_alike_in_any_shard(trainer):
    """``keyed``: problem i's k samples come from EVAL_SEED + i alone: a shard starting at
    problem 3, with another batch size, draws the whole evaluation's samples of problems 3–5."""
    policy, problems = trainer.policy, trainer.eval_problems[:6]
    scorer = trainer.collector.scorer

    def sampled(chosen, seed, batch_size):
        return generate_and_score(
            policy.model, policy.tokenizer, chosen, scorer, 2, 1.0, 4, batch_size, seed,
            keyed=True,
        )  # fmt: skip

    rewards, texts = sampled(problems, EVAL_SEED, 12)
    shard_rewards, shard_texts = sampled(problems[3:], EVAL_SEED + 3, 2)
    assert shard_texts == texts[6:] and torch.equal(shard_rewards, rewards[3:])


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("sampling_stream", "rank", "a run with rollout.sampling_stream=prompt resumes at any"),
        ("lag", 1, "with rollout.lag=1 each rank's share of the batches drawn ahead"),
    ],
)
def test_resume_at_another_world_size_is_refused_where_it_cannot_work(
    trainer, monkeypatch, setting, value, message
):
    monkeypatch.setattr(trainer.cfg.rollout, setting, value)
    with pytest.raises(ValueError, match="written by 2 process") as err:
        trainer.load_state(Path("checkpoints/step_000001"), {"world_size": 2})
    assert message in str(err.value)


def test_sampling_stream_is_checked():
    with pytest.raises(ValueError, match=r"rollout.sampling_stream must be one of .*'global'"):
        load_config("tiny-cpu", ["rollout.sampling_stream=global"])
    with pytest.raises(ValueError, match="rollout.sampling_stream='prompt' with rollout.engine"):
        load_config("tiny-cpu", [PROMPT, "rollout.engine=vllm"])


# ------------------------------------------------------------------ torchrun, 1 and 2 ranks
def launch(out: Path, nproc: int, cases: dict[str, dict]) -> dict[str, dict]:
    """Every run of ``cases`` trained in turn by one launch of ``nproc`` processes; rank 0's
    record of each."""
    spec = out.with_suffix(".json")
    spec.write_text(json.dumps(cases))
    run([str(WORKER), str(out), f"cases:{spec}", *COMMON], nproc)
    return {name: torch.load(out / name / "rank0.pt", weights_only=False) for name in cases}


def resumable(run: Path, to: Path) -> Path:
    """A copy of ``run`` as it was after step 1: its step-1 checkpoint the latest."""
    shutil.copytree(run, to)
    shutil.rmtree(to / "checkpoints" / "step_000002")
    (to / "checkpoints" / "latest").write_text("step_000001")
    return to


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The runs of CASES by one process, then by two with the resume of one's GRPO run from
    its step-1 checkpoint, then the resume of two's by one, then FOUR by four processes (four
    launches in all)."""
    root = tmp_path_factory.mktemp("world")
    cases = {name: {"overrides": overrides} for name, overrides in CASES.items()}
    one = launch(root / "one", 1, cases)

    def resume(world: str) -> dict:
        out = resumable(root / world / "grpo" / "run", root / f"from_{world}")
        return {"overrides": [*CASES["grpo"], f"output_dir={out}"], "resume": True}

    two = launch(root / "two", 2, {**cases, "from_one": resume("one")})
    two_to_one = launch(root / "back", 1, {"from_two": resume("two")})
    four = launch(root / "four", 4, {name: cases[name] for name in FOUR})
    return {
        "one": one,
        "two": two,
        "four": four,
        "root": root,
        "from_one": two.pop("from_one"),
        **two_to_one,
    }


def assert_same_draws(one: dict, other: dict, where: str) -> None:
    """The same prompts, completions, advantages and evaluation; the rest to rounding."""
    assert len(one["steps"]) == len(other["steps"]), where
    for step, (mine, theirs) in enumerate(zip(one["steps"], other["steps"])):
        at = f"{where} step {step}"
        assert mine["kept"] == theirs["kept"], at
        assert mine["texts"] == theirs["texts"], at
        assert torch.equal(mine["advantages"], theirs["advantages"]), at
        assert_close(mine["state"], theirs["state"], f"{at} method state")
        assert_close(mine["metrics"], theirs["metrics"], at)
    assert one["evals"] == other["evals"], where
    scores, others = one["eval_scores"], other["eval_scores"]
    assert torch.equal(scores.sampled, others.sampled), where
    assert scores.greedy_texts == others.greedy_texts, where
    for name, weight in one["weights"].items():
        assert (weight - other["weights"][name]).abs().max() <= 1e-9, f"{where} {name}"


@pytest.mark.slow
@pytest.mark.one_thread_workers  # torchrun subprocesses at one thread (env())
@pytest.mark.parametrize(
    ("case", "world"),
    [(c, "two") for c in CASES if c != "rank"] + [(c, "four") for c in FOUR],
)
def test_one_two_and_four_processes_draw_the_same_run(runs, case, world):
    one = runs["one"][case]
    assert_same_draws(one, runs[world][case], f"{case} on {world} processes")
    rows = [{k: float(v) for k, v in s["metrics"].items()} for s in one["steps"]]
    if case == "ebpo_dapo":  # DAPO refilled the batch
        assert any(r["dapo/gen_batches"] > 1 and r["dapo/dropped_groups"] > 0 for r in rows)
    if case.startswith("agpo"):  # τ and ε per prompt
        assert any(r["agpo/temperature/min"] < r["agpo/temperature/max"] for r in rows)
        assert any(r["agpo/epsilon/min"] < r["agpo/epsilon/max"] for r in rows)
    if case == "agpo":
        assert any(r["clip_ratio/region_mean"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.one_thread_workers  # torchrun subprocesses at one thread (env())
def test_the_rank_stream_samples_other_tokens_with_two_processes(runs):
    """The default stream seeds each rank's global RNG apart: two processes are another run."""
    one, two = runs["one"]["rank"], runs["two"]["rank"]
    assert one["steps"][0]["kept"] == two["steps"][0]["kept"]  # the same prompts
    assert one["steps"][0]["texts"] != two["steps"][0]["texts"]


@pytest.mark.slow
@pytest.mark.one_thread_workers  # torchrun subprocesses at one thread (env())
@pytest.mark.parametrize(("resumed", "by"), [("from_two", "one"), ("from_one", "two")])
def test_a_run_resumes_at_another_world_size(runs, resumed, by):
    """GRPO checkpointed at step 1 by two processes and resumed by one, or the other way
    round: step 2 and the final evaluation are the uninterrupted run's, and so is the log, row
    for row."""
    whole = runs[by]["grpo"]
    assert_same_draws({**whole, "steps": whole["steps"][1:]}, runs[resumed], resumed)
    uninterrupted = metrics(runs["root"] / by / "grpo" / "run")
    assert_close(metrics(runs["root"] / resumed), uninterrupted, "metrics.jsonl")
