"""``rlkit plan``: the peak GPU memory of each phase of a training step, before loading anything.

The model is built from its ``config.json`` on the meta device (no weights, no download for the
shipped Qwen3-8B / Llama-3.1-8B configs in ``rlkit/models/configs``), and each phase's peak is
counted from the shapes, in bytes:

- **weights**: 4-bit linears (QLoRA: NF4 packs 2 weights a byte, plus one 8-bit absmax per block
  of 64 with double quantization, plus an fp32 scale per 256 blocks), everything else in the
  compute dtype (`load_policy` casts the frozen non-4-bit weights back to it);
- **generation copy** (``rollout.generation_copy=dequantized``, QLoRA): every 4-bit linear
  dequantized to the compute dtype, resident for the whole run (`rlkit.generation_copy`); the
  sampling phases then dequantize nothing;
- **LoRA + optimizer**: fp32 adapter matrices, their gradients and AdamW's two moments;
- **generation** (``rollout.generation_batch_size`` rows, or ``eval.batch_size`` for evaluation):
  the KV cache of prompt + completion tokens in the compute dtype, the prefill's MLP activations,
  three fp32 next-token score tensors (logits, processed scores, probabilities) and one
  dequantized linear weight;
- **log-prob pass** (``optim.logprob_micro_batch_size`` rows, ``optim.logprob_chunk_size``
  positions): the final hidden states and the larger of one layer's activations or one chunk's
  logits (compute-dtype head output, its fp32 copy and the logsumexp workspace; + the entropy's
  log-softmax and probabilities when entropy is computed);
- **train micro-batch** (``optim.micro_batch_size`` rows): with gradient checkpointing, every
  layer's input plus one layer's recomputed activations and their gradients (LoRA casts each
  projection's input to fp32), the final hidden states and their gradient, and one chunk's
  logits with their gradient.

With ``optim.share_prompt_forward`` (``auto``, the default, counts as on) the log-prob pass and
the train micro-batch also hold each row's copy of its prompt's keys and values in every layer
(the completion pass reads them, and under checkpointing the replay in backward reads them
again), counted as if no row shared its prompt's other tensors: a bound, since the pass falls
back to the plain forward when no prompt repeats in a micro-batch.

Every phase's peak is the resident weights + adapter + optimizer state plus the phase's own
tensors. With ``rollout.engine: vllm`` the training rollouts are vLLM's, inside the
``rollout.vllm_memory`` share of the GPU that the other phases must leave free. Prompt length is not in the config: ``prompt_tokens`` (default 512) is assumed. The
counts are an analytic model of what PyTorch allocates (``torch.cuda.max_memory_allocated``),
not of the CUDA context or allocator fragmentation; ``benchmarks/gpu_qlora_8b.py`` prints them
beside the measured peaks.

With ``world`` processes (``torchrun``, ``rlkit plan --nproc N``) every number is one process's:
its share of the prompts, mini-batch and evaluation (:func:`per_rank`); with
``parallel.strategy=fsdp2`` its shard of the gradients and optimizer state, while the weights
are counted whole (generation gathers them).
"""

from __future__ import annotations

import copy
import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from rlkit.config import BUILTIN_MODEL, TrainConfig
from rlkit.engines import get_engine
from rlkit.methods import build_method
from rlkit.models.gguf import gguf_path, is_gguf
from rlkit.pass_plan import PassPlan
from rlkit.tasks.loader import check_context

SHIPPED_CONFIGS = Path(__file__).parent / "models" / "configs"
SHIPPED = {
    "Qwen/Qwen3-8B": "qwen3-8b.json",
    "Qwen/Qwen3-8B-Base": "qwen3-8b.json",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b.json",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b.json",
}
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # packed weights + 8-bit absmax + fp32 scale / 256 blocks
FP4_PLAIN_BYTES = 0.5 + 4 / 64  # packed weights + fp32 absmax per block of 64
GIB = 1024**3
DEFAULT_PROMPT_TOKENS = 512
DEFAULT_HEADROOM = 0.1


