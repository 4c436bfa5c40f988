"""The verl plugin: registers rlkit's ``ebpo`` and ``agpo`` advantages in verl's estimator registry
and provides the checkpoint callback that saves and restores their state (docs/scaling-out.md).

``import verl`` imports this module through the ``verl.plugins`` entry point of rlkit's
pyproject.toml (``VERL_USE_EXTERNAL_PLUGINS``: ``auto``, the default, loads every plugin, a list
of names only those; the name here is ``rlkit``). verl logs a plugin that fails to import only at
debug level and carries on, so a broken install shows up as ``Unknown advantage estimator
simply: ebpo``: ``python -c "import rlkit.integrations.verl_plugin"`` then shows the error.

Then ``algorithm.adv_estimator=ebpo`` (or ``agpo``) selects rlkit's estimator, with its options
under ``+algorithm.rlkit.*`` (:mod:`rlkit.integrations.verl`), and
``trainer.checkpoint_callback_class=rlkit.integrations.verl_plugin.RlkitStateCallback`` writes
the estimators' state into every ``global_step_N`` checkpoint and restores it on resume.
"""

from __future__ import annotations

import logging
import os

from verl.trainer.ppo.checkpoint_callback import CheckpointCallback
from verl.trainer.ppo.core_algos import register_adv_est

from rlkit.integrations import verl as adapter

logger = logging.getLogger(__name__)


def _verl_estimator(name: str):
    """The function verl calls for ``algorithm.adv_estimator=name`` (keywords only).
    ``reward_baselines`` (ReMax's) is accepted and unused: rlkit's baselines come from the group
    and, for EBPO, the prior. ``non_tensor_batch`` carries cluster labels where a caller passes it
    (verl 0.9.1 does not)."""

    def estimator(
        token_level_rewards,
        response_mask,
        index,
        config=None,
        reward_baselines=None,
        non_tensor_batch=None,
    ):
        return adapter.estimate(
            name, token_level_rewards, response_mask, index, config, non_tensor_batch
        )

    estimator.__name__ = estimator.__qualname__ = f"compute_rlkit_{name}_advantage"
    estimator.__doc__ = f"rlkit's {name!r} advantage on verl's batch (rlkit.integrations.verl)."
    return estimator


ESTIMATOR_FNS = {
    name: register_adv_est(name)(_verl_estimator(name)) for name in adapter.ESTIMATOR_NAMES
}


def resume_folder(config) -> str | None:
    """The ``global_step_N`` folder verl's trainer resumes from, or None: what
    ``PPOTrainer._load_checkpoint`` (verl/trainer/ppo/v1/trainer_base.py, 0.9.1) chooses from
    ``trainer.resume_mode`` (``disable`` | ``auto`` | ``resume_path``)."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    trainer = config.trainer
    mode = trainer.resume_mode
    if mode == "disable":
        return None
    if mode == "auto":
        return find_latest_ckpt_path(os.path.abspath(trainer.default_local_dir))
    if mode == "resume_path":
        return os.path.abspath(trainer.resume_from_path)
    raise ValueError(
        f"trainer.resume_mode={mode!r}: RlkitStateCallback knows 'disable', 'auto', 'resume_path'"
    )


class RlkitStateCallback(CheckpointCallback):
    """verl's checkpoint callback (``trainer.checkpoint_callback_class``), built once in the
    trainer process, where the estimators run. On construction it restores the state saved in the
    checkpoint verl is about to resume from (or starts fresh); after each save it writes the state
    into that ``global_step_N`` folder as :data:`rlkit.integrations.verl.STATE_FILE`."""

    def __init__(self, config=None):
        super().__init__(config)
        adapter.reset()
        folder = resume_folder(config) if config is not None else None
        if folder is None:
            return
        if adapter.load(folder):
            logger.info("rlkit estimator state restored from %s", folder)
        else:
            logger.warning(
                "%s has no %s (saved without RlkitStateCallback): rlkit's estimators start afresh",
                folder,
                adapter.STATE_FILE,
            )

    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        adapter.save(checkpoint_dir)
