"""rlkit's EBPO and AGPO advantages as verl advantage estimators, without importing verl.

verl (0.9.1) computes advantages once per step, in its trainer process, over the whole batch: it
calls the estimator registered as ``algorithm.adv_estimator`` with keywords only —
``token_level_rewards`` and ``response_mask`` [bs, T], ``index`` (each row's prompt uid, a numpy
object array), ``config`` (the ``algorithm`` config) and, when present, ``reward_baselines`` — and
takes back ``(advantages, returns)``, both [bs, T]. This module turns that flat batch into rlkit's
``[P, G]`` grouped rewards, runs rlkit's own estimator (:mod:`rlkit.advantages`; the formulas of
docs/algorithms.md §1 ``agpo`` and §2 ``ebpo``) and scatters the advantages back:

- a row's reward is the sum of its token-level rewards (verl's outcome convention, as its GRPO);
- groups come from ``index``, never from row positions: verl's ``balance_batch`` reorders rows;
- rows whose uid starts with ``pad`` are the synthetic rows verl appends to make the batch divisible
  (``verl/trainer/ppo/padding_utils.py``; a uuid4 uid never starts so). They are left out of every
  statistic (group means, EBPO's prior, the batch whitening) and get advantage 0;
- groups are laid out in a canonical order (by uid, and within a group by reward), so the result
  is bit-identical under any reordering of the rows;
- every group must have the same size G (rlkit's estimators take a ``[P, G]`` tensor): a batch
  whose groups differ is refused with an error naming the uids, and, where the plugin's callback
  told :data:`STATES` ``actor_rollout_ref.rollout.n``, so is a batch whose G is not n. Both are
  what a multi-output agent loop gives (:data:`MULTI_OUTPUT`).

The estimators' state (EBPO's prior, the cluster ids) lives in this module, one
:class:`~rlkit.methods.Method` per estimator name, because verl builds nothing per estimator: it
persists across steps in the trainer process, and :func:`state_dict` / :func:`load_state_dict` /
:func:`save` / :func:`load` let it travel with verl's checkpoints (the plugin's
``RlkitStateCallback`` does that; docs/scaling-out.md).

Options are read from ``algorithm.rlkit`` (:data:`CONFIG_KEY`)::

    algorithm:
      adv_estimator: ebpo
      rlkit:
        ebpo: {prior: history, prior_decay: 1.0, whitening: whiten}   # rlkit's EBPO options
        agpo: {dispersion: std}                                       # AGPO's advantage options
        cluster_key: null   # EBPO only: the batch field holding each prompt's cluster label
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from types import SimpleNamespace

import numpy as np
import torch

from rlkit.advantages import ESTIMATORS, AdvantageResult, get_estimator
from rlkit.config import _check_kwargs
from rlkit.methods import Method

ESTIMATOR_NAMES = ("ebpo", "agpo")  # the rlkit estimators registered with verl, under these names
CONFIG_KEY = "rlkit"  # their options: algorithm.rlkit.<name>.<option>, algorithm.rlkit.cluster_key
PAD_PREFIX = "pad"  # verl's synthetic padding rows: uid f"pad{uuid4().hex}", zero reward
STATE_FILE = "rlkit_estimators.pt"  # written beside verl's actor/ and data.pt in global_step_N/
STATE_VERSION = 1
# Why a prompt's row count can differ from actor_rollout_ref.rollout.n, and what to do. verl 0.9.1's
# agent loop writes one row per output of a session, keyed {uid}_{session}_{turn}, all carrying the
# prompt's uid (verl/trainer/ppo/v1/agent_loop_tq.py); compute_advantage_for_multi_trajectories
# (verl/trainer/ppo/v1/utils.py) reduces them to each session's last output for GRPO only and
# passes any other estimator every row with the uid alone, so the sessions cannot be told apart.
MULTI_OUTPUT = (
    "verl gives a prompt other than actor_rollout_ref.rollout.n rows when its agent loop returns "
    "several outputs per session: each output is a row with the prompt's uid, and verl 0.9.1 keeps "
    "only each session's last output for GRPO alone, passing rlkit's estimators every row with no "
    "session or turn to group them by. Return one output per session (verl's single_turn_agent "
    "and tool_agent loops do: a multi-turn conversation is one row, its tool tokens masked), keep "
    "every prompt's rows or none, or use algorithm.adv_estimator=grpo (docs/scaling-out.md)"
)


def _plain(value):
    """A Mapping (dict, omegaconf DictConfig, verl's dataclass config) as nested plain dicts."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def settings_from_config(name: str, config) -> dict:
    """The options of estimator ``name`` from verl's ``algorithm`` config (a DictConfig, verl's
    ``AlgoConfig`` or a dict; None gives the defaults): ``{"options": {...}, "cluster_key": ...}``.
    An unknown key or a bad value is a ValueError naming ``algorithm.rlkit.<key>``."""
    if name not in ESTIMATOR_NAMES:
        raise ValueError(f"unknown rlkit estimator {name!r} for verl; known: {ESTIMATOR_NAMES}")
    section = _plain(config.get(CONFIG_KEY) if config is not None else None) or {}
    if not isinstance(section, dict):
        raise ValueError(f"algorithm.{CONFIG_KEY} must be a mapping, got {section!r}")
    known = [*ESTIMATOR_NAMES, "cluster_key"]
    for key in section:
        if key not in known:
            raise ValueError(
                f"unknown config key algorithm.{CONFIG_KEY}.{key}; known keys: {known}"
            )
    for est in ESTIMATOR_NAMES:  # every section present, so a typo fails at once, not at a switch
        options = section.get(est) or {}
        if not isinstance(options, dict):
            raise ValueError(
                f"algorithm.{CONFIG_KEY}.{est} must be a mapping of {est}'s options, got {options!r}"
            )
        _check_kwargs(f"algorithm.{CONFIG_KEY}.{est}", ESTIMATORS[est], options)
    cluster_key = section.get("cluster_key")
    if cluster_key is not None:
        if not isinstance(cluster_key, str) or not cluster_key:
            raise ValueError(
                f"algorithm.{CONFIG_KEY}.cluster_key must name a batch field, got {cluster_key!r}"
            )
        if not ESTIMATORS[name].uses_clusters:
            raise ValueError(
                f"algorithm.{CONFIG_KEY}.cluster_key={cluster_key!r} has no effect with "
                f"algorithm.adv_estimator={name}: only EBPO's priors use clusters; unset it"
            )
    return {"options": dict(section.get(name) or {}), "cluster_key": cluster_key}


def build_method(name: str, settings: dict) -> Method:
    """rlkit's estimator ``name`` with ``settings`` (from :func:`settings_from_config`), wrapped in
    a :class:`~rlkit.methods.Method` that keeps the cluster-label → id map and the state."""
    cluster_key = "cluster" if settings["cluster_key"] is not None else None
    return Method(get_estimator(name, **settings["options"]), cluster_key=cluster_key)


class Grouping:
    """Where each group's members sit in verl's flat batch.

    ``rows`` [P, G]: row indices, groups sorted by uid and members by (reward, row); ``uids`` [P];
    ``pad`` [bs]: True for verl's padding rows, which belong to no group.
    """

    def __init__(
        self,
        index,
        scores: torch.Tensor,
        min_group_size: int = 1,
        rows_per_prompt: int | None = None,
    ):
        uids = list(np.asarray(index, dtype=object).reshape(-1))
        if len(uids) != scores.shape[0]:
            raise ValueError(
                f"index has {len(uids)} uids for a batch of {scores.shape[0]} rows: one uid per row"
            )
        self.pad = np.array([str(u).startswith(PAD_PREFIX) for u in uids], dtype=bool)
        members: dict = {}
        for row, uid in enumerate(uids):
            if not self.pad[row]:
                members.setdefault(uid, []).append(row)
        if not members:
            raise ValueError(
                f"every row of the batch is padding (uid starting with {PAD_PREFIX!r}): no group"
            )
        sizes = {uid: len(rows) for uid, rows in members.items()}
        small, large = min(sizes, key=sizes.get), max(sizes, key=sizes.get)
        if sizes[small] != sizes[large]:
            raise ValueError(
                f"groups differ in size: uid {small!r} has {sizes[small]} rows, uid {large!r} has "
                f"{sizes[large]}; rlkit's estimators take P groups of one size G. {MULTI_OUTPUT}"
            )
        if rows_per_prompt is not None and sizes[small] != rows_per_prompt:
            raise ValueError(
                f"every prompt has {sizes[small]} rows (uid {small!r}), but "
                f"actor_rollout_ref.rollout.n={rows_per_prompt}. {MULTI_OUTPUT}"
            )
        if sizes[small] < min_group_size:
            raise ValueError(
                f"groups of {sizes[small]} row(s) (uid {small!r}): this estimator needs at least "
                f"{min_group_size} per prompt (actor_rollout_ref.rollout.n >= {min_group_size})"
            )
        value = scores.tolist()
        self.uids = sorted(members, key=str)
        self.rows = torch.tensor(
            [sorted(members[uid], key=lambda row: (value[row], row)) for uid in self.uids],
            dtype=torch.long,
        )

    def cluster_labels(self, labels, field: str) -> list[str]:
        """Each group's label from the per-row ``labels``; they must agree within a group."""
        labels = list(np.asarray(labels, dtype=object).reshape(-1))
        if len(labels) != len(self.pad):
            raise ValueError(
                f"batch field {field!r} has {len(labels)} entries for {len(self.pad)} rows"
            )
        out = []
        for uid, rows in zip(self.uids, self.rows.tolist()):
            seen = {str(labels[row]) for row in rows}
            if len(seen) != 1:
                raise ValueError(
                    f"rows of uid {uid!r} carry different {field!r} labels {sorted(seen)}: a "
                    "prompt's cluster must be one label"
                )
            out.append(seen.pop())
        return out


def grouped_advantages(
    method: Method,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    cluster_labels=None,
    cluster_field: str = "cluster",
    rows_per_prompt: int | None = None,
) -> tuple[torch.Tensor, AdvantageResult, Grouping]:
    """verl's flat batch through ``method``'s estimator: advantages [bs, T] (each row's scalar
    advantage on its response tokens, 0 on pad rows), the estimator's result on the grouped
    ``[P, G]`` rewards and the grouping (whose groups must have ``rows_per_prompt`` rows where
    it is given)."""
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            "token_level_rewards and response_mask must both be [bs, T], got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    scores = token_level_rewards.detach().sum(dim=-1).cpu()
    grouping = Grouping(index, scores, method.estimator.min_group_size, rows_per_prompt)
    problems = None
    if method.cluster_key is not None:
        labels = grouping.cluster_labels(cluster_labels, cluster_field)
        problems = [SimpleNamespace(**{method.cluster_key: label}) for label in labels]
    result = method.advantages(scores[grouping.rows], problems)
    flat = torch.zeros(scores.shape[0], dtype=result.advantages.dtype)
    flat[grouping.rows.reshape(-1)] = result.advantages.reshape(-1)
    advantages = flat.to(token_level_rewards.device).unsqueeze(-1) * response_mask
    return advantages, result, grouping


class EstimatorStates:
    """The :class:`~rlkit.methods.Method` of each estimator name used in this process, built on its
    first call from the config, and states loaded from a checkpoint that wait for it.
    ``rows_per_prompt``: verl's ``actor_rollout_ref.rollout.n`` where the plugin's callback set it
    (the estimators see only the ``algorithm`` config), then every group must have that size."""

    def __init__(self):
        self.built: dict[str, tuple[dict, Method]] = {}
        self.pending: dict[str, dict] = {}
        self.rows_per_prompt: int | None = None

    def method(self, name: str, settings: dict) -> Method:
        if name in self.built:
            built_settings, method = self.built[name]
            if built_settings != settings:
                raise ValueError(
                    f"rlkit estimator {name!r} was built with {built_settings} and is now asked "
                    f"for {settings}: algorithm.{CONFIG_KEY} must not change during a run"
                )
            return method
        method = build_method(name, settings)
        if name in self.pending:
            saved = self.pending.pop(name)
            if saved["settings"] != settings:
                raise ValueError(
                    f"the checkpoint's rlkit state for {name!r} was saved with {saved['settings']}, "
                    f"the config now gives {settings}: resume with the same algorithm.{CONFIG_KEY} "
                    "settings, or start the run afresh"
                )
            method.load_state_dict(saved["method"])
        self.built[name] = (settings, method)
        return method

    def state_dict(self) -> dict:
        estimators = dict(self.pending)
        for name, (settings, method) in self.built.items():
            estimators[name] = {"settings": settings, "method": method.state_dict()}
        return {"version": STATE_VERSION, "estimators": estimators}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"rlkit estimator state version {state.get('version')!r}; this rlkit reads "
                f"version {STATE_VERSION}"
            )
        self.built = {}
        self.pending = dict(state["estimators"])