@dataclass(frozen=True)
class ModelShape:
    """What the memory counts need from a model: sizes and parameter counts by kind."""

    layers: int
    hidden: int
    intermediate: int
    q_dim: int  # attention heads × head dim
    kv_dim: int  # key/value heads × head dim
    vocab: int
    linear_params: int  # the decoder's linear layers (4-bit under QLoRA)
    other_params: int  # embeddings, output head, norms
    lora_params: int  # adapter matrices at the config's rank and target modules
    largest_linear: int  # parameters of the largest decoder linear (one is dequantized at a time)


def engine_share(cfg: TrainConfig) -> float:
    """The share of the GPU the rollout engine keeps for itself (its declared ``gpu_share``
    setting, vLLM's ``rollout.vllm_memory``; 0: it shares training's memory)."""
    share = get_engine(cfg.rollout.engine).gpu_share
    return getattr(cfg.rollout, share) if share is not None else 0.0


def model_config(name_or_path: str):
    """A transformers config: a GGUF checkpoint's metadata, a local directory's ``config.json``,
    a shipped 8B config, or the hub's (cache) config."""
    from transformers import AutoConfig

    if name_or_path == BUILTIN_MODEL:
        raise ValueError("rlkit plan: builtin:tiny needs no plan (it trains on the CPU)")
    if is_gguf(name_or_path):  # the file's metadata (no weights are read)
        source = gguf_path(name_or_path)
        return AutoConfig.from_pretrained(str(source.parent), gguf_file=source.name)
    path = Path(name_or_path)
    if path.is_dir() or path.suffix == ".json":
        return AutoConfig.from_pretrained(str(path))
    if name_or_path in SHIPPED:
        return AutoConfig.from_pretrained(str(SHIPPED_CONFIGS / SHIPPED[name_or_path]))
    try:
        return AutoConfig.from_pretrained(name_or_path)
    except OSError as err:
        raise ValueError(
            f"rlkit plan: no config for model.name_or_path={name_or_path!r} (not a local "
            f"directory, not one of the shipped {sorted(SHIPPED)}, and not in the hub cache)"
        ) from err


def _targeted(name: str, targets: str | list[str]) -> bool:
    if targets == "all-linear":
        return True
    return any(name == t or name.endswith("." + t) or fnmatch.fnmatch(name, t) for t in targets)


