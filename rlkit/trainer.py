"""The RLVR trainer: one loop for GRPO, Dr. GRPO, RLOO, EBPO and AGPO (docs/algorithms.md §1–§5).

One step, top to bottom (:meth:`Trainer.step`):

1. draw P prompts (shuffled / topic clusters / difficulty curriculum; DAPO dynamic sampling);
2. AGPO only: probe statistics (``full`` | ``previous`` | ``reuse``) → per-prompt τ_t;
3. sample G completions per prompt at its temperature and score them;
4. advantages from the registry estimator;
5. old / reference log-probs at each sequence's sampling temperature, pre-update entropy (AGPO,
   or when ``log_entropy``), each pass only when needed: no reference pass when β = 0, and π_old
   is the training forward itself when the update is on-policy (:meth:`Trainer.on_policy_update`);
6. AGPO only: per-prompt clip radius ε;
7. μ update epochs over mini-batches with gradient accumulation;
8. AGPO only: the step KL after the update feeds the clip controller;
9. metrics (docs/algorithms.md §5), periodic evaluation, atomic checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm.auto import tqdm

from rlkit.advantages import get_estimator
from rlkit.checkpoint import load_checkpoint, save_checkpoint
from rlkit.config import BUILTIN_MODEL, TrainConfig, inactive_clips, read_yaml
from rlkit.controllers import AdaptiveClip, AdaptiveTemperature, ProbeStats
from rlkit.dapo import informative_groups, overlong_penalty
from rlkit.evaluation import evaluate, sampled_pass_rates
from rlkit.losses import aggregate_loss, clipped_surrogate, kl_divergence, masked_mean
from rlkit.metrics import MetricsLogger
from rlkit.models.loading import (
    ModelSpec,
    Policy,
    eval_mode,
    load_policy,
    train_mode_changes_forward,
)
from rlkit.rewards import RewardScorer, get_reward_fn
from rlkit.rollout import (
    NonFiniteScoresError,
    RolloutBatch,
    concat_rollouts,
    generate_in_batches,
    sequence_logprobs,
)
from rlkit.rundir import (
    CONFIG,
    RunLock,
    check_fresh,
    check_resume_config,
    check_run_files,
    clear_run,
    confined,
    saved_config,
)
from rlkit.sampling import PromptSampler
from rlkit.tasks.base import Problem
from rlkit.tasks.chat import chat_problems
from rlkit.tasks.loader import (
    check_sizes,
    load_problems,
    shifted_train_problems,
    subset,
    warn_long_prompts,
)


class NonFiniteError(RuntimeError):
    """Raised after too many consecutive steps with a non-finite loss or gradient, when an
    optimizer step leaves the policy non-finite, or when sampling from the policy meets
    non-finite scores."""


@dataclass
class OldPolicy:
    """π_old on the batch: per-token log-probs at the ratio temperature and full-vocabulary entropy
    at T = 1, [B, Lc]. Both None when the update is on-policy: the training forward fills them."""

    logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


@dataclass
class Groups:
    """P prompts × G scored completions, rows laid out prompt-major (B = P·G)."""

    problems: list[Problem]
    rollouts: RolloutBatch
    rewards: torch.Tensor  # [P, G]
    temperatures: torch.Tensor  # [P] sampling temperature of each prompt's group
    probe_stats: ProbeStats | None = None  # AGPO: the statistics τ_t and ε were computed from
    reward_failures: int = 0  # rewards that raised or timed out

    @property
    def group_size(self) -> int:
        return self.rewards.shape[1]

    @property
    def answers(self) -> list[list[str]]:
        texts, g = self.rollouts.completion_texts, self.group_size
        return [texts[p * g : (p + 1) * g] for p in range(len(self.problems))]

    def select(self, keep: torch.Tensor) -> Groups:
        """The prompts where ``keep`` (bool [P]) is True."""
        rows = torch.nonzero(keep).flatten()
        seq = (rows[:, None] * self.group_size + torch.arange(self.group_size)).flatten()
        return Groups(
            [self.problems[i] for i in rows.tolist()],
            self.rollouts.select(seq),
            self.rewards[rows],
            self.temperatures[rows],
            None if self.probe_stats is None else self.probe_stats.select(rows),
            self.reward_failures,
        )

    @staticmethod
    def cat(parts: Sequence[Groups], pad_token_id: int) -> Groups:
        if len(parts) == 1:
            return parts[0]
        stats = [p.probe_stats for p in parts]
        return Groups(
            [q for p in parts for q in p.problems],
            concat_rollouts([p.rollouts for p in parts], pad_token_id),
            torch.cat([p.rewards for p in parts]),
            torch.cat([p.temperatures for p in parts]),
            None if stats[0] is None else ProbeStats.cat(stats),
            sum(p.reward_failures for p in parts),
        )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every RNG's state as tensors and plain values (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(key.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trained_model(run_dir: Path) -> str:
    """``name_or_path (mode)`` of the model a run directory's ``config.yaml`` names, for
    messages ("unknown" when the file does not say)."""
    try:
        model = read_yaml(str(confined(run_dir, run_dir / CONFIG)))["model"]
        return f"{model['name_or_path']} ({model.get('mode', 'full')})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "unknown"


def resolve_model_path(cfg: TrainConfig) -> str:
    """``builtin:tiny`` → the warm-started tiny policy shipped with rlkit (never rebuilt)."""
    if cfg.model.name_or_path != BUILTIN_MODEL:
        return cfg.model.name_or_path
    from rlkit.models.tiny import shipped_tiny_policy

    return str(shipped_tiny_policy())


def lr_factor(cfg: TrainConfig) -> Callable[[int], float]:
    """Linear warm-up over ``warmup_steps``, then constant or cosine decay to 0 at ``steps``."""
    warmup, total, schedule = cfg.optim.warmup_steps, cfg.steps, cfg.optim.schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "cosine":
            return 0.5 * (
                1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup)))
            )
        return 1.0

    return factor


def per_prompt_mean(values: torch.Tensor, mask: torch.Tensor, num_prompts: int) -> torch.Tensor:
    """Mean of a per-token quantity over the real tokens of each prompt's G completions."""
    mask = mask.to(values.dtype)
    return (values * mask).view(num_prompts, -1).sum(1) / mask.view(num_prompts, -1).sum(
        1
    ).clamp_min(1)