STATES = EstimatorStates()


def reset() -> None:
    """Forget every estimator's state (a fresh run in this process)."""
    STATES.__init__()


def state_dict() -> dict:
    """Every rlkit estimator's state in this process (settings, prior, cluster ids)."""
    return STATES.state_dict()


def load_state_dict(state: dict) -> None:
    """Replace the state; each estimator takes its part on its next call, after checking that
    the config gives the settings it was saved with."""
    STATES.load_state_dict(state)


def save(folder: str) -> str:
    """Write :func:`state_dict` to ``folder``/:data:`STATE_FILE` (a verl ``global_step_N``
    directory) and return the path. The write is atomic (a temporary file in ``folder``, then
    ``os.replace``, atomic on POSIX): a crash mid-write leaves no file rather than a torn one, so
    :func:`load` and the plugin's resume see the state whole or not at all."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, STATE_FILE)
    fd, tmp = tempfile.mkstemp(prefix=f".{STATE_FILE}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state_dict(), f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def load(folder: str) -> None:
    """Load ``folder``/:data:`STATE_FILE`; a FileNotFoundError naming the file where it is
    missing (the state is never silently fresh)."""
    path = os.path.join(folder, STATE_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no rlkit estimator state: {path} does not exist")
    load_state_dict(torch.load(path, weights_only=True))


def estimate(
    name: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    config=None,
    non_tensor_batch: Mapping | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One verl call of rlkit's estimator ``name``: ``(advantages, returns)``, both [bs, T] and
    equal (an outcome advantage is its own return, as verl's GRPO). With
    ``algorithm.rlkit.cluster_key`` the labels are read from ``non_tensor_batch[cluster_key]``,
    which verl 0.9.1 does not pass to its estimators (docs/scaling-out.md)."""
    settings = settings_from_config(name, config)
    method = STATES.method(name, settings)
    labels, field = None, settings["cluster_key"]
    if field is not None:
        if non_tensor_batch is None:
            raise ValueError(
                f"algorithm.{CONFIG_KEY}.cluster_key={field!r} needs each row's cluster label, but "
                "the estimator was called without non_tensor_batch: verl 0.9.1 passes its "
                "estimators only token_level_rewards, response_mask, index and config (see "
                "docs/scaling-out.md); unset cluster_key or pass non_tensor_batch"
            )
        if field not in non_tensor_batch:
            raise ValueError(
                f"algorithm.{CONFIG_KEY}.cluster_key={field!r}: the batch has no field {field!r} "
                f"(fields: {sorted(non_tensor_batch)})"
            )
        labels = non_tensor_batch[field]
    advantages, _, _ = grouped_advantages(
        method,
        token_level_rewards,
        response_mask,
        index,
        labels,
        field or "cluster",
        STATES.rows_per_prompt,
    )
    return advantages, advantages