def model_shape(config, lora_r: int, target_modules: str | list[str]) -> ModelShape:
    """Count parameters of a model built from ``config`` on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    linear_params = lora_params = largest = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            linear_params += module.weight.numel()
            largest = max(largest, module.weight.numel())
            if _targeted(name, target_modules):
                lora_params += lora_r * (module.in_features + module.out_features)
    total = sum(p.numel() for p in model.parameters())
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return ModelShape(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        q_dim=heads * head_dim,
        kv_dim=kv_heads * head_dim,
        vocab=config.vocab_size,
        linear_params=linear_params,
        other_params=total - linear_params,
        lora_params=lora_params,
        largest_linear=largest,
    )


@dataclass(frozen=True)
class Phase:
    name: str
    peak: float  # bytes: resident state + this phase's tensors
    knob: str  # the setting that bounds this phase


class MemoryPlan:
    """Per-phase peaks of ``cfg`` on a model of shape ``shape`` (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, shape: ModelShape, prompt_tokens: int, world: int = 1):
        if prompt_tokens < 1:
            raise ValueError(f"prompt_tokens (--prompt-tokens) must be >= 1, got {prompt_tokens}")
        self.cfg, self.shape, self.prompt_tokens = cfg, shape, prompt_tokens
        self.world = world  # processes; cfg is already one process's share (per_rank)
        self.passes = PassPlan.from_config(cfg, build_method(cfg))
        self.dtype_bytes = torch.empty((), dtype=cfg.model.dtype).element_size()

    # --------------------------------------------------------------- resident
    def weights(self) -> float:
        s, m, b = self.shape, self.cfg.model, self.dtype_bytes
        if m.mode == "qlora":
            per = NF4_BYTES if m.double_quant else FP4_PLAIN_BYTES
            return s.linear_params * per + s.other_params * b
        copies = 2 if m.mode == "full" else 1  # full: a frozen reference copy
        return copies * (s.linear_params + s.other_params) * b

    def generation_copy(self) -> float:
        """The dequantized linears of ``rollout.generation_copy=dequantized`` (0 without it)."""
        if self.cfg.model.mode != "qlora" or self.cfg.rollout.generation_copy == "none":
            return 0.0
        return self.shape.linear_params * self.dtype_bytes

    def trainable(self) -> float:
        """Trainable weights' gradients + AdamW moments (+ the fp32 adapter itself)."""
        s, m = self.shape, self.cfg.model
        shards = self.world if self.cfg.parallel.strategy == "fsdp2" else 1
        if m.mode == "full":
            return (s.linear_params + s.other_params) * 3 * self.dtype_bytes / shards
        return s.lora_params * 4 * 4 / shards  # weight, gradient, exp_avg, exp_avg_sq: fp32

    def resident(self) -> float:
        return self.weights() + self.generation_copy() + self.trainable()

    # ----------------------------------------------------------------- phases
    @property
    def completion_tokens(self) -> int:
        return self.cfg.rollout.max_new_tokens

    @property
    def rows(self) -> int:
        return self.cfg.rollout.num_prompts * self.cfg.rollout.group_size

    def _layer_activation_bytes(self) -> float:
        """One decoder layer's forward tensors per token (no grad): attention projections and
        the MLP's gate, up and their product, in the compute dtype."""
        s = self.shape
        return (2 * s.hidden + 2 * s.q_dim + 2 * s.kv_dim + 3 * s.intermediate) * self.dtype_bytes

    def kv_cache(self, rows: int, tokens: int) -> float:
        """Keys and values of every layer for ``rows`` × ``tokens`` positions."""
        return 2 * self.shape.layers * self.shape.kv_dim * self.dtype_bytes * rows * tokens

    def shared_prompt(self, rows: int) -> float:
        """The shared prompt forward's per-row copies of the prompt keys and values (0 when
        ``optim.share_prompt_forward`` is off; rlkit.logprobs._PromptCache). ``auto`` counts as
        on: the plan does not load the policy, and a policy that cannot share needs less."""
        if not self.passes.share_prompts:
            return 0.0
        return self.kv_cache(rows, self.prompt_tokens)

    def generation(self, rows: int) -> float:
        s, b = self.shape, self.dtype_bytes
        kv = self.kv_cache(rows, self.prompt_tokens + self.completion_tokens)
        prefill = rows * self.prompt_tokens * self._layer_activation_bytes()
        scores = 3 * rows * s.vocab * 4
        dequantizes = self.cfg.model.mode == "qlora" and not self.generation_copy()
        dequant = s.largest_linear * b if dequantizes else 0
        return self.resident() + kv + max(prefill, scores) + dequant

    def _head_chunk(self, rows: int, positions: int, entropy: bool, grad: bool) -> float:
        per = self.dtype_bytes + 4 + 4  # head output, fp32 copy, logsumexp workspace
        if entropy:
            per += 4 + 4  # log-softmax and probabilities
        if grad:
            per += 4 + self.dtype_bytes  # fp32 logits gradient and the head output's gradient
        return rows * positions * self.shape.vocab * per

    def _chunk(self) -> int:
        return self.cfg.optim.logprob_chunk_size or self.completion_tokens

    def logprob(self, rows: int, chunk: int, entropy: bool) -> float:
        s, b = self.shape, self.dtype_bytes
        tokens = self.prompt_tokens + self.completion_tokens
        hidden = rows * tokens * s.hidden * b
        layer = rows * tokens * self._layer_activation_bytes()
        dequant = s.largest_linear * b if self.cfg.model.mode == "qlora" else 0
        head = self._head_chunk(rows, min(chunk, self.completion_tokens), entropy, grad=False)
        return self.resident() + hidden + max(layer, head) + dequant + self.shared_prompt(rows)

    def train(self, rows: int, chunk: int) -> float:
        s, m, b = self.shape, self.cfg.model, self.dtype_bytes
        tokens = rows * (self.prompt_tokens + self.completion_tokens)
        saved_per_token = 2 * s.hidden * b + self._layer_activation_bytes()
        if m.mode != "full":  # peft casts each projection's input to the fp32 adapter
            saved_per_token += (5 * s.hidden + s.q_dim + s.intermediate) * 4
        if m.gradient_checkpointing:
            stored = s.layers * tokens * s.hidden * b + 2 * tokens * saved_per_token
        else:
            stored = s.layers * tokens * saved_per_token + tokens * saved_per_token
        final = 2 * tokens * s.hidden * b  # final hidden states and their gradient
        head = self._head_chunk(rows, min(chunk, self.completion_tokens), False, grad=True)
        dequant = s.largest_linear * b if m.mode == "qlora" else 0
        return self.resident() + stored + final + head + dequant + self.shared_prompt(rows)

    # ------------------------------------------------------------------ table
    def settings(self) -> dict[str, int]:
        """The chunk sizes the config runs with (0 knobs resolved to what the trainer does)."""
        cfg, opt = self.cfg, self.cfg.optim
        mini = opt.mini_batch_size or self.rows
        micro = opt.micro_batch_size or mini
        return {
            "rollout.generation_batch_size": cfg.rollout.generation_batch_size or self.rows,
            "eval.batch_size": cfg.eval.batch_size,
            "optim.logprob_micro_batch_size": opt.logprob_micro_batch_size or micro,
            "optim.logprob_chunk_size": self._chunk(),
            "optim.micro_batch_size": micro,
        }

    def phases(self) -> list[Phase]:
        cfg, k = self.cfg, self.settings()
        entropy = self.passes.entropy
        out = [Phase("weights", self.weights(), "model.mode")]
        if self.generation_copy():
            out.append(
                Phase(
                    "weights + dequantized generation copy",
                    self.weights() + self.generation_copy(),
                    "rollout.generation_copy",
                )
            )
        out.append(
            Phase(
                "LoRA + optimizer" if cfg.model.mode != "full" else "grads + optimizer",
                self.resident(),
                "model.lora_r",
            )
        )
        # an engine that batches its rows itself (vLLM) generates in its own share of the GPU
        if not get_engine(cfg.rollout.engine).batches_rows_itself:
            out.append(
                Phase(
                    f"generation ({k['rollout.generation_batch_size']} rows)",
                    self.generation(k["rollout.generation_batch_size"]),
                    "rollout.generation_batch_size",
                )
            )
        rows = min(
            k["eval.batch_size"], cfg.eval.num_problems * cfg.eval.k
        )  # the last step evaluates
        out += [
            Phase(f"eval generation ({rows} rows)", self.generation(rows), "eval.batch_size"),
            Phase(
                f"log-prob pass ({k['optim.logprob_micro_batch_size']} rows × "
                f"{k['optim.logprob_chunk_size']} positions)",
                self.logprob(
                    k["optim.logprob_micro_batch_size"], k["optim.logprob_chunk_size"], entropy
                ),
                "optim.logprob_micro_batch_size",
            ),
            Phase(
                f"train micro-batch ({k['optim.micro_batch_size']} rows"
                f"{', checkpointing' if cfg.model.gradient_checkpointing else ''})",
                self.train(k["optim.micro_batch_size"], k["optim.logprob_chunk_size"]),
                "optim.micro_batch_size",
            ),
        ]
        return out

    def usable(self, gpu_bytes: float, headroom: float) -> float:
        """Bytes the training process may use: ``headroom`` kept free, and with the vLLM engine
        its ``rollout.vllm_memory`` share of the GPU (vLLM's weights and KV cache). A headroom
        outside [0, 1), or one that leaves vLLM's share nothing, is a ValueError."""
        if not 0 <= headroom < 1:  # NaN fails too
            raise ValueError(f"headroom (--headroom) must be in [0, 1), got {headroom!r}")
        vllm = engine_share(self.cfg)
        if headroom + vllm >= 1:
            raise ValueError(
                f"headroom (--headroom) {headroom:g} plus rollout.vllm_memory={vllm:g} leaves "
                "no GPU memory for training: their sum must be below 1"
            )
        return gpu_bytes * (1 - headroom - vllm)

    def peak(self) -> float:
        return max(p.peak for p in self.phases())

    def largest_fitting(self, budget: float) -> dict[str, int]:
        """The largest value of each chunk knob whose phase fits in ``budget`` bytes (0: none
        fits), at the configured log-prob chunk size."""
        cfg, chunk = self.cfg, self._chunk()
        entropy = self.passes.entropy
        mini = cfg.optim.mini_batch_size or self.rows
        return {
            "rollout.generation_batch_size": _largest(
                self.rows, lambda n: self.generation(n), budget
            ),
            "eval.batch_size": _largest(
                cfg.eval.num_problems * cfg.eval.k, lambda n: self.generation(n), budget
            ),
            "optim.logprob_micro_batch_size": _largest(
                self.rows, lambda n: self.logprob(n, chunk, entropy), budget
            ),
            "optim.micro_batch_size": _largest(mini, lambda n: self.train(n, chunk), budget),
        }


