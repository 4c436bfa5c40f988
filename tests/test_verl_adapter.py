"""rlkit.integrations.verl without verl: verl-shaped batches (rows shuffled, padding rows
appended) give exactly what rlkit's estimator gives on the grouped rewards, step after step of
EBPO's state, and the state survives a save and load. tests/with_verl/ repeats the central checks
through verl's own registry, in the environment `make test-verl` builds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rlkit.advantages import get_estimator
from rlkit.integrations import verl as rv

P, G, T = 5, 4, 6
UIDS = [f"u{p}" for p in range(P)]  # sorted: the adapter's canonical group order


@pytest.fixture(autouse=True)
def fresh_state():
    rv.reset()
    yield
    rv.reset()


def grouped_rewards(step: int) -> torch.Tensor:
    """[P, G] rewards, each group sorted (the adapter's canonical member order): 0/1 rewards
    with a continuous part, so EBPO's statistics move from step to step."""
    gen = torch.Generator().manual_seed(100 + step)
    r = (torch.rand(P, G, generator=gen) < 0.5).float() + 0.25 * torch.rand(P, G, generator=gen)
    r[0] = 0.0  # an all-fail group: EBPO still gives it a signal (docs/algorithms.md §2)
    return r.sort(dim=1).values


def verl_batch(rewards: torch.Tensor, seed: int, num_pad: int = 3, pad_reward: float = 0.0):
    """verl's flat batch for ``rewards``: the reward on each row's last response token, rows
    shuffled (as balance_batch does), ``num_pad`` padding rows appended. Returns the batch and
    each real row's (group, member) position."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (P * G,), generator=gen)
    order = torch.randperm(P * G, generator=gen)
    bs = P * G + num_pad
    token_rewards = torch.zeros(bs, T)
    mask = torch.zeros(bs, T)
    index, where = [], []
    for row, k in enumerate(order.tolist()):
        p, g = divmod(k, G)
        mask[row, : lengths[k]] = 1
        token_rewards[row, lengths[k] - 1] = rewards[p, g]
        index.append(UIDS[p])
        where.append((p, g))
    for row in range(P * G, bs):
        mask[row, 0] = 1
        token_rewards[row, 0] = pad_reward
        index.append("pad" + "0f" * 16)
    batch = {
        "token_level_rewards": token_rewards,
        "response_mask": mask,
        "index": np.array(index, dtype=object),
    }
    return batch, where


def expected_rows(expected: torch.Tensor, batch: dict, where) -> torch.Tensor:
    """The grouped advantages [P, G] placed on verl's rows and response tokens."""
    flat = torch.zeros(batch["response_mask"].shape[0])
    for row, (p, g) in enumerate(where):
        flat[row] = expected[p, g]
    return flat.unsqueeze(-1) * batch["response_mask"]


CASES = [
    ("ebpo", {}),
    ("ebpo", {"prior": "batch"}),
    ("ebpo", {"prior": "history", "prior_decay": 0.9, "whitening": "center"}),
    ("ebpo", {"whitening": "none"}),
    ("agpo", {}),
    ("agpo", {"dispersion": "mad"}),
    ("agpo", {"dispersion": "iqr"}),
]


@pytest.mark.parametrize("name,options", CASES)
def test_shuffled_padded_batch_equals_the_estimator_on_grouped_rewards(name, options):
    reference = get_estimator(name, **options)
    config = {"rlkit": {name: options}}
    for step in range(3):  # EBPO's history prior carries over between the steps
        rewards = grouped_rewards(step)
        expected = reference(rewards).advantages
        batch, where = verl_batch(rewards, seed=step, pad_reward=0.5 * step)
        advantages, returns = rv.estimate(name, config=config, **batch)
        assert torch.equal(advantages, expected_rows(expected, batch, where))
        assert torch.equal(returns, advantages)
        assert advantages[P * G :].abs().sum() == 0  # pad rows: no advantage, whatever reward


def test_clusters_equal_the_estimator_with_cluster_ids():
    options = {"min_cluster_count": 2}
    reference = get_estimator("ebpo", **options)
    config = {"rlkit": {"ebpo": options, "cluster_key": "topic"}}
    topics = ["b", "a", "b", "c", "a"]  # first seen: b → 0, a → 1, c → 2 (groups in uid order)
    cluster_ids = torch.tensor([0, 1, 0, 2, 1])
    for step in range(3):
        rewards = grouped_rewards(step)
        expected = reference(rewards, cluster_ids).advantages
        batch, where = verl_batch(rewards, seed=10 + step)
        labels = [topics[p] for p, _ in where] + ["pad"] * 3
        non_tensor = {"topic": np.array(labels, dtype=object), "uid": batch["index"]}
        advantages, _ = rv.estimate("ebpo", config=config, non_tensor_batch=non_tensor, **batch)
        assert torch.equal(advantages, expected_rows(expected, batch, where))


def test_row_order_does_not_change_a_single_bit():
    rewards = grouped_rewards(0)
    results = []
    for seed in (0, 1):
        rv.reset()
        batch, where = verl_batch(rewards, seed=seed)
        advantages, _ = rv.estimate("ebpo", **batch)
        per_member = torch.zeros(P, G)
        for row, (p, g) in enumerate(where):
            per_member[p, g] = advantages[row, 0]  # every row has its first token
        results.append(per_member)
    assert not np.array_equal(
        verl_batch(rewards, 0)[0]["index"], verl_batch(rewards, 1)[0]["index"]
    )
    assert torch.equal(results[0], results[1])


def test_groups_of_unequal_or_unexpected_size_are_refused_saying_why():
    """Unequal groups name two uids; with verl's rollout.n known (the plugin's callback sets it),
    groups of another size are refused too: both say how a multi-output agent loop causes it."""
    batch, _ = verl_batch(grouped_rewards(0), seed=0, num_pad=0)
    unequal = batch | {"index": batch["index"].copy()}
    unequal["index"][np.flatnonzero(batch["index"] == "u3")[0]] = "u1"  # u1: 5 rows, u3: 3
    with pytest.raises(
        ValueError, match=r"uid 'u3' has 3 rows, uid 'u1' has 5; .* several outputs"
    ):
        rv.estimate("ebpo", **unequal)
    rv.STATES.rows_per_prompt = G
    rv.estimate("ebpo", **batch)
    rv.STATES.rows_per_prompt = 2 * G  # as if every session had returned half an output
    with pytest.raises(
        ValueError, match=r"every prompt has 4 rows \(uid 'u\d'\), but .*rollout.n=8"
    ):
        rv.estimate("ebpo", **batch)


def test_agpo_needs_two_rows_per_prompt():
    batch = {
        "token_level_rewards": torch.ones(2, 1),
        "response_mask": torch.ones(2, 1),
        "index": np.array(["a", "b"], dtype=object),
    }
    with pytest.raises(ValueError, match=r"at least 2 per prompt \(actor_rollout_ref.rollout.n"):
        rv.estimate("agpo", **batch)


def test_a_batch_of_padding_only_is_refused():
    batch = {
        "token_level_rewards": torch.zeros(2, 1),
        "response_mask": torch.ones(2, 1),
        "index": np.array(["pad1", "pad1"], dtype=object),
    }
    with pytest.raises(ValueError, match="every row of the batch is padding"):
        rv.estimate("ebpo", **batch)


@pytest.mark.parametrize(
    "config,match",
    [
        ({"rlkit": {"epbo": {}}}, r"unknown config key algorithm.rlkit.epbo"),
        ({"rlkit": {"ebpo": {"prior": "global"}}}, r"algorithm.rlkit.ebpo: unknown EBPO prior"),
        ({"rlkit": {"ebpo": {"decay": 0.9}}}, r"unknown config key algorithm.rlkit.ebpo.decay"),
        ({"rlkit": {"agpo": {"dispersion": "var"}}}, r"algorithm.rlkit.agpo: unknown dispersion"),
        ({"rlkit": {"ebpo": "batch"}}, r"algorithm.rlkit.ebpo must be a mapping"),
        ({"rlkit": {"cluster_key": 3}}, r"cluster_key must name a batch field"),
    ],
)
def test_bad_options_name_their_key(config, match):
    with pytest.raises(ValueError, match=match):
        rv.settings_from_config("ebpo", config)


def test_cluster_key_is_refused_for_agpo_and_without_labels():
    config = {"rlkit": {"cluster_key": "topic"}}
    with pytest.raises(ValueError, match="only EBPO's priors use clusters"):
        rv.settings_from_config("agpo", config)
    batch, _ = verl_batch(grouped_rewards(0), seed=0)
    with pytest.raises(ValueError, match="verl 0.9.1 passes its estimators only"):
        rv.estimate("ebpo", config=config, **batch)
    with pytest.raises(ValueError, match=r"the batch has no field 'topic' \(fields: \['uid'\]\)"):
        rv.estimate("ebpo", config=config, non_tensor_batch={"uid": batch["index"]}, **batch)


def test_state_saved_and_loaded_resumes_exactly(tmp_path):
    config = {"rlkit": {"ebpo": {"prior_decay": 0.95}}}
    batches = [verl_batch(grouped_rewards(step), seed=step)[0] for step in range(3)]
    straight = [rv.estimate("ebpo", config=config, **b)[0] for b in batches]

    rv.reset()
    for b in batches[:2]:
        rv.estimate("ebpo", config=config, **b)
    path = rv.save(str(tmp_path / "global_step_2"))
    assert path.endswith(rv.STATE_FILE)
    rv.reset()
    assert not torch.equal(rv.estimate("ebpo", config=config, **batches[2])[0], straight[2])

    rv.load(str(tmp_path / "global_step_2"))
    assert torch.equal(rv.estimate("ebpo", config=config, **batches[2])[0], straight[2])
    missing = tmp_path / "global_step_9" / rv.STATE_FILE
    with pytest.raises(FileNotFoundError, match=f"{missing} does not exist"):
        rv.load(str(tmp_path / "global_step_9"))


def test_a_crash_while_saving_leaves_the_state_whole_or_absent(tmp_path, monkeypatch):
    """A save killed mid-write leaves no torn state file and no temporary file: a new folder
    stays empty, and a folder saved before keeps its whole file."""
    rv.estimate("ebpo", **verl_batch(grouped_rewards(0), seed=0)[0])
    rv.save(str(tmp_path / "global_step_1"))

    def torn(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # the process killed in the middle of the write

    monkeypatch.setattr(torch, "save", torn)
    for step in (1, 2):
        with pytest.raises(KeyboardInterrupt):
            rv.save(str(tmp_path / f"global_step_{step}"))
    assert list((tmp_path / "global_step_2").iterdir()) == []
    assert [p.name for p in (tmp_path / "global_step_1").iterdir()] == [rv.STATE_FILE]
    rv.load(str(tmp_path / "global_step_1"))


def test_resuming_with_other_settings_is_refused(tmp_path):
    batch = verl_batch(grouped_rewards(0), seed=0)[0]
    rv.estimate("ebpo", **batch)
    rv.save(str(tmp_path))
    rv.load(str(tmp_path))
    with pytest.raises(ValueError, match="saved with .* resume with the same algorithm.rlkit"):
        rv.estimate("ebpo", config={"rlkit": {"ebpo": {"prior": "batch"}}}, **batch)


def test_malformed_batches_say_what_is_wrong():
    batch, where = verl_batch(grouped_rewards(0), seed=0)
    with pytest.raises(ValueError, match="index has 22 uids for a batch of 23 rows"):
        rv.estimate("ebpo", **(batch | {"index": batch["index"][:-1]}))
    with pytest.raises(ValueError, match=r"must both be \[bs, T\], got \(23, 6\) and \(23, 5\)"):
        rv.estimate("ebpo", **(batch | {"response_mask": batch["response_mask"][:, :-1]}))
    labels = np.array(["a"] * len(batch["index"]), dtype=object)
    labels[next(row for row, (p, _) in enumerate(where) if p == 2)] = "b"
    config = {"rlkit": {"cluster_key": "topic"}}
    rv.reset()  # a run with clusters: the settings must not change within one
    with pytest.raises(
        ValueError, match=r"rows of uid 'u2' carry different 'topic' labels \['a', 'b'\]"
    ):
        rv.estimate("ebpo", config=config, non_tensor_batch={"topic": labels}, **batch)


def test_options_changed_within_a_run_are_refused():
    batch = verl_batch(grouped_rewards(0), seed=0)[0]
    rv.estimate("ebpo", **batch)
    with pytest.raises(ValueError, match="algorithm.rlkit must not change during a run"):
        rv.estimate("ebpo", config={"rlkit": {"ebpo": {"whitening": "none"}}}, **batch)


def test_ci_tests_the_lowest_verl_pyproject_allows():
    """The Makefile's verl environment pins the lower bound of pyproject.toml's verl extra (0.9.0
    lacks verl.trainer.ppo.checkpoint_callback, which the plugin imports)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    root = Path(__file__).resolve().parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (spec,) = [d for d in extras["verl"] if re.match(r"verl\b", d)]
    lowest = re.fullmatch(r"verl>=([\d.]+),<[\d.]+", spec).group(1)
    assert re.search(
        rf"^VERL_OLDEST := {re.escape(lowest)}$", (root / "Makefile").read_text(), re.M
    )
