"""Checks that span a config's sections (:func:`check_combination`: estimator and controller
options, the group size each method needs, the combinations a method refuses, and
:func:`ignored_settings`, the settings that cannot act) and against the filesystem
(:func:`check_paths`); each problem is a ``ValueError`` naming the keys. Also the values a run
derives from several sections (:func:`run_tis_cap`, :func:`run_tis_tripwire`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

from rlkit.advantages import ESTIMATORS
from rlkit.config.readers import ignored_settings, method_choice, unread
from rlkit.config.schema import BUILTIN_MODEL, TrainConfig, _choice, estimator_options
from rlkit.controllers import AdaptiveClip, AdaptiveTemperature
from rlkit.methods.registry import get_method, method_name
from rlkit.models.gguf import GGUF_SUFFIX, gguf_path
from rlkit.paths import check_dir, check_link
from rlkit.settings import show
from rlkit.tasks.registry import TASKS
from rlkit.tis import resolve_tis_cap, resolve_tis_tripwire


def _check_kwargs(key: str, factory: Callable, options: dict, reserved: dict | None = None) -> None:
    """``factory(**options)`` must accept every key and value: an unknown key or a bad value is a
    ValueError naming ``key``. ``reserved`` maps keys the trainer sets itself to where to set them."""
    reserved = reserved or {}
    known = [name for name in inspect.signature(factory).parameters if name not in reserved]
    for name in options:
        if name in reserved:
            raise ValueError(f"{key}.{name} is set by the trainer; use {reserved[name]} instead")
        if name not in known:
            raise ValueError(f"unknown config key {key}.{name}; known keys: {known}")
    try:
        factory(**options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{key}: {err}") from None


def check_combination(cfg: TrainConfig) -> None:
    """Checks that span sections: estimator and controller options, the group size each
    component needs, the combinations the method refuses (its ``refuses``), the settings that
    cannot act (:func:`ignored_settings`) and the options shared between sections."""
    estimator = ESTIMATORS[cfg.algo.estimator]
    _check_kwargs("algo.options", estimator, cfg.algo.options)
    one_rule = {"ema_update": "agpo.ema_update"}  # both controllers' running averages
    _check_kwargs("agpo.clip", AdaptiveClip, cfg.agpo.clip, reserved=one_rule)
    _check_kwargs(
        "agpo.temperature",
        AdaptiveTemperature,
        cfg.agpo.temperature,
        reserved={"tau_base": "rollout.temperature", **one_rule},
    )
    name = method_name(cfg)  # an unknown method is a ValueError here
    method, chosen = get_method(name), method_choice(name).text
    needs = [  # (what needs it, the completions a group needs)
        (show("algo.estimator", cfg.algo.estimator), estimator.min_group_size),
        (chosen, method.min_group_size),
        ("rollout.dynamic_sampling=true", 2 if cfg.rollout.dynamic_sampling else 1),
    ]
    for reason, minimum in needs:
        if cfg.rollout.group_size < minimum:
            raise ValueError(
                f"rollout.group_size={cfg.rollout.group_size} with {reason}: a group needs "
                f"at least {minimum} completions (a single one has no group baseline: A = 0)"
            )
    for refused in method.refuses:
        if refused.when(cfg):
            raise ValueError(f"{chosen} with {refused.when.text}: {refused.because}; {refused.fix}")
    if cfg.parallel.strategy == "fsdp2" and cfg.model.mode == "qlora":
        raise ValueError(
            "parallel.strategy=fsdp2 with model.mode=qlora: rlkit does not shard bitsandbytes' "
            "4-bit weights yet (bitsandbytes' FSDP-QLoRA route, bnb_4bit_quant_storage set to "
            "the compute dtype, is not wired in: its forward and backward run under fully_shard "
            "on the CPU, but rlkit's gathered generation and saving of the packed weights are "
            "untested); use parallel.strategy=ddp with model.mode=qlora, or "
            "parallel.strategy=fsdp2 with model.mode=lora on the unquantized model"
        )
    if run_tis_cap(cfg) is not None and cfg.loss.ratio_temperature != "sampling":
        raise ValueError(
            f"loss.tis_cap={cfg.loss.tis_cap} (on with rollout.engine={cfg.rollout.engine}, "
            f"rollout.generation_copy={cfg.rollout.generation_copy}) "
            f"needs loss.ratio_temperature=sampling: the sampler's log-probs are at the sampling "
            f"temperature, π_old's at {cfg.loss.ratio_temperature}; set loss.tis_cap=off or "
            "loss.ratio_temperature=sampling"
        )
    if cfg.model.name_or_path == BUILTIN_MODEL and cfg.task.name != "arithmetic":
        raise ValueError(
            f"model.name_or_path={BUILTIN_MODEL} only works with task.name=arithmetic "
            f"(got task.name={cfg.task.name!r})"
        )
    if ignored := ignored_settings(cfg):
        raise ValueError(ignored[0])
    shared = estimator_options(cfg)
    for name, key in ESTIMATORS[cfg.algo.estimator].shared_settings.items():
        explicit = cfg.algo.options.get(name, shared[name])
        if explicit != shared[name]:
            raise ValueError(
                f"{key} ({shared[name]!r}) sets the {cfg.algo.estimator} advantage's {name}; "
                f"algo.options.{name} ({explicit!r}) conflicts with it: set only {key}"
            )
    if cfg.rollout.lag and cfg.rollout.lag >= cfg.steps:
        raise ValueError(
            f"rollout.lag={cfg.rollout.lag} with steps={cfg.steps}: no batch would wait its "
            f"{cfg.rollout.lag} steps, every batch would be drawn at step 0 by the starting "
            "policy (offline RL, not the asynchronous RL rollout.lag models); set rollout.lag "
            "below steps"
        )
    if cfg.token_budget and cfg.rollout.lag:
        raise ValueError(
            f"token_budget={cfg.token_budget} with rollout.lag={cfg.rollout.lag}: the "
            "batches drawn ahead of the step the budget stops would be generated but never "
            "counted; set rollout.lag=0 or token_budget=0"
        )
    if cfg.task.shift and cfg.task.shift["step"] >= cfg.steps:
        raise ValueError(
            f"task.shift.step ({cfg.task.shift['step']}) must be below steps ({cfg.steps})"
        )
    if cfg.task.shift and cfg.rollout.order == "difficulty":
        raise ValueError(
            "task.shift with rollout.order=difficulty: the curriculum ranks the starting "
            "prompts only; use rollout.order=shuffle or topic"
        )


def run_tis_cap(cfg: TrainConfig) -> float | None:
    """C for a run (`rlkit.tis`): :func:`rlkit.tis.resolve_tis_cap` of its ``loss.tis_cap``,
    engine and generation copy, or None where the run's method reads no ``loss.tis_cap`` (DPO,
    whose sequence loss, docs/algorithms.md §4d, takes no per-token weight)."""
    if unread(cfg, "loss.tis_cap") is not None:
        return None
    return resolve_tis_cap(cfg.loss.tis_cap, cfg.rollout.engine, cfg.rollout.generation_copy)


def run_tis_tripwire(cfg: TrainConfig) -> float | None:
    """The run's divergence tripwire in nats (`rlkit.tis.check_divergence`), or None: where
    :func:`run_tis_cap` records no sampler log-probs, or ``loss.tis_tripwire=off``."""
    return resolve_tis_tripwire(run_tis_cap(cfg), cfg.loss.tis_tripwire)


def _looks_local(name_or_path: str) -> bool:
    """A filesystem path rather than a hub id (``org/name``): absolute, ``./``/``~``-relative,
    or more than one ``/``."""
    return name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1


def _check_output_dir(output_dir: str) -> None:
    if not output_dir.strip():
        raise ValueError("output_dir must name a directory, got an empty string")
    check_dir("output_dir", output_dir)


def _check_dataset(key: str, name: str) -> None:
    from rlkit.tasks.math_datasets import LOCAL_FORMATS, resolve_spec

    if Path(name).suffix in LOCAL_FORMATS:
        check_link(key, name)
        if not Path(name).is_file():
            raise ValueError(f"{key}: dataset file not found: {name}")
    elif name not in TASKS:
        try:
            resolve_spec(name)
        except ValueError as err:
            raise ValueError(f"{key}: {err}; or a registered task: {sorted(TASKS)}") from None


def check_paths(cfg: TrainConfig) -> None:
    """Checks against the filesystem: the output directory can be created and written, a local
    model or dataset path exists (a GGUF file too), a dataset name is known; a path behind a
    symlink loop or a dangling symlink is named as such."""
    from rlkit.tasks.math_datasets import TEMPLATES

    _check_output_dir(cfg.output_dir)
    model = cfg.model.name_or_path
    if _looks_local(model) or model.endswith(GGUF_SUFFIX):
        check_link("model.name_or_path", model)
    if model.endswith(GGUF_SUFFIX):  # (a built-in GGUF id is checked when it is loaded)
        gguf_path(model)
    elif model != BUILTIN_MODEL and _looks_local(model) and not Path(model).exists():
        raise ValueError(
            f"model.name_or_path {model} does not exist (a hub id looks like org/name)"
        )
    _check_dataset("task.name", cfg.task.name)
    if cfg.task.eval_name is not None:
        _check_dataset("task.eval_name", cfg.task.eval_name)
    _choice("task.template", cfg.task.template, TEMPLATES)
