"""QLoRA at 8B on one GPU: measured memory and speed of real training steps beside `rlkit plan`.

For each of Qwen3-8B and Llama-3.1-8B (shapes from the configs shipped in rlkit/models/configs):

1. build the model with random weights on the device in bf16 and save it with a word-level
   tokenizer of the same vocabulary (no hub access needed);
2. load it through the real `Trainer` (`load_policy`: NF4 4-bit base, LoRA r = 16 on every
   projection, bf16 compute, gradient checkpointing), from that model's 8B preset with the
   shapes below;
3. run two real training steps: P = 2 prompts of exactly 512 tokens × G = 8 completions of up to
   1024 new tokens (a random model rarely samples EOS, so they run to the limit), old and
   reference log-probs, one optimizer step over the 16 rows in micro-batches;
4. record, per phase, the peak of `torch.cuda.max_memory_allocated` (generation, no-grad log-prob
   passes, the update), the generation tokens/s, log-prob and update seconds, the LoRA gradient
   norm of every projection at the second step's optimizer step (LoRA-B starts at 0, so LoRA-A
   gradients appear from the second step), and `rlkit plan`'s prediction for the same phases.

Rewards come from a fixed hash of each completion (about half score 1), so advantages are mixed
and every LoRA matrix gets a gradient; the text of a random model has no answer to verify.

    python benchmarks/gpu_qlora_8b.py --out runs/bench-qlora-8b            # GPU, both models
    python benchmarks/gpu_qlora_8b.py --tiny --device cpu --out /tmp/smoke # CI smoke test

Writes ``results.json`` and ``results.md`` to ``--out``. ``--tiny`` shrinks the models (hidden
64, 2 layers, vocabulary 512) and lengths (16 + 16 tokens) but runs the same code; on the CPU
the memory columns are empty (no CUDA allocator to read).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import hashlib
import json
import math
import platform
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlkit.config import load_config  # noqa: E402
from rlkit.plan import GIB, SHIPPED_CONFIGS, build_plan  # noqa: E402
from rlkit.rewards import RewardBatch  # noqa: E402
from rlkit.rollout import sampling_processors  # noqa: E402
from rlkit.sampling import PromptSampler  # noqa: E402
from rlkit.static_decode import static_generate  # noqa: E402
from rlkit.tasks.base import Problem  # noqa: E402
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


def log(name: str, message: str, start: float) -> None:
    """Progress with elapsed seconds, so a run cut off at its time limit shows where it was."""
    print(f"[{name} +{time.perf_counter() - start:.0f}s] {message}", flush=True)


def run_model(name: str, args, work_dir: Path) -> dict:
    cuda = args.device == "cuda"
    begin = time.perf_counter()
    prompt_tokens, new_tokens = (16, 16) if args.tiny else (512, 1024)
    new_tokens = args.new_tokens or new_tokens
    t0 = time.perf_counter()
    path = save_random_model(name, args.tiny, args.device, work_dir)
    build_s = time.perf_counter() - t0
    log(name, f"random model built and saved to {path}", begin)
    config = model_config(name, args.tiny)
    rows = args.prompts * args.group_size
    cfg = load_config(
        MODELS[name][1],
        [
            f"model.name_or_path={path}",
            f"model.device={args.device}",
            "task.name=arithmetic",  # replaced below by the fixed-length prompts
            "task.eval_name=null",
            "task.template=plain",  # the preset's dataset template has no effect on arithmetic
            "task.chat_template=false",
            "task.reward=exact_match",
            "task.reward_workers=0",
            f"rollout.num_prompts={args.prompts}",
            f"rollout.group_size={args.group_size}",
            f"rollout.max_new_tokens={new_tokens}",
            # vLLM batches its rollouts itself (rlkit.config.ignored_settings)
            "rollout.generation_batch_size="
            + str(0 if args.engine == "vllm" else args.generation_batch_size or rows),
            "rollout.truncated=keep",  # a random model's completions are all truncated
            f"rollout.engine={args.engine}",
            f"optim.mini_batch_size={rows}",
            f"optim.micro_batch_size={args.micro_batch_size}",
            f"optim.logprob_micro_batch_size={args.logprob_micro_batch_size}",
            f"optim.logprob_chunk_size={args.logprob_chunk_size}",
            "optim.lr=1e-4",
            "optim.warmup_steps=0",
            "loss.kl_coef=0.001",
            "eval.at_start=false",
            "steps=2",
            f"output_dir={work_dir / (name + '-run')}",
            "tensorboard=false",
            "progress=false",
            "checkpoint_every=0",
        ],
    )
    plan = build_plan(cfg, prompt_tokens)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    load_s = time.perf_counter() - t0
    log(name, "loaded in 4-bit through Trainer", begin)
    loaded = torch.cuda.memory_allocated() if cuda else None
    train_problems = problems(config, prompt_tokens)
    trainer.sampler = PromptSampler(train_problems, "shuffle", cfg.seed)
    trainer.collector.scorer = HashScorer()

    meter = PhaseMeter(cuda)
    trainer.phases.add_hook(meter)
    norms, model = [], trainer.policy.model
    trainer.update.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: norms.append(lora_grad_norms(model))
    )
    steps = []
    for _ in range(2):
        steps.append(trainer.step())
        log(name, f"training step {len(steps)} done", begin)
    resident = torch.cuda.memory_allocated() if cuda else None
    variants = {}
    if args.variant_tokens:
        texts = [p.prompt for p in train_problems[: args.prompts] for _ in range(args.group_size)]
        variants = generation_variants(trainer, texts, args.variant_tokens)
        log(name, f"generation variants: {variants}", begin)

    last = steps[-1]
    tokens = float(last["completions/mean_length"]) * rows
    settings = plan.settings()
    entropy = plan.passes.entropy
    chunk = settings["optim.logprob_chunk_size"]
    lora_bytes = plan.shape.lora_params * 4  # one fp32 copy of the adapter
    phases = {  # measured (None on the CPU), plan
        "weights + LoRA (after loading)": (loaded, plan.weights() + lora_bytes),
        # between steps the gradients are freed (set_to_none); AdamW's two moments stay
        "resident after two steps (+ AdamW)": (resident, plan.resident() - lora_bytes),
        f"generation ({settings['rollout.generation_batch_size']} rows)": (
            meter.peak("generation"),
            plan.generation(settings["rollout.generation_batch_size"]),
        ),
        f"log-prob pass ({settings['optim.logprob_micro_batch_size']} rows × {chunk})": (
            meter.peak("logprob"),
            plan.logprob(settings["optim.logprob_micro_batch_size"], chunk, entropy),
        ),
        f"train micro-batch ({settings['optim.micro_batch_size']} rows)": (
            meter.peak("update"),
            plan.train(settings["optim.micro_batch_size"], chunk),
        ),
    }
    final_norms = norms[-1]
    result = {
        "model": name,
        "engine": args.engine,
        "shape": {
            k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")
        },
        "prompt_tokens": prompt_tokens,
        "max_new_tokens": new_tokens,
        "rows": rows,
        "settings": settings,
        "build_and_save_s": build_s,
        "load_s": load_s,
        "generation_tokens_per_s": tokens / float(last["time/generate"]),
        "generation_s": float(last["time/generate"]),
        "mean_completion_tokens": float(last["completions/mean_length"]),
        "logprob_s": meter.seconds("logprob", 2),  # old + reference passes of the last step
        "update_s": meter.seconds("update", 1),
        "phases": {k: {"measured": m, "plan": p} for k, (m, p) in phases.items()},
        "lora_grad_norms": final_norms,
        "all_lora_b_nonzero": all(v > 0 for v in final_norms["lora_B"].values()),
        "all_lora_a_nonzero": all(v > 0 for v in final_norms["lora_A"].values()),
        "generation_variants": variants,
        "variant_new_tokens": args.variant_tokens,
        "loss": float(last["loss"]),
        "grad_norm": float(last["grad_norm"]),
        # sampler/trainer mismatch (rlkit.tis), logged when the engine is not HF generate
        "mismatch": {k: float(v) for k, v in last.items() if k.startswith("sampling/")},
    }
    shutil.rmtree(path, ignore_errors=True)
    return result


def size(value: float | None, unit: float) -> str:
    return "n/a" if value is None else f"{value / unit:.2f}"


def markdown(report: dict) -> str:
    lines = [
        f"# QLoRA 8B benchmark — {report['date']}, {report['device_name']}",
        "",
        f"torch {report['torch']}, transformers {report['transformers']}, "
        f"bitsandbytes {report['bitsandbytes']}{' (tiny shapes)' if report['tiny'] else ''}",
    ]
    unit, unit_name = (2**20, "MiB") if report["tiny"] else (GIB, "GiB")
    for name, failure in report.get("failures", {}).items():
        lines += ["", f"## {name}: failed", "", "```", failure.strip()[-3000:], "```"]
    for r in report["models"].values():
        lines += [
            "",
            f"## {r['model']} ({r['engine']} engine): {r['rows']} rows × ({r['prompt_tokens']} prompt + "
            f"{r['max_new_tokens']} new tokens)",
            "",
            f"| phase | measured peak {unit_name} | plan {unit_name} | plan / measured |",
            "|---|---|---|---|",
        ]
        for phase, v in r["phases"].items():
            ratio = f"{v['plan'] / v['measured']:.2f}" if v["measured"] else "n/a"
            measured, planned = size(v["measured"], unit), size(v["plan"], unit)
            lines.append(f"| {phase} | {measured} | {planned} | {ratio} |")
        lines += [
            "",
            f"generation {r['generation_tokens_per_s']:.0f} tokens/s ({r['generation_s']:.1f} s, "
            f"mean completion {r['mean_completion_tokens']:.0f} tokens); log-prob passes "
            f"{r['logprob_s']:.1f} s; update {r['update_s']:.1f} s; build + save "
            f"{r['build_and_save_s']:.0f} s, load {r['load_s']:.0f} s",
            "",
            "| LoRA grad norm | " + " | ".join(PROJECTIONS) + " |",
            "|---|" + "---|" * len(PROJECTIONS),
        ]
        for matrix, values in r["lora_grad_norms"].items():
            lines.append(
                f"| {matrix} | " + " | ".join(f"{values[p]:.3g}" for p in PROJECTIONS) + " |"
            )
        lines.append(f"\nevery LoRA-B gradient non-zero: {r['all_lora_b_nonzero']}")
        if r["generation_variants"]:
            lines += [
                "",
                f"HF `generate` options, {r['rows']} rows × {r['variant_new_tokens']} new tokens:",
                "",
                "| variant | tokens/s | × dynamic |",
                "|---|---|---|",
            ]
            base = r["generation_variants"].get("dynamic", {}).get("tokens_per_s")
            for variant, v in r["generation_variants"].items():
                if "error" in v:
                    lines.append(f"| {variant} | failed: {v['error']} | |")
                else:
                    ratio = f"{v['tokens_per_s'] / base:.2f}" if base else "n/a"
                    lines.append(f"| {variant} | {v['tokens_per_s']:.0f} | {ratio} |")
        for key, value in r.get("mismatch", {}).items():
            lines.append(f"\n{key}: {value:.3g}")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-qlora-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--engine", default="hf", choices=["hf", "hf_static", "vllm"], help="vllm: needs vLLM"
    )
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--generation-batch-size", type=int, default=0, help="0: all rows")
    parser.add_argument(
        "--new-tokens", type=int, default=0, help="completion tokens (0: 1024, 16 with --tiny)"
    )
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--logprob-micro-batch-size", type=int, default=8)
    parser.add_argument("--logprob-chunk-size", type=int, default=256)
    parser.add_argument(
        "--variant-tokens",
        type=int,
        default=None,
        help="new tokens per row for the generate-option comparison (0: skip; default 128, "
        "16 with --tiny)",
    )
    parser.add_argument("--work-dir", help="where the random models are saved (default: RAM disk)")
    return parser.parse_args(argv)


def default_work_dir() -> Path:
    """/dev/shm when it has room for a 16 GB checkpoint (fast save and load), else /tmp."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 40 * 10**9:
        return Path(tempfile.mkdtemp(dir=shm))
    return Path(tempfile.mkdtemp())


def main(argv=None) -> dict:
    import transformers

    args = parse_args(argv)
    if args.variant_tokens is None:
        args.variant_tokens = 16 if args.tiny else 128
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
        "models": {},
    }
    work_dir = Path(args.work_dir) if args.work_dir else default_work_dir()
    start = time.perf_counter()
    try:
        for name in args.models:
            try:
                report["models"][name] = run_model(name, args, work_dir)
            except Exception:  # record it and go on to the next model: device time is scarce
                report.setdefault("failures", {})[name] = traceback.format_exc()
                print(report["failures"][name], flush=True)
            gc.collect()  # the trainer and its 4-bit model go before the next model loads
            if cuda:
                torch.cuda.empty_cache()
            report["total_s"] = time.perf_counter() - start
            (out / "results.json").write_text(json.dumps(report, indent=2))
            (out / "results.md").write_text(markdown(report))
            print(markdown(report), flush=True)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    if report.get("failures"):
        raise SystemExit(f"failed: {', '.join(report['failures'])} (tracebacks in results.md)")
    return report


if __name__ == "__main__":
    main()
