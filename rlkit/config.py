"""Configuration dataclasses, YAML presets and ``key=value`` overrides (TRL-style configs).

A run is described by one :class:`TrainConfig`. ``load_config(name_or_path, overrides)`` reads a
YAML preset (shipped in ``rlkit/configs``) or file, applies dotted overrides such as
``algo.estimator=ebpo rollout.group_size=4``, and validates everything before any work starts:
an unknown key or a bad value raises ``ValueError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlkit.advantages import ESTIMATORS
from rlkit.controllers import EMA_UPDATES, AdaptiveClip, AdaptiveTemperature
from rlkit.engines import engine_names, get_engine
from rlkit.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, loss_modes
from rlkit.models.gguf import GGUF_SUFFIX, gguf_path
from rlkit.models.spec import ModelSpec
from rlkit.paths import check_dir, check_link
from rlkit.stats import MAD_MEDIANS
from rlkit.tasks.arithmetic import arithmetic_task
from rlkit.tasks.registry import TASKS
from rlkit.tasks.word_problems import word_problem_task
from rlkit.tis import DEFAULT_TIS_TRIPWIRE, TIS_MODES, resolve_tis_cap

PRESET_DIR = Path(__file__).parent / "configs"
BUILTIN_MODEL = "builtin:tiny"
# A config or sweep spec is a few kilobytes; a larger file is a mistake (and would take PyYAML
# minutes to parse), so it is refused before parsing.
MAX_CONFIG_BYTES = 1 << 20


def _choice(key: str, value: Any, allowed: typing.Iterable) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{key} must be one of {allowed}, got {value!r}")


def expand_path(key: str, value: str) -> str:
    """``~`` and ``$VAR``/``${VAR}`` expanded, as a shell would (a literal ``~`` directory is
    never what was meant); an unset variable is a ValueError naming ``key``."""
    expanded = os.path.expandvars(os.path.expanduser(value))
    if "$" in expanded:
        raise ValueError(f"{key}={value!r} names an environment variable that is not set")
    return expanded


def _positive(key: str, value: float, strict: bool = True) -> None:
    if value < 0 or (strict and value == 0):
        raise ValueError(f"{key} must be {'> 0' if strict else '>= 0'}, got {value!r}")


def _auto_or_positive(key: str, value: int | str, strict: bool = True) -> None:
    """A batch size: ``auto`` (resolved from the device's memory at start) or a count."""
    if isinstance(value, str):
        _choice(key, value, ("auto",))
    else:
        _positive(key, value, strict)


@dataclass
class ModelConfig(ModelSpec):
    """The policy (see :class:`rlkit.models.spec.ModelSpec`). ``builtin:tiny`` is the tiny
    Llama the project warm-starts itself on the arithmetic task."""

    name_or_path: str = BUILTIN_MODEL
    mode: str = "full"

    def __post_init__(self):
        self.name_or_path = expand_path("model.name_or_path", self.name_or_path)
        super().__post_init__()


@dataclass
class TaskConfig:
    """Where prompts come from and how completions are scored.

    ``name``: a registered task (``arithmetic``, ``word_problems``, `rlkit.tasks.registry`), a
    math dataset short name (``gsm8k``, ``math500``, …) or a local ``.jsonl``/``.json``/``.parquet``
    path.
    """

    name: str = "arithmetic"
    eval_name: str | None = None  # defaults to the eval split of ``name``
    arithmetic: dict = field(default_factory=dict)  # ArithmeticTask fields, e.g. {"topics": [...]}
    word_problems: dict = field(default_factory=dict)  # WordProblemTask fields (name=word_problems)
    template: str = "plain"
    chat_template: bool = False  # render prompts with the tokenizer's chat template
    num_train: int = 2000
    num_eval: int = 200
    reward: str = "exact_match"
    reward_workers: int = 0  # 0: score in-process, where reward_timeout_s is not enforced
    reward_timeout_s: float = 10.0
    on_reward_error: str = "warn"
    # A mid-run change of the training prompts (notebook 09's difficulty shift): from step
    # ``shift.step`` on, training prompts come from the arithmetic task ``shift.arithmetic``
    # (ArithmeticTask fields, as task.arithmetic); evaluation keeps this task's eval set.
    shift: dict = field(default_factory=dict)

    def __post_init__(self):
        self.name = expand_path("task.name", self.name)
        if self.eval_name is not None:
            self.eval_name = expand_path("task.eval_name", self.eval_name)
        _choice("task.reward", self.reward, ("exact_match", "math_verify"))
        if self.arithmetic:
            if self.name != "arithmetic":
                raise ValueError("task.arithmetic only applies to task.name=arithmetic")
            arithmetic_task(self.arithmetic)  # unknown fields and bad values fail here
        if self.word_problems:
            if self.name != "word_problems":
                raise ValueError("task.word_problems only applies to task.name=word_problems")
            word_problem_task(self.word_problems)
        if self.shift:
            self._check_shift()
        _choice("task.on_reward_error", self.on_reward_error, ("warn", "raise"))
        _positive("task.num_train", self.num_train)
        _positive("task.num_eval", self.num_eval)
        _positive("task.reward_workers", self.reward_workers, strict=False)
        _positive("task.reward_timeout_s", self.reward_timeout_s)

    def _check_shift(self) -> None:
        if self.name != "arithmetic":
            raise ValueError("task.shift only applies to task.name=arithmetic")
        unknown = sorted(set(self.shift) - {"step", "arithmetic"})
        if unknown:
            raise ValueError(
                f"unknown config key task.shift.{unknown[0]}; known keys: ['arithmetic', 'step']"
            )
        step = self.shift.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise ValueError(f"task.shift.step must be an integer >= 1, got {step!r}")
        if not isinstance(self.shift.get("arithmetic"), dict):
            raise ValueError("task.shift.arithmetic must be a mapping of ArithmeticTask fields")
        arithmetic_task(self.shift["arithmetic"], "task.shift.arithmetic")


@dataclass
class AlgoConfig:
    """Advantage estimator (docs/algorithms.md §1–§2) and its options, e.g. ``{"prior": "batch"}`` for EBPO."""

    estimator: str = "grpo"
    options: dict = field(default_factory=dict)
    cluster_key: str | None = None  # "topic" | "difficulty": per-cluster EBPO priors

    def __post_init__(self):
        _choice("algo.estimator", self.estimator, sorted(ESTIMATORS))
        if self.cluster_key is not None:
            _choice("algo.cluster_key", self.cluster_key, ("topic", "difficulty"))


@dataclass
class PPOConfig:
    """PPO with a value head on the shared backbone and the KL penalty in the reward
    (``algo.estimator=ppo``; docs/algorithms.md §4c, where each default's source is given)."""

    gamma: float = 1.0  # GAE discount (TRL's PPOConfig, verl's algorithm.gamma)
    lam: float = 0.95  # GAE λ (TRL's PPOConfig; verl's algorithm.lam is 1.0)
    vf_coef: float = 0.1  # value-loss coefficient (TRL's PPOConfig)
    cliprange_value: float = 0.2  # value clipping c (TRL's PPOConfig)
    whiten_advantages: bool = True  # over the batch's real tokens (TRL)
    kl_coef: float = 0.05  # β of the per-token reward penalty −β·KL (TRL's PPOConfig)
    adaptive_kl: bool = False  # Ziegler et al.'s adaptive β (TRL's AdaptiveKLController)
    kl_target: float = 6.0  # its target KL (TRL's legacy PPOConfig ``target``)
    kl_horizon: int = 10000  # its horizon (TRL's legacy PPOConfig, verl's kl_ctrl.horizon)

    def __post_init__(self):
        for key in ("gamma", "lam"):
            value = getattr(self, key)
            if not 0 <= value <= 1:
                raise ValueError(f"ppo.{key} must be in [0, 1], got {value!r}")
        _positive("ppo.vf_coef", self.vf_coef)
        _positive("ppo.cliprange_value", self.cliprange_value)
        _positive("ppo.kl_coef", self.kl_coef, strict=False)
        _positive("ppo.kl_target", self.kl_target)
        _positive("ppo.kl_horizon", self.kl_horizon)


@dataclass
class DPOConfig:
    """DPO on the policy's own rollouts (``algo.estimator=dpo``; docs/algorithms.md §4d, where
    each default's source is given)."""

    beta: float = 0.1  # β of the preference loss (TRL's DPOConfig and OnlineDPOConfig)
    # online: pairs from each step's fresh rollouts; offline: pairs collected at the first step
    # from the starting policy over offline_batches batches of prompts (0: one per step, the
    # prompts and the generation an online run has), step k training on batch (k − 1) mod that
    mode: str = "online"
    offline_batches: int = 0

    def __post_init__(self):
        _positive("dpo.beta", self.beta)
        _choice("dpo.mode", self.mode, ("online", "offline"))
        _positive("dpo.offline_batches", self.offline_batches, strict=False)


@dataclass
class AGPOConfig:
    """AGPO controllers (docs/algorithms.md §3). Off by default; ``enabled=true`` turns on ATS and adaptive ε."""

    enabled: bool = False
    probe: str = "full"  # full | previous | reuse
    adaptive_temperature: bool = True
    adaptive_clip: bool = True
    dispersion: str = "std"
    # the MAD's median at even G: midpoint (scipy) | lower (the authors' torch.median), §1
    mad_median: str = "midpoint"
    # when Ū and H̄_ref are read and written within a step (§3 "Running averages"): per_prompt
    # (Ū prompt by prompt, the authors' commit 11e5596) | per_minibatch (one frozen copy of each,
    # updated once from the batch mean, their commit d6676b8)
    ema_update: str = "per_prompt"
    temperature: dict = field(default_factory=dict)  # AdaptiveTemperature kwargs
    clip: dict = field(default_factory=dict)  # AdaptiveClip kwargs

    def __post_init__(self):
        _choice("agpo.probe", self.probe, ("full", "previous", "reuse"))
        _choice("agpo.dispersion", self.dispersion, ("std", "mad", "iqr"))
        _choice("agpo.mad_median", self.mad_median, MAD_MEDIANS)
        _choice("agpo.ema_update", self.ema_update, EMA_UPDATES)


SAMPLING_STREAMS = ("rank", "prompt")  # rollout.sampling_stream


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
    order: str = (
        "shuffle"  # shuffle | topic | difficulty (docs/algorithms.md §2, clustered sampling)
    )
    dynamic_sampling: bool = False
    max_gen_batches: int = 3
    overlong_buffer: int = 0  # > 0 turns on DAPO overlong reward shaping
    overlong_penalty: float = 1.0
    # rows per generate call (bounds the KV cache); 0 = all P·G; auto = the largest that fits
    # the device, balanced across calls (rlkit.plan.resolve_batch_sizes)
    generation_batch_size: int | str = 0
    # hf | hf_static (static KV cache, CUDA graph on CUDA) | vllm (optional extra; LoRA / QLoRA)
    engine: str = "hf"
    # sample through fused LoRA (q/k/v and gate/up share x @ cat(A)ᵀ; rlkit.fused_lora):
    # auto = on with engine=hf_static and a LoRA/QLoRA model | true | false
    fuse_lora: bool | str = "auto"
    # torch.compile hf_static's decode step (CUDA only: on the CPU it decodes eagerly, saying so)
    compile: bool = False
    vllm_memory: float = 0.3  # fraction of the GPU vLLM may take (weights + KV cache)
    # none | dequantized: with model.mode=qlora, sample from the 4-bit base dequantized once to
    # the compute dtype, under the live (unmerged) LoRA (rlkit.generation_copy; costs the
    # linears in that dtype: 2 bytes a weight in bf16)
    generation_copy: str = "none"
    # train each step on the batch drawn this many steps earlier (asynchronous RL; rlkit.stale):
    # π_old is the sampling policy's, so a clip can bind at one mini-batch; 0 = on-policy batches
    lag: int = 0
    # the random stream sampling draws from (docs/scaling-out.md, "The same run on any number
    # of processes"): rank = each process's own global RNG, seeded per rank (the default: every
    # committed result, golden file and `rlkit reproduce` was drawn from it) | prompt = each
    # group from a stream keyed by (seed, step, the prompt's place in the global batch), each
    # group generated as a batch of its own, evaluation per problem: the samples do not depend
    # on the number of processes, and a run resumes at another world size
    sampling_stream: str = "rank"

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
        _auto_or_positive("rollout.generation_batch_size", self.generation_batch_size, strict=False)
        _choice("rollout.engine", self.engine, engine_names())
        if isinstance(self.fuse_lora, str):
            _choice("rollout.fuse_lora", self.fuse_lora, ("auto",))
        _choice("rollout.generation_copy", self.generation_copy, ("none", "dequantized"))
        _positive("rollout.lag", self.lag, strict=False)
        _choice("rollout.sampling_stream", self.sampling_stream, SAMPLING_STREAMS)
        if self.sampling_stream == "prompt" and get_engine(self.engine).batches_rows_itself:
            raise ValueError(
                "rollout.sampling_stream='prompt' with rollout.engine='vllm': vLLM schedules "
                "and batches the rows itself, so a group's tokens cannot be drawn from its own "
                "stream; use rollout.engine=hf or hf_static, or rollout.sampling_stream=rank"
            )
        if not 0 < self.vllm_memory < 1:
            raise ValueError(f"rollout.vllm_memory must be in (0, 1), got {self.vllm_memory!r}")
        if self.overlong_buffer > self.max_new_tokens:
            raise ValueError(
                f"rollout.overlong_buffer ({self.overlong_buffer}) must not exceed "
                f"rollout.max_new_tokens ({self.max_new_tokens})"
            )


@dataclass
class LossConfig:
    """Clipped surrogate, KL and aggregation (docs/algorithms.md §4)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    loss_agg: str = "token-mean"
    # leave the tokens (rows) of groups whose rewards are all equal out of the loss's normaliser
    # (TRL issue #6367; docs/algorithms.md §4, Aggregation); their loss still counts
    exclude_zero_var_from_norm: bool = False
    ratio_temperature: str | float = "sampling"  # "sampling" (default) or 1.0 (AGPO's code)
    # the policy loss (verl's policy_loss.loss_mode names): vanilla (the clipped surrogate) |
    # EntropyMech's clip_cov | kl_cov (docs/algorithms.md §4b) | gspo | cispo (§4f), and the
    # EntropyMech authors' 7B settings (Clip-Cov: ratio 2e-4, bounds 1 and 5; KL-Cov: k = 2e-3, coef 1)
    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-3
    ppo_kl_coef: float = 1.0
    # truncated importance sampling C (rlkit.tis): auto = 3 unless the sampler is the training
    # forward (rollout.engine=hf without rollout.generation_copy) | off | C > 0
    tis_cap: float | str = "auto"
    # how the weights use C (rlkit.tis.importance_weights; TRL 1.16's
    # vllm_importance_sampling_mode): token_truncate | token_mask | sequence_truncate | sequence_mask
    tis_mode: str = "token_truncate"
    # stop the run when a step's mean |sampler − trainer log-prob| exceeds this many nats
    # (rlkit.tis.check_divergence): auto = 0.5 wherever sampler log-probs are recorded | off | x > 0
    tis_tripwire: float | str = "auto"

    def __post_init__(self):
        _choice("loss.loss_mode", self.loss_mode, loss_modes())
        for key in ("clip_cov_ratio", "kl_cov_ratio"):
            value = getattr(self, key)
            if not 0 < value <= 1:
                raise ValueError(f"loss.{key} must be in (0, 1], got {value!r}")
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(
                f"loss.clip_cov_lb ({self.clip_cov_lb!r}) must be < loss.clip_cov_ub "
                f"({self.clip_cov_ub!r})"
            )
        _positive("loss.ppo_kl_coef", self.ppo_kl_coef, strict=False)
        _positive("loss.eps_low", self.eps_low, strict=False)
        if self.eps_low > 1 or (self.eps_low == 1 and self.loss_mode != "cispo"):
            raise ValueError(
                f"loss.eps_low must be < 1 (the ratio's lower clip is 1 - eps_low; 1, no lower "
                f"bound, with loss.loss_mode=cispo only), got {self.eps_low!r}"
            )
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
        _choice("loss.tis_mode", self.tis_mode, TIS_MODES)
        for key in ("tis_cap", "tis_tripwire"):
            value = getattr(self, key)
            if isinstance(value, str):
                _choice(f"loss.{key}", value, ("auto", "off"))
            else:
                _positive(f"loss.{key}", value)


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
    # Skip the passes the run does not need: the reference pass (and mode=full's frozen copy)
    # when kl_coef = 0, and π_old's pass when the update is on-policy (rlkit.pass_plan.PassPlan).
    # false runs every pass; the results are the same up to float rounding (tests/test_passes.py).
    skip_redundant_passes: bool = True
    # Every forward runs each distinct prompt once and lets its G completions attend to the
    # prompt's cached keys/values (rlkit.logprobs._completion_states; docs/algorithms.md §4), also
    # under gradient checkpointing; a split mini-batch's micro-batches take its rows in prompt order.
    # Same results as the plain forward up to float rounding. auto: on where the policy supports
    # it (rlkit.logprobs.prompt_sharing_refusal), else the plain forward with a note; true: on,
    # and a policy that cannot share is an error at start; false: the plain forward.
    share_prompt_forward: bool | str = "auto"

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
        share = self.share_prompt_forward
        if not (isinstance(share, bool) or share == "auto"):
            raise ValueError(
                f"optim.share_prompt_forward must be true, false or auto, got {share!r}"
            )


@dataclass
class EvalConfig:
    """Periodic evaluation: greedy accuracy, Pass@1 averaged over k samples, Maj@k."""

    every: int = 0  # steps; 0 = only at the start and the end
    num_problems: int = 200
    k: int = 4
    temperature: float = 1.0
    at_start: bool = True  # evaluate the starting policy (step 0)
    # rows per generate call (k samples of a problem stay together); auto: as for rollout's
    batch_size: int | str = 512

    def __post_init__(self):
        _positive("eval.every", self.every, strict=False)
        _positive("eval.num_problems", self.num_problems)
        _positive("eval.k", self.k)
        _positive("eval.temperature", self.temperature)
        _auto_or_positive("eval.batch_size", self.batch_size)


@dataclass
class ParallelConfig:
    """Data parallelism, when a launcher (``torchrun``, ``accelerate launch``) starts several
    processes (``rlkit.dist``, ``rlkit.parallel``); one process ignores it. ``strategy``:
    ``ddp`` replicates the trainable weights and sums gradients; ``fsdp2`` shards weights,
    gradients and optimizer state (``fully_shard``; not with model.mode=qlora)."""

    strategy: str = "ddp"  # ddp | fsdp2

    def __post_init__(self):
        _choice("parallel.strategy", self.strategy, ("ddp", "fsdp2"))


@dataclass
class TrainConfig:
    """One training run."""

    seed: int = 0
    steps: int = 60
    # stop once tokens/generated + tokens/probe reach this many (0: no budget; the step that
    # reaches it is the run's last, evaluated and checkpointed as the last of `steps` is)
    token_budget: int = 0
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
    ppo: PPOConfig = field(default_factory=PPOConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        self.output_dir = expand_path("output_dir", self.output_dir)
        if not 0 <= self.seed < 2**32:  # what numpy's global RNG accepts (seed_everything)
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        _positive("steps", self.steps)
        _positive("token_budget", self.token_budget, strict=False)
        _positive("checkpoint_every", self.checkpoint_every, strict=False)
        _positive("keep_checkpoints", self.keep_checkpoints)
        check_combination(self)
        shared = estimator_options(self)
        for name, key in ESTIMATORS[self.algo.estimator].shared_settings.items():
            explicit = self.algo.options.get(name, shared[name])
            if explicit != shared[name]:
                raise ValueError(
                    f"{key} ({shared[name]!r}) sets the {self.algo.estimator} advantage's {name}; "
                    f"algo.options.{name} ({explicit!r}) conflicts with it: set only {key}"
                )
        if self.rollout.lag and self.rollout.lag >= self.steps:
            raise ValueError(
                f"rollout.lag={self.rollout.lag} with steps={self.steps}: no batch would wait its "
                f"{self.rollout.lag} steps, every batch would be drawn at step 0 by the starting "
                "policy (offline RL, not the asynchronous RL rollout.lag models); set rollout.lag "
                "below steps"
            )
        if self.token_budget and self.rollout.lag:
            raise ValueError(
                f"token_budget={self.token_budget} with rollout.lag={self.rollout.lag}: the "
                "batches drawn ahead of the step the budget stops would be generated but never "
                "counted; set rollout.lag=0 or token_budget=0"
            )
        if self.task.shift and self.task.shift["step"] >= self.steps:
            raise ValueError(
                f"task.shift.step ({self.task.shift['step']}) must be below steps ({self.steps})"
            )
        if self.task.shift and self.rollout.order == "difficulty":
            raise ValueError(
                "task.shift with rollout.order=difficulty: the curriculum ranks the starting "
                "prompts only; use rollout.order=shuffle or topic"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def estimator_options(cfg: TrainConfig) -> dict:
    """``algo.estimator``'s options: ``algo.options``, and the options it shares with another
    section, read there (``shared_settings``: AGPO's advantage takes ``agpo.dispersion`` and
    ``agpo.mad_median``, one setting for the probe and the advantage, docs/algorithms.md §1)."""
    shared = ESTIMATORS[cfg.algo.estimator].shared_settings
    return cfg.algo.options | {
        name: getattr(getattr(cfg, section), field)
        for name, (section, field) in ((n, key.split(".")) for n, key in shared.items())
    }


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
        if not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number, got {value!r}")
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
    return key.split("."), _load_yaml(raw, f"override {text!r}") if raw else ""


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
    path = Path(expand_path("config", name_or_path))
    if not path.suffix and not path.exists():
        path = PRESET_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ValueError(f"unknown preset {name_or_path!r}; known: {preset_names()}")
    check_link("config", path)
    if not path.is_file():
        raise ValueError(f"config file not found: {name_or_path}")
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"config {path} is larger than {MAX_CONFIG_BYTES // 1024} KiB; a config is a few "
            "kilobytes of YAML (is this the right file?)"
        )
    try:
        text = raw.decode()
    except UnicodeDecodeError as err:
        raise ValueError(f"config {path} is not UTF-8 text: {err}") from None
    data = _load_yaml(text, f"config {path}")
    if data is None:
        raise ValueError(f"config {path} is empty")
    if not isinstance(data, dict):
        raise ValueError(f"config {path} must hold a mapping at the top level")
    return data


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (plain YAML keeps the last)
    and any alias (``*name``): aliases let a few hundred bytes expand into billions of nodes (the
    "billion laughs"), and a config has no need for them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"alias *{event.anchor}: YAML aliases are not accepted in a config (write the "
                "value out)",
                event.start_mark,
            )
        return super().compose_node(parent, index)


# YAML 1.2's booleans: true and false alone. PyYAML follows YAML 1.1, where on/off/yes/no are
# booleans too, so `loss.tis_cap=off` would reach the config as False instead of "off".
_BOOL = "tag:yaml.org,2002:bool"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str, source: str) -> Any:
    """Parse YAML safely; a syntax error, a duplicate key or an alias is a ValueError naming the
    line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ValueError(f"{source}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ValueError(f"{source}: invalid YAML{where}: {problem}") from None


def _check_finite(data: Any, key: str = "") -> None:
    """Every number in a (nested) config mapping is finite; NaN/inf is an error naming the key."""
    if isinstance(data, dict):
        for name, value in data.items():
            _check_finite(value, f"{key}.{name}" if key else str(name))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            _check_finite(value, f"{key}[{i}]")
    elif isinstance(data, float) and not math.isfinite(data):
        raise ValueError(f"{key} must be a finite number, got {data!r}")


def load_config(
    name_or_path: str | None = "tiny-cpu", overrides: typing.Iterable[str] = ()
) -> TrainConfig:
    """Read a preset or YAML file, apply ``key=value`` overrides, validate everything (values,
    combinations, paths) and return the config; any problem is a ValueError naming the key."""
    data = read_yaml(name_or_path) if name_or_path else {}
    data = merge_overrides(data, overrides)
    _check_finite(data)
    cfg = from_dict(TrainConfig, data)
    check_paths(cfg)
    return cfg


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
