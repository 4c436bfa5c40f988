"""The RLVR trainer: one loop for GRPO, Dr. GRPO, RLOO, EBPO and AGPO (docs/algorithms.md §1–§5).

:meth:`Trainer.step` reads as the algorithm; each line is a stage with its own module:

1. draw P prompts and their scored groups (``rlkit.collect``; the method decides how, e.g. AGPO's
   probe → τ_t → sample, ``rlkit.methods``; DAPO's dynamic sampling refills the batch);
2. advantages from the method's estimator (``rlkit.advantages``);
3. the batch to train on with its passes (``rlkit.logprobs``): π_old and the reference, each
   only when needed (:class:`~rlkit.pass_plan.PassPlan`);
4. μ update epochs over mini-batches with gradient accumulation, the clip radius from the
   method's rule (``rlkit.update``; DPO: its preference loss over each group's pairs);
5. the method's feedback after the update (AGPO's step KL);
6. metrics (``rlkit.step_metrics``); periodic evaluation and atomic checkpoints in :meth:`train`.

Every quantity that must agree across processes passes the collective (``rlkit.dist``); every
phase is timed and hookable (``rlkit.phases``). Nothing imports this module's internals.
"""

from __future__ import annotations

import contextlib
import gc
import uuid
import warnings
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rlkit.advantages import zero_variance_groups
from rlkit.batch import BatchRows, Groups, PolicyPass, StepRecord, TrainBatch
from rlkit.checkpoint import TRAINER_STATE, open_run, save_checkpoint
from rlkit.collect import Collector
from rlkit.config import BUILTIN_MODEL, TrainConfig
from rlkit.dist import check_world, collective, rank_device, rank_seed
from rlkit.evaluation import EVAL_SEED, EvalScores, sampled_pass_rates, score_problems
from rlkit.logprobs import PolicyForward
from rlkit.machine import unpinned
from rlkit.methods import build_method
from rlkit.metrics import MetricsLogger, tokens_spent
from rlkit.models.loading import (
    CheckpointFileError,
    ModelSpec,
    Policy,
    load_error_line,
    load_policy,
)
from rlkit.parallel import (
    full_weights_state,
    load_optimizer_state,
    optimizer_state,
    sharded,
    unsharded,
    wrap,
)
from rlkit.pass_plan import PassPlan
from rlkit.phases import Phases
from rlkit.plan import resolve_for_device
from rlkit.rundir import CONFIG, RunLock, clear_run, trained_model, write_config
from rlkit.sampling import PromptSampler
from rlkit.seeding import rng_state, seed_everything, set_rng_state
from rlkit.stale import RolloutQueue
from rlkit.step_metrics import step_metrics
from rlkit.tasks.chat import chat_problems
from rlkit.tasks.loader import (
    check_context,
    check_sizes,
    load_problems,
    shifted_train_problems,
    subset,
    warn_long_prompts,
)
from rlkit.update import PolicyUpdate


def resolve_model_path(cfg: TrainConfig) -> str:
    """``builtin:tiny`` → the warm-started tiny policy shipped with rlkit (never rebuilt)."""
    if cfg.model.name_or_path != BUILTIN_MODEL:
        return cfg.model.name_or_path
    from rlkit.models.tiny import shipped_tiny_policy

    return str(shipped_tiny_policy())


