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
the estimators' state into every ``global_step_N`` checkpoint and restores it on resume (a
checkpoint without it stops the resume), and holds every batch to ``actor_rollout_ref.rollout.n``
rows per prompt.
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


MARKER = "latest_checkpointed_iteration.txt"  # verl's "checkpoint complete" tracker file


def missing_state_message(folder: str) -> str:
    """Why a ``global_step_N`` folder without :data:`rlkit.integrations.verl.STATE_FILE` stops
    the resume, and the two ways on: the newest earlier checkpoint of the same directory that has
    the state (by name, where there is one), or an empty state written by hand."""
    parent = os.path.dirname(folder.rstrip(os.sep))
    step = int(folder.rsplit("global_step_", 1)[-1])
    steps = [
        int(entry.name[len("global_step_") :])
        for entry in os.scandir(parent)
        if entry.name.startswith("global_step_") and entry.name[len("global_step_") :].isdigit()
    ]
    earlier = [
        n
        for n in steps
        if n < step and os.path.exists(os.path.join(parent, f"global_step_{n}", adapter.STATE_FILE))
    ]
    previous = (
        f"trainer.resume_mode=resume_path "
        f"trainer.resume_from_path={os.path.join(parent, f'global_step_{max(earlier)}')}"
        if earlier
        else "no earlier checkpoint here has the state"
    )
    return (
        f"{os.path.join(folder, adapter.STATE_FILE)} does not exist, so rlkit's estimators (EBPO's "
        f"prior) cannot resume with verl from {folder}. verl 0.9.1 writes {MARKER} before it "
        "calls RlkitStateCallback.on_save, so a crash between the two leaves such a checkpoint, as "
        "does a run saved without the callback. Resume from an earlier complete checkpoint "
        f"({previous}), or start rlkit's estimators afresh from this one by writing an empty "
        f"state first: python -c \"from rlkit.integrations import verl; verl.save('{folder}')\""
    )


class RlkitStateCallback(CheckpointCallback):
    """verl's checkpoint callback (``trainer.checkpoint_callback_class``), built once in the
    trainer process, where the estimators run. On construction it restores the state saved in the
    checkpoint verl is about to resume from (or starts fresh where there is none to resume), and
    tells the estimators ``actor_rollout_ref.rollout.n``, the group size every batch must have
    (:data:`rlkit.integrations.verl.MULTI_OUTPUT`); after each save it writes the state into that
    ``global_step_N`` folder as :data:`rlkit.integrations.verl.STATE_FILE`, atomically
    (:func:`rlkit.integrations.verl.save`).

    verl 0.9.1 calls ``on_save`` after writing :data:`MARKER` (``PPOTrainer._save_checkpoint`` in
    verl/trainer/ppo/v1/trainer_base.py) and offers no hook before it, so a crash between the two
    leaves a checkpoint that verl resumes from but that lacks the state: resuming from it is a
    FileNotFoundError naming the file (:func:`missing_state_message`), never a fresh prior."""

    def __init__(self, config=None):
        super().__init__(config)
        adapter.reset()
        if config is None:
            return
        adapter.STATES.rows_per_prompt = config.actor_rollout_ref.rollout.n
        folder = resume_folder(config)
        if folder is None:
            return
        try:
            adapter.load(folder)
        except FileNotFoundError as missing:
            raise FileNotFoundError(missing_state_message(folder)) from missing
        logger.info("rlkit estimator state restored from %s", folder)

    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        adapter.save(checkpoint_dir)
