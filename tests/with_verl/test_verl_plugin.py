"""rlkit's estimators through the real verl 0.9.1 (`make test-verl`, .venv-verl): the plugin is
found the way `import verl` finds plugins, and verl's own advantage step (the v1 trainer's
``compute_advantage_for_multi_trajectories``, on a DataProto reordered as ``balance_batch`` does
and with padding rows) gives exactly rlkit's estimator on the grouped rewards, step after step of
EBPO's state; the state rides verl's own checkpoint save and resume."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from verl import DataProto
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.v1 import PPOTrainerSync
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from rlkit.advantages import get_estimator
from rlkit.integrations import verl as adapter
from rlkit.integrations import verl_plugin

P, G, T, NUM_PAD = 6, 4, 5, 3
CALLBACK = "rlkit.integrations.verl_plugin.RlkitStateCallback"
CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


@pytest.fixture(autouse=True)
def fresh_state():
    adapter.reset()
    yield
    adapter.reset()


def verl_config(*overrides: str):
    """verl's own trainer config (ppo_trainer.yaml) with command-line style overrides."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def grouped_rewards(step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(step)
    r = (torch.rand(P, G, generator=gen) < 0.4).float() + 0.1 * torch.rand(P, G, generator=gen)
    r[1] = 0.0
    return r.sort(dim=1).values  # members in the adapter's canonical order


def uids(step: int) -> list[str]:
    """uuid4 strings as verl draws them, sorted (the adapter's canonical group order)."""
    gen = torch.Generator().manual_seed(1000 + step)
    bits = torch.randint(0, 2**62, (P, 2), generator=gen).tolist()
    return sorted(str(uuid.UUID(int=(a << 64) | b, version=4)) for a, b in bits)


def verl_data(rewards: torch.Tensor, step: int, pad_reward: float = 0.0) -> DataProto:
    """The batch verl's advantage step sees: each row's reward on its last response token, the
    padding rows the v1 trainer appends (uid ``pad…``), all rows reordered as balance_batch does.
    ``position`` remembers each row's place (p·G + g; −1 for padding)."""
    gen = torch.Generator().manual_seed(2000 + step)
    n = P * G
    lengths = torch.randint(1, T + 1, (n,), generator=gen)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).float()
    token_rewards = torch.zeros(n, T)
    token_rewards[torch.arange(n), lengths - 1] = rewards.reshape(-1)
    index = np.array([u for u in uids(step) for _ in range(G)], dtype=object)
    real = DataProto.from_dict(
        tensors={
            "token_level_rewards": token_rewards,
            "response_mask": mask,
            "position": torch.arange(n),
        },
        non_tensors={"uid": index},
    )
    pad_mask = torch.zeros(NUM_PAD, T)
    pad_mask[:, 0] = 1
    pad = DataProto.from_dict(
        tensors={
            "token_level_rewards": pad_mask * pad_reward,
            "response_mask": pad_mask,
            "position": torch.full((NUM_PAD,), -1),
        },
        non_tensors={"uid": np.array([f"pad{uuid.uuid4().hex}"] * NUM_PAD, dtype=object)},
    )
    data = DataProto.concat([real, pad])
    data.reorder(torch.randperm(n + NUM_PAD, generator=gen))
    return data


def verl_advantages(data: DataProto, config, keys: list[str] | None = None) -> torch.Tensor:
    """verl's own advantage step of the v1 trainer (trainer_base._compute_advantage), on rows
    keyed ``{uid}_{session}_{output}`` as verl's agent loop keys them (default: one output each)."""
    if keys is None:
        keys = [f"{uid}_{i}_0" for i, uid in enumerate(data.non_tensor_batch["uid"])]
    out = compute_advantage_for_multi_trajectories(
        data,
        batch_keys=keys,
        adv_estimator=config.algorithm.adv_estimator,
        num_repeat=G,
        config=config.algorithm,
    )
    return out.batch["advantages"]


def placed(expected: torch.Tensor, data: DataProto) -> torch.Tensor:
    """Grouped advantages [P, G] on the batch's rows and response tokens; 0 on padding rows."""
    position = data.batch["position"]
    flat = torch.where(position >= 0, expected.reshape(-1)[position.clamp_min(0)], 0.0)
    return flat.unsqueeze(-1) * data.batch["response_mask"]


def test_this_environment_has_the_makefiles_oldest_verl():
    """`make test-verl` runs at VERL_OLDEST, the lower bound of pyproject.toml's verl extra
    (tests/test_verl_adapter.py checks that the two agree)."""
    from importlib.metadata import version

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert re.search(r"^VERL_OLDEST := (\S+)$", makefile, re.M).group(1) == version("verl")


def test_the_entry_point_is_the_plugin_module():
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="verl.plugins") if ep.name == "rlkit"]
    assert ep.value == "rlkit.integrations.verl_plugin"


