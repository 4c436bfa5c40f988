"""The config schema: one dataclass per section of a run's :class:`TrainConfig`, each checking
its own fields' values when built (an unknown value raises ``ValueError`` naming the key).

Checks that span sections are :mod:`rlkit.config.checks`'; reading YAML and ``key=value``
overrides into these classes is :mod:`rlkit.config.loading`'s.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlkit.advantages import ESTIMATORS
from rlkit.controllers import EMA_UPDATES
from rlkit.engines import engine_names, get_engine
from rlkit.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, loss_modes
from rlkit.models.spec import ModelSpec
from rlkit.settings import When, differs, equals, positive
from rlkit.stats import MAD_MEDIANS
from rlkit.tasks.arithmetic import arithmetic_task
from rlkit.tasks.word_problems import word_problem_task
from rlkit.tis import TIS_MODES

BUILTIN_MODEL = "builtin:tiny"


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

    # fields read only under another setting (`rlkit.settings`): the adapter's and the 4-bit
    # base's
    read_when: ClassVar[dict[str, When]] = dict.fromkeys(
        ("lora_r", "lora_alpha", "lora_dropout", "target_modules"),
        equals("model.mode", "lora", "qlora"),
    ) | dict.fromkeys(("quant_type", "double_quant"), equals("model.mode", "qlora"))

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

    # fields read only under another setting (`rlkit.settings`): the built-in task has its own
    # prompts and eval split; in-process scoring enforces no timeout
    read_when: ClassVar[dict[str, When]] = dict.fromkeys(
        ("template", "eval_name"), differs("task.name", "arithmetic")
    ) | {"reward_timeout_s": positive("task.reward_workers")}

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
    """The method (``rlkit.methods``, docs/algorithms.md §1–§4), the advantage estimator
    (§1–§2) and its options, e.g. ``{"prior": "batch"}`` for EBPO. ``method`` is a registered
    method's name, checked when the config is loaded (`rlkit.config.aliases`, which also reads
    the older keys ``agpo.enabled=true`` and ``algo.estimator=ppo``/``dpo``)."""

    method: str = "grpo"  # grpo (the GRPO family: the estimator's advantages) | agpo | ppo | dpo
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
    (``algo.method=ppo``; docs/algorithms.md §4c, where each default's source is given)."""

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
    """DPO on the policy's own rollouts (``algo.method=dpo``; docs/algorithms.md §4d, where
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
    """AGPO's controllers (docs/algorithms.md §3), read with ``algo.method=agpo``: ATS and the
    adaptive ε."""

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

    # fields read only under another setting (`rlkit.settings`): DAPO's refills and its
    # overlong reward shaping
    read_when: ClassVar[dict[str, When]] = {
        "max_gen_batches": equals("rollout.dynamic_sampling", True),
        "overlong_penalty": positive("rollout.overlong_buffer"),
    }

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
