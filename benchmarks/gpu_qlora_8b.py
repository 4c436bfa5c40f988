"""QLoRA at 8B on one GPU: engines, batch sizes and memory budgets measured side by side, beside
`rlkit plan`, in one device call.

For each model (default Qwen3-8B; shapes from the configs shipped in rlkit/models/configs):

1. build the model with random weights on the device in bf16 and save it with a word-level
   tokenizer of the same vocabulary (no hub access needed), once;
2. run each **arm** of :data:`ARMS`: load the model through the real `Trainer` (`load_policy`: NF4
   4-bit base, LoRA r = 16 on every projection, bf16 compute, gradient checkpointing) from the
   model's 8B preset with the arm's overrides, pass its **correctness gate** (below), and run
   real training steps: prompts of exactly 512 tokens × G = 8 completions of up to 1024 new
   tokens (a random model rarely samples EOS, so they run to the limit), old and reference
   log-probs, one optimizer step in micro-batches;
3. record per arm, per phase, the peak of `torch.cuda.max_memory_allocated` (generation, no-grad
   log-prob passes, the update) beside `rlkit plan`'s prediction, the step's seconds, generation
   tokens/s, log-prob and update seconds, the sampler/trainer mismatch (`rlkit.tis` metrics:
   every arm runs with ``loss.tis_cap=3``, so the plain HF path reports its mismatch too) and the
   LoRA gradient norm of every projection at the last optimizer step (LoRA-B starts at 0, so
   LoRA-A gradients appear from the second step);
4. print one table of every arm with its gate, its tokens/s and step time as ratios to the HF arm
   of the same rows and budget, and the issue-20 targets the arms measured.

**Correctness gate.** Before its steps, every arm decodes the first :data:`GATE_ROWS` prompts its
steps will draw, cut to their first :data:`GATE_PROMPT_TOKENS` tokens, for ``--gate-tokens`` new
tokens, through its own sampling path (its engine, generation copy, fused LoRA, compile option and
CUDA graph: the collector's), greedily and at T = 1, and the same through the ``hf`` engine (HF
``generate`` over the training weights), all with a random LoRA-B drawn for the gate (peft's
zeros would hide a wrong adapter path). It records each row's first token that differs from the
hf engine's greedy tokens, and the mean and max |sampler log-prob − trainer log-prob| of both
sampled batches. Rule: a row passes if its tokens equal hf's, or if they first differ at a
near-tie, where the trainer's log-probs put the hf token at most ``--tie-factor`` (4) times the
hf engine's own max |Δ log p| ahead of the arm's (two correct kernels flip a greedy argmax only
within their rounding, which that difference measures on this device and dtype). An arm with a
row that fails is **wrong**: it is recorded with its gate and not timed, and the script exits
non-zero at the end, as for a failed arm. The prompts are cut short because a random model
attends almost uniformly, so a wrong key moves a step by about 1/(keys attended): with tiny
shapes on the CPU, a KV cache written one column late flipped tokens at 512 prompt tokens only as
narrowly as a correct loop does (≤ 0.002 nats); at 16, 6 of 8 rows led by 0.012 to 0.023 nats,
over the tolerance of 0.0095 (benchmarks/README.md).

An arm is one line of :data:`ARMS` (or one ``--arm``): config overrides separated by spaces, plus
``rows=N`` (prompts × G, default 16), ``memory_gib=X`` (a smaller card simulated with
``torch.cuda.set_per_process_memory_fraction``; the batch sizes are the plan's for X GiB) and
``steps=N`` (default ``--steps``). ``rollout.generation_batch_size`` is ``auto`` (the plan's
largest for the arm's memory, balanced across calls) unless the arm sets it. An arm whose engine
cannot be imported (vLLM on the device machine) is skipped with the reason; an arm whose override
fails is recorded as failed and the next one runs.

**Time budget** (``--budget-s``): an arm starts only if its estimate (load + the gate's four
decodes + steps × (decode steps × seconds per decode step + rows × training seconds per row), from
:data:`PRIORS` until an earlier arm measured the engine) fits in the time left; an arm still
running at the deadline is stopped (SIGALRM), recorded as cut off, and the tables are written.
They are rewritten after every arm.

Rewards come from a fixed hash of each completion (about half score 1), so advantages are mixed
and every LoRA matrix gets a gradient; the text of a random model has no answer to verify.

    python benchmarks/gpu_qlora_8b.py --out runs/bench-qlora-8b --budget-s 420   # GPU
    python benchmarks/gpu_qlora_8b.py --tiny --device cpu --out /tmp/smoke       # CI smoke test
    python benchmarks/gpu_qlora_8b.py --arm "rows=128 rollout.engine=hf_static rollout.compile=true"

Writes ``results.json`` and ``results.md`` to ``--out``, and the same table as
``gpu_qlora_8b_<gpu>_<date>.md`` for benchmarks/results/. ``--tiny`` shrinks the models (hidden
64, 2 layers, vocabulary 512) and lengths (16 + 16 tokens) but runs the same code; on the CPU
the memory columns are empty (no CUDA allocator to read) and ``memory_gib`` only sizes the
batches.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import hashlib
import importlib.util
import json
import math
import platform
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from peft.tuners.lora import LoraLayer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlkit.config import load_config  # noqa: E402
from rlkit.plan import GIB, SHIPPED_CONFIGS, build_plan, resolve_batch_sizes  # noqa: E402
from rlkit.rewards import RewardBatch  # noqa: E402
from rlkit.rollout import generate_rollouts, sampling_processors  # noqa: E402
from rlkit.rollout_batch import RolloutBatch  # noqa: E402
from rlkit.sampling import PromptSampler  # noqa: E402
from rlkit.static_decode import static_generate  # noqa: E402
from rlkit.tasks.base import Problem  # noqa: E402
from rlkit.tis import DEFAULT_TIS_CAP, mismatch_metrics  # noqa: E402
from rlkit.trainer import Trainer  # noqa: E402

MODELS = {  # name -> (shipped config, preset whose settings it trains with)
    "qwen3-8b": ("qwen3-8b.json", "qwen3-8b-qlora"),
    "llama-3.1-8b": ("llama-3.1-8b.json", "llama3-8b-qlora"),
}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def model_config(name: str, tiny: bool):
    from transformers import AutoConfig

    values = json.loads((SHIPPED_CONFIGS / MODELS[name][0]).read_text())
    values.update(TINY if tiny else {})
    return AutoConfig.for_model(values.pop("model_type"), **values)


def word_tokenizer(config):
    """One word token per id ("w17"), with the config's BOS / EOS ids; id 0 is <unk>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = {0: "<unk>", config.bos_token_id: "<bos>", config.eos_token_id: "<eos>"}
    vocab = {specials.get(i, f"w{i}"): i for i in range(config.vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<eos>",
    )


def save_random_model(name: str, tiny: bool, device: str, work_dir: Path) -> Path:
    """Random bf16 weights of the model's shape, saved with its tokenizer."""
    from transformers import AutoModelForCausalLM

    config = model_config(name, tiny)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    path = work_dir / name
    model.save_pretrained(path)
    word_tokenizer(config).save_pretrained(path)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return path


def problems(config, prompt_tokens: int, count: int = 64) -> list[Problem]:
    """Prompts of exactly ``prompt_tokens`` word tokens (no special ids)."""
    rng = random.Random(0)
    special = {0, config.bos_token_id, config.eos_token_id}
    ids = [i for i in range(config.vocab_size) if i not in special]
    return [
        Problem(f"bench/{k}", " ".join(f"w{rng.choice(ids)}" for _ in range(prompt_tokens)), "0")
        for k in range(count)
    ]


class HashScorer:
    """Reward 1 for completions whose SHA-1 is even: fixed, mixed within groups."""

    def score(self, completions, answers) -> RewardBatch:
        rewards = [float(hashlib.sha1(c.encode()).digest()[0] % 2) for c in completions]
        return RewardBatch(torch.tensor(rewards), 0, 0)

    def close(self) -> None:
        pass


class PhaseMeter:
    """A ``Trainer.phases`` hook: seconds and (on CUDA) the peak allocated bytes of the phases in
    :attr:`ROWS`, under the row names of the results table.

    A phase entered while another measured phase runs (the update's no-grad finiteness check) is
    not measured: resetting CUDA's peak counter there would hide the outer phase's peak. (The
    first H200 run, 2026-11-30, had that defect in its update row.)
    """

    # trainer phase → row: the no-grad log-prob passes (π_old, reference, AGPO's step KL) are
    # one row; the optimizer loop is the update
    ROWS = {
        "generate": "generation",
        "old": "logprob",
        "reference": "logprob",
        "step_kl": "logprob",
        "train": "update",
    }

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.active = False
        self.records: dict[str, list[tuple[float, float | None]]] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        name = self.ROWS.get(phase)
        if name is None or self.active:
            yield
            return
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.active = True
        start = time.perf_counter()
        try:
            yield
        finally:
            self.active = False
        peak = None
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        self.records.setdefault(name, []).append((time.perf_counter() - start, peak))

    def peak(self, name: str) -> float | None:
        peaks = [p for _, p in self.records.get(name, []) if p is not None]
        return max(peaks) if peaks else None

    def seconds(self, name: str, last_step_calls: int) -> float:
        return sum(s for s, _ in self.records.get(name, [])[-last_step_calls:])


def lora_grad_norms(model) -> dict[str, dict[str, float]]:
    """‖grad‖ over all layers, per projection, for lora_A and lora_B."""
    sums = {m: {p: 0.0 for p in PROJECTIONS} for m in ("lora_A", "lora_B")}
    for name, param in model.named_parameters():
        for matrix in sums:
            if f".{matrix}." in name and param.grad is not None:
                proj = next(p for p in PROJECTIONS if f".{p}." in name)
                sums[matrix][proj] += float(param.grad.float().pow(2).sum())
    return {m: {p: math.sqrt(v) for p, v in d.items()} for m, d in sums.items()}


def generation_variants(trainer, prompt_texts: list[str], new_tokens: int) -> dict:
    """Tokens/s of one `generate` over the same rows under each HF option (issue 9, item 5).

    ``dynamic``: what rlkit runs today (HF's default dynamic KV cache, adapter unmerged);
    ``static``: ``cache_implementation="static"`` (no ``torch.compile``); ``no_adapter``: the
    same call with the LoRA adapter switched off, an upper bound for merging it; ``static_loop``:
    rlkit's own static-cache loop (``rollout.engine: hf_static``, a CUDA graph on CUDA). EOS is never
    sampled before ``new_tokens`` (``min_new_tokens``), so every variant generates the same count.
    Each variant is timed once, as a training step would call it: a static cache is allocated anew
    on every call (rlkit does not keep one between steps). The training steps before it warmed the
    CUDA kernels.
    """
    model, tokenizer = trainer.policy.model, trainer.policy.tokenizer
    device = next(model.parameters()).device
    encoded = tokenizer(prompt_texts, return_tensors="pt", padding=True, padding_side="left")
    encoded = encoded.to(device)
    options = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "pad_token_id": tokenizer.pad_token_id,
    }
    variants = {
        "dynamic": ({}, contextlib.nullcontext),
        "static": ({"cache_implementation": "static"}, contextlib.nullcontext),
        "no_adapter": ({}, model.disable_adapter),
        "static_loop": (None, contextlib.nullcontext),  # rollout.engine=hf_static's loop
    }
    results = {}
    model.eval()
    for name, (extra, context) in variants.items():
        try:
            with torch.no_grad(), context():
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                if extra is None:  # no EOS ids: every row decodes new_tokens, as min_new_tokens
                    rows = len(prompt_texts)
                    processors = sampling_processors(torch.ones(rows, device=device))
                    static_generate(
                        model,
                        encoded["input_ids"],
                        encoded["attention_mask"],
                        new_tokens,
                        [],
                        tokenizer.pad_token_id,
                        processors,
                    )
                else:
                    model.generate(**encoded, **options, **extra)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            results[name] = {
                "seconds": seconds,
                "tokens_per_s": len(prompt_texts) * new_tokens / seconds,
            }
        except Exception as error:  # a variant this transformers/bitsandbytes pair cannot run
            results[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
    model.train()
    return results


# One arm a line: overrides, plus rows= / memory_gib= / steps= (see the module docstring). In order
# of what the time budget should reach first: the graph path's 16-row step (target ≤ 25 s), the
# HF baseline beside it, the preset's 128 rows on the whole card and on 24 GiB, then HF's, then
# the graph path's levers one at a time (hf_static fuses the LoRA by default: rollout.fuse_lora).
ARMS = (
    "rows=16 rollout.engine=hf_static",
    "rows=16 rollout.engine=hf",
    "rows=16 rollout.engine=vllm",
    "rows=128 rollout.engine=hf_static",
    "rows=128 memory_gib=24 rollout.engine=hf_static",
    "rows=128 rollout.engine=hf",
    "rows=128 memory_gib=24 rollout.engine=hf",
    "rows=128 rollout.engine=hf_static rollout.generation_copy=dequantized",
    "rows=16 rollout.engine=hf_static rollout.fuse_lora=false",
    "rows=128 rollout.engine=hf_static rollout.compile=true",
    "rows=128 rollout.engine=hf_static optim.share_prompt_forward=false",
)
# Seconds an arm's estimate starts from until an earlier arm has measured them: per decode step of
# one generate call (H200, 8B NF4: HF 100.7 ms measured, benchmarks/results/gpu_qlora_8b_h200.md;
# the graph path's ≈30 ms at 128 rows estimated in issue 20's rollout-speed notes §2 (b)), per trained
# row at 512 + 1024 tokens (log-prob passes + update: 5.4 s for 16 rows measured), and per load.
PRIORS = {"decode_s": {"hf": 0.105, "hf_static": 0.03, "vllm": 0.03}, "row_s": 0.35, "load_s": 20}
TARGETS = (  # rows, memory_gib (None: the whole card), metric, at most (True) or least, bound
    (16, None, "step_s", True, 25.0),
    (128, None, "generation_tokens_per_s", False, 4000.0),
    (128, None, "step_s", True, 90.0),
    (128, 24.0, "step_s", True, 360.0),
)
TIS_CLIPPED_TARGET = 0.01  # TIS clips under 1 % of the tokens
CLIPPED = "sampling/importance_sampling_ratio/clipped_fraction"
DIFFERENCE = "sampling/sampling_logp_difference/mean"
DIFFERENCE_MAX = "sampling/sampling_logp_difference/max"


class OutOfTime(BaseException):
    """The benchmark's time budget ran out while an arm was running (a BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` in the trainer swallows it)."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise :class:`OutOfTime` in the main thread once ``seconds`` have passed (SIGALRM: the
    decode loops return to Python every step, so a running arm stops within one step)."""

    def expire(signum, frame):
        raise OutOfTime(f"the time budget ran out ({seconds:.0f} s left at the arm's start)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclasses.dataclass(frozen=True)
class Arm:
    """One line of :data:`ARMS`, parsed: its config overrides and the benchmark's own keys."""

    label: str
    overrides: tuple[str, ...]
    rows: int = 16
    memory_gib: float | None = None
    steps: int | None = None  # None: --steps

    @classmethod
    def parse(cls, line: str) -> Arm:
        own, overrides = {}, []
        for item in line.split():
            key, sep, value = item.partition("=")
            if not sep or not value:
                raise ValueError(f"arm {line!r}: {item!r} is not key=value")
            if key in ("rows", "steps"):
                own[key] = int(value)
            elif key == "memory_gib":
                own[key] = float(value)
            else:
                overrides.append(item)
        return cls(line, tuple(overrides), **own)

    @property
    def engine(self) -> str:
        engines = [o.split("=", 1)[1] for o in self.overrides if o.startswith("rollout.engine=")]
        return engines[-1] if engines else "hf"

    def unavailable(self) -> str | None:
        """Why this arm cannot run here (its engine's package is missing), or None."""
        if self.engine == "vllm" and importlib.util.find_spec("vllm") is None:
            return "vLLM is not importable here (pip install 'rlkit[vllm]')"
        return None


def log(name: str, message: str, start: float) -> None:
    """Progress with elapsed seconds, so a run cut off at its time limit shows where it was."""
    print(f"[{name} +{time.perf_counter() - start:.0f}s] {message}", flush=True)


def arm_config(name: str, arm: Arm, args, path: Path, work_dir: Path, prompt_tokens: int):
    """The arm's `TrainConfig` with its ``auto`` batch sizes resolved for its memory (the whole
    device, ``memory_gib``, or on the CPU without one: every row in one call), and the notes."""
    if arm.rows % args.group_size:
        raise ValueError(f"arm {arm.label!r}: rows={arm.rows} is not a multiple of G")
    new_tokens = args.new_tokens or (16 if args.tiny else 1024)
    base = [
        f"model.name_or_path={path}",
        f"model.device={args.device}",
        "task.name=arithmetic",  # replaced by the fixed-length prompts
        "task.eval_name=null",
        "task.template=plain",  # the preset's dataset template has no effect on arithmetic
        "task.chat_template=false",
        "task.reward=exact_match",
        "task.reward_workers=0",
        f"rollout.num_prompts={arm.rows // args.group_size}",
        f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={new_tokens}",
        # vLLM batches its rollouts itself (rlkit.config.ignored_settings)
        f"rollout.generation_batch_size={0 if arm.engine == 'vllm' else 'auto'}",
        "rollout.truncated=keep",  # a random model's completions are all truncated
        f"optim.mini_batch_size={arm.rows}",
        f"optim.micro_batch_size={args.micro_batch_size}",
        f"optim.logprob_micro_batch_size={args.logprob_micro_batch_size}",
        f"optim.logprob_chunk_size={args.logprob_chunk_size}",
        "optim.lr=1e-4",
        "optim.warmup_steps=0",
        "loss.kl_coef=0.001",
        f"loss.tis_cap={DEFAULT_TIS_CAP}",  # every engine reports its sampler/trainer mismatch
        "eval.at_start=false",
        f"steps={arm.steps or args.steps}",
        f"output_dir={tempfile.mkdtemp(dir=work_dir, prefix=name + '-run-')}",  # one per arm
        "tensorboard=false",
        "progress=false",
        "checkpoint_every=0",
    ]
    cfg = load_config(MODELS[name][1], [*base, *arm.overrides])
    budget = None
    if arm.memory_gib is not None:
        budget = arm.memory_gib * GIB
    elif args.device == "cuda":
        budget = torch.cuda.get_device_properties(0).total_memory
    return resolve_batch_sizes(cfg, budget, prompt_tokens)


@contextlib.contextmanager
def memory_budget(gib: float | None, cuda: bool):
    """Limit this process's CUDA allocations to ``gib`` (a smaller card); nothing on the CPU."""
    if gib is None or not cuda:
        yield
        return
    fraction = gib * GIB / torch.cuda.get_device_properties(0).total_memory
    if fraction > 1:
        raise ValueError(f"memory_gib={gib:g} is more than this device has")
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


# The correctness gate (module docstring): its prompts, their length, the new tokens it decodes,
# and its near-tie tolerance as a multiple of the hf engine's own sampler/trainer difference.
GATE_ROWS = 8
GATE_PROMPT_TOKENS = 16
GATE_TOKENS = 32
TIE_FACTOR = 4.0
GATE_SEED = 0  # the adapter it draws and the batches it samples


@contextlib.contextmanager
def live_adapter(model: torch.nn.Module):
    """Every LoRA-B matrix drawn at random while the gate runs, restored on exit.

    peft starts B at 0, where the adapter adds nothing, so a sampler that got the adapter wrong
    (the fused LoRA projections, say) would still match. Each B is drawn so that the adapter's
    update s·B·A has the spread of the random base weights (``initializer_range``): every
    projection's output moves by about as much again. Seeded: every arm gets the same adapter.
    """
    spread = model.config.initializer_range
    generator = torch.Generator().manual_seed(GATE_SEED)
    saved = []
    with torch.no_grad():
        for layer in model.modules():
            if not isinstance(layer, LoraLayer):
                continue
            for name, b in layer.lora_B.items():
                a_rms = float(layer.lora_A[name].weight.float().pow(2).mean().sqrt())
                std = spread / (layer.scaling[name] * math.sqrt(layer.r[name]) * a_rms)
                saved.append((b.weight, b.weight.clone()))
                b.weight.copy_(torch.randn(b.weight.shape, generator=generator) * std)
    try:
        yield
    finally:
        with torch.no_grad():
            for weight, value in saved:
                weight.copy_(value)


def gate_rollouts(
    trainer: Trainer, prompts: list[str], temperature: float, new_tokens: int, arm: bool
) -> RolloutBatch:
    """``prompts`` decoded at ``temperature`` (0: greedy) with the sampler's log-probs, seeded
    apart from the global RNG (the timed steps draw what they would have drawn without the gate).

    ``arm``: as the arm's steps decode them, by the collector's engine (vLLM's) or by
    `generate_rollouts` with the arm's engine and compile option over the collector's sampling
    weights (generation copy, fused LoRA); else by the reference, the ``hf`` engine over the
    training weights.
    """
    collector, rollout = trainer.collector, trainer.collector.cfg
    model, tokenizer = trainer.policy.model, trainer.policy.tokenizer
    temperatures = torch.full((len(prompts),), float(temperature))
    if arm and collector.engine is not None:  # it draws its per-row seeds from the global RNG
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(GATE_SEED)
            return collector.engine.generate(
                prompts, temperatures, new_tokens, rollout.top_p, rollout.top_k
            )
    options = {
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
        "generator_seed": GATE_SEED,
        "record_logprobs": True,
    }
    if not arm:
        return generate_rollouts(model, tokenizer, prompts, temperatures, new_tokens, **options)
    with trainer.full_weights(), collector.sampling_weights():
        return generate_rollouts(
            model,
            tokenizer,
            prompts,
            temperatures,
            new_tokens,
            engine=rollout.engine,
            compile_step=rollout.compile,
            **options,
        )


def trainer_logprobs(trainer: Trainer, rollouts: RolloutBatch) -> torch.Tensor:
    """The trainer's log-probs of the rollouts' tokens at T = 1: its π_old pass, [B, Lc]."""
    return trainer.forward.old(rollouts, torch.ones(len(rollouts)), False).logp


def logp_difference(trainer: Trainer, sampled: RolloutBatch) -> dict[str, float]:
    """Mean and max |sampler log-prob − trainer log-prob| over the sampled tokens."""
    metrics = mismatch_metrics(
        trainer_logprobs(trainer, sampled),
        sampled.sampler_logp,
        sampled.completion_mask,
        DEFAULT_TIS_CAP,
    )
    return {"mean": metrics[DIFFERENCE], "max": metrics[DIFFERENCE_MAX]}


def first_differences(
    reference: torch.Tensor, tokens: torch.Tensor, pad_id: int
) -> list[tuple[int, int]]:
    """(row, position) of the first token where each row of ``tokens`` leaves ``reference`` (the
    narrower of the two padded with ``pad_id``); rows that never leave it are not listed."""
    width = max(reference.shape[1], tokens.shape[1])
    reference, tokens = (
        torch.nn.functional.pad(t.cpu(), (0, width - t.shape[1]), value=pad_id)
        for t in (reference, tokens)
    )
    differ = reference != tokens
    rows = differ.any(dim=1).nonzero().flatten().tolist()
    return [(row, int(differ[row].int().argmax())) for row in rows]


def correctness_gate(
    trainer: Trainer, prompts: list[str], new_tokens: int, tie_factor: float
) -> dict:
    """The arm's greedy tokens against the ``hf`` engine's on ``prompts``, and the
    sampler/trainer log-prob difference of a batch each samples at T = 1, all under
    :func:`live_adapter`; passed: every row equal up to a near-tie (the module docstring).

    At a row's first differing token both sequences share the prefix, so the trainer's log-probs
    of the two sequences there score both tokens: the hf token's lead over the arm's. The arm
    chose its token, so its log-probs moved the two by at least that lead: a correct sampler
    does so only within its rounding. The hf engine's own difference from the trainer (the max
    over its sampled batch) measures that rounding on this device and dtype; the tolerance is
    ``tie_factor`` times it (2 for the two log-probs a lead compares, 2 again for a sampler
    that rounds more than HF generate: bf16 LoRA, the dequantized copy). After a flip the row is
    not compared further: its prefixes differ.
    """
    start = time.perf_counter()
    pad_id = trainer.policy.tokenizer.pad_token_id
    with live_adapter(trainer.policy.model):
        reference = gate_rollouts(trainer, prompts, 0.0, new_tokens, arm=False)
        tokens = gate_rollouts(trainer, prompts, 0.0, new_tokens, arm=True)
        reference_logp = trainer_logprobs(trainer, reference)
        tokens_logp = trainer_logprobs(trainer, tokens)
        hf_difference = logp_difference(
            trainer, gate_rollouts(trainer, prompts, 1.0, new_tokens, arm=False)
        )
        arm_difference = logp_difference(
            trainer, gate_rollouts(trainer, prompts, 1.0, new_tokens, arm=True)
        )
    tolerance = tie_factor * hf_difference["max"]
    differences = [
        {
            "row": row,
            "token": position,
            "hf_lead_nats": float(reference_logp[row, position] - tokens_logp[row, position]),
        }
        for row, position in first_differences(
            reference.completion_ids, tokens.completion_ids, pad_id
        )
    ]
    return {
        "passed": all(d["hf_lead_nats"] <= tolerance for d in differences),
        "rows": len(prompts),
        "new_tokens": new_tokens,
        "tolerance_nats": tolerance,
        "differences": differences,
        "logp_difference": arm_difference,
        "hf_logp_difference": hf_difference,
        "seconds": time.perf_counter() - start,
    }


def gate_verdict(gate: dict) -> str:
    """The gate's result in a few words (the table's gate column, a wrong arm's reason)."""
    differences, rows = gate["differences"], gate["rows"]
    if not differences:
        return f"equal ({rows} rows × {gate['new_tokens']} tokens)"
    worst = max(differences, key=lambda d: d["hf_lead_nats"])
    verdict = "near-ties" if gate["passed"] else "differs"
    return (
        f"{verdict} in {len(differences)}/{rows} rows: hf ahead by up to "
        f"{worst['hf_lead_nats']:.2g} nats (row {worst['row']}, token {worst['token']}; "
        f"tolerance {gate['tolerance_nats']:.2g})"
    )


def run_arm(name: str, arm: Arm, args, path: Path, work_dir: Path) -> dict:
    """Load the model with the arm's settings, run its correctness gate on the first prompts its
    steps will draw, then, if it passed, run its steps and measure them."""
    cuda = args.device == "cuda"
    begin = time.perf_counter()
    prompt_tokens = 16 if args.tiny else 512
    config = model_config(name, args.tiny)
    cfg, notes = arm_config(name, arm, args, path, work_dir, prompt_tokens)
    steps_wanted = cfg.steps
    plan = build_plan(cfg, prompt_tokens)
    rows = arm.rows
    trainer = None
    with memory_budget(arm.memory_gib, cuda):
        try:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            trainer = Trainer(cfg)
            load_s = time.perf_counter() - t0
            log(arm.label, f"{name} loaded in 4-bit through Trainer ({'; '.join(notes)})", begin)
            loaded = torch.cuda.memory_allocated() if cuda else None
            train_problems = problems(config, prompt_tokens)
            trainer.sampler = PromptSampler(train_problems, "shuffle", cfg.seed)
            # the gate's prompts: the first the steps will draw, cut short (module docstring)
            first = PromptSampler(train_problems, "shuffle", cfg.seed).next_batch(GATE_ROWS)
            prompts = [" ".join(p.prompt.split()[:GATE_PROMPT_TOKENS]) for p in first]
            gate = correctness_gate(trainer, prompts, args.gate_tokens, args.tie_factor)
            log(arm.label, f"gate in {gate['seconds']:.1f} s: {gate_verdict(gate)}", begin)
            if not gate["passed"]:
                return {"status": "wrong", "reason": gate_verdict(gate), "gate": gate}
            trainer.collector.scorer = HashScorer()
            meter = PhaseMeter(cuda)
            trainer.phases.add_hook(meter)
            norms, model = [], trainer.policy.model
            trainer.update.optimizer.register_step_pre_hook(
                lambda optimizer, a, kw: norms.append(lora_grad_norms(model))
            )
            steps, step_s = [], []
            for _ in range(steps_wanted):
                t0 = time.perf_counter()
                steps.append(trainer.step())
                step_s.append(time.perf_counter() - t0)
                log(arm.label, f"training step {len(steps)} done in {step_s[-1]:.1f} s", begin)
            resident = torch.cuda.memory_allocated() if cuda else None
            variants = {}
            if args.variant_tokens:
                texts = [p.prompt for p in train_problems[: cfg.rollout.num_prompts]]
                texts = [t for t in texts for _ in range(args.group_size)]
                variants = generation_variants(trainer, texts, args.variant_tokens)
                log(arm.label, f"generation variants: {variants}", begin)
        finally:
            if trainer is not None:
                trainer.close()
            shutil.rmtree(cfg.output_dir, ignore_errors=True)
    last = steps[-1]
    tokens = float(last["completions/mean_length"]) * rows
    settings = plan.settings()
    chunk = settings["optim.logprob_chunk_size"]
    lora_bytes = plan.shape.lora_params * 4  # one fp32 copy of the adapter
    phases = {  # measured (None on the CPU), plan
        "weights + LoRA (after loading)": (loaded, plan.weights() + lora_bytes),
        # between steps the gradients are freed (set_to_none); AdamW's two moments stay
        "resident after the steps (+ AdamW)": (resident, plan.resident() - lora_bytes),
        f"generation ({settings['rollout.generation_batch_size']} rows)": (
            meter.peak("generation"),
            plan.generation(settings["rollout.generation_batch_size"]),
        ),
        f"log-prob pass ({settings['optim.logprob_micro_batch_size']} rows × {chunk})": (
            meter.peak("logprob"),
            plan.logprob(settings["optim.logprob_micro_batch_size"], chunk, plan.passes.entropy),
        ),
        f"train micro-batch ({settings['optim.micro_batch_size']} rows)": (
            meter.peak("update"),
            plan.train(settings["optim.micro_batch_size"], chunk),
        ),
    }
    final_norms = norms[-1]
    return {
        "status": "done",
        "gate": gate,
        "model": name,
        "engine": arm.engine,
        "shape": {
            k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")
        },
        "prompt_tokens": prompt_tokens,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "rows": rows,
        "memory_gib": arm.memory_gib,
        "steps": steps_wanted,
        "settings": settings,
        "generate_calls": math.ceil(rows / settings["rollout.generation_batch_size"]),
        "load_s": load_s,
        "step_s": step_s[-1],
        "step_seconds": step_s,
        "generation_tokens_per_s": tokens / float(last["time/generate"]),
        "generation_s": float(last["time/generate"]),
        "mean_completion_tokens": float(last["completions/mean_length"]),
        "logprob_s": meter.seconds("logprob", 2),  # old + reference passes of the last step
        "update_s": meter.seconds("update", 1),
        "phases": {k: {"measured": m, "plan": p} for k, (m, p) in phases.items()},
        "lora_grad_norms": final_norms,
        "all_lora_b_nonzero": all(v > 0 for v in final_norms["lora_B"].values()),
        # LoRA-B starts at 0, so LoRA-A has a gradient from the second step on
        "all_lora_a_nonzero": (
            all(v > 0 for v in final_norms["lora_A"].values()) if steps_wanted > 1 else None
        ),
        "generation_variants": variants,
        "variant_new_tokens": args.variant_tokens,
        "loss": float(last["loss"]),
        "grad_norm": float(last["grad_norm"]),
        "mismatch": {k: float(v) for k, v in last.items() if k.startswith("sampling/")},
    }


class Estimator:
    """An arm's seconds before it runs: :data:`PRIORS`, replaced by what earlier arms measured
    (seconds per decode step of each engine, per trained row, per load). The gate decodes its
    tokens four times: greedy and sampled, on the hf engine and on the arm's."""

    def __init__(self, tiny: bool, gate_tokens: int):
        self.decode_s = dict(PRIORS["decode_s"])
        self.row_s, self.load_s = PRIORS["row_s"], PRIORS["load_s"]
        self.tokens = 16 if tiny else 1024
        self.gate_tokens = gate_tokens

    def seconds(self, arm: Arm, steps: int, tokens: int | None = None) -> float:
        decode = self.decode_s.get(arm.engine, max(self.decode_s.values()))
        gate = 2 * self.gate_tokens * (self.decode_s["hf"] + decode)
        per_step = (tokens or self.tokens) * decode + arm.rows * self.row_s
        return self.load_s + gate + steps * per_step

    def learn(self, result: dict) -> None:
        decode_steps = result["generate_calls"] * result["mean_completion_tokens"]
        if decode_steps > 0:
            self.decode_s[result["engine"]] = result["generation_s"] / decode_steps
        self.row_s = (result["logprob_s"] + result["update_s"]) / result["rows"]
        self.load_s = result["load_s"]


def size(value: float | None, unit: float) -> str:
    return "n/a" if value is None else f"{value / unit:.2f}"


def baseline(report: dict, entry: dict) -> dict | None:
    """The measured HF arm of the same model, rows and memory with no other overrides."""
    for other in report["arms"]:
        if (
            other["status"] == "done"
            and other["model"] == entry["model"]
            and other["overrides"] == ["rollout.engine=hf"]
            and (other["rows"], other["memory_gib"]) == (entry["rows"], entry["memory_gib"])
        ):
            return other
    return None


def ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}" if base else "n/a"


def gate_cells(entry: dict) -> str:
    """The gate's two table cells: its verdict, and the sampler/trainer abs Δ log p of the arm
    and of the hf engine (empty for an arm whose gate did not run)."""
    gate = entry.get("gate")
    if gate is None:
        return " | "
    arm, hf = gate["logp_difference"], gate["hf_logp_difference"]
    return (
        f"{gate_verdict(gate)} | {arm['mean']:.2g} / {arm['max']:.2g} "
        f"(hf {hf['mean']:.2g} / {hf['max']:.2g})"
    )


def summary(report: dict) -> list[str]:
    """One row per arm: its gate, what it measured and its ratios to the HF arm beside it."""
    lines = [
        "| model | arm | status | gate: greedy vs hf | gate: abs Δ log p, mean / max | "
        "rows / calls | step s | generation tokens/s | × hf | step × hf | log-prob s | "
        "update s | mean abs Δ log p | TIS clipped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["arms"]:
        head = f"| {entry['model']} | `{entry['arm']}`"
        if entry["status"] != "done":
            status = entry["status"]
            status = "wrong: not timed" if status == "wrong" else f"{status}: {entry['reason']}"
            lines.append(f"{head} | {status} | {gate_cells(entry)} |" + " |" * 9)
            continue
        base = baseline(report, entry)
        mismatch = entry["mismatch"]
        lines.append(
            f"{head} | done | {gate_cells(entry)} | {entry['rows']} / "
            f"{entry['generate_calls']} | {entry['step_s']:.1f} | "
            f"{entry['generation_tokens_per_s']:.0f} | "
            f"{ratio(entry['generation_tokens_per_s'], base and base['generation_tokens_per_s'])}"
            f" | {ratio(base['step_s'], entry['step_s']) if base else 'n/a'} | "
            f"{entry['logprob_s']:.1f} | {entry['update_s']:.1f} | "
            f"{mismatch.get(DIFFERENCE, float('nan')):.3g} | "
            f"{mismatch.get(CLIPPED, float('nan')):.2%} |"
        )
    return lines


def targets(report: dict) -> list[str]:
    """Issue 20's targets against the best arm of each shape that ran, and each arm's TIS
    clipping."""
    lines, done = [], [e for e in report["arms"] if e["status"] == "done"]
    for rows, gib, metric, at_most, bound in TARGETS:
        shape = f"{rows} rows" + (f" on {gib:g} GiB" if gib else "")
        what = f"{shape}: {metric} {'≤' if at_most else '≥'} {bound:g}"
        arms = [e for e in done if (e["rows"], e["memory_gib"]) == (rows, gib)]
        if not arms:
            lines.append(f"- {what}: not measured")
            continue
        best = (min if at_most else max)(arms, key=lambda e: e[metric])
        met = best[metric] <= bound if at_most else best[metric] >= bound
        lines.append(
            f"- {what}: {best[metric]:.1f} (`{best['arm']}`), {'met' if met else 'NOT met'}"
        )
    for e in done:
        if CLIPPED in e["mismatch"]:
            share, met = e["mismatch"][CLIPPED], e["mismatch"][CLIPPED] < TIS_CLIPPED_TARGET
            lines.append(
                f"- TIS clips < {TIS_CLIPPED_TARGET:.0%} of tokens, `{e['arm']}`: {share:.2%}, "
                f"{'met' if met else 'NOT met'}"
            )
    return lines


def gate_lines(gate: dict) -> list[str]:
    """An arm's gate in its section: the verdict, the log-prob differences, each differing row."""
    arm, hf = gate["logp_difference"], gate["hf_logp_difference"]
    lines = [
        "",
        f"Correctness gate ({gate['seconds']:.1f} s, live adapter): greedy tokens against the hf "
        f"engine's, {gate_verdict(gate)}. Sampler/trainer abs Δ log p over {gate['rows']} rows "
        f"sampled at T = 1: mean {arm['mean']:.3g}, max {arm['max']:.3g} (the hf engine's: "
        f"{hf['mean']:.3g}, {hf['max']:.3g}).",
    ]
    if gate["differences"]:
        lines += [
            "",
            "| row | first differing token | hf token ahead by, nats |",
            "|---|---|---|",
        ]
        for d in gate["differences"]:
            lines.append(f"| {d['row']} | {d['token']} | {d['hf_lead_nats']:.3g} |")
    return lines


def markdown(report: dict) -> str:
    lines = [
        f"# QLoRA 8B benchmark — {report['date']}, {report['device_name']}",
        "",
        f"torch {report['torch']}, transformers {report['transformers']}, "
        f"bitsandbytes {report['bitsandbytes']}{' (tiny shapes)' if report['tiny'] else ''}; "
        f"{report['total_s']:.0f} s of a {report['budget_s']:.0f} s budget",
        "",
        "Ratios are to the `rows=… rollout.engine=hf` arm of the same rows and memory, measured "
        "in this run (step × hf: the HF step's seconds over this arm's). Step s is the arm's "
        "last step: with one step it includes the first call's costs (CUDA graph capture, the "
        "allocator's growth).",
        "",
        *summary(report),
        "",
        "Targets (issue 20)" + (": tiny shapes, so not a test of them" if report["tiny"] else ":"),
        "",
        *targets(report),
    ]
    unit, unit_name = (2**20, "MiB") if report["tiny"] else (GIB, "GiB")
    for entry in report["arms"]:
        if entry["status"] == "failed":
            lines += ["", f"## `{entry['arm']}` ({entry['model']}): failed", "", "```"]
            lines += [entry["traceback"].strip()[-3000:], "```"]
        if entry["status"] == "wrong":
            lines += ["", f"## `{entry['arm']}` ({entry['model']}): wrong, not timed"]
            lines += gate_lines(entry["gate"])
        if entry["status"] != "done":
            continue
        lines += [
            "",
            f"## `{entry['arm']}` ({entry['model']}): {entry['rows']} rows × "
            f"({entry['prompt_tokens']} prompt + {entry['max_new_tokens']} new tokens)"
            + (f", {entry['memory_gib']:g} GiB budget" if entry["memory_gib"] else ""),
            *gate_lines(entry["gate"]),
            "",
            f"| phase | measured peak {unit_name} | plan {unit_name} | plan / measured |",
            "|---|---|---|---|",
        ]
        for phase, v in entry["phases"].items():
            measured, planned = size(v["measured"], unit), size(v["plan"], unit)
            lines.append(
                f"| {phase} | {measured} | {planned} | {ratio(v['plan'], v['measured'])} |"
            )
        seconds = ", ".join(f"{s:.1f}" for s in entry["step_seconds"])
        lines += [
            "",
            f"steps {seconds} s; generation {entry['generation_tokens_per_s']:.0f} tokens/s "
            f"({entry['generation_s']:.1f} s in {entry['generate_calls']} call(s), mean "
            f"completion {entry['mean_completion_tokens']:.0f} tokens); log-prob passes "
            f"{entry['logprob_s']:.1f} s; update {entry['update_s']:.1f} s; load "
            f"{entry['load_s']:.0f} s",
            "",
            "| LoRA grad norm | " + " | ".join(PROJECTIONS) + " |",
            "|---|" + "---|" * len(PROJECTIONS),
        ]
        for matrix, values in entry["lora_grad_norms"].items():
            lines.append(
                f"| {matrix} | " + " | ".join(f"{values[p]:.3g}" for p in PROJECTIONS) + " |"
            )
        lines.append(f"\nevery LoRA-B gradient non-zero: {entry['all_lora_b_nonzero']}")
        if entry["generation_variants"]:
            lines += [
                "",
                f"HF `generate` options, {entry['rows']} rows × {entry['variant_new_tokens']} "
                "new tokens:",
                "",
                "| variant | tokens/s | × dynamic |",
                "|---|---|---|",
            ]
            base = entry["generation_variants"].get("dynamic", {}).get("tokens_per_s")
            for variant, v in entry["generation_variants"].items():
                if "error" in v:
                    lines.append(f"| {variant} | failed: {v['error']} | |")
                else:
                    lines.append(
                        f"| {variant} | {v['tokens_per_s']:.0f} | {ratio(v['tokens_per_s'], base)} |"
                    )
        for key, value in entry["mismatch"].items():
            lines.append(f"\n{key}: {value:.3g}")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-qlora-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument("--models", nargs="+", default=["qwen3-8b"], choices=list(MODELS))
    parser.add_argument(
        "--arm",
        action="append",
        help="one arm, e.g. 'rows=128 memory_gib=24 rollout.engine=hf_static' (repeat it; "
        "replaces the default ARMS)",
    )
    parser.add_argument("--budget-s", type=float, default=420.0, help="seconds for all arms")
    parser.add_argument("--steps", type=int, default=1, help="training steps per arm")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument(
        "--new-tokens", type=int, default=0, help="completion tokens (0: 1024, 16 with --tiny)"
    )
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--logprob-micro-batch-size", type=int, default=16)
    parser.add_argument("--logprob-chunk-size", type=int, default=256)
    parser.add_argument(
        "--variant-tokens",
        type=int,
        default=None,
        help="new tokens per row for HF generate's options, compared on the first arm (0: skip; "
        "default 0, 16 with --tiny; about 50 s at 128 tokens on 8B)",
    )
    parser.add_argument(
        "--gate-tokens",
        type=int,
        default=GATE_TOKENS,
        help=f"new tokens of the correctness gate's {GATE_ROWS} rows (module docstring)",
    )
    parser.add_argument(
        "--tie-factor",
        type=float,
        default=TIE_FACTOR,
        help="the gate's near-tie tolerance, in multiples of the hf engine's largest "
        "sampler/trainer log-prob difference (module docstring)",
    )
    parser.add_argument("--work-dir", help="where the random models are saved (default: RAM disk)")
    return parser.parse_args(argv)


def default_work_dir() -> Path:
    """/dev/shm when it has room for a 16 GB checkpoint (fast save and load), else /tmp."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 40 * 10**9:
        return Path(tempfile.mkdtemp(dir=shm))
    return Path(tempfile.mkdtemp())


def dated_name(report: dict) -> str:
    """``gpu_qlora_8b_<device>_<date>``, the name its table takes in benchmarks/results/."""
    device = re.sub(r"[^a-z0-9]+", "_", report["device_name"].lower()).strip("_") or "cpu"
    return f"gpu_qlora_8b_{device}_{report['date'][:10]}"


def write(report: dict, out: Path, start: float) -> None:
    """results.json, results.md and the dated copy of the table, as the run stands."""
    report["total_s"] = time.perf_counter() - start
    table = markdown(report)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(table)
    (out / f"{dated_name(report)}.md").write_text(table)


def run_arms(report: dict, args, out: Path, work_dir: Path, start: float) -> None:
    """Every arm of every model within the budget, the tables rewritten after each."""
    cuda = args.device == "cuda"
    arms = [Arm.parse(line) for line in (args.arm or ARMS)]
    estimator = Estimator(args.tiny, args.gate_tokens)
    for name in args.models:
        path = None
        for arm in arms:
            entry = {"model": name, "arm": arm.label, "overrides": list(arm.overrides)}
            entry |= {"rows": arm.rows, "memory_gib": arm.memory_gib}
            left = args.budget_s - (time.perf_counter() - start)
            needed = estimator.seconds(arm, arm.steps or args.steps, args.new_tokens or None)
            reason = arm.unavailable()
            if reason is None and path is None:
                needed += PRIORS["load_s"]  # building and saving the random model first
            if reason is None and needed > left:
                reason = f"time budget: about {needed:.0f} s needed, {max(left, 0):.0f} s left"
            if reason is not None:
                report["arms"].append(entry | {"status": "skipped", "reason": reason})
                log(arm.label, f"skipped: {reason}", start)
                continue
            try:
                with deadline(left):
                    if path is None:
                        path = save_random_model(name, args.tiny, args.device, work_dir)
                        log(name, f"random model built and saved to {path}", start)
                    result = run_arm(name, arm, args, path, work_dir)
                entry |= result
                if result["status"] == "done":
                    estimator.learn(result)
                    args.variant_tokens = 0  # HF's generate options: on the first timed arm only
            except OutOfTime as error:
                entry |= {"status": "cut off", "reason": str(error)}
            except Exception as error:  # record it and go on: device time is scarce
                entry |= {"status": "failed", "reason": f"{type(error).__name__}: {error}"[:200]}
                entry["traceback"] = traceback.format_exc()
                print(entry["traceback"], flush=True)
            report["arms"].append(entry)
            write(report, out, start)
            if entry["status"] == "cut off":  # no more device calls: the table is what is left
                return
            gc.collect()  # the trainer and its 4-bit model go before the next arm loads
            if cuda:
                torch.cuda.empty_cache()
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def main(argv=None) -> dict:
    import transformers

    args = parse_args(argv)
    if args.variant_tokens is None:
        args.variant_tokens = 16 if args.tiny else 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import bitsandbytes

        bnb_version = bitsandbytes.__version__
    except ImportError:
        bnb_version = "missing"
    cuda = args.device == "cuda"
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device_name": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bitsandbytes": bnb_version,
        "tiny": args.tiny,
        "budget_s": args.budget_s,
        "arms": [],
    }
    work_dir = Path(args.work_dir) if args.work_dir else default_work_dir()
    start = time.perf_counter()
    try:
        run_arms(report, args, out, work_dir, start)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
        write(report, out, start)
        print(markdown(report), flush=True)
    failed = [e["arm"] for e in report["arms"] if e["status"] == "failed"]
    wrong = [e["arm"] for e in report["arms"] if e["status"] == "wrong"]
    errors = []
    if failed:
        errors.append(f"failed: {', '.join(failed)} (tracebacks in results.md)")
    if wrong:
        errors.append(f"wrong (failed the correctness gate): {', '.join(wrong)}")
    if errors:
        raise SystemExit("; ".join(errors))
    return report


if __name__ == "__main__":
    main()