@pytest.mark.parametrize("policy,found", [("auto", True), ("rlkit", True), ("none", False)])
def test_import_verl_registers_the_estimators(policy, found):
    """A fresh interpreter: only `import verl`, as verl's trainer processes do. With plugins off
    (``VERL_USE_EXTERNAL_PLUGINS=none``) the names are missing: the entry point registered them."""
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as r\n"
        "print([r[n].__name__ for n in ('ebpo', 'agpo') if n in r])\n"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_PLUGINS=policy)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    names = "['compute_rlkit_ebpo_advantage', 'compute_rlkit_agpo_advantage']"
    assert out.strip().splitlines()[-1] == (names if found else "[]")


def test_verl_lookup_gives_the_plugin_functions():
    for name in adapter.ESTIMATOR_NAMES:
        assert get_adv_estimator_fn(name) is verl_plugin.ESTIMATOR_FNS[name]


CASES = [
    ("ebpo", {}),
    ("ebpo", {"prior": "batch"}),
    ("ebpo", {"prior_decay": 0.9, "whitening": "center"}),
    ("ebpo", {"whitening": "none"}),
    ("agpo", {}),
    ("agpo", {"dispersion": "iqr"}),
]


@pytest.mark.parametrize("name,options", CASES)
def test_verl_advantage_step_equals_the_estimator_on_grouped_rewards(name, options):
    overrides = [f"+algorithm.rlkit.{name}.{k}={v}" for k, v in options.items()]
    config = verl_config(f"algorithm.adv_estimator={name}", *overrides)
    reference = get_estimator(name, **options)
    for step in range(3):
        rewards = grouped_rewards(step)
        data = verl_data(rewards, step, pad_reward=-0.3 * step)  # in-reward KL can touch pads
        advantages = verl_advantages(data, config)
        assert torch.equal(advantages, placed(reference(rewards).advantages, data))


def test_clusters_through_the_registered_function():
    """verl 0.9.1 passes no per-prompt fields to an estimator: clusters work where a caller passes
    ``non_tensor_batch`` (here by hand), and verl's own step says what is missing."""
    config = verl_config(
        "algorithm.adv_estimator=ebpo",
        "+algorithm.rlkit.cluster_key=topic",
        "+algorithm.rlkit.ebpo.min_cluster_count=2",
    )
    reference = get_estimator("ebpo", min_cluster_count=2)
    topics = np.array(["easy", "hard", "easy", "mid", "hard", "easy"], dtype=object)
    cluster_ids = torch.tensor([0, 1, 0, 2, 1, 0])  # first seen, in uid order
    fn = get_adv_estimator_fn("ebpo")
    for step in range(3):
        rewards = grouped_rewards(step)
        data = verl_data(rewards, step)
        position = data.batch["position"]
        labels = np.where(position.numpy() >= 0, topics[position.clamp_min(0).numpy() // G], "")
        advantages, _ = fn(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=data.batch["response_mask"],
            index=data.non_tensor_batch["uid"],
            config=config.algorithm,
            non_tensor_batch={"topic": labels},
        )
        assert torch.equal(advantages, placed(reference(rewards, cluster_ids).advantages, data))
    with pytest.raises(ValueError, match="verl 0.9.1 passes its estimators only"):
        verl_advantages(verl_data(grouped_rewards(0), 0), config)


def multi_output_data(outputs: list[list[int]]) -> tuple[DataProto, list[str]]:
    """A multi-output agent loop's batch: session s of prompt p returned ``outputs[p][s]``
    outputs, each a row with the prompt's uid and the session's final reward (as verl's
    agent_loop_tq copies it), keyed ``{uid}_{s}_{output}``."""
    rewards, prompt_uids = grouped_rewards(0), uids(0)
    index, keys, scores = [], [], []
    for p, sessions in enumerate(outputs):
        for s, count in enumerate(sessions):
            for i in range(count):
                index.append(prompt_uids[p])
                keys.append(f"{prompt_uids[p]}_{s}_{i}")
                scores.append(rewards[p, s])
    mask = torch.ones(len(index), T)
    token_rewards = torch.zeros(len(index), T)
    token_rewards[:, -1] = torch.stack(scores)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask},
        non_tensors={"uid": np.array(index, dtype=object)},
    )
    return data, keys


def test_multi_output_agent_loops_are_refused_saying_why(tmp_path):
    """verl's advantage step passes every output of every session to rlkit's estimator: sessions
    of unequal length give unequal groups, refused; sessions of one length k give groups of
    k·n rows, refused where the callback told the estimator actor_rollout_ref.rollout.n."""
    config = verl_config(
        "algorithm.adv_estimator=ebpo",
        f"trainer.checkpoint_callback_class={CALLBACK}",
        f"trainer.default_local_dir={tmp_path}",
        f"actor_rollout_ref.rollout.n={G}",
    )
    outputs = [[2] * G for _ in range(P)]
    outputs[2][0] = 1
    data, keys = multi_output_data(outputs)
    with pytest.raises(ValueError, match=r"uid '.*' has 7 rows, .* has 8; .* several outputs per"):
        verl_advantages(data, config, keys)
    build_checkpoint_callback(config)
    data, keys = multi_output_data([[2] * G for _ in range(P)])
    with pytest.raises(
        ValueError, match=r"every prompt has 8 rows .*, but actor_rollout_ref.rollout.n=4\. verl"
    ):
        verl_advantages(data, config, keys)


