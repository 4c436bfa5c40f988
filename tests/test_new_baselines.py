"""The EBPO authors' added baselines (rlkit.advantages, docs/algorithms.md §2c): ``jspo_page``,
``bnpo``, ``grpo_bn`` and ``spo``, each against the authors' function on the same inputs, their
edge cases, SPO's tracker across a checkpoint and across ranks, and a short training run of each.

The authors' functions are those of github.com/Tonyzhou98/verl at commit
75b014702650312cb1e7c3537183d7df6dc5a81f, verl/trainer/ppo/core_algos.py:
``compute_shrinkage_js_outcome_advantage`` (jspo_page), ``compute_bnpo_outcome_advantage`` (bnpo),
``compute_grpo_bn_outcome_advantage`` (grpo_bn), ``SPOTracker`` with
``compute_spo_outcome_advantage`` (spo). They import verl, so they cannot be imported here; as for
JSPO (tests/data/jspo_published.json) they were run once, in float64, on the inputs stored with
their outputs in tests/data/ebpo_baselines_published.json (each prompt's score on the last of
three response tokens, a mask of ones, ``index`` the prompt's id repeated over its G rows, the
defaults epsilon = 1e-6 and norm_adv_by_std_in_grpo = True unless the case says ``center``).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from test_trainer import CrashAfter, make_config, without_timings

from rlkit.advantages import get_estimator
from rlkit.checkpoint import load_checkpoint
from rlkit.config import load_config
from rlkit.dist import Local, TorchCollective
from rlkit.methods import Method
from rlkit.metrics import read_metrics
from rlkit.tasks.base import Problem
from rlkit.trainer import Trainer

PUBLISHED = json.loads(
    (Path(__file__).parent / "data" / "ebpo_baselines_published.json").read_text()
)
STATIC = ("jspo_page", "bnpo", "grpo_bn")
NEW = ("jspo_page", "bnpo", "grpo_bn", "spo")
TOL = {"rtol": 1e-12, "atol": 1e-12}


def cases(name: str) -> list[tuple[str, dict]]:
    return [(name, case) for case in PUBLISHED[name]]


def ids_of(name_case) -> str:
    return f"{name_case[0]}-{name_case[1]['case']}"


# ---------------------------------------------------------------------------------------------
# against the authors' functions


@pytest.mark.parametrize("name_case", [c for name in STATIC for c in cases(name)], ids=ids_of)
def test_matches_the_authors_function(name_case):
    name, case = name_case
    out = get_estimator(name)(torch.tensor(case["rewards"], dtype=torch.float64))
    np.testing.assert_allclose(out.advantages.numpy(), case["advantages"], **TOL)


@pytest.mark.parametrize("case", PUBLISHED["grpo_bn_center"], ids=lambda c: c["case"])
def test_grpo_bn_centred_matches_the_authors_function_without_std(case):
    out = get_estimator("grpo_bn", whitening="center")(
        torch.tensor(case["rewards"], dtype=torch.float64)
    )
    np.testing.assert_allclose(out.advantages.numpy(), case["advantages"], **TOL)


@pytest.mark.parametrize("case", PUBLISHED["spo"], ids=lambda c: c["case"])
def test_spo_matches_the_authors_tracker_step_by_step(case):
    est = get_estimator("spo", whitening=case["whitening"])
    for step in case["steps"]:
        r = torch.tensor(step["rewards"], dtype=torch.float64)
        out = est(r, prompt_ids=step["prompt_ids"])
        np.testing.assert_allclose(out.advantages.numpy(), step["advantages"], **TOL)
    tracker = est.state_dict()["tracker"]
    assert tracker.keys() == case["tracker"].keys()
    for key, counts in case["tracker"].items():
        np.testing.assert_allclose(tracker[key], counts, rtol=1e-15, atol=0)


# ---------------------------------------------------------------------------------------------
# edge cases: G = 1, G = 2, equal rewards


@pytest.mark.parametrize("name", STATIC)
def test_one_completion_per_prompt_gets_zero(name):
    r = torch.tensor([[1.0], [0.0], [0.4]], dtype=torch.float64)
    assert torch.equal(get_estimator(name)(r).advantages, torch.zeros(3, 1, dtype=torch.float64))


@pytest.mark.parametrize("name", STATIC)
@pytest.mark.parametrize("value", [0.0, 1.0, 0.3])
def test_equal_rewards_get_zero(name, value):
    r = torch.full((4, 4), value, dtype=torch.float64)
    assert get_estimator(name)(r).advantages.abs().max().item() < 1e-12


def test_two_completions():
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    # grpo_bn: Â = ±0.5, 0, ∓0.5; whitened with the ddof = 1 std of the six Â
    std = math.sqrt(4 * 0.25 / 5)
    expected = torch.tensor([[0.5, -0.5], [0.0, 0.0], [-0.5, 0.5]], dtype=torch.float64)
    out = get_estimator("grpo_bn")(r).advantages
    torch.testing.assert_close(out, expected / (std + 1e-6), rtol=1e-12, atol=1e-12)
    # bnpo: p = 0.5, 1, 0.5 → m = 2/3, var = 1/12 < m(1 − m) = 2/9: c = 5/3, a = 10/9, b = 5/9
    alpha, beta = 1 + 10 / 27, 1 + 5 / 27
    f = math.exp(
        (alpha - 1) * math.log(0.5)
        + (beta - 1) * math.log(0.5)
        - (math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta))
    )
    out = get_estimator("bnpo")(r)
    assert out.diagnostics["alpha"].item() == pytest.approx(alpha, rel=1e-6)
    torch.testing.assert_close(out.advantages[0], torch.tensor([0.5, -0.5]).double() / f)
    assert torch.equal(out.advantages[1], torch.zeros(2, dtype=torch.float64))


def test_spo_single_completion_and_equal_rewards():
    est = get_estimator("spo")
    r = torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64)
    first = est(r, prompt_ids=["a", "b", "c"])  # every v̂ = 0.5: Â = ±0.5, whitened
    torch.testing.assert_close(
        first.advantages, (r - r.mean()) / (r.std() + 1e-6), rtol=1e-12, atol=1e-12
    )
    # a = (0.9·4 + 1, 0.9·4): v̂ = 4.6 / 8.2 for a, 3.6 / 8.2 for b
    assert est.value("a") == pytest.approx(4.6 / 8.2) and est.value("b") == pytest.approx(3.6 / 8.2)
    ones = get_estimator("spo")(torch.ones(3, 4), prompt_ids=["a", "b", "c"])
    assert ones.advantages.abs().max().item() == 0.0  # Â = 0.5 everywhere


# ---------------------------------------------------------------------------------------------
# jspo and jspo_page


def test_jspo_page_is_jspo_with_the_page_factor():
    r = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]).double()
    code, page = get_estimator("jspo")(r), get_estimator("jspo_page")(r)
    for key in ("v_square", "s_square"):
        assert torch.equal(code.diagnostics[key], page.diagnostics[key])
    v, s = page.diagnostics["v_square"].double(), page.diagnostics["s_square"].double()
    torch.testing.assert_close(page.diagnostics["shrinkage"].double(), 2 / 3 * v / (v + s))
    torch.testing.assert_close(code.diagnostics["shrinkage"].double(), v / (v + s + 1e-6))
    # one prompt: jspo is RLOO, jspo_page the authors' fallback r − mean
    one = r[:1]
    assert torch.equal(get_estimator("jspo")(one).advantages, get_estimator("rloo")(one).advantages)
    torch.testing.assert_close(get_estimator("jspo_page")(one).advantages, one - one.mean())


def test_grpo_bn_is_not_trls_batch_scaling():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]]).double()
    bn = get_estimator("grpo_bn")(r).advantages
    trl = get_estimator("grpo", scale_rewards="batch")(r).advantages
    assert not torch.allclose(bn, trl)
    centred = r - r.mean(1, keepdim=True)
    torch.testing.assert_close(bn, centred / (centred.std() + 1e-6))


# ---------------------------------------------------------------------------------------------
# SPO's tracker: state, resume, ranks


def spo_batches(steps: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randperm(10, generator=g)[:4]
        r = torch.bernoulli(torch.full((4, 4), 0.5, dtype=torch.float64), generator=g)
        out.append((r, [f"q{i}" for i in ids.tolist()]))
    return out


def test_spo_state_dict_round_trip_continues_the_same_tracker():
    batches = spo_batches(8)
    a = get_estimator("spo")
    for r, ids in batches[:4]:
        a(r, prompt_ids=ids)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)  # checkpoints go through torch.save / weights_only load
    buffer.seek(0)
    b = get_estimator("spo")
    b.load_state_dict(torch.load(buffer, weights_only=True))
    fresh = get_estimator("spo")  # the authors' module global after a restart
    differs = False
    for r, ids in batches[4:]:
        out_a, out_b, out_c = (e(r, prompt_ids=ids) for e in (a, b, fresh))
        assert torch.equal(out_a.advantages, out_b.advantages)
        differs |= not torch.equal(out_a.advantages, out_c.advantages)
    assert differs
    assert a.state_dict() == b.state_dict()
    a.reset()
    assert a.state_dict() == {"tracker": {}}


def test_spo_needs_prompt_ids_and_checks_them():
    est = get_estimator("spo")
    with pytest.raises(ValueError, match="'spo' keeps state per prompt: pass prompt_ids"):
        est(torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"one id per prompt \(2\), got 3 ids"):
        est(torch.zeros(2, 2), prompt_ids=["a", "b", "c"])


def test_method_passes_problem_ids_to_spo_only():
    problems = [Problem(id=f"q{i}", prompt=f"{i}+1=", answer=str(i + 1)) for i in range(3)]
    method = Method(get_estimator("spo"))
    method.advantages(torch.ones(3, 2), problems)
    assert sorted(method.estimator.state_dict()["tracker"]) == ["q0", "q1", "q2"]
    assert Method(get_estimator("grpo")).prompt_ids(problems) is None


def rank_problems(step: int) -> tuple[torch.Tensor, list[Problem]]:
    """The global batch of ``step``: 4 prompts from a pool of 10, G = 4."""
    ((r, ids),) = spo_batches(1, seed=step)
    problems = [Problem(id=i, prompt=i, answer="0") for i in ids]
    return r, problems


def two_rank_worker(rank: int, init: str, out: str) -> None:
    tdist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    dist = TorchCollective("gloo", torch.device("cpu"))
    method = Method(get_estimator("spo"))
    seen = []
    for step in range(5):
        r, problems = rank_problems(step)
        mine = slice(2 * rank, 2 * rank + 2)  # each rank draws its contiguous share
        rewards = dist.all_gather(r[mine].contiguous())  # as rlkit.trainer.Trainer.step
        gathered = [p for part in dist.all_gather_object(problems[mine]) for p in part]
        seen.append(dist.my_rows(method.advantages(rewards, gathered).advantages))
    trackers = dist.all_gather_object(method.state_dict()["estimator"])
    if rank == 0:
        torch.save({"trackers": trackers}, out)
    torch.save(torch.cat(seen), f"{out}.rank{rank}")
    tdist.destroy_process_group()


def test_two_ranks_keep_the_same_tracker_as_one_process(tmp_path):
    out = str(tmp_path / "ranks.pt")
    mp.spawn(two_rank_worker, args=(f"file://{tmp_path / 'pg'}", out), nprocs=2, join=True)
    trackers = torch.load(out, weights_only=True)["trackers"]
    single = Method(get_estimator("spo"))
    dist = Local()
    expected = []
    for step in range(5):
        r, problems = rank_problems(step)
        expected.append(single.advantages(dist.all_gather(r), problems).advantages)
    assert trackers[0] == trackers[1] == single.state_dict()["estimator"]
    assert len(trackers[0]["tracker"]) > 4  # prompts came back across steps
    ranks = [torch.load(f"{out}.rank{k}", weights_only=True) for k in range(2)]
    for step, full in enumerate(expected):
        for k in range(2):
            assert torch.equal(ranks[k][2 * step : 2 * step + 2], full[2 * k : 2 * k + 2])


# ---------------------------------------------------------------------------------------------
# options and config


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("jspo_page", {"eps": -1.0}, "eps must be >= 0, got -1.0"),
        ("bnpo", {"eps": 0.0}, r"eps must be in \(0, 0.5\), got 0.0"),
        ("grpo_bn", {"whitening": "zscore"}, "unknown grpo_bn whitening 'zscore'"),
        ("grpo_bn", {"whiten_eps": 0.0}, "whiten_eps must be positive, got 0.0"),
        ("spo", {"rho": 1.5}, r"rho must be in \(0, 1\], got 1.5"),
        ("spo", {"rho_min": 1.0}, r"rho_min must be in \[0, 1\), got 1.0"),
        ("spo", {"whitening": "unit"}, "unknown spo whitening 'unit'"),
    ],
)
def test_bad_options_name_the_option(name, options, message):
    with pytest.raises(ValueError, match=message):
        get_estimator(name, **options)


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"algo.options: rho must be in \(0, 1\], got 1.5"):
        load_config("tiny-cpu", ["algo.estimator=spo", "algo.options={rho: 1.5}"])
    with pytest.raises(ValueError, match="unknown config key algo.options.smooth_coef"):
        load_config("tiny-cpu", ["algo.estimator=bnpo", "algo.options={smooth_coef: 0.9}"])
    cfg = load_config("tiny-cpu", ["algo.estimator=spo", "rollout.group_size=1"])
    assert cfg.rollout.group_size == 1  # the tracker is a baseline for one completion


# ---------------------------------------------------------------------------------------------
# through the trainer


@pytest.mark.parametrize("estimator", NEW)
def test_trains_end_to_end(tmp_path, tiny_model_dir, estimator):
    Trainer(make_config(tmp_path, tiny_model_dir, f"algo.estimator={estimator}")).train()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows[1:]:
        for key in ("reward", "advantages/std", "grad_norm"):
            assert row[key] is not None and math.isfinite(row[key]), key
    if estimator == "spo":
        assert rows[-1]["spo/tracked_prompts"] == 8  # 4 prompts a step, all distinct


def test_spo_resume_continues_the_same_tracker(tmp_path, tiny_model_dir):
    common = ("algo.estimator=spo", "steps=5", "checkpoint_every=2", "task.num_train=6")
    straight = Trainer(make_config(tmp_path / "straight", tiny_model_dir, *common))
    straight.train()
    interrupted = make_config(tmp_path / "resumed", tiny_model_dir, *common)
    with pytest.raises(KeyboardInterrupt):
        CrashAfter(interrupted).train()
    saved = load_checkpoint(tmp_path / "resumed").state["estimator"]
    assert len(saved["tracker"]) == 6  # two steps of 4 prompts from 6: some seen twice
    resumed = Trainer(interrupted, resume=True)
    assert resumed.method.estimator.state_dict() == saved
    resumed.train()
    expected = without_timings(read_metrics(tmp_path / "straight"))
    assert without_timings(read_metrics(tmp_path / "resumed")) == expected
    assert resumed.method.estimator.state_dict() == straight.method.estimator.state_dict()
