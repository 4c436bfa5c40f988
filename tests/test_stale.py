"""Stale rollouts (``rollout.lag``, rlkit.stale, docs/algorithms.md §4e): which weights sample
each trained batch, π_old taken by those weights at sampling time, a clip that binds at one
mini-batch, and exact resume with batches waiting in the queue."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from test_faults import tamper_state
from test_trainer import CrashAfter

from rlkit.batch import CollectStats
from rlkit.config import load_config
from rlkit.metrics import read_metrics
from rlkit.stale import RolloutQueue
from rlkit.trainer import Trainer

# the warm-started policy: groups with mixed rewards, so advantages and updates are not 0
TINY = [
    "model.name_or_path=builtin:tiny",
    "rollout.num_prompts=4",
    "eval.num_problems=8",
    "eval.every=0",
    "eval.at_start=false",
    "checkpoint_every=0",
    "tensorboard=false",
    "progress=false",
]


def config(run_dir, *overrides):
    return load_config("tiny-cpu", [*TINY, f"output_dir={run_dir}", *overrides])


def without_timings(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize(
    ("lag", "total", "sampled_at"),
    [
        (0, 4, [0, 1, 2, 3]),
        (1, 4, [0, 0, 1, 2]),
        (2, 5, [0, 0, 0, 1, 2]),
        (3, 2, [0, 0]),  # a lag beyond the run: everything is drawn at step 0
    ],
)
def test_the_batch_trained_at_step_t_was_sampled_at_step_t_minus_lag(lag, total, sampled_at):
    draws = []

    def draw(batch):
        assert batch == len(draws)  # the step that trains it
        draws.append(step)
        return f"batch {len(draws) - 1}", CollectStats()

    queue = RolloutQueue(lag, total, draw, lambda groups: None)
    trained = []
    for step in range(total):
        batch = queue.next(step)
        trained.append((batch.groups, batch.step))
    assert trained == [(f"batch {i}", s) for i, s in enumerate(sampled_at)]
    assert len(draws) == total and not queue.queue  # every batch drawn is trained on


def test_old_pass_is_taken_by_the_weights_that_sampled_the_batch(tmp_path):
    """lag = 1: step 0 draws two batches from θ_0 and trains on the first; the second waits with
    π_old from θ_0, bit for bit, not from the updated θ_1."""
    trainer = Trainer(config(tmp_path, "rollout.lag=1", "optim.lr=3e-5", "steps=2"))
    start = copy.deepcopy(trainer.policy.model.state_dict())
    trainer.step()
    (waiting,) = trainer.rollouts.queue
    assert waiting.step == 0
    rollouts = waiting.groups.rollouts
    temps = trainer.forward.ratio_temperatures(rollouts)
    assert not torch.equal(trainer.old_pass(rollouts, temps).logp, waiting.old.logp)  # θ_1 moved
    trainer.policy.model.load_state_dict(start)
    assert torch.equal(trainer.old_pass(rollouts, temps).logp, waiting.old.logp)
    trainer.close()


def test_a_clip_binds_at_one_mini_batch_only_on_stale_batches(tmp_path):
    """One epoch over one mini-batch: with fresh batches the ratio is 1 and no clip binds; with
    lag = 2 the ratio spans the updates since sampling, and the clip binds once it has any."""
    common = ["algo.estimator=agpo", "agpo.enabled=true", "optim.lr=3e-5", "steps=4"]
    with pytest.warns(UserWarning, match="agpo.adaptive_clip=true cannot act"):
        Trainer(config(tmp_path / "fresh", *common)).train()
    fresh = read_metrics(tmp_path / "fresh")
    assert all(r["clip_ratio/region_mean"] == 0 for r in fresh)
    assert all("rollout/staleness" not in r for r in fresh)

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*cannot act")
        Trainer(config(tmp_path / "stale", *common, "rollout.lag=2")).train()
    stale = read_metrics(tmp_path / "stale")
    assert [r["rollout/staleness"] for r in stale] == [0, 1, 2, 2]
    assert stale[0]["clip_ratio/region_mean"] == 0  # sampled by the weights it trains
    assert max(r["clip_ratio/region_mean"] for r in stale[1:]) > 0


@pytest.mark.parametrize(
    "overrides",
    [
        ("algo.estimator=ebpo", "rollout.lag=2"),
        ("algo.estimator=agpo", "agpo.enabled=true", "rollout.lag=1"),
    ],
)
def test_resume_with_batches_in_the_queue_continues_the_identical_run(tmp_path, overrides):
    """The checkpoint at step 2 holds the batches drawn ahead (their rollouts, rewards, probe
    statistics and π_old); the resumed run logs what the uninterrupted run logs."""
    common = ("steps=6", "checkpoint_every=2", "optim.lr=3e-5", *overrides)
    Trainer(config(tmp_path / "straight", *common)).train()

    class CrashAtStep3(Trainer):
        def step(self):
            if self.step_count == 3:
                raise KeyboardInterrupt
            return super().step()

    interrupted = config(tmp_path / "resumed", *common)
    with pytest.raises(KeyboardInterrupt):
        CrashAtStep3(interrupted).train()
    Trainer(interrupted, resume=True).train()
    expected = without_timings(read_metrics(tmp_path / "straight"))
    assert [r["step"] for r in expected] == [1, 2, 3, 4, 5, 6]
    assert without_timings(read_metrics(tmp_path / "resumed")) == expected


def test_a_negative_lag_names_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"rollout.lag must be >= 0, got -1"):
        config(tmp_path, "rollout.lag=-1")


def test_a_lag_the_run_never_reaches_is_refused(tmp_path):
    """lag >= steps: every batch would be drawn at step 0 by the starting policy (offline RL
    under an on-policy name)."""
    assert config(tmp_path, "rollout.lag=3", "steps=4").rollout.lag == 3
    for lag in (4, 9):
        with pytest.raises(ValueError, match=f"rollout.lag={lag} with steps=4: no batch"):
            config(tmp_path, f"rollout.lag={lag}", "steps=4")


def interrupted_lag_run(run_dir):
    """A rollout.lag=2 run of 5 steps killed in step 3: its step-2 checkpoint holds the batches
    trained at steps 3 and 4, drawn at steps 0 and 1."""
    cfg = config(run_dir, "rollout.lag=2", "steps=5", "checkpoint_every=2", "optim.lr=3e-5")
    with pytest.raises(KeyboardInterrupt):
        CrashAfter(cfg).train()
    return cfg


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda q: q.append(q[-1]), "holds 3 batches drawn ahead; at step 2 of steps=5 with "),
        (lambda q: q.pop(), "holds 1 batches drawn ahead; at step 2 of steps=5 with "),
        (lambda q: q.reverse(), "batch 1 of its queue was drawn at step 1; at step 2 with "),
    ],
    ids=["one-more", "one-less", "reordered"],
)
def test_a_tampered_queue_is_refused_on_load(tmp_path, change, message):
    cfg = interrupted_lag_run(tmp_path)
    step_dir = tamper_state(tmp_path, lambda state: change(state["rollout_queue"]))
    with pytest.raises(ValueError, match=message) as err:
        Trainer(cfg, resume=True)
    assert str(err.value).startswith(f"{step_dir / 'trainer_state.pt'} is inconsistent: ")


def test_a_lag_run_resumed_with_more_steps_says_its_queue_restarts(tmp_path):
    cfg = interrupted_lag_run(tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*queue refills")
        Trainer(cfg, resume=True).train()  # the run's own length: resumes as it was
    longer = config(tmp_path, "rollout.lag=2", "steps=7", "checkpoint_every=2", "optim.lr=3e-5")
    with pytest.warns(UserWarning, match="was saved with steps=5") as caught:
        trainer = Trainer(longer, resume=True)
    assert "rollout.lag=2's queue refills at step 5 as at a run's start" in str(caught[0].message)
    trainer.train()
    # the batches of steps 6 and 7 were drawn at step 5, not 2 steps before each as in a run
    # started with steps=7
    assert [r["rollout/staleness"] for r in read_metrics(tmp_path)][4:] == [2, 0, 1]
