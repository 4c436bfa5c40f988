"""Prompts → scored groups (docs/algorithms.md §3 step 3, §4 DAPO dynamic sampling).

:class:`Collector` is the step's sampler: it expands each prompt to G rows, generates them at the
prompt's temperature with the run's engine object (`rlkit.engines.RolloutEngine`: HF
``generate``, the static-cache loop or vLLM; the in-process ones optionally over the dequantized
generation copy, `rlkit.generation_copy`), scores them and shapes the rewards (truncation,
DAPO's overlong penalty). :meth:`Collector.draw` asks the method for a batch of
groups (the method decides how: AGPO probes first) and, with DAPO's dynamic sampling, drops the
groups of identical rewards and draws more prompts until P remain or ``max_gen_batches`` rounds
are spent.

With several processes (``rlkit.dist``) every rank draws the same P prompts and generates its
contiguous share; DAPO's filter then runs on every rank's groups gathered in global order, so
the refill decisions are the same everywhere, and each rank trains its share of the P kept.

Where the tokens' randomness comes from is ``rollout.sampling_stream``. ``rank``: the process's
global RNG, seeded per rank (``rlkit.dist.rank_seed``), so the samples depend on the world size.
``prompt``: each group is generated as a batch of its own under a stream keyed by (seed, the
batch's step, probe or training group, the prompt's index among the prompts this draw took from
the sampler, DAPO's refills continuing the count), so a prompt's group is the same whichever
rank holds it and whatever else is in the batch (docs/scaling-out.md).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence

import torch

from rlkit.batch import CollectStats, Groups
from rlkit.config import RolloutConfig, TrainConfig, run_tis_cap
from rlkit.controllers import ProbeStats
from rlkit.dapo import informative_groups, overlong_penalty
from rlkit.dist import Collective, Local
from rlkit.engines import RolloutEngine, get_engine
from rlkit.fused_lora import fused_lora, resolve_fuse_lora
from rlkit.generation_copy import GenerationCopy
from rlkit.models.loading import Policy
from rlkit.phases import Phases
from rlkit.rewards import RewardScorer, get_reward_fn
from rlkit.rollout import InProcessEngine, model_device, padding_id
from rlkit.rollout_batch import RolloutBatch, concat_rollouts
from rlkit.sampling import PromptSampler
from rlkit.seeding import keyed_seed, seeded
from rlkit.tasks.base import Problem


def build_engine(cfg: TrainConfig, policy: Policy, prompts: Sequence[str] = ()) -> RolloutEngine:
    """The run's engine object, built once from its ``rollout.engine`` entry: the entry's own
    ``build`` (vLLM, sized for the longest of ``prompts`` plus ``rollout.max_new_tokens``; no
    prompts: vLLM's default, the model's context), else an in-process engine on the training
    model with ``rollout.generation_batch_size``, ``rollout.compile`` and the sampler's
    log-probs recorded where truncated IS reads them (`rlkit.tis`)."""
    ro = cfg.rollout
    entry = get_engine(ro.engine)
    if entry.build is None:
        record = run_tis_cap(cfg) is not None
        batch_size = ro.generation_batch_size or None
        return InProcessEngine(
            policy.model, policy.tokenizer, ro.engine, batch_size, record, ro.compile
        )
    max_model_len = None
    if prompts:
        longest = max(map(len, policy.tokenizer(list(prompts))["input_ids"]))
        max_model_len = longest + ro.max_new_tokens
    return entry.build(cfg, policy, max_model_len)


class Collector:
    """Generates and scores groups; ``draw`` fills one step's batch."""

    def __init__(
        self,
        policy: Policy,
        scorer: RewardScorer,
        cfg: RolloutConfig,
        phases: Phases,
        engine: RolloutEngine | None = None,
        dist: Collective | None = None,
        full_weights: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        generation_copy: GenerationCopy | None = None,
        fuse_lora: bool = False,
        sampling_stream: str = "rank",
        seed: int = 0,
    ):
        self.policy, self.scorer, self.cfg, self.phases = policy, scorer, cfg, phases
        # what generates the rows (None: HF generate on the policy's model, one call)
        self.engine = engine or InProcessEngine(policy.model, policy.tokenizer)
        # the ranks, and the full weights for generating outside FSDP2's root (rlkit.parallel)
        self.dist, self.full_weights = dist or Local(), full_weights
        # the dequantized base HF sampling runs over, None: the training weights
        self.generation_copy = generation_copy
        # sample through fused LoRA projections (rlkit.fused_lora; rollout.fuse_lora resolved)
        self.fuse_lora = fuse_lora
        self.probe_tokens = self.reward_failures = 0  # this draw's
        self.prompts: PromptSampler | None = None  # the sampler this draw takes prompts from
        # rollout.sampling_stream, and with "prompt" the keys of this draw's groups: the batch's
        # step, the prompts taken from the sampler so far (every rank's) and, by the id of each
        # Problem object this rank handed out, its index among them and the object (held, so
        # no other object takes its id during the draw)
        self.sampling_stream, self.seed = sampling_stream, seed
        self.batch, self.taken, self.keys = 0, 0, {}

    @classmethod
    def from_config(
        cls,
        cfg: TrainConfig,
        policy: Policy,
        phases: Phases,
        prompts: Sequence[str] = (),
        dist: Collective | None = None,
        full_weights: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> Collector:
        """The run's collector: its reward scorer (in-process or a worker pool), its engine
        object (:func:`build_engine`, for ``prompts``) and, with
        ``rollout.generation_copy=dequantized``, the copy (built here, once)."""
        engine = build_engine(cfg, policy, prompts)
        scorer = RewardScorer(
            get_reward_fn(cfg.task.reward),
            num_workers=cfg.task.reward_workers,
            timeout_s=cfg.task.reward_timeout_s,
            on_error=cfg.task.on_reward_error,
        )
        ro = cfg.rollout
        copy = GenerationCopy(policy.model) if ro.generation_copy == "dequantized" else None
        fuse = resolve_fuse_lora(ro.fuse_lora, ro.engine, cfg.model.mode)
        return cls(
            policy,
            scorer,
            ro,
            phases,
            engine,
            dist,
            full_weights,
            copy,
            fuse,
            ro.sampling_stream,
            cfg.seed,
        )

    @contextlib.contextmanager
    def sampling_weights(self) -> Iterator[None]:
        """The weights HF sampling runs with (rollouts and evaluation): the generation copy's
        dequantized base swapped in, or the training weights as they are; with ``fuse_lora``,
        through fused LoRA projections whose copies are refreshed from the live adapters on
        entry (inside ``full_weights``: FSDP2's unsharded ones)."""
        with contextlib.ExitStack() as stack:
            if self.generation_copy is not None:
                stack.enter_context(self.generation_copy.sampling())
            if self.fuse_lora:
                stack.enter_context(fused_lora(self.policy.model))
            yield

    def __call__(
        self,
        problems: Sequence[Problem],
        temperatures: torch.Tensor,
        stats: ProbeStats | None = None,
        probe: bool = False,
    ) -> Groups:
        """G completions per problem at its temperature, scored; ``probe``: AGPO's probe group
        (its tokens are counted apart)."""
        ro, g = self.cfg, self.cfg.group_size
        prompts, temps = (
            [p.prompt for p in problems for _ in range(g)],
            temperatures.repeat_interleave(g),
        )
        with self.engine_weights():
            if self.sampling_stream == "prompt":
                rollouts = self.keyed_groups(problems, temps, probe)
            else:
                rollouts = self.generate(prompts, temps)
        with self.phases("score"):
            scored = self.scorer.score(
                rollouts.completion_texts, [p.answer for p in problems for _ in range(g)]
            )
        self.reward_failures += scored.num_errors + scored.num_timeouts
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
        if probe:
            self.probe_tokens += int(rollouts.lengths.sum())
        return Groups(
            list(problems), rollouts, rewards.view(len(problems), g), temperatures.float(), stats
        )

    @contextlib.contextmanager
    def engine_weights(self) -> Iterator[None]:
        """The weights the engine samples with: its own where its ``rollout.engine`` entry
        declares them (vLLM), else the training model's full weights (``full_weights``) as
        :meth:`sampling_weights` sets them."""
        if get_engine(self.cfg.engine).own_weights:
            yield
            return
        with self.full_weights(), self.sampling_weights():
            yield

    def generate(self, prompts: list[str], temps: torch.Tensor) -> RolloutBatch:
        """One completion per row of ``prompts`` at ``temps`` with the run's engine, drawing
        from the global RNG."""
        ro = self.cfg
        return self.engine.generate(prompts, temps, ro.max_new_tokens, ro.top_p, ro.top_k)

    def keyed_groups(
        self, problems: Sequence[Problem], temps: torch.Tensor, probe: bool
    ) -> RolloutBatch:
        """``rollout.sampling_stream=prompt``: each problem's G rows generated alone, under
        :func:`rlkit.seeding.keyed_seed` of (seed, step, ``probe`` or ``sample``, its index in
        this draw), so its tokens and their floating-point path depend on nothing else in the
        batch (``problems`` must be ones :meth:`draw` handed out)."""
        g, device = self.cfg.group_size, model_device(self.policy.model)
        purpose = "probe" if probe else "sample"
        parts = []
        for j, problem in enumerate(problems):
            index, handed = self.keys.get(id(problem), (None, None))
            if handed is not problem:
                raise ValueError(
                    "rollout.sampling_stream=prompt keys each group by its prompt's place in "
                    f"the step's batch; problem {problem.id!r} was not drawn by Collector.draw"
                )
            seed = keyed_seed(self.seed, self.batch, purpose, index)
            with seeded(seed, device):
                parts.append(self.generate([problem.prompt] * g, temps[j * g : (j + 1) * g]))
        return concat_rollouts(parts, padding_id(self.policy.model, self.policy.tokenizer))

    def trained_probe(self, groups: Groups) -> Groups:
        """Probe groups the method trains on (AGPO's ``reuse``): from here on their tokens are
        training tokens (``tokens/generated``), not probe overhead, so each counts once."""
        self.probe_tokens -= int(groups.rollouts.lengths.sum())
        return groups

    def cat(self, parts: Sequence[Groups]) -> Groups:
        return Groups.cat(parts, self.policy.tokenizer.pad_token_id)

    def next_problems(self) -> list[Problem]:
        """This rank's share of the next P prompts of the sampler ``draw`` is drawing from
        (DAPO's refills; offline DPO collects ahead of the steps, docs/algorithms.md §4d), each
        a Problem object of its own, keyed by its index among the prompts this draw took (every
        rank's), so a method may sample any of them (AGPO's ``reuse``) and a prompt drawn twice
        keeps two keys."""
        n = self.cfg.num_prompts
        batch = [copy.copy(p) for p in self.prompts.next_batch(n)]
        mine = self.dist.shard(list(zip(range(self.taken, self.taken + n), batch)))
        self.taken += n
        self.keys |= {id(problem): (index, problem) for index, problem in mine}
        return [problem for _, problem in mine]

    def draw(self, prompts: PromptSampler, method, batch: int = 0) -> tuple[Groups, CollectStats]:
        """P prompts with their groups, drawn by ``method`` (``method.groups(problems, self)``)
        for the run's batch ``batch`` (the step that trains it, the stream's key); with several
        processes, this rank's share of them (the counts are the global ones)."""
        ro, dist = self.cfg, self.dist
        self.prompts, self.batch, self.taken, self.keys = prompts, batch, 0, {}
        parts, dropped, batches, generated = [], 0, 0, 0
        self.probe_tokens = self.reward_failures = 0
        while batches < (ro.max_gen_batches if ro.dynamic_sampling else 1):
            groups = method.groups(self.next_problems(), self)
            batches += 1
            if ro.dynamic_sampling:
                groups = self.gathered(groups)  # the filter decides on the global batch
                generated += int(groups.rollouts.lengths.sum())
                keep = informative_groups(groups.rewards)
                dropped += int((~keep).sum())
                if not keep.any() and (parts or batches < ro.max_gen_batches):
                    continue
                groups = groups.select(keep) if keep.any() else groups
            parts.append(groups)
            if sum(len(p.problems) for p in parts) >= ro.num_prompts:
                break
        groups = self.cat(parts)
        if len(groups.problems) > ro.num_prompts:
            groups = groups.select(torch.arange(len(groups.problems)) < ro.num_prompts)
        discarded = 0
        if ro.dynamic_sampling:
            if dist.world > 1:
                # a short batch is cut to a multiple of the world size: every rank trains as
                # many rows (DDP's gradient reductions must match up)
                usable = len(groups.problems) - len(groups.problems) % dist.world
                dropped += len(groups.problems) - usable
                groups = groups.select(torch.arange(len(groups.problems)) < usable)
            discarded = generated - int(groups.rollouts.lengths.sum())  # global: gathered
            if dist.world > 1:
                mine = torch.zeros(len(groups.problems), dtype=torch.bool)
                mine[dist.shard(range(len(groups.problems)))] = True
                groups = groups.select(mine)
        total = dist.all_reduce_sum(torch.tensor([self.probe_tokens, self.reward_failures]))
        return groups, CollectStats(batches, dropped, int(total[0]), int(total[1]), discarded)

    def gathered(self, groups: Groups) -> Groups:
        """Every rank's groups in global order (the same on every rank); one process: ``groups``."""
        if self.dist.world == 1:
            return groups
        device = groups.rollouts.input_ids.device
        parts = self.dist.all_gather_object(groups.to("cpu"))
        return self.cat([p.to(device) for p in parts])
