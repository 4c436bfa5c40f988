"""Checks that span a config's sections (:func:`check_combination`: estimator and controller
options, the group size each method needs, the combinations a method refuses, and
:func:`ignored_settings`, the settings that cannot act) and against the filesystem
(:func:`check_paths`); each problem is a ``ValueError`` naming the keys. Also the values a run
derives from several sections (:func:`run_tis_cap`, :func:`run_tis_tripwire`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkit.advantages import ESTIMATORS
from rlkit.config.schema import (
    BUILTIN_MODEL,
    DPOConfig,
    PPOConfig,
    TrainConfig,
    _choice,
    estimator_options,
)
from rlkit.controllers import AdaptiveClip, AdaptiveTemperature
from rlkit.engines import get_engine
from rlkit.models.gguf import GGUF_SUFFIX, gguf_path
from rlkit.paths import check_dir, check_link
from rlkit.tis import DEFAULT_TIS_TRIPWIRE, resolve_tis_cap


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
    """Checks that span sections: estimator and controller options, the group size each needs."""
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
    needs = {f"algo.estimator={cfg.algo.estimator}": estimator.min_group_size}
    needs |= {"agpo.enabled=true": 2 if cfg.agpo.enabled else 1}
    needs |= {"rollout.dynamic_sampling=true": 2 if cfg.rollout.dynamic_sampling else 1}
    for reason, minimum in needs.items():
        if cfg.rollout.group_size < minimum:
            raise ValueError(
                f"rollout.group_size={cfg.rollout.group_size} with {reason}: a group needs "
                f"at least {minimum} completions (a single one has no group baseline: A = 0)"
            )
    if cfg.loss.loss_mode == "kl_cov" and cfg.agpo.enabled and cfg.agpo.adaptive_clip:
        raise ValueError(
            "loss.loss_mode=kl_cov with agpo.enabled=true and agpo.adaptive_clip=true: KL-Cov's "
            "surrogate has no ratio clip for AGPO's ε to set; set agpo.adaptive_clip=false"
        )
    if cfg.algo.estimator == "ppo" and cfg.loss.exclude_zero_var_from_norm:
        raise ValueError(
            "loss.exclude_zero_var_from_norm=true with algo.estimator=ppo: PPO's advantages come "
            "from its value head, so a group whose rewards are all equal still has a policy "
            "gradient; set loss.exclude_zero_var_from_norm=false"
        )
    if cfg.algo.estimator == "ppo" and cfg.agpo.enabled:
        raise ValueError(
            "algo.estimator=ppo with agpo.enabled=true: AGPO's controllers act on group "
            "advantages, PPO's come from its value head; set agpo.enabled=false"
        )
    if cfg.parallel.strategy == "fsdp2" and cfg.algo.estimator == "ppo":
        raise ValueError(
            "parallel.strategy=fsdp2 with algo.estimator=ppo: PPO's value head is saved from "
            "whole weights, which FSDP2 shards; use parallel.strategy=ddp"
        )
    if cfg.algo.estimator == "dpo":
        check_dpo(cfg)
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


def run_tis_tripwire(cfg: TrainConfig) -> float | None:
    """The run's divergence tripwire in nats (`rlkit.tis.check_divergence`), or None: where
    :func:`run_tis_cap` records no sampler log-probs, or ``loss.tis_tripwire=off``."""
    if run_tis_cap(cfg) is None or cfg.loss.tis_tripwire == "off":
        return None
    return DEFAULT_TIS_TRIPWIRE if cfg.loss.tis_tripwire == "auto" else cfg.loss.tis_tripwire


def run_tis_cap(cfg: TrainConfig) -> float | None:
    """C for a run (`rlkit.tis`): :func:`rlkit.tis.resolve_tis_cap` of its ``loss.tis_cap``,
    engine and generation copy, or None for DPO, whose sequence loss (docs/algorithms.md §4d)
    takes no per-token weight."""
    if cfg.algo.estimator == "dpo":
        return None
    return resolve_tis_cap(cfg.loss.tis_cap, cfg.rollout.engine, cfg.rollout.generation_copy)


def check_dpo(cfg: TrainConfig) -> None:
    """The combinations DPO cannot do (docs/algorithms.md §4d), each a ValueError naming them."""
    refused = [
        (
            cfg.agpo.enabled,
            "agpo.enabled=true",
            "AGPO's controllers set a clip radius and temperatures for the clipped surrogate, "
            "which DPO's preference loss replaces",
            "set agpo.enabled=false",
        ),
        (
            cfg.parallel.strategy == "fsdp2",
            "parallel.strategy=fsdp2",
            "DPO trains on one process only (each rank's pairs would differ in number, and "
            "the ranks' gradient reductions with them)",
            "run one process",
        ),
        (
            cfg.dpo.mode == "offline" and cfg.rollout.dynamic_sampling,
            "dpo.mode=offline and rollout.dynamic_sampling=true",
            "offline DPO replays the groups it collected at the first step and generates "
            "nothing to refill with",
            "set rollout.dynamic_sampling=false or dpo.mode=online",
        ),
        (
            cfg.dpo.mode == "offline" and bool(cfg.task.shift),
            "dpo.mode=offline and task.shift",
            "offline DPO collects its prompts at the first step, before the shift",
            "leave task.shift out or set dpo.mode=online",
        ),
    ]
    for bad, setting, because, fix in refused:
        if bad:
            raise ValueError(f"algo.estimator=dpo with {setting}: {because}; {fix}")


def _default(section: Any, name: str) -> Any:
    """The dataclass default of field ``name`` of a config section."""
    f = next(f for f in dataclasses.fields(section) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def ignored_settings(cfg: TrainConfig) -> list[str]:
    """Settings changed from their default that cannot act, because another setting replaces
    or switches off what they control; one message per setting, naming both keys.

    A changed setting must act or be refused: dropping it without a word (AGPO's adaptive clip
    replacing the 8B presets' clip-higher ``loss.eps_high=0.28``) gives a run that is not the
    one asked for. Every rule is a row here (docs/algorithms.md §4)."""
    agpo, ro, task, model = cfg.agpo, cfg.rollout, cfg.task, cfg.model
    engine = get_engine(ro.engine)  # what the rollout engine declares it does
    estimator = cfg.algo.estimator
    mode = cfg.loss.loss_mode
    rules = [  # (section key, section, fields, ignored?, because, what to do)
        (
            "loss",
            cfg.loss,
            ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"),
            mode != "clip_cov",
            f"loss.loss_mode={mode}: only Clip-Cov reads them",
            "set loss.loss_mode=clip_cov or leave them at their defaults",
        ),
        (
            "loss",
            cfg.loss,
            ("kl_cov_ratio", "ppo_kl_coef"),
            mode != "kl_cov",
            f"loss.loss_mode={mode}: only KL-Cov reads them",
            "set loss.loss_mode=kl_cov or leave them at their defaults",
        ),
        (
            "loss",
            cfg.loss,
            ("eps_low", "eps_high", "dual_clip"),
            mode == "kl_cov",
            "loss.loss_mode=kl_cov: KL-Cov's surrogate −ρ·A is not clipped (verl's kl_cov)",
            "use loss.loss_mode=clip_cov or vanilla for a clipped surrogate, or leave them out",
        ),
        (
            "loss",
            cfg.loss,
            ("dual_clip",),
            mode in ("gspo", "cispo"),
            f"loss.loss_mode={mode}: its loss has no dual clip (TRL's and verl's have none)",
            "use loss.loss_mode=vanilla or clip_cov for the dual clip, or leave it out",
        ),
        (
            "loss",
            cfg.loss,
            ("eps_low", "eps_high"),
            agpo.enabled and agpo.adaptive_clip,
            "agpo.enabled=true and agpo.adaptive_clip=true: AGPO's clip radius replaces it "
            "(symmetric, per prompt, from agpo.clip's eps_base, default 0.2)",
            "set the radius in agpo.clip, or agpo.adaptive_clip=false to keep the loss's clip",
        ),
        (
            "agpo",
            agpo,
            ("probe", "adaptive_temperature", "adaptive_clip", "ema_update", "temperature", "clip"),
            not agpo.enabled,
            "agpo.enabled=false: the AGPO controllers are off",
            "set agpo.enabled=true or leave it at its default",
        ),
        (
            "agpo",
            agpo,
            ("dispersion", "mad_median"),
            not agpo.enabled
            and "agpo.dispersion" not in ESTIMATORS[estimator].shared_settings.values(),
            f"agpo.enabled=false and algo.estimator={estimator}: neither AGPO's probe nor its "
            "advantage runs",
            "set agpo.enabled=true or algo.estimator=agpo, or leave it at its default",
        ),
        (
            "agpo",
            agpo,
            ("mad_median",),
            agpo.dispersion != "mad",
            f"agpo.dispersion={agpo.dispersion}: only the MAD has a median",
            "set agpo.dispersion=mad or leave it at its default",
        ),
        (
            "agpo",
            agpo,
            ("temperature",),
            agpo.enabled and not agpo.adaptive_temperature,
            "agpo.adaptive_temperature=false: the temperature controller is off",
            "set agpo.adaptive_temperature=true or leave it at its default",
        ),
        (
            "agpo",
            agpo,
            ("clip",),
            agpo.enabled and not agpo.adaptive_clip,
            "agpo.adaptive_clip=false: the clip controller is off",
            "set agpo.adaptive_clip=true or leave it at its default",
        ),
        (
            "agpo",
            agpo,
            ("ema_update",),
            agpo.enabled and not agpo.adaptive_temperature and not agpo.adaptive_clip,
            "agpo.adaptive_temperature=false and agpo.adaptive_clip=false: no controller keeps "
            "a running average",
            "switch a controller on or leave it at its default",
        ),
        (
            "algo",
            cfg.algo,
            ("cluster_key",),
            not ESTIMATORS[estimator].uses_clusters,
            f"algo.estimator={estimator}: only EBPO's priors use clusters",
            "set algo.estimator=ebpo or leave it unset",
        ),
        (
            "rollout",
            ro,
            ("max_gen_batches",),
            not ro.dynamic_sampling,
            "rollout.dynamic_sampling=false: one generation batch per step",
            "set rollout.dynamic_sampling=true or leave it at its default",
        ),
        (
            "rollout",
            ro,
            ("overlong_penalty",),
            ro.overlong_buffer == 0,
            "rollout.overlong_buffer=0: overlong reward shaping is off",
            "set rollout.overlong_buffer > 0 or leave it at its default",
        ),
        (
            "rollout",
            ro,
            ("vllm_memory",),
            engine.gpu_share != "vllm_memory",
            f"rollout.engine={ro.engine}: there is no vLLM engine",
            "set rollout.engine=vllm or leave it at its default",
        ),
        (
            "rollout",
            ro,
            ("fuse_lora", "compile"),
            not (engine.fuses_lora and engine.compiles_step),
            f"rollout.engine={ro.engine}: only the static decode loop (hf_static) fuses LoRA "
            "and compiles its decode step",
            "set rollout.engine=hf_static or leave them at their defaults",
        ),
        (
            "rollout",
            ro,
            ("fuse_lora",),
            engine.fuses_lora and model.mode == "full",
            "model.mode=full: there is no LoRA adapter to fuse",
            "set model.mode=lora or qlora, or leave it at its default",
        ),
        (
            "rollout",
            ro,
            ("generation_batch_size",),
            engine.batches_rows_itself,
            "rollout.engine=vllm: vLLM batches the training rollouts itself",
            "leave it at 0 (rollout.vllm_memory bounds vLLM's memory)",
        ),
        (
            "rollout",
            ro,
            ("generation_copy",),
            model.mode != "qlora",
            f"model.mode={model.mode}: there is no 4-bit base to dequantize (the sampler "
            "already runs the compute-dtype weights)",
            "set model.mode=qlora or leave it at its default",
        ),
        (
            "rollout",
            ro,
            ("generation_copy",),
            model.mode == "qlora" and engine.own_weights,
            "rollout.engine=vllm: vLLM samples with its own copy of the weights",
            "set rollout.engine=hf or hf_static, or leave it at its default",
        ),
        (
            "loss",
            cfg.loss,
            ("kl_estimator",),
            cfg.loss.kl_coef == 0 and cfg.optim.skip_redundant_passes,
            "loss.kl_coef=0: there is no KL term (and no kl metric)",
            "set loss.kl_coef > 0 or leave it at its default",
        ),
        (
            "model",
            model,
            ("lora_r", "lora_alpha", "lora_dropout", "target_modules"),
            model.mode == "full",
            "model.mode=full: there is no LoRA adapter",
            "set model.mode=lora or qlora, or leave it at its default",
        ),
        (
            "model",
            model,
            ("quant_type", "double_quant"),
            model.mode != "qlora",
            f"model.mode={model.mode}: the base model is not 4-bit",
            "set model.mode=qlora or leave it at its default",
        ),
        (
            "task",
            task,
            ("template", "eval_name"),
            task.name == "arithmetic",
            "task.name=arithmetic: the built-in task has its own prompts and eval split",
            "use a dataset task.name, or leave it unset",
        ),
        (
            "ppo",
            cfg.ppo,
            tuple(f.name for f in dataclasses.fields(PPOConfig)),
            estimator != "ppo",
            f"algo.estimator={estimator}: only PPO has a value head and a reward KL penalty",
            "set algo.estimator=ppo or leave the ppo section out",
        ),
        (
            "ppo",
            cfg.ppo,
            ("kl_target", "kl_horizon"),
            estimator == "ppo" and not cfg.ppo.adaptive_kl,
            "ppo.adaptive_kl=false: β stays at ppo.kl_coef",
            "set ppo.adaptive_kl=true or leave them at their defaults",
        ),
        (
            "dpo",
            cfg.dpo,
            tuple(f.name for f in dataclasses.fields(DPOConfig)),
            estimator != "dpo",
            f"algo.estimator={estimator}: only DPO has a preference loss",
            "set algo.estimator=dpo or leave the dpo section out",
        ),
        (
            "loss",
            cfg.loss,
            ("tis_mode", "tis_tripwire"),
            estimator != "dpo" and run_tis_cap(cfg) is None,
            f"loss.tis_cap={cfg.loss.tis_cap} with rollout.engine={ro.engine}: no sampler "
            "log-probs are recorded, so there is no mismatch to weigh or watch",
            "set loss.tis_cap to a number (or rollout.engine=hf_static) or leave it at its default",
        ),
        (
            "dpo",
            cfg.dpo,
            ("offline_batches",),
            estimator == "dpo" and cfg.dpo.mode == "online",
            "dpo.mode=online: every step's pairs are fresh",
            "set dpo.mode=offline or leave it at its default",
        ),
        (
            "loss",
            cfg.loss,
            (
                "eps_low",
                "eps_high",
                "dual_clip",
                "kl_coef",
                "loss_agg",
                "exclude_zero_var_from_norm",
                "loss_mode",
                "tis_cap",
                "tis_mode",
                "tis_tripwire",
            ),
            estimator == "dpo",
            "algo.estimator=dpo: its preference loss on sequence log-probs replaces the clipped "
            "surrogate, its KL term, token aggregation and importance weights (β is dpo.beta)",
            "leave them at their defaults",
        ),
        (
            "task",
            task,
            ("reward_timeout_s",),
            task.reward_workers == 0,
            "task.reward_workers=0: rewards are scored in-process, where no timeout is enforced",
            "set task.reward_workers >= 1 or leave it at its default",
        ),
    ]
    found = [
        f"{key}.{name}={getattr(section, name)!r} has no effect with {because}; {fix}"
        for key, section, names, ignored, because, fix in rules
        if ignored
        for name in names
        if getattr(section, name) != _default(section, name)
    ]
    options = cfg.algo.options  # check_combination refused any the estimator does not take
    option_rules = [  # EBPO's options: (option, ignored?, because, what to do)
        (
            "prior_decay",
            options.get("prior") == "batch",
            "algo.options.prior=batch: the prior restarts from the batch every step",
            "use prior=history, or leave it out",
        ),
        (
            "min_cluster_count",
            cfg.algo.cluster_key is None,
            "algo.cluster_key unset: there are no clusters",
            "set algo.cluster_key, or leave it out",
        ),
    ]
    signature = inspect.signature(ESTIMATORS[estimator]).parameters
    found += [
        f"algo.options.{name}={options[name]!r} has no effect with {because}; {fix}"
        for name, ignored, because, fix in option_rules
        if ignored and name in options and options[name] != signature[name].default
    ]
    return found


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
    elif name not in ("arithmetic", "word_problems"):
        try:
            resolve_spec(name)
        except ValueError as err:
            raise ValueError(f"{key}: {err}") from None


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