def _largest(limit: int, peak, budget: float) -> int:
    """Largest n in [1, limit] with peak(n) <= budget (peaks grow with n), else 0."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if peak(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


AUTO_KNOBS = ("rollout.generation_batch_size", "eval.batch_size")


def balanced(rows: int, largest: int, unit: int = 1) -> tuple[int, int]:
    """(batch size, calls): the fewest calls of at most ``largest`` rows, as even as possible,
    in whole ``unit``s of rows (evaluation keeps a problem's k samples in one call)."""
    units, per_call = math.ceil(rows / unit), max(largest // unit, 1)
    calls = math.ceil(units / per_call)
    return math.ceil(units / calls) * unit, calls


def per_rank(cfg: TrainConfig, world: int) -> TrainConfig:
    """One of ``world`` processes' share of ``cfg``: its prompts and mini-batch rows (both
    divide by ``world``: ``rlkit.trainer.check_world``) and its (largest) share of evaluation."""
    if world == 1:
        return cfg
    out = copy.deepcopy(cfg)
    out.rollout.num_prompts //= world
    out.optim.mini_batch_size //= world
    out.eval.num_problems = -(-cfg.eval.num_problems // world)
    return out


def resolve_batch_sizes(
    cfg: TrainConfig,
    gpu_bytes: float | None,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    headroom: float = DEFAULT_HEADROOM,
    world: int = 1,
) -> tuple[TrainConfig, list[str]]:
    """``cfg`` with every ``auto`` batch size (``AUTO_KNOBS``) resolved, and one line per knob
    saying what it became and in how many calls.

    On a device of ``gpu_bytes``: the largest size whose generation phase fits the plan's budget
    (``headroom`` kept free, and vLLM's share), balanced across the calls it needs. Without one
    (``gpu_bytes`` None: the CPU, or a model the plan cannot shape): every row in one call, as
    ``0`` does for the rollouts; the CPU has no device memory to bound the KV cache by. With
    ``world`` processes, each process's rows are sized.
    """
    shares = per_rank(cfg, world)
    ro, ev = shares.rollout, shares.eval
    rows = {"rollout.generation_batch_size": ro.num_prompts * ro.group_size}
    rows["eval.batch_size"] = ev.num_problems * ev.k
    auto = [k for k in AUTO_KNOBS if _knob(cfg, k) == "auto"]
    if not auto:
        return cfg, []
    fitting = dict(rows)
    where = "no device memory limit: one call"
    if gpu_bytes is not None:
        concrete = _with_knobs(cfg, {k: 1 for k in auto})  # any size: the plan sizes each knob
        plan = build_plan(concrete, prompt_tokens, world)
        fitting = plan.largest_fitting(plan.usable(gpu_bytes, headroom))
        where = f"the largest that fits {gpu_bytes / GIB:.0f} GiB"
    resolved, notes = {}, []
    for knob in auto:
        if fitting[knob] == 0:
            raise ValueError(
                f"{knob}=auto: not even one row's generation fits {gpu_bytes / GIB:.1f} GiB "
                f"(`rlkit plan --gpu-mem {gpu_bytes / GIB:.0f}` lists every phase)"
            )
        size, calls = balanced(rows[knob], fitting[knob], ev.k if knob == "eval.batch_size" else 1)
        resolved[knob] = size
        notes.append(f"{knob}=auto -> {size} ({where}; {calls} call(s) for {rows[knob]} rows)")
    return _with_knobs(cfg, resolved), notes


def resolve_for_device(cfg: TrainConfig, world: int = 1) -> tuple[TrainConfig, list[str]]:
    """:func:`resolve_batch_sizes` against the memory of ``model.device`` (CUDA), or with no
    device limit (the CPU, and the built-in tiny model, which needs no plan), for one of
    ``world`` processes."""
    device = cfg.model.torch_device
    gpu_bytes = None
    if device.type == "cuda" and cfg.model.name_or_path != BUILTIN_MODEL:
        gpu_bytes = torch.cuda.get_device_properties(device).total_memory
    return resolve_batch_sizes(cfg, gpu_bytes, world=world)


def _knob(cfg: TrainConfig, knob: str):
    section, name = knob.split(".")
    return getattr(getattr(cfg, section), name)


def _with_knobs(cfg: TrainConfig, values: dict[str, int]) -> TrainConfig:
    """A copy of ``cfg`` with ``section.name`` knobs replaced (the original is left as is)."""
    out = copy.deepcopy(cfg)
    for knob, value in values.items():
        section, name = knob.split(".")
        setattr(getattr(out, section), name, value)
    return out


def build_plan(
    cfg: TrainConfig, prompt_tokens: int = DEFAULT_PROMPT_TOKENS, world: int = 1
) -> MemoryPlan:
    """The plan of ``cfg`` for one of ``world`` processes; an ``auto`` batch size still in it is
    planned as one call of every row (resolve it against a device first:
    :func:`resolve_batch_sizes`)."""
    cfg, _ = resolve_batch_sizes(cfg, None, prompt_tokens, world=world)
    config = model_config(cfg.model.name_or_path)
    context = getattr(config, "max_position_embeddings", None)
    check_context(cfg.rollout.max_new_tokens, context, cfg.model.name_or_path)
    shape = model_shape(config, cfg.model.lora_r, cfg.model.target_modules)
    return MemoryPlan(per_rank(cfg, world), shape, prompt_tokens, world)


def check_gpu_mem(gpu_mem_gib: float) -> None:
    if not (math.isfinite(gpu_mem_gib) and gpu_mem_gib > 0):
        raise ValueError(f"--gpu-mem must be a positive number of GiB, got {gpu_mem_gib!r}")


def format_plan(plan: MemoryPlan, gpu_mem_gib: float | None, headroom: float) -> str:
    """The per-phase table and, for a GPU size, the largest chunk sizes that fit it."""
    lines = [
        f"model {plan.cfg.model.name_or_path} ({plan.cfg.model.mode}, {plan.cfg.model.compute_dtype}),"
        f" {plan.prompt_tokens} prompt + {plan.completion_tokens} completion tokens assumed"
        + (
            f"; one of {plan.world} processes ({plan.cfg.parallel.strategy})"
            if plan.world > 1
            else ""
        ),
        f"{'phase':<48} {'peak GiB':>9}",
    ]
    lines += [f"{p.name:<48} {p.peak / GIB:>9.2f}" for p in plan.phases()]
    lines.append(f"{'peak':<48} {plan.peak() / GIB:>9.2f}")
    if gpu_mem_gib is not None:
        check_gpu_mem(gpu_mem_gib)
        budget = plan.usable(gpu_mem_gib * GIB, headroom)
        engine = get_engine(plan.cfg.rollout.engine)
        if engine.gpu_share is not None:
            lines.append(
                f"{engine.label} engine: {engine_share(plan.cfg):.0%} of the GPU is {engine.label}'s"
            )
        lines.append(
            f"largest settings that fit {gpu_mem_gib:g} GiB with {headroom:.0%} headroom "
            f"(log-prob chunk {plan.settings()['optim.logprob_chunk_size']} positions):"
        )
        current = plan.settings()
        for knob, value in plan.largest_fitting(budget).items():
            flag = "   <- lower it" if current[knob] > value else ""
            if current[knob] < value:
                flag = "   <- can be raised" + (" (or auto)" if knob in AUTO_KNOBS else "")
            lines.append(f"  {knob}={value}   (now {current[knob]}){flag}")
        if plan.cfg.model.mode == "qlora":
            lines.append(generation_copy_fit(plan, budget, gpu_mem_gib))
    return "\n".join(lines)


def generation_copy_fit(plan: MemoryPlan, budget: float, gpu_mem_gib: float) -> str:
    """Whether ``rollout.generation_copy=dequantized`` fits ``budget`` bytes (with the copy off:
    whether turning it on would), and whether ``model.mode=lora``, which dominates it wherever
    it fits (its sampler is the training forward; nothing dequantizes in training), does."""
    on = plan.cfg.rollout.generation_copy != "none"
    copy = plan if on else _variant(plan, {"rollout.generation_copy": "dequantized"})
    lora = _variant(plan, {"model.mode": "lora", "rollout.generation_copy": "none"})
    return (
        f"rollout.generation_copy=dequantized ({'on' if on else 'off'}; "
        f"+{copy.generation_copy() / GIB:.1f} GiB resident): {_fit(copy, budget, gpu_mem_gib)}\n"
        "model.mode=lora (better wherever it fits: its sampler is the training forward, no "
        f"dequantization in training): {_fit(lora, budget, gpu_mem_gib)}"
    )


def _variant(plan: MemoryPlan, values: dict) -> MemoryPlan:
    return MemoryPlan(_with_knobs(plan.cfg, values), plan.shape, plan.prompt_tokens, plan.world)


def _fit(plan: MemoryPlan, budget: float, gpu_mem_gib: float) -> str:
    """``plan`` against ``budget``: fits at its settings, with smaller batches (which), or not."""
    if plan.peak() <= budget:
        return f"fits {gpu_mem_gib:g} GiB at these settings"
    current, fitting = plan.settings(), plan.largest_fitting(budget)
    if plan.resident() <= budget and all(fitting.values()):
        lower = ", ".join(f"{k}={v}" for k, v in fitting.items() if v < current[k])
        return f"fits {gpu_mem_gib:g} GiB with {lower}"
    return f"does not fit {gpu_mem_gib:g} GiB"


def check_fits(plan: MemoryPlan, gpu_bytes: float, headroom: float = DEFAULT_HEADROOM) -> None:
    """Raise a ValueError naming the knob to turn when a phase does not fit ``gpu_bytes``."""
    budget = plan.usable(gpu_bytes, headroom)
    fitting = plan.largest_fitting(budget)
    engine = get_engine(plan.cfg.rollout.engine)
    vllm = (
        f", rollout.{engine.gpu_share}={engine_share(plan.cfg):g} for {engine.label}"
        if engine.gpu_share is not None
        else ""
    )
    for phase in plan.phases():
        if phase.peak <= budget:
            continue
        if fitting.get(phase.knob):
            hint = f"set {phase.knob}={fitting[phase.knob]}"
        elif phase.knob in fitting:  # even one row does not fit
            hint = f"{phase.knob}=1 does not fit either: lower optim.logprob_chunk_size or rollout.max_new_tokens"
        elif plan.generation_copy() and phase.knob != "model.mode":
            hint = (
                f"set rollout.generation_copy=none (its dequantized linears take "
                f"{plan.generation_copy() / GIB:.1f} GiB)"
            )
        else:
            hint = "use model.mode=qlora, a lower model.lora_r or a smaller model"
        raise ValueError(
            f"the {phase.name} phase needs about {phase.peak / GIB:.1f} GiB but only "
            f"{budget / GIB:.1f} of the GPU's {gpu_bytes / GIB:.1f} GiB are for training "
            f"({headroom:.0%} kept free{vllm}): {hint} "
            f"(`rlkit plan --gpu-mem {gpu_bytes / GIB:.0f}` lists every phase)"
        )
