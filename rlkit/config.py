"""Configuration dataclasses, YAML presets and ``key=value`` overrides (TRL-style configs).

A run is described by one :class:`TrainConfig`. ``load_config(name_or_path, overrides)`` reads a
YAML preset (shipped in ``rlkit/configs``) or file, applies dotted overrides such as
``algo.estimator=ebpo rollout.group_size=4``, and validates everything before any work starts:
an unknown key or a bad value raises ``ValueError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlkit.advantages import ESTIMATORS
from rlkit.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS
from rlkit.models.loading import ModelSpec

PRESET_DIR = Path(__file__).parent / "configs"
BUILTIN_MODEL = "builtin:tiny"


def _choice(key: str, value: Any, allowed: typing.Iterable) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{key} must be one of {allowed}, got {value!r}")


def _positive(key: str, value: float, strict: bool = True) -> None:
    if value < 0 or (strict and value == 0):
        raise ValueError(f"{key} must be {'> 0' if strict else '>= 0'}, got {value!r}")


@dataclass
class ModelConfig(ModelSpec):
    """The policy (see :class:`rlkit.models.loading.ModelSpec`). ``builtin:tiny`` is the tiny
    Llama the project warm-starts itself on the arithmetic task."""

    name_or_path: str = BUILTIN_MODEL
    mode: str = "full"


@dataclass
class TaskConfig:
    """Where prompts come from and how completions are scored.

    ``name``: ``arithmetic`` (built-in), a math dataset short name (``gsm8k``, ``math500``, …) or
    a local ``.jsonl``/``.json``/``.parquet`` path.
    """

    name: str = "arithmetic"
    eval_name: str | None = None  # defaults to the eval split of ``name``
    template: str = "plain"
    chat_template: bool = False  # render prompts with the tokenizer's chat template
    num_train: int = 2000
    num_eval: int = 200
    reward: str = "exact_match"
    reward_workers: int = 0
    reward_timeout_s: float = 10.0
    on_reward_error: str = "warn"

    def __post_init__(self):
        _choice("task.reward", self.reward, ("exact_match", "math_verify"))
        _choice("task.on_reward_error", self.on_reward_error, ("warn", "raise"))
        _positive("task.num_train", self.num_train)
        _positive("task.num_eval", self.num_eval)
        _positive("task.reward_workers", self.reward_workers, strict=False)
        _positive("task.reward_timeout_s", self.reward_timeout_s)


@dataclass
class AlgoConfig:
    """Advantage estimator (spec §1–§2) and its options, e.g. ``{"prior": "batch"}`` for EBPO."""

    estimator: str = "grpo"
    options: dict = field(default_factory=dict)
    cluster_key: str | None = None  # "topic" | "difficulty": per-cluster EBPO priors

    def __post_init__(self):
        _choice("algo.estimator", self.estimator, sorted(ESTIMATORS))
        if self.cluster_key is not None:
            _choice("algo.cluster_key", self.cluster_key, ("topic", "difficulty"))


@dataclass
class AGPOConfig:
    """AGPO controllers (spec §3). Off by default; ``enabled=true`` turns on ATS and adaptive ε."""

    enabled: bool = False
    probe: str = "full"  # full | previous | reuse
    adaptive_temperature: bool = True
    adaptive_clip: bool = True
    dispersion: str = "std"
    temperature: dict = field(default_factory=dict)  # AdaptiveTemperature kwargs
    clip: dict = field(default_factory=dict)  # AdaptiveClip kwargs

    def __post_init__(self):
        _choice("agpo.probe", self.probe, ("full", "previous", "reuse"))
        _choice("agpo.dispersion", self.dispersion, ("std", "mad", "iqr"))


@dataclass
class RolloutConfig:
    """Sampling of training groups: P prompts × G completions per step."""

    num_prompts: int = 16
    group_size: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    truncated: str = "keep"  # keep | zero_reward | mask
    order: str = "shuffle"  # shuffle | topic | difficulty (spec §2, clustered sampling)
    dynamic_sampling: bool = False
    max_gen_batches: int = 3
    overlong_buffer: int = 0  # > 0 turns on DAPO overlong reward shaping
    overlong_penalty: float = 1.0
    generation_batch_size: int = 0  # rows per generate call (bounds the KV cache); 0 = all P·G
    engine: str = "hf"  # hf | vllm (optional extra; LoRA / QLoRA only)
    vllm_memory: float = 0.3  # fraction of the GPU vLLM may take (weights + KV cache)

    def __post_init__(self):
        _positive("rollout.num_prompts", self.num_prompts)
        _positive("rollout.group_size", self.group_size)
        _positive("rollout.max_new_tokens", self.max_new_tokens)
        _positive("rollout.temperature", self.temperature)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p!r}")
        _positive("rollout.top_k", self.top_k, strict=False)
        _choice("rollout.truncated", self.truncated, ("keep", "zero_reward", "mask"))
        _choice("rollout.order", self.order, ("shuffle", "topic", "difficulty"))
        _positive("rollout.max_gen_batches", self.max_gen_batches)
        _positive("rollout.overlong_buffer", self.overlong_buffer, strict=False)
        _positive("rollout.generation_batch_size", self.generation_batch_size, strict=False)
        _choice("rollout.engine", self.engine, ("hf", "vllm"))
        if not 0 < self.vllm_memory < 1:
            raise ValueError(f"rollout.vllm_memory must be in (0, 1), got {self.vllm_memory!r}")
        if self.overlong_buffer > self.max_new_tokens:
            raise ValueError(
                f"rollout.overlong_buffer ({self.overlong_buffer}) must not exceed "
                f"rollout.max_new_tokens ({self.max_new_tokens})"
            )


@dataclass
class LossConfig:
    """Clipped surrogate, KL and aggregation (spec §4)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    loss_agg: str = "token-mean"
    ratio_temperature: str | float = "sampling"  # "sampling" (default) or 1.0 (AGPO's code)

    def __post_init__(self):
        _positive("loss.eps_low", self.eps_low, strict=False)
        _positive("loss.eps_high", self.eps_high, strict=False)
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"loss.dual_clip must be > 1, got {self.dual_clip!r}")
        _positive("loss.kl_coef", self.kl_coef, strict=False)
        _choice("loss.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice("loss.loss_agg", self.loss_agg, LOSS_AGGREGATIONS)
        if self.ratio_temperature != "sampling":
            try:
                self.ratio_temperature = float(self.ratio_temperature)
            except (TypeError, ValueError):
                raise ValueError(
                    "loss.ratio_temperature must be 'sampling' or a positive number, "
                    f"got {self.ratio_temperature!r}"
                ) from None
            _positive("loss.ratio_temperature", self.ratio_temperature)


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then constant or cosine decay; μ update epochs over mini-batches."""

    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine
    max_grad_norm: float = 1.0
    update_epochs: int = 1
    mini_batch_size: int = 0  # sequences per optimizer step; 0 = the whole batch
    micro_batch_size: int = 0  # sequences per forward pass (gradient accumulation); 0 = mini-batch
    max_nonfinite_skips: int = 3
    logprob_micro_batch_size: int = 0  # sequences per no-grad log-prob pass; 0 = micro_batch_size
    logprob_chunk_size: int = 0  # completion positions per output-head call; 0 = all at once

    def __post_init__(self):
        _positive("optim.lr", self.lr)
        _positive("optim.weight_decay", self.weight_decay, strict=False)
        self.betas = tuple(self.betas)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {self.betas!r}")
        _positive("optim.warmup_steps", self.warmup_steps, strict=False)
        _choice("optim.schedule", self.schedule, ("constant", "cosine"))
        _positive("optim.max_grad_norm", self.max_grad_norm)
        _positive("optim.update_epochs", self.update_epochs)
        _positive("optim.mini_batch_size", self.mini_batch_size, strict=False)
        _positive("optim.micro_batch_size", self.micro_batch_size, strict=False)
        _positive("optim.max_nonfinite_skips", self.max_nonfinite_skips)
        _positive("optim.logprob_micro_batch_size", self.logprob_micro_batch_size, strict=False)
        _positive("optim.logprob_chunk_size", self.logprob_chunk_size, strict=False)


@dataclass
class EvalConfig:
    """Periodic evaluation: greedy accuracy, Pass@1 averaged over k samples, Maj@k."""

    every: int = 0  # steps; 0 = only at the start and the end
    num_problems: int = 200
    k: int = 4
    temperature: float = 1.0
    at_start: bool = True  # evaluate the starting policy (step 0)
    batch_size: int = 512  # rows per generate call (k samples of a problem stay together)

    def __post_init__(self):
        _positive("eval.every", self.every, strict=False)
        _positive("eval.num_problems", self.num_problems)
        _positive("eval.k", self.k)
        _positive("eval.temperature", self.temperature)
        _positive("eval.batch_size", self.batch_size)


@dataclass
class TrainConfig:
    """One training run."""

    seed: int = 0
    steps: int = 60
    output_dir: str = "runs/tiny-cpu"
    checkpoint_every: int = 20
    keep_checkpoints: int = 2
    tensorboard: bool = True
    progress: bool = True
    log_entropy: bool = True  # log the policy entropy every step (AGPO computes it regardless)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    agpo: AGPOConfig = field(default_factory=AGPOConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self):
        _positive("steps", self.steps)
        _positive("checkpoint_every", self.checkpoint_every, strict=False)
        _positive("keep_checkpoints", self.keep_checkpoints)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field annotation; build nested dataclasses from dicts."""
    if isinstance(annotation, str):
        raise TypeError(f"unresolved annotation for {key}")
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        return from_dict(annotation, value, prefix=f"{key}.")
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, arg)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(f"{key}: {value!r} does not fit {annotation} ({'; '.join(errors)})")
    if annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} must be a list, got {value!r}")
        return origin(value)
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    return value


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (nested) dict; unknown keys raise naming the key."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown config key {prefix}{unknown[0]!s}; known keys: {sorted(names)}")
    kwargs = {name: _coerce(prefix + name, value, hints[name]) for name, value in data.items()}
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` → (["a", "b"], YAML-parsed value)."""
    if "=" not in text:
        raise ValueError(f"override {text!r} must look like key=value (e.g. algo.estimator=ebpo)")
    key, raw = text.split("=", 1)
    if not key:
        raise ValueError(f"override {text!r} has an empty key")
    return key.split("."), yaml.safe_load(raw) if raw else ""


def merge_overrides(data: dict, overrides: typing.Iterable[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {text!r}: {part} is not a section")
        node[path[-1]] = value
    return data


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def read_yaml(name_or_path: str) -> dict:
    """A preset name (``tiny-cpu``) or a path to a YAML file."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = PRESET_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ValueError(f"unknown preset {name_or_path!r}; known: {preset_names()}")
    if not path.exists():
        raise ValueError(f"config file not found: {name_or_path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config {path} must hold a mapping at the top level")
    return data


def load_config(
    name_or_path: str | None = "tiny-cpu", overrides: typing.Iterable[str] = ()
) -> TrainConfig:
    data = read_yaml(name_or_path) if name_or_path else {}
    return from_dict(TrainConfig, merge_overrides(data, overrides))