class Trainer:
    """Trains ``cfg`` in ``cfg.output_dir`` (see :mod:`rlkit.rundir` for what a run directory
    promises). ``resume``: continue from the latest intact checkpoint, with the saved config;
    ``overwrite``: a fresh run may replace a previous run's files; ``read_only``: only to
    evaluate (the policy, or with ``resume`` the latest checkpoint), without locking or writing
    anything. ``phases`` times each step's phases; ``phases.add_hook`` wraps them.

    Started by ``torchrun``/``accelerate launch`` with several processes, each trains its share
    of every batch (``rlkit.dist``, ``rlkit.parallel``) and rank 0 alone writes the run
    directory: metrics, TensorBoard, checkpoints, the lock and the progress bar."""

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
        self.device = rank_device(cfg.model.torch_device)
        self.dist = collective(self.device)
        self.writes = not read_only and self.dist.rank == 0  # rank 0 alone writes the run
        self.lock = RunLock(self.run_dir) if self.writes else None
        try:
            self.setup(resume, overwrite)
        except BaseException:
            self.close()
            raise

    def setup(self, resume: bool, overwrite: bool) -> None:
        cfg = self.cfg
        # the other ranks only read: rank 0 checks the directory and writes it
        checkpoint = open_run(self.run_dir, cfg, resume, overwrite, not self.writes)
        self.run_id = self.dist.all_gather_object(
            checkpoint.run_id if checkpoint else uuid.uuid4().hex
        )[0]
        # rollout.sampling_stream=rank: each rank samples from its own global RNG; prompt: the
        # groups from keyed streams (rlkit.collect), and every rank's global RNG is one process's
        keyed = cfg.rollout.sampling_stream == "prompt"
        seed_everything(cfg.seed if keyed else rank_seed(cfg.seed, self.dist.rank))
        self.phases = Phases()
        check_world(cfg, self.dist.world)
        if self.device.type == "cpu" and (why := unpinned()):
            warnings.warn(why, stacklevel=2)

        self.train_problems, eval_problems = load_problems(cfg.task)
        # from step task.shift.step on, training draws these (shift_task)
        self.shift_problems = shifted_train_problems(cfg.task) if cfg.task.shift else None
        if self.read_only:  # evaluation only: the training sets do not matter
            check_sizes(cfg, eval_problems)
        elif not resume:  # a resumed run keeps the config it started with (check_resume_config)
            check_sizes(cfg, eval_problems, self.train_problems, self.shift_problems)
        # a seeded sample, not a prefix: the splits are ordered cell by cell (topic, difficulty)
        self.eval_problems = subset(eval_problems, cfg.eval.num_problems)
        self.method = build_method(cfg, self.dist)
        spec = {name: getattr(cfg.model, name) for name in ModelSpec.__dataclass_fields__}
        spec["name_or_path"] = resolve_model_path(cfg)
        spec["device"] = str(self.device)
        plan = PassPlan.from_config(cfg, self.method)
        self.policy: Policy = load_policy(
            ModelSpec(**spec), keep_reference=plan.reference, with_value_head=plan.values
        )
        self.passes = plan.for_model(self.policy.model)
        state = checkpoint.state if checkpoint else None
        if state:  # the checkpoint's weights, before any wrapper shards them
            self.load_policy_state(checkpoint.path / "policy")
        # several processes: every pass of the policy runs through its DDP/FSDP2 wrapper, and
        # code that runs the model outside it (generation, saving) needs the full weights
        self.parallel = None
        if self.dist.world > 1 and not self.read_only:
            self.parallel = wrap(
                self.policy.model, cfg.parallel.strategy, self.dist, self.policy.value_head
            )
        self.full_weights = partial(unsharded, self.parallel)
        if cfg.task.chat_template:
            self.train_problems = chat_problems(self.train_problems, self.policy.tokenizer)
            self.eval_problems = chat_problems(self.eval_problems, self.policy.tokenizer)
        self.passes.warn_inactive_clips()
        context = getattr(self.policy.model.config, "max_position_embeddings", None)
        check_context(cfg.rollout.max_new_tokens, context, cfg.model.name_or_path)
        warn_long_prompts(
            self.train_problems + self.eval_problems,
            self.policy.tokenizer,
            context,
            cfg.rollout.max_new_tokens,
        )
        # auto batch sizes from the device's memory, for this process's share of the rows
        sized, notes = resolve_for_device(cfg, self.dist.world)
        for note in notes:
            tqdm.write(note)
        self.eval_batch_size = sized.eval.batch_size
        shifted = self.shift_problems or []  # formatted as shift_task will format them
        if shifted and cfg.task.chat_template:
            shifted = chat_problems(shifted, self.policy.tokenizer)
        self.collector = Collector.from_config(
            sized,
            self.policy,
            self.phases,
            [p.prompt for p in self.train_problems + shifted],
            self.dist,
            self.full_weights,
        )
        # evaluation samples with the rollouts' engine (HF generate, the static loop or vLLM)
        # and, on the in-process ones, over the rollouts' weights (collector.sampling_weights)
        self.eval_engine = self.collector.engine.for_evaluation()
        self.forward = PolicyForward(
            self.policy, cfg, self.phases, self.parallel, share_prompts=self.passes.share_prompts
        )
        loss = self.method.loss(cfg, self.passes.reference)  # §4: the method's, with its terms
        self.update = PolicyUpdate(
            self.policy, self.forward, self.passes, cfg, self.phases, self.dist, loss
        )
        self.rollouts = RolloutQueue(
            cfg.rollout.lag,
            cfg.steps,
            lambda batch: self.collector.draw(self.sampler, self.method, batch),
            self.stale_old_pass,
        )
        self.step_count = 0
        self.tokens = {"tokens_generated": 0, "tokens_probe": 0}
        self.eval_scores: EvalScores | None = None  # the latest evaluate()'s, problem by problem

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
        if not self.writes:
            return
        if not state:
            clear_run(self.run_dir)
        write_config(self.run_dir, cfg)
        self.logger = MetricsLogger(
            self.run_dir, cfg.tensorboard, self.step_count if state else None
        )

    def shift_task(self) -> None:
        """From now on draw training prompts from ``task.shift.arithmetic`` (notebook 09's
        difficulty shift), in a fresh order under the run's seed."""
        problems = self.shift_problems
        if self.cfg.task.chat_template:
            problems = chat_problems(problems, self.policy.tokenizer)
        self.train_problems = problems
        self.sampler = PromptSampler(problems, self.cfg.rollout.order, self.cfg.seed)
        self.shifted = True

    def maybe_shift_task(self) -> None:
        shift = self.cfg.task.shift
        if shift and not self.shifted and self.step_count >= shift["step"]:
            self.shift_task()

    def starting_pass_rates(self) -> torch.Tensor:
        """The curriculum's ranking: the starting policy's pass rate over k samples at T = 1
        (every process ranks every problem alike: the same weights, the evaluation's own seed)."""
        with self.finite_sampling(), self.full_weights(), self.collector.sampling_weights():
            return sampled_pass_rates(
                self.policy.model,
                self.policy.tokenizer,
                self.train_problems,
                self.collector.scorer,
                k=self.cfg.eval.k,
                max_new_tokens=self.cfg.rollout.max_new_tokens,
                batch_size=self.eval_batch_size,
                engine=self.eval_engine,
            )

    def finite_sampling(self):
        """Sampling's non-finite scores as a NonFiniteError naming the step (``guard.sampling``)."""
        return self.update.guard.sampling(self.step_count)

    @property
    def counters(self) -> dict[str, int]:
        """Run totals: tokens trained on and probed, non-finite skips (all and in a row)."""
        guard = self.update.guard
        return self.tokens | {
            "nonfinite_skips": guard.skips,
            "consecutive_skips": guard.consecutive,
        }

    # ---------------------------------------------------------------------- step
    def step(self) -> dict:
        """One step: prompts → groups → advantages → passes → update → feedback → metrics."""
        self.maybe_shift_task()
        self.phases.take()
        with self.phases("generate"), self.finite_sampling():  # §3 steps 1–3; DAPO refills
            queued = self.rollouts.next(self.step_count)  # rollout.lag > 0: drawn steps ago
        groups, drawn = queued.groups, queued.stats
        with self.phases("update"):
            rewards = self.dist.all_gather(groups.rewards)  # [P_all, G], the same on every rank
            problems = [p for part in self.dist.all_gather_object(groups.problems) for p in part]
            adv = self.method.advantages(rewards, problems)  # §1–§2
            advantages = self.dist.my_rows(adv.advantages)
            batch = self.train_batch(groups, advantages, queued.old)  # π_old, π_ref
            batch = self.method.token_advantages(batch)  # PPO: GAE over V_old (§4c)
            lr = self.update.lr  # this step's; the update steps the scheduler
            result = self.method.train(self.update, batch, groups, self.step_count)  # §4, §4d
            drift = partial(self.update.drift, batch, result.old, self.step_count)
            after = self.method.after_update(groups, drift)  # §3 step 5: the post-update pass
            signals = self.method.metrics(groups, result.old) | after
        rows = self.batch_rows(groups, result.old)  # the whole batch's, on every rank
        self.step_count += 1
        self.tokens["tokens_generated"] += (
            self.method.generated_tokens(rows.lengths) + drawn.discarded_tokens
        )
        self.tokens["tokens_probe"] += drawn.probe_tokens
        metrics = step_metrics(
            StepRecord(
                rows, rewards, adv, adv.advantages.reshape(-1), result, drawn, signals,
                self.method.estimator.metrics(adv), lr, self.counters, self.phases.take(),
            )
        )  # fmt: skip
        if self.cfg.rollout.lag:  # updates between the sampling policy and this step's start
            metrics["rollout/staleness"] = self.step_count - 1 - queued.step
        return metrics

    def batch_rows(self, groups: Groups, old: PolicyPass) -> BatchRows:
        """Lengths, truncation and mean entropy of every rank's rows (this rank's, alone)."""
        rollouts, dist = groups.rollouts, self.dist
        entropy = None
        if self.cfg.log_entropy:  # masked_mean over the global batch
            mask = rollouts.completion_mask.to(old.entropy.dtype)
            total = dist.all_reduce_sum((old.entropy * mask).sum())
            entropy = total / dist.all_reduce_sum(mask.sum()).clamp_min(1.0)
        return BatchRows(
            dist.all_gather(rollouts.lengths), dist.all_gather(rollouts.truncated), entropy
        )

    def stale_old_pass(self, groups: Groups) -> PolicyPass | None:
        """π_old's pass right after the draw, by the weights that sampled ``groups``, when the
        batch waits ``rollout.lag`` steps for training (rlkit.stale); None with ``lag = 0``."""
        if not self.cfg.rollout.lag:
            return None
        rollouts = groups.rollouts
        return self.old_pass(rollouts, self.forward.ratio_temperatures(rollouts))

    def old_pass(self, rollouts, temps: torch.Tensor) -> PolicyPass | None:
        """π_old's pass at the ratio temperatures ``temps``, or None when the update is on-policy
        and π_old is its own forward."""
        passes = self.passes
        if passes.on_policy(len(rollouts)):
            return None
        return self.forward.old(rollouts, temps, passes.entropy, passes.values)

    def train_batch(
        self, groups: Groups, advantages: torch.Tensor, old: PolicyPass | None = None
    ) -> TrainBatch:
        """The groups with their advantages, ratio temperatures and the passes the plan needs:
        π_old unless the update is on-policy (``old``: taken when the batch was drawn), the
        reference only for the KL term (§4)."""
        rollouts, passes = groups.rollouts, self.passes
        temps = self.forward.ratio_temperatures(rollouts)
        norm_rows = None
        if self.cfg.loss.exclude_zero_var_from_norm:  # §4: zero-variance groups' tokens left out
            informative = ~zero_variance_groups(groups.rewards)
            norm_rows = informative.repeat_interleave(groups.group_size).to(
                rollouts.input_ids.device
            )
        return TrainBatch(
            rollouts,
            advantages=advantages.reshape(-1).to(rollouts.input_ids.device),
            ratio_temps=temps,
            group_size=groups.group_size,
            old=old if old is not None else self.old_pass(rollouts, temps),
            ref_logp=self.forward.reference(rollouts, temps) if passes.reference else None,
            norm_rows=norm_rows,
        )

    # ------------------------------------------------------------ eval, saving
    def evaluate(self) -> dict:
        """Greedy accuracy, Pass@1 and Maj@k on the eval split (own RNG: training is unaffected);
        with several processes each rank scores its share of the problems, in whole generation
        batches of the sampled pass, so its samples are those one process draws with the same
        ``eval.batch_size``. ``rollout.sampling_stream=prompt``: each problem is generated alone,
        its k samples from a seed keyed by its index, whatever the batch size. The scores
        problem by problem stay in ``self.eval_scores`` (the latest evaluation's)."""
        ev = self.cfg.eval
        mine = self.dist.share(len(self.eval_problems), max(1, self.eval_batch_size // ev.k))
        with self.finite_sampling(), self.full_weights(), self.collector.sampling_weights():
            scores = score_problems(
                self.policy.model,
                self.policy.tokenizer,
                self.eval_problems[mine.start : mine.stop],
                self.collector.scorer,
                ev.k,
                ev.temperature,
                self.cfg.rollout.max_new_tokens,
                self.eval_batch_size,
                self.eval_engine,
                EVAL_SEED + mine.start,
                keyed=self.cfg.rollout.sampling_stream == "prompt",
            )
        self.eval_scores = EvalScores.cat(self.dist.all_gather_object(scores))
        return self.eval_scores.summary()

    def state_dict(self) -> dict:
        update = self.update
        return {
            "step": self.step_count,
            "optimizer": optimizer_state(self.parallel, update.optimizer),
            "scheduler": update.scheduler.state_dict(),
            "rng": rng_state(),  # rank 0's; the others' follow (several processes)
            **self.method.state_dict(),  # estimator, cluster_index, *_ctl, previous_stats
            "sampler": self.sampler.state_dict(),
            "curriculum_pass_rates": self.curriculum_pass_rates,
            "counters": self.counters,
            **self.rollouts.state_dict(),  # rollout.lag > 0: the batches drawn ahead
        } | self.rank_state()

    def rank_state(self) -> dict:
        """With several processes: the world size and every rank's RNG, in rank order (a
        collective: every rank calls it); nothing for one process."""
        if self.dist.world == 1:
            return {}
        gather = self.dist.all_gather_object
        return {
            "world_size": self.dist.world,
            "rank_rng": gather(rng_state()),
            "rank_rollouts": gather(self.rollouts.state_dict()),  # each rank's drawn batches
        }

    def load_policy_state(self, policy_dir: Path) -> None:
        """The checkpoint's weights (or adapter) into the policy; a checkpoint of another model
        (``rlkit eval --config`` with another model) is a ValueError naming both models and the
        first mismatch, not a size-mismatch traceback. A file that does not load for another
        reason (unreadable; PPO's value head missing or of another shape) is one naming it."""
        try:
            self.policy.load_trainable_state(policy_dir)
        except CheckpointFileError:
            raise
        except (RuntimeError, ValueError, OSError) as err:
            model = self.cfg.model
            raise ValueError(
                f"{policy_dir} holds weights of another model than model.name_or_path="
                f"{model.name_or_path} ({model.mode}): {load_error_line(err)}; the run's "
                f"{CONFIG} names model {trained_model(self.run_dir)}"
            ) from None

    def load_state(self, checkpoint: Path, state: dict) -> None:
        """The trainer's state from ``checkpoint`` (its weights are loaded before wrapping). A
        state that breaks its own invariants (offline DPO without its set, a stale queue that
        is not the one its run holds at that step, a sampler position outside the split, EBPO's
        or AGPO's running statistics not finite or negative) is a ValueError naming the file,
        and so is a checkpoint of another world size, unless the run samples with
        ``rollout.sampling_stream=prompt`` and draws no batches ahead (``rollout.lag=0``)."""
        saved_world, world = state.get("world_size", 1), self.dist.world
        rollout = self.cfg.rollout
        if saved_world != world and rollout.sampling_stream == "rank":
            raise ValueError(
                f"{checkpoint} was written by {saved_world} process(es) and this run has "
                f"{world}: resume with the same number of processes (each rank's sampling "
                "stream depends on it; a run with rollout.sampling_stream=prompt resumes at "
                "any world size)"
            )
        if saved_world != world and rollout.lag:
            raise ValueError(
                f"{checkpoint} was written by {saved_world} process(es) and this run has "
                f"{world}: with rollout.lag={rollout.lag} each rank's share of the batches "
                "drawn ahead is in the checkpoint; resume with the same number of processes"
            )
        load_optimizer_state(self.parallel, self.update.optimizer, state["optimizer"])
        self.update.scheduler.load_state_dict(state["scheduler"])
        counters = state["counters"]
        self.tokens = {k: counters[k] for k in self.tokens}
        self.update.guard.skips = counters["nonfinite_skips"]
        self.update.guard.consecutive = counters["consecutive_skips"]
        self.step_count = state["step"]
        # each rank's own RNG; at another world size (sampling_stream=prompt, whose ranks were
        # seeded alike) rank 0's, which a one-process run's follows
        same = saved_world == world > 1
        set_rng_state(state["rank_rng"][self.dist.rank] if same else state["rng"])
        # several processes: each rank's own queue (absent from checkpoints older than it)
        rollouts = (
            state["rank_rollouts"][self.dist.rank] if same and "rank_rollouts" in state else state
        )
        try:
            self.sampler.load_state_dict(state["sampler"])
            self.method.load_state_dict(state)
            self.rollouts.load_state_dict(rollouts, self.device, self.step_count)
        except ValueError as err:
            raise ValueError(f"{checkpoint / TRAINER_STATE} is inconsistent: {err}") from None

    def save(self) -> Path | None:
        """The checkpoint of this step, written by rank 0 (every rank gathers its part)."""
        state = self.state_dict()
        weights = full_weights_state(self.parallel) if sharded(self.parallel) else None
        if not self.writes:
            return None
        return save_checkpoint(
            self.run_dir,
            self.step_count,
            self.policy,
            state,
            self.cfg.keep_checkpoints,
            self.run_id,
            weights,
        )

    # ----------------------------------------------------------------------- run
    def budget_spent(self) -> bool:
        """The run's tokens, the probe's included, have reached ``cfg.token_budget`` (if any)."""
        spent = tokens_spent(self.tokens["tokens_generated"], self.tokens["tokens_probe"])
        return bool(self.cfg.token_budget) and spent >= self.cfg.token_budget

    def finished(self) -> bool:
        """The run's last step is done: ``cfg.steps`` of them, or the token budget spent."""
        return self.step_count >= self.cfg.steps or self.budget_spent()

    def eval_due(self) -> bool:
        every = self.cfg.eval.every
        return (
            self.step_count == 0 or self.finished() or bool(every and self.step_count % every == 0)
        )

    def train(self) -> list[dict]:
        """Run to ``cfg.steps``, or to the step whose tokens reach ``cfg.token_budget``.
        Evaluation rows (step 0, every ``eval.every`` steps, the last step) are logged with the
        step's metrics under ``eval/…`` and returned."""
        cfg = self.cfg
        if self.read_only:
            raise ValueError("this Trainer was opened read-only (for evaluation); it cannot train")
        evals = []
        if self.step_count == 0 and cfg.eval.at_start:
            evals.append({"step": 0, **self.evaluate()})
            self.log(0, evals[-1])
        bar = tqdm(
            total=cfg.steps,
            initial=self.step_count,
            desc=self.method.name,
            disable=not cfg.progress or not self.writes,
        )
        try:
            while not self.finished():
                metrics = self.step()
                if self.eval_due():
                    evals.append({"step": self.step_count, **self.evaluate()})
                    metrics |= evals[-1]
                self.log(self.step_count, metrics)
                bar.update(1)
                bar.set_postfix(reward=f"{float(metrics['reward']):.3f}")
                if self.finished() or (
                    cfg.checkpoint_every and self.step_count % cfg.checkpoint_every == 0
                ):
                    self.save()
            self.dist.barrier()  # every rank is done before any leaves the process group
        finally:
            bar.close()
            self.close()
        return evals

    def log(self, step: int, metrics: dict) -> None:
        if self.logger is not None:  # rank 0's
            self.logger.log(step, metrics)

    def close(self) -> None:
        """Close the metrics sinks and reward workers, release the run directory's lock and
        leave the process group."""
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        if getattr(self, "collector", None) is not None:
            self.collector.scorer.close()
        if self.lock is not None:
            self.lock.release()
        if getattr(self, "parallel", None) is not None:
            # the DDP/FSDP2 wrapper goes before the process group it holds, not at interpreter
            # exit after the group is gone
            self.parallel, self.full_weights = None, contextlib.nullcontext
            if getattr(self, "forward", None) is not None:
                self.forward.parallel = None
            if getattr(self, "collector", None) is not None:
                self.collector.full_weights = contextlib.nullcontext
            gc.collect()
        self.dist.close()