class FakeWorkers:
    """The actor worker group's checkpoint calls, writing nothing but the folder."""

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)

    def load_checkpoint(self, local_path, del_local_after_load=False):
        assert os.path.isdir(local_path)


class FakeLoader:
    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def trainer(config) -> PPOTrainerSync:
    """verl's v1 sync trainer with its real checkpoint methods and callback, fake workers."""
    t = object.__new__(PPOTrainerSync)
    t.config, t.trainer_mode, t.use_critic, t.global_steps = config, "sync", False, 0
    t.actor_rollout_wg, t.train_dataloader = FakeWorkers(), FakeLoader()
    t.checkpoint_callback = build_checkpoint_callback(config)  # as PPOTrainer.__init__ does
    return t


def test_state_rides_verl_checkpoints(tmp_path):
    common = [
        "algorithm.adv_estimator=ebpo",
        "+algorithm.rlkit.ebpo.prior_decay=0.95",
        f"trainer.checkpoint_callback_class={CALLBACK}",
        f"trainer.default_local_dir={tmp_path}",
        f"actor_rollout_ref.rollout.n={G}",
    ]
    config = verl_config(*common)
    datas = [verl_data(grouped_rewards(step), step) for step in range(3)]

    first = trainer(config)  # nothing to resume: a fresh state
    assert isinstance(first.checkpoint_callback, verl_plugin.RlkitStateCallback)
    straight = [verl_advantages(d, config) for d in datas]

    adapter.reset()
    run = trainer(config)
    for d in datas[:2]:
        verl_advantages(d, config)
    run.global_steps = 2
    run._save_checkpoint()  # verl's save: actor/, data.pt, the tracker, then the callback
    assert os.path.exists(tmp_path / "global_step_2" / adapter.STATE_FILE)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"

    adapter.reset()  # a new trainer process
    resumed = trainer(config)  # resume_mode=auto: the callback restores global_step_2
    resumed._load_checkpoint()
    assert resumed.global_steps == 2
    assert torch.equal(verl_advantages(datas[2], config), straight[2])

    by_path = trainer(
        verl_config(
            *common,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={tmp_path / 'global_step_2'}",
        )
    )
    by_path._load_checkpoint()
    assert torch.equal(verl_advantages(datas[2], config), straight[2])

    trainer(verl_config(*common, "trainer.resume_mode=disable"))  # starts afresh
    assert not torch.equal(verl_advantages(datas[2], config), straight[2])


def test_a_crash_between_verls_marker_and_the_state_stops_the_resume(tmp_path, monkeypatch):
    """verl's real _save_checkpoint with the process killed after it wrote
    latest_checkpointed_iteration.txt and before the callback wrote the state: the resume stops
    with an error naming the missing file and the earlier complete checkpoint; an empty state
    written as the error says lets it start rlkit's estimators afresh."""
    common = [
        "algorithm.adv_estimator=ebpo",
        f"trainer.checkpoint_callback_class={CALLBACK}",
        f"trainer.default_local_dir={tmp_path}",
        f"actor_rollout_ref.rollout.n={G}",
    ]
    config = verl_config(*common)
    run = trainer(config)
    verl_advantages(verl_data(grouped_rewards(0), 0), config)
    run.global_steps = 1
    run._save_checkpoint()

    def killed(folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(adapter, "save", killed)
    run.global_steps = 2
    with pytest.raises(KeyboardInterrupt):
        run._save_checkpoint()
    monkeypatch.undo()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"

    adapter.reset()  # a new trainer process, resume_mode=auto
    folder = tmp_path / "global_step_2"
    with pytest.raises(FileNotFoundError) as refused:
        trainer(config)
    assert str(refused.value).startswith(f"{folder / adapter.STATE_FILE} does not exist")
    assert f"trainer.resume_from_path={tmp_path / 'global_step_1'}" in str(refused.value)
    earlier = trainer(
        verl_config(
            *common,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={tmp_path / 'global_step_1'}",
        )
    )
    earlier._load_checkpoint()
    assert earlier.global_steps == 1 and "ebpo" in adapter.state_dict()["estimators"]

    adapter.reset()
    adapter.save(str(folder))  # the error's other way on: an empty state
    trainer(config)._load_checkpoint()
    assert adapter.state_dict()["estimators"] == {}