def summary(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {
        f"{prefix}/mean": values.mean(),
        f"{prefix}/min": values.min(),
        f"{prefix}/max": values.max(),
    }


class Trainer:
    """Trains ``cfg`` in ``cfg.output_dir`` (see :mod:`rlkit.rundir` for what a run directory
    promises). ``resume``: continue from the latest intact checkpoint, with the saved config;
    ``overwrite``: a fresh run may replace a previous run's files; ``read_only``: only to
    evaluate (the policy, or with ``resume`` the latest checkpoint), without locking or writing
    anything."""

    def __init__(
        self,
        cfg: TrainConfig,
        resume: bool = False,
        overwrite: bool = False,
        read_only: bool = False,
    ):
        self.cfg = cfg
        self.run_dir = Path(cfg.output_dir)
        self.read_only = read_only
        self.lock = None if read_only else RunLock(self.run_dir)
        try:
            self.setup(resume, overwrite)
        except BaseException:
            self.close()
            raise

    def setup(self, resume: bool, overwrite: bool) -> None:
        cfg = self.cfg
        if resume:
            check_run_files(self.run_dir)
        checkpoint = load_checkpoint(self.run_dir) if resume else None
        if resume and checkpoint is None:
            raise ValueError(f"resume: no checkpoint in {self.run_dir / 'checkpoints'}")
        if resume and not self.read_only:
            check_resume_config(saved_config(self.run_dir), cfg)
        if not resume and not self.read_only:
            check_fresh(self.run_dir, overwrite)
        self.run_id = checkpoint.run_id if checkpoint else uuid.uuid4().hex
        seed_everything(cfg.seed)

        self.train_problems, eval_problems = load_problems(cfg.task)
        # from step task.shift.step on, training draws these (shift_task)
        self.shift_problems = shifted_train_problems(cfg.task) if cfg.task.shift else None
        if self.read_only:  # evaluation only: the training sets do not matter
            check_sizes(cfg, eval_problems)
        elif not resume:  # a resumed run keeps the config it started with (check_resume_config)
            check_sizes(cfg, eval_problems, self.train_problems, self.shift_problems)
        # a seeded sample, not a prefix: the splits are ordered cell by cell (topic, difficulty)
        self.eval_problems = subset(eval_problems, cfg.eval.num_problems)
        spec = {name: getattr(cfg.model, name) for name in ModelSpec.__dataclass_fields__}
        spec["name_or_path"] = resolve_model_path(cfg)
        skip = cfg.optim.skip_redundant_passes
        self.uses_reference = cfg.loss.kl_coef > 0 or not skip
        self.policy: Policy = load_policy(ModelSpec(**spec), keep_reference=self.uses_reference)
        self.mode_free_forward = skip and not train_mode_changes_forward(self.policy.model)
        self.pad_id = self.policy.tokenizer.pad_token_id
        self.engine = None
        if cfg.rollout.engine == "vllm":
            from rlkit.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(self.policy, cfg.rollout.vllm_memory, cfg.seed)
        if cfg.task.chat_template:
            self.train_problems = chat_problems(self.train_problems, self.policy.tokenizer)
            self.eval_problems = chat_problems(self.eval_problems, self.policy.tokenizer)
        if clips := inactive_clips(cfg):
            warnings.warn(
                f"{', '.join(clips)} cannot act: one update epoch over one mini-batch updates "
                "only at π_θ = π_old, where the ratio is 1 and no clip binds; set "
                "optim.mini_batch_size below the batch's rows or optim.update_epochs above 1 "
                "(docs/algorithms.md §4)",
                stacklevel=2,
            )
        warn_long_prompts(
            self.train_problems + self.eval_problems,
            self.policy.tokenizer,
            getattr(self.policy.model.config, "max_position_embeddings", None),
            cfg.rollout.max_new_tokens,
        )
        self.scorer = RewardScorer(
            get_reward_fn(cfg.task.reward),
            num_workers=cfg.task.reward_workers,
            timeout_s=cfg.task.reward_timeout_s,
            on_error=cfg.task.on_reward_error,
        )
        options = dict(cfg.algo.options)
        if cfg.algo.estimator == "agpo":  # one setting for the probe and the advantage
            options["dispersion"] = cfg.agpo.dispersion
        self.estimator = get_estimator(cfg.algo.estimator, **options)
        self.cluster_index: dict[str, int] = {}
        self.temperature_ctl = self.clip_ctl = None
        if cfg.agpo.enabled:
            self.temperature_ctl = AdaptiveTemperature(
                tau_base=cfg.rollout.temperature, **cfg.agpo.temperature
            )
            self.clip_ctl = AdaptiveClip(**cfg.agpo.clip)
        self.previous_stats: dict[str, ProbeStats] = {}  # probe "previous": problem id → stats

        self.optimizer = torch.optim.AdamW(
            self.policy.trainable_parameters(),
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(cfg))
        self.step_count = 0
        self.score_time = 0.0
        self.counters = {
            "tokens_generated": 0,
            "tokens_probe": 0,
            "nonfinite_skips": 0,
            "consecutive_skips": 0,
        }

        state = checkpoint.state if checkpoint else None
        pass_rates = None
        if cfg.rollout.order == "difficulty":
            pass_rates = state["curriculum_pass_rates"] if state else self.starting_pass_rates()
        self.curriculum_pass_rates = pass_rates
        self.sampler = PromptSampler(self.train_problems, cfg.rollout.order, cfg.seed, pass_rates)
        self.shifted = False
        if state and cfg.task.shift and state["step"] > cfg.task.shift["step"]:
            # the checkpoint's sampler state belongs to the shifted prompts; one saved at the
            # shift step itself was written before step() shifted, so it holds the original's
            self.shift_task()
        if state:
            self.load_state(checkpoint.path, state)
        self.logger = None
        if self.read_only:
            return
        if not state:
            clear_run(self.run_dir)
        config_tmp = self.run_dir / f".{CONFIG}.tmp"
        config_tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        config_tmp.replace(self.run_dir / CONFIG)
        self.logger = MetricsLogger(
            self.run_dir, cfg.tensorboard, self.step_count if state else None
        )

    def shift_task(self) -> None:
        """From now on draw training prompts from ``task.shift.arithmetic`` (notebook 08's
        difficulty shift), in a fresh order under the run's seed."""
        problems = self.shift_problems
        if self.cfg.task.chat_template:
            problems = chat_problems(problems, self.policy.tokenizer)
        self.train_problems = problems
        self.sampler = PromptSampler(problems, self.cfg.rollout.order, self.cfg.seed)
        self.shifted = True

    def starting_pass_rates(self) -> torch.Tensor:
        """The curriculum's ranking: the starting policy's pass rate over k samples at T = 1."""
        with self.finite_sampling():
            return sampled_pass_rates(
                self.policy.model,
                self.policy.tokenizer,
                self.train_problems,
                self.scorer,
                k=self.cfg.eval.k,
                max_new_tokens=self.cfg.rollout.max_new_tokens,
                batch_size=self.cfg.eval.batch_size,
            )

    @contextlib.contextmanager
    def finite_sampling(self):
        """Turn sampling's non-finite scores (a broken policy: finite but huge weights can pass
        the update's one-row check, :meth:`check_finite_policy`) into a NonFiniteError naming
        the step, raised before anything of this step is logged or saved."""
        try:
            yield
        except NonFiniteScoresError as err:
            done = self.step_count
            raise NonFiniteError(
                f"sampling after step {done} met {err}: "
                + (
                    "the starting policy is non-finite"
                    if done == 0
                    else "an optimizer step left the policy non-finite; lower optim.lr "
                    f"(now {self.cfg.optim.lr:g}). The run's checkpoints are kept."
                )
            ) from None

    # ------------------------------------------------------------------ rollouts
    def sample_groups(
        self, problems: list[Problem], temperatures: torch.Tensor, stats: ProbeStats | None = None
    ) -> Groups:
        """G completions per problem at its temperature, scored (docs/algorithms.md §3 step 3)."""
        ro, g = self.cfg.rollout, self.cfg.rollout.group_size
        prompts, temps = (
            [p.prompt for p in problems for _ in range(g)],
            temperatures.repeat_interleave(g),
        )
        if self.engine is not None:
            rollouts = self.engine.generate(prompts, temps, ro.max_new_tokens, ro.top_p, ro.top_k)
        else:
            with self.finite_sampling():
                rollouts = generate_in_batches(
                    self.policy.model,
                    self.policy.tokenizer,
                    prompts,
                    temps,
                    ro.max_new_tokens,
                    ro.generation_batch_size or None,
                    top_p=ro.top_p,
                    top_k=ro.top_k,
                )
        t0 = time.perf_counter()
        scored = self.scorer.score(
            rollouts.completion_texts, [p.answer for p in problems for _ in range(g)]
        )
        self.score_time += time.perf_counter() - t0
        rewards = scored.rewards.clone()
        lengths, truncated = rollouts.lengths.cpu(), rollouts.truncated.cpu()
        if ro.truncated == "zero_reward":
            rewards[truncated] = 0.0
        elif ro.truncated == "mask":
            rollouts.completion_mask[truncated.to(rollouts.completion_mask.device)] = False
        if ro.overlong_buffer > 0:
            rewards += overlong_penalty(
                lengths, ro.max_new_tokens, ro.overlong_buffer, ro.overlong_penalty
            )
        return Groups(
            problems,
            rollouts,
            rewards.view(len(problems), g),
            temperatures.float(),
            stats,
            scored.num_errors + scored.num_timeouts,
        )

    def probe(self, problems: list[Problem]) -> tuple[ProbeStats, Groups | None]:
        """Per-prompt probe statistics (docs/algorithms.md §3 step 1).

        ``full``/``reuse``: sample a probe group at τ_base. ``previous``: the statistics of the
        prompt's last training group, else the mean of the last batch's (no generation).
        """
        if self.cfg.agpo.probe == "previous":
            fallback = self.previous_stats.get("__batch__")
            known = [self.previous_stats.get(p.id, fallback) for p in problems]
            if fallback is None:
                return ProbeStats.zeros(len(problems)), None
            return ProbeStats.cat(known), None
        base = torch.full((len(problems),), self.cfg.rollout.temperature)
        probe = self.sample_groups(problems, base)
        self.counters["tokens_probe"] += int(probe.rollouts.lengths.sum())
        return ProbeStats.from_rewards(
            probe.rewards, probe.answers, self.cfg.agpo.dispersion
        ), probe

    def groups_for(self, problems: list[Problem]) -> Groups:
        """Training groups for ``problems``: at τ_base, or at AGPO's per-prompt τ_t."""
        base = torch.full((len(problems),), self.cfg.rollout.temperature)
        if not self.cfg.agpo.enabled:
            return self.sample_groups(problems, base)
        stats, probe = self.probe(problems)
        tau = self.temperature_ctl(stats) if self.cfg.agpo.adaptive_temperature else base
        if probe is None or self.cfg.agpo.probe != "reuse":
            return self.sample_groups(problems, tau, stats)
        reuse = (tau - base).abs() <= 1e-6  # the probe was drawn at τ_t already: train on it
        probe.probe_stats = stats
        parts = [probe.select(reuse)] if reuse.any() else []
        if not reuse.all():
            fresh = [p for p, r in zip(problems, reuse.tolist()) if not r]
            parts.append(self.sample_groups(fresh, tau[~reuse], stats.select(~reuse)))
        return Groups.cat(parts, self.pad_id)

    def draw_groups(self) -> tuple[Groups, dict]:
        """P prompts with their groups. With DAPO dynamic sampling, groups of identical rewards
        are dropped and more prompts drawn until P remain or ``max_gen_batches`` is reached."""
        ro = self.cfg.rollout
        parts, dropped, batches = [], 0, 0
        while batches < (ro.max_gen_batches if ro.dynamic_sampling else 1):
            groups = self.groups_for(self.sampler.next_batch(ro.num_prompts))
            batches += 1
            if ro.dynamic_sampling:
                keep = informative_groups(groups.rewards)
                dropped += int((~keep).sum())
                if not keep.any() and (parts or batches < ro.max_gen_batches):
                    continue
                groups = groups.select(keep) if keep.any() else groups
            parts.append(groups)
            if sum(len(p.problems) for p in parts) >= ro.num_prompts:
                break
        groups = Groups.cat(parts, self.pad_id)
        if len(groups.problems) > ro.num_prompts:
            groups = groups.select(torch.arange(len(groups.problems)) < ro.num_prompts)
        return groups, {"dapo/gen_batches": batches, "dapo/dropped_groups": dropped}

    def cluster_ids(self, problems: list[Problem]) -> torch.Tensor | None:
        key = self.cfg.algo.cluster_key
        if key is None:
            return None
        labels = [str(getattr(p, key)) for p in problems]
        for label in labels:
            self.cluster_index.setdefault(label, len(self.cluster_index))
        return torch.tensor([self.cluster_index[label] for label in labels])

    # -------------------------------------------------------------------- update
    def ratio_temperatures(self, rollouts: RolloutBatch) -> torch.Tensor:
        """Temperature of the importance ratio: each row's sampling τ (default) or a constant
        (``1.0`` reproduces AGPO's code, docs/algorithms.md §3 known flaws)."""
        t = self.cfg.loss.ratio_temperature
        return (
            rollouts.temperatures.float()
            if t == "sampling"
            else torch.full((len(rollouts),), float(t))
        )

    def logprobs(self, model, rollouts, temps, compute_entropy=False, micro=None):
        """`sequence_logprobs` in the configured memory bounds: ``micro`` rows per pass (default
        the no-grad log-prob micro-batch) and ``optim.logprob_chunk_size`` positions per head call,
        sharing each prompt's forward across its rows with ``optim.share_prompt_forward``."""
        opt = self.cfg.optim
        micro = micro or opt.logprob_micro_batch_size or opt.micro_batch_size or None
        return sequence_logprobs(
            model,
            rollouts,
            temps,
            compute_entropy,
            micro,
            opt.logprob_chunk_size or None,
            opt.share_prompt_forward,
        )

    @torch.no_grad()
    def reference_logprobs(self, rollouts: RolloutBatch, temps: torch.Tensor) -> torch.Tensor:
        with self.policy.reference() as ref_model:
            return self.logprobs(ref_model, rollouts, temps)[0]

    def on_policy_update(self, rows: int) -> bool:
        """Whether π_old's pass would repeat the training forward (docs/algorithms.md §4): one
        epoch and one mini-batch over all ``rows`` (the ratio is then exactly 1 at the only
        forward), a forward that train mode does not change (no active dropout), and, for AGPO's
        adaptive clip (ε needs every row's pre-update entropy before the loss), one micro-batch."""
        opt = self.cfg.optim

        def whole(size: int) -> bool:
            return size == 0 or size >= rows

        if not (self.mode_free_forward and opt.update_epochs == 1 and whole(opt.mini_batch_size)):
            return False
        return not self.clip_needs_entropy or whole(opt.micro_batch_size)

    @property
    def clip_needs_entropy(self) -> bool:
        return self.cfg.agpo.enabled and self.cfg.agpo.adaptive_clip

    @property
    def needs_entropy(self) -> bool:
        """π_old's entropy is computed for AGPO (its signals) or when logged (``log_entropy``)."""
        return self.cfg.agpo.enabled or self.cfg.log_entropy

    def update(self, rollouts, advantages, old: OldPolicy, ref_logp, temps, clip_radii) -> dict:
        """μ epochs of clipped-surrogate updates over mini-batches (docs/algorithms.md §4).

        ``old`` empty: on-policy (:meth:`on_policy_update`), π_old is the detached training
        forward, which fills ``old`` (ratio exactly 1). ``ref_logp`` None: no KL term and no
        ``kl`` metric. ``clip_radii(entropy)`` → per-row (ε_low, ε_high), called once the
        pre-update entropy of every row is known."""
        cfg, opt = self.cfg, self.cfg.optim
        rows = len(rollouts)
        mini = opt.mini_batch_size or rows
        micro = opt.micro_batch_size or mini
        mask = rollouts.completion_mask
        on_policy = old.logp is None
        if on_policy:  # log-probs are at least float32 (rollout.sequence_logprobs)
            dtype = torch.promote_types(cfg.model.dtype, torch.float32)
            old.logp = torch.zeros(mask.shape, device=mask.device, dtype=dtype)
            old.entropy = torch.zeros(mask.shape, device=mask.device, dtype=dtype)
        eps = None if on_policy and self.clip_needs_entropy else clip_radii(old.entropy)
        params = self.policy.trainable_parameters()
        sums = {"loss": 0.0, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0}
        sums.update({"clip_ratio/region_mean": 0.0, "grad_norm": 0.0})
        if ref_logp is not None:
            sums["kl"] = 0.0
        updates = 0
        self.policy.model.train()
        for epoch in range(opt.update_epochs):
            order = torch.randperm(rows)
            for start in range(0, rows, mini):
                mb = order[start : start + mini]
                mb_tokens = mask[mb].sum().clamp_min(1)
                self.optimizer.zero_grad(set_to_none=True)
                loss_total, stats = 0.0, []
                for mstart in range(0, len(mb), micro):
                    idx = mb[mstart : mstart + micro]
                    sub = rollouts.select(idx)
                    logp, entropy = self.logprobs(
                        self.policy.model,
                        sub,
                        temps[idx],
                        on_policy and self.needs_entropy,
                        len(idx),
                    )
                    if on_policy:
                        old.logp[idx.to(mask.device)] = logp.detach()
                        if entropy is not None:
                            old.entropy[idx.to(mask.device)] = entropy
                    if eps is None:  # on-policy AGPO: this one forward covered every row
                        eps = clip_radii(old.entropy)
                    m = sub.completion_mask
                    loss_tok, clip = clipped_surrogate(
                        logp,
                        old.logp[idx],
                        advantages[idx],
                        eps[0][idx],
                        eps[1][idx],
                        m,
                        cfg.loss.dual_clip,
                    )
                    kl = None
                    if ref_logp is not None:
                        kl_tok = kl_divergence(logp, ref_logp[idx], cfg.loss.kl_estimator)
                        loss_tok = loss_tok + cfg.loss.kl_coef * kl_tok
                        kl = masked_mean(kl_tok.detach(), m)
                    weight = (
                        (m.sum() / mb_tokens)
                        if cfg.loss.loss_agg == "token-mean"
                        else len(idx) / len(mb)
                    )
                    loss = (
                        aggregate_loss(loss_tok, m, cfg.loss.loss_agg, cfg.rollout.max_new_tokens)
                        * weight
                    )
                    loss.backward()
                    loss_total += loss.item()
                    stats.append((weight, clip, kl))
                grad_norm = torch.nn.utils.clip_grad_norm_(params, opt.max_grad_norm)
                if not (math.isfinite(loss_total) and torch.isfinite(grad_norm)):
                    self.skip_nonfinite(loss_total, float(grad_norm))
                    continue
                self.optimizer.step()
                last = epoch == opt.update_epochs - 1 and start + mini >= rows
                # AGPO's step-KL pass runs every row through the final weights next and checks
                # their log-probs (step_kl), so the last step's one-row probe would repeat it
                probe = None if last and cfg.agpo.enabled else rollouts.select(mb[:1])
                self.check_finite_policy(probe, temps[mb[:1]])
                self.counters["consecutive_skips"] = 0
                updates += 1
                sums["loss"] += loss_total
                sums["grad_norm"] += float(grad_norm)
                for weight, clip, kl in stats:
                    w = float(weight)
                    if kl is not None:
                        sums["kl"] += w * float(kl)
                    sums["clip_ratio/low_mean"] += w * float(clip.low)
                    sums["clip_ratio/high_mean"] += w * float(clip.high)
                    sums["clip_ratio/region_mean"] += w * float(clip.region)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return {k: v / max(updates, 1) for k, v in sums.items()} | {"optimizer_steps": updates}

    def skip_nonfinite(self, loss: float, grad_norm: float) -> None:
        """A non-finite loss or gradient: skip the optimizer step; stop after too many in a row."""
        self.optimizer.zero_grad(set_to_none=True)
        self.counters["nonfinite_skips"] += 1
        self.counters["consecutive_skips"] += 1
        tqdm.write(
            f"step {self.step_count}: non-finite loss ({loss}) or grad norm ({grad_norm}); skipped"
        )
        if self.counters["consecutive_skips"] >= self.cfg.optim.max_nonfinite_skips:
            raise NonFiniteError(
                f"{self.counters['consecutive_skips']} consecutive optimizer steps had a non-finite loss "
                f"or gradient (last loss {loss}, grad norm {grad_norm}); lower optim.lr or check the rewards"
            )

    @torch.no_grad()
    def check_finite_policy(self, probe: RolloutBatch | None, temps: torch.Tensor) -> None:
        """After an optimizer step the weights, and the log-probs of one sequence (``probe``; None:
        the weights only), must be finite (finite but huge weights, e.g. from optim.lr=1e30, give
        NaN outputs); otherwise stop with NonFiniteError before sampling from a broken policy."""
        params = self.policy.trainable_parameters()
        if not all(torch.isfinite(p).all() for p in params):
            self.stop_nonfinite("non-finite weights")
        if probe is not None:
            logp, _ = self.logprobs(self.policy.model, probe, temps)  # in the chunk bounds
            self.check_finite_logprobs(logp)

    def check_finite_logprobs(self, logp: torch.Tensor) -> None:
        if not torch.isfinite(logp).all():
            self.stop_nonfinite("finite weights but non-finite log-probabilities")

    def stop_nonfinite(self, problem: str) -> None:
        raise NonFiniteError(
            f"step {self.step_count + 1}: the optimizer step left the policy with {problem}; "
            f"lower optim.lr (now {self.cfg.optim.lr:g}). The last checkpoint is unaffected."
        )

    @torch.no_grad()
    def step_kl(self, rollouts: RolloutBatch, old_logp, temps, num_prompts: int) -> torch.Tensor:
        """Per-prompt k1 drift mean_t(log π_old − log π_new) after the update (docs/algorithms.md §3 step 5)."""
        with eval_mode(self.policy.model):
            new_logp, _ = self.logprobs(self.policy.model, rollouts, temps)
        self.check_finite_logprobs(new_logp)  # the update's last check left this to the pass
        return per_prompt_mean(old_logp - new_logp, rollouts.completion_mask, num_prompts)

    # ---------------------------------------------------------------------- step
    def step(self) -> dict:
        cfg = self.cfg
        if cfg.task.shift and not self.shifted and self.step_count >= cfg.task.shift["step"]:
            self.shift_task()
        t0, self.score_time = time.perf_counter(), 0.0
        groups, metrics = self.draw_groups()
        t_generate = time.perf_counter() - t0 - self.score_time
        rollouts, rewards = groups.rollouts, groups.rewards
        num_prompts, g = rewards.shape

        t1 = time.perf_counter()
        result = self.estimator(rewards, self.cluster_ids(groups.problems))
        advantages = result.advantages.reshape(-1).to(rollouts.input_ids.device)

        temps = self.ratio_temperatures(rollouts)
        old = OldPolicy()
        if not self.on_policy_update(len(rollouts)):
            with torch.no_grad(), eval_mode(self.policy.model):  # π_old samples without dropout
                old.logp, old.entropy = self.logprobs(
                    self.policy.model, rollouts, temps, self.needs_entropy
                )
        ref_logp = self.reference_logprobs(rollouts, temps) if self.uses_reference else None
        mask = rollouts.completion_mask

        def clip_radii(entropy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            """Per-row (ε_low, ε_high): the loss's, or AGPO's per-prompt ε (docs/algorithms.md §3 step 4)."""
            if self.clip_needs_entropy:
                tok_entropy = per_prompt_mean(entropy, mask, num_prompts).cpu()
                eps = self.clip_ctl(groups.probe_stats, tok_entropy).repeat_interleave(g)
                return eps, eps
            rows = len(rollouts)
            return torch.full((rows,), cfg.loss.eps_low), torch.full((rows,), cfg.loss.eps_high)

        lr = self.scheduler.get_last_lr()[0]  # this step's; update() steps the scheduler
        update = self.update(rollouts, advantages, old, ref_logp, temps, clip_radii)
        entropy = old.entropy
        if cfg.agpo.enabled:
            metrics |= self.agpo_metrics(groups, per_prompt_mean(entropy, mask, num_prompts))
            drift = self.step_kl(rollouts, old.logp, temps, num_prompts)
            metrics["agpo/kl_drift"] = self.clip_ctl.update_kl(drift.cpu())
            self.remember_stats(groups)
        t_update = time.perf_counter() - t1

        self.step_count += 1
        self.counters["tokens_generated"] += int(rollouts.lengths.sum())
        lengths = rollouts.lengths.float()
        metrics |= {
            "reward": rewards.mean(),
            "reward_std": rewards.std() if rewards.numel() > 1 else 0.0,
            "frac_reward_zero_std": result.diagnostics["frac_reward_zero_std"],
            "advantages/mean": advantages.mean(),
            "advantages/std": advantages.std() if advantages.numel() > 1 else 0.0,
            "advantages/abs_max": advantages.abs().max(),
            **({"entropy": masked_mean(entropy, mask)} if cfg.log_entropy else {}),
            "completions/mean_length": lengths.mean(),
            "completions/max_length": lengths.max(),
            "completions/clipped_ratio": rollouts.truncated.float().mean(),
            "tokens/generated": self.counters["tokens_generated"],
            "tokens/probe": self.counters["tokens_probe"],
            "reward_failures": groups.reward_failures,
            "nonfinite_skips": self.counters["nonfinite_skips"],
            "learning_rate": lr,
            "time/generate": t_generate,
            "time/score": self.score_time,
            "time/update": t_update,
            **update,
        }
        if cfg.algo.estimator == "ebpo":
            d = result.diagnostics
            metrics |= {"ebpo/shrinkage_mean": d["shrinkage"].mean(), "ebpo/mu_glob": d["mu_glob"]}
            metrics |= {"ebpo/sigma2": d["sigma2"], "ebpo/tau2": d["tau2"]}
        return metrics

    def agpo_metrics(self, groups: Groups, tok_entropy: torch.Tensor) -> dict:
        out = summary("agpo/temperature", groups.temperatures)
        if self.cfg.agpo.adaptive_temperature:  # the controller ran in groups_for this step
            out |= {
                "agpo/U": self.temperature_ctl.last_u.mean(),
                "agpo/U_bar": self.temperature_ctl.u_bar,
            }
        out["agpo/H"] = tok_entropy.mean()
        if self.cfg.agpo.adaptive_clip:
            out["agpo/H_ref"] = self.clip_ctl.entropy_ref.value
            out |= summary("agpo/epsilon", self.clip_ctl.last_eps)
        return out

    def remember_stats(self, groups: Groups) -> None:
        """For probe ``previous``: each prompt's training-group statistics, and the batch mean."""
        if self.cfg.agpo.probe != "previous":
            return
        stats = ProbeStats.from_rewards(groups.rewards, groups.answers, self.cfg.agpo.dispersion)
        for i, problem in enumerate(groups.problems):
            self.previous_stats[problem.id] = stats.select([i])
        self.previous_stats["__batch__"] = ProbeStats(
            *(
                getattr(stats, f).mean().reshape(1)
                for f in ("dispersion", "skewness", "vote_entropy")
            )
        )

    # ------------------------------------------------------------ eval, saving
    def evaluate(self) -> dict:
        """Greedy accuracy, Pass@1 and Maj@k on the eval split (own RNG: training is unaffected)."""
        ev = self.cfg.eval
        with self.finite_sampling():
            return evaluate(
                self.policy.model,
                self.policy.tokenizer,
                self.eval_problems,
                self.scorer,
                ev.k,
                ev.temperature,
                self.cfg.rollout.max_new_tokens,
                ev.batch_size,
            )

    def state_dict(self) -> dict:
        return {
            "step": self.step_count,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "estimator": self.estimator.state_dict(),
            "cluster_index": dict(self.cluster_index),
            "temperature_ctl": self.temperature_ctl.state_dict() if self.temperature_ctl else None,
            "clip_ctl": self.clip_ctl.state_dict() if self.clip_ctl else None,
            "previous_stats": {k: asdict(v) for k, v in self.previous_stats.items()},
            "sampler": self.sampler.state_dict(),
            "curriculum_pass_rates": self.curriculum_pass_rates,
            "counters": dict(self.counters),
        }

    def load_policy_state(self, policy_dir: Path) -> None:
        """The checkpoint's weights (or adapter) into the policy; a checkpoint of another model
        (``rlkit eval --config`` with another model) is a ValueError naming both models and the
        first mismatch, not a size-mismatch traceback."""
        try:
            self.policy.load_trainable_state(policy_dir)
        except (RuntimeError, ValueError, OSError) as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            first = next((line for line in lines if "mismatch" in line), lines[0] if lines else "")
            model = self.cfg.model
            raise ValueError(
                f"{policy_dir} holds weights of another model than model.name_or_path="
                f"{model.name_or_path} ({model.mode}): {first.rstrip('.')}; the run's {CONFIG} "
                f"names model {trained_model(self.run_dir)}"
            ) from None

    def load_state(self, checkpoint: Path, state: dict) -> None:
        self.load_policy_state(checkpoint / "policy")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.estimator.load_state_dict(state["estimator"])
        self.cluster_index = dict(state["cluster_index"])
        if self.temperature_ctl:
            self.temperature_ctl.load_state_dict(state["temperature_ctl"])
        if self.clip_ctl:
            self.clip_ctl.load_state_dict(state["clip_ctl"])
        self.previous_stats = {k: ProbeStats(**v) for k, v in state["previous_stats"].items()}
        self.sampler.load_state_dict(state["sampler"])
        self.counters = dict(state["counters"])
        self.step_count = state["step"]
        set_rng_state(state["rng"])

    def save(self) -> Path:
        return save_checkpoint(
            self.run_dir,
            self.step_count,
            self.policy,
            self.state_dict(),
            self.cfg.keep_checkpoints,
            self.run_id,
        )

    # ----------------------------------------------------------------------- run
    def eval_due(self) -> bool:
        every = self.cfg.eval.every
        return self.step_count in (0, self.cfg.steps) or bool(
            every and self.step_count % every == 0
        )

    def train(self) -> list[dict]:
        """Run to ``cfg.steps``. Evaluation rows (step 0, every ``eval.every`` steps, the last
        step) are logged with the step's metrics under ``eval/…`` and returned."""
        cfg = self.cfg
        if self.read_only:
            raise ValueError("this Trainer was opened read-only (for evaluation); it cannot train")
        evals = []
        if self.step_count == 0 and cfg.eval.at_start:
            evals.append({"step": 0, **self.evaluate()})
            self.logger.log(0, evals[-1])
        bar = tqdm(
            total=cfg.steps,
            initial=self.step_count,
            desc=cfg.algo.estimator,
            disable=not cfg.progress,
        )
        try:
            while self.step_count < cfg.steps:
                metrics = self.step()
                if self.eval_due():
                    evals.append({"step": self.step_count, **self.evaluate()})
                    metrics |= evals[-1]
                self.logger.log(self.step_count, metrics)
                bar.update(1)
                bar.set_postfix(reward=f"{float(metrics['reward']):.3f}")
                if self.step_count == cfg.steps or (
                    cfg.checkpoint_every and self.step_count % cfg.checkpoint_every == 0
                ):
                    self.save()
        finally:
            bar.close()
            self.close()
        return evals

    def close(self) -> None:
        """Close the metrics sinks and reward workers, and release the run directory's lock."""
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        if getattr(self, "scorer", None) is not None:
            self.scorer.close()
        if self.lock is not None:
            self.lock.release()
