"""recipes/verl_qwen3_8b_ebpo.yaml against verl 0.9.1's own config: it composes, every key it sets
is one of verl's (a misspelt key would otherwise be added silently), verl's config checks pass,
and the launch command of docs/scaling-out.md reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.import_utils import load_class_from_fqn

from rlkit.integrations import verl as adapter
from rlkit.integrations.verl_plugin import RlkitStateCallback

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
NAME = "verl_qwen3_8b_ebpo"
VERL_CONFIG = os.path.join(os.path.dirname(sys.modules["verl"].__file__), "trainer", "config")


def leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def composed(config_dir, name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(name, overrides=list(overrides))


def test_the_recipe_sets_only_verl_keys_and_passes_verl_checks():
    recipe = yaml.safe_load((RECIPES / f"{NAME}.yaml").read_text())
    own = {k: v for k, v in recipe.items() if k not in ("hydra", "defaults")}
    base = OmegaConf.to_container(composed(VERL_CONFIG, "ppo_trainer"))  # keeps "???" values
    own_keys = [key for key in leaves(own) if not key.startswith("algorithm.rlkit.")]
    foreign = [key for key in own_keys if key not in set(leaves(base))]
    assert foreign == []
    config = composed(RECIPES, NAME)
    validate_config(config, need_reference_policy(config), need_critic(config))
    assert config.algorithm.adv_estimator == "ebpo"
    assert adapter.settings_from_config("ebpo", config.algorithm) == {
        "options": {"prior": "history", "prior_decay": 1.0, "whitening": "whiten"},
        "cluster_key": None,
    }
    fqn = config.trainer.checkpoint_callback_class
    assert load_class_from_fqn(fqn, "CheckpointCallback") is RlkitStateCallback


def test_the_launch_command_reads_the_recipe(tmp_path):
    """verl's entry point with the recipe, as docs/scaling-out.md launches it; hydra's ``--cfg
    job`` prints the composed config instead of starting Ray."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.trainer.main_ppo",
            f"--config-path={RECIPES}",
            f"--config-name={NAME}",
            "trainer.nnodes=2",
            "algorithm.rlkit.ebpo.prior=batch",
            "--cfg",
            "job",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    config = yaml.safe_load(out)
    assert config["algorithm"]["rlkit"]["ebpo"]["prior"] == "batch"
    assert config["trainer"]["nnodes"] == 2
    assert config["actor_rollout_ref"]["rollout"]["name"] == "vllm"
    assert list(tmp_path.iterdir()) == []  # nothing written
