"""The training forward: per-token log-probs at the ratio temperature, as the step's passes.

- `sequence_logprobs` recomputes log π(y_t | y_<t) / T per completion token (with or without
  grad) and, optionally, the full-vocabulary entropy at T = 1 (docs/algorithms.md §3 step 4), in
  bounded memory (micro-batches of rows, chunks of positions, a shared prompt forward).
- `PolicyForward` runs it in the configured bounds as the step's four passes: π_old before the
  update (`old`), the reference policy (`reference`), the training forward (`train`) and AGPO's
  pass after the update (`after`); which of them run is `rlkit.pass_plan.PassPlan`'s decision.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
import torch.utils.checkpoint
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from rlkit.batch import PolicyPass
from rlkit.config import TrainConfig
from rlkit.losses import entropy_from_logits
from rlkit.models.hf_compat import cache_keyword, causal_lm
from rlkit.models.loading import Policy, eval_mode
from rlkit.phases import Phases
from rlkit.rollout import model_device
from rlkit.rollout_batch import RolloutBatch


def _output_head(lm: torch.nn.Module) -> torch.nn.Module:
    """The output projection, applied here as a plain linear map of the final hidden states."""
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(lm.config, name, None) not in (None, 1.0):
            raise ValueError(
                f"sequence_logprobs applies the output head as a plain linear map, but the model's "
                f"config sets {name}={getattr(lm.config, name)!r}"
            )
    return lm.get_output_embeddings()


def _chunk_logprobs(
    head: torch.nn.Module,
    states: torch.Tensor,
    targets: torch.Tensor,
    temperatures: torch.Tensor,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(z / T)[y] and, optionally, H(softmax(z)) for one chunk of positions.

    ``states`` may hold one position more than ``targets`` (the last one predicts past the end
    and is dropped). The logits are divided by T in place: the only [B, C, V] tensors alive are
    the chunk's logits and the logsumexp's workspace.
    """
    logits = head(states)[:, : targets.shape[1]]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    entropy = None
    if compute_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    logits.div_(temperatures[:, None, None])
    logp = logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return logp, entropy


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that follow the attention mask, so left padding does not shift positions."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def _take_rows(prompts: torch.Tensor, row_prompt: torch.Tensor) -> torch.Tensor:
    """``prompts[row_prompt]`` (row i: its prompt's tensor) by ``index_select``, whose backward
    sums each prompt's rows in row order (``index_add_``) at any thread count. Advanced
    indexing's backward, ``index_put_(accumulate=True)``, adds them with atomic float adds in a
    parallel loop on CPU once a tensor has 32768 elements (more than one thread; float32), so
    rows of one prompt on different threads summed in a run-to-run varying order; on one thread
    both sum in row order, bit for bit alike."""
    return prompts.index_select(0, row_prompt)


def _completion_states(
    lm: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    share_prompts: bool,
) -> torch.Tensor:
    """Final hidden states from position ``prompt_length - 1`` on, [B, Lc + 1, H]: position t
    predicts completion token t.

    ``share_prompts``: rows with the same prompt (a group's G completions) share its forward. Each
    distinct prompt runs through the decoder once; its keys and values are then copied to its rows,
    and the completion positions attend to them. Causal attention makes the prompt's states
    independent of the completion, so this is the same computation as one pass over every row
    (equal up to float rounding; gradients reach the prompt positions through the copies), with the
    prompt positions costing 1/G of theirs, forward and backward. The keys and values travel in a
    `_PromptCache`, which gradient checkpointing's replay cannot rewrite (`_cache_kept`).
    """
    decoder = lm.get_decoder()
    positions = _positions(attention_mask)
    if share_prompts:
        prompts = torch.cat([input_ids[:, :prompt_length], attention_mask[:, :prompt_length]], 1)
        distinct, row_prompt = torch.unique(prompts, dim=0, return_inverse=True)
        if len(distinct) < len(prompts):
            prompt_mask = distinct[:, prompt_length:]
            keyword = cache_keyword(decoder)
            recorded = _PromptCache()
            with _cache_kept(decoder):
                prefix = decoder(
                    input_ids=distinct[:, :prompt_length],
                    attention_mask=prompt_mask,
                    position_ids=_positions(prompt_mask),
                    use_cache=False,
                    **{keyword: recorded},
                ).last_hidden_state
                completion = decoder(
                    input_ids=input_ids[:, prompt_length:],
                    attention_mask=attention_mask,
                    position_ids=positions[:, prompt_length:],
                    use_cache=False,
                    **{keyword: recorded.for_rows(row_prompt, decoder, prompt_length)},
                ).last_hidden_state
            return torch.cat([_take_rows(prefix[:, -1:], row_prompt), completion], dim=1)
    hidden = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False
    ).last_hidden_state
    return hidden[:, prompt_length - 1 :]


class _RecordedPrompt(DynamicLayer):
    """One decoder layer's prompt keys and values, as the prompt pass computes them.

    The prompt pass starts from no past, so ``update`` returns its input; it stores the first
    keys and values it sees and ignores later ones: a checkpoint replay of the prompt layer in
    backward recomputes them, but the completion's graph holds the stored ones, which are kept.
    """

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.keys, self.values = key_states, value_states
            self.device, self.is_initialized = key_states.device, True
        return key_states, value_states


class _ReadOnlyPrompt(DynamicLayer):
    """One decoder layer's prompt keys and values for the completion pass, read and never written.

    ``update`` returns cat(prompt, new) and stores nothing, so a checkpoint replay of the layer
    in backward sees the same prompt as the forward did (a growing cache would give the replay
    the completion's keys twice). Gradients reach the prompt positions through the
    concatenation.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values = keys, values
        self.device, self.is_initialized = keys.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        return (
            torch.cat([self.keys, key_states], dim=-2),
            torch.cat([self.values, value_states], dim=-2),
        )


class _PromptCache(Cache):
    """The shared prompt forward's key/value cache: the prompt pass fills one `_RecordedPrompt`
    per decoder layer (lazily, as HF's `DynamicCache` does); `for_rows` hands each row its
    prompt's keys and values as `_ReadOnlyPrompt` layers."""

    def __init__(self, layers: list[DynamicLayer] | None = None):
        if layers is None:
            super().__init__(layer_class_to_replicate=_RecordedPrompt)
        else:
            super().__init__(layers=layers)

    def for_rows(
        self, row_prompt: torch.Tensor, decoder: torch.nn.Module, prompt_length: int
    ) -> _PromptCache:
        """Row i reads prompt ``row_prompt[i]``'s keys and values (an index_select: the rows'
        gradients reach the prompt summed in row order, `_take_rows`). A decoder that did not
        pass every layer's keys and values through the cache cannot share its prompts:
        RuntimeError."""
        layers = decoder.config.get_text_config().num_hidden_layers
        lengths = [layer.get_seq_length() for layer in self.layers]
        if lengths != [prompt_length] * layers:
            raise PromptSharingError(
                f"optim.share_prompt_forward needs every decoder layer's keys and values of the "
                f"prompts, and {type(decoder).__name__} passed {len(lengths)} of {layers} layers "
                f"through its cache (lengths {sorted(set(lengths))}, prompt {prompt_length})"
            )
        return _PromptCache(
            [
                _ReadOnlyPrompt(_take_rows(la.keys, row_prompt), _take_rows(la.values, row_prompt))
                for la in self.layers
            ]
        )


class PromptSharingError(RuntimeError):
    """The policy cannot share each prompt's forward across its rows (`prompt_sharing_refusal`);
    its message names the reason (``args[0]``) and the remedy, at start or during training."""

    def __str__(self) -> str:
        return f"{self.args[0]}; set optim.share_prompt_forward=false"


def _checkpointed_layers(decoder: torch.nn.Module) -> list[GradientCheckpointingLayer]:
    return [
        m
        for m in decoder.modules()
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    ]


def _checkpointing_refusal(layers: list[GradientCheckpointingLayer]) -> str | None:
    """Why these checkpointed layers cannot keep the read-only prompt cache (`_cache_kept`), or
    None: a transformers without ``_can_checkpoint_with_cache``, or reentrant checkpointing."""
    if not layers:
        return None
    layer, checkpoint = layers[0], layers[0]._gradient_checkpointing_func
    if not hasattr(layer, "_can_checkpoint_with_cache"):
        return (
            "optim.share_prompt_forward with model.gradient_checkpointing=true needs a "
            "transformers whose GradientCheckpointingLayer keeps a read-only cache "
            f"(_can_checkpoint_with_cache; {type(layer).__name__} has none)"
        )
    if getattr(checkpoint, "keywords", {}).get("use_reentrant", True) is not False:
        return (
            "optim.share_prompt_forward under gradient checkpointing needs non-reentrant "
            "checkpointing (use_reentrant=False, as rlkit enables it): a reentrant one does "
            "not differentiate the prompt keys and values the completion reads"
        )
    return None


def prompt_sharing_refusal(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot share each prompt's forward across its rows, or None where it can
    (docs/algorithms.md §4, "One prompt forward per group"): it has no HF decoder, its
    checkpointing cannot keep the prompt cache (`_checkpointing_refusal`), or a probe (two rows
    of one two-token prompt, no grad, eval mode, so no randomness is drawn) finds a decoder layer
    that does not pass its keys and values through the cache (`_PromptCache.for_rows`) or fails
    in any other way (a decoder that refuses rlkit's cache, its mask or its positions): a policy
    the default cannot share with trains on the plain forward rather than failing to start."""
    lm = causal_lm(model)
    if not hasattr(lm, "get_decoder"):
        return f"optim.share_prompt_forward needs an HF causal LM, got {type(lm).__name__}"
    if refusal := _checkpointing_refusal(_checkpointed_layers(lm.get_decoder())):
        return refusal
    ids = torch.zeros(2, 3, dtype=torch.long, device=model_device(model))
    try:
        with torch.no_grad(), eval_mode(model):
            _completion_states(lm, ids, torch.ones_like(ids), 2, share_prompts=True)
    except PromptSharingError as err:
        return err.args[0]
    except Exception as err:  # noqa: BLE001 - any failure of the shared forward is a refusal
        return f"the shared prompt forward failed on a probe ({type(err).__name__}: {err})"
    return None


@contextmanager
def _cache_kept(decoder: torch.nn.Module):
    """Let checkpointed decoder layers keep the `_PromptCache` during the shared prompt forward.

    Under gradient checkpointing HF's `GradientCheckpointingLayer` drops a layer's cache unless
    the layer sets ``_can_checkpoint_with_cache`` (for layers that only read it, so the replay
    in backward reads the same states). `_PromptCache` makes every layer such a reader, so the
    flag is set on each checkpointed layer for the two calls (the replays use the cache the
    calls were given). The keys and values leave the checkpointed region by the cache, not as
    its output, which only non-reentrant checkpointing differentiates: with a reentrant one, or
    a transformers without the flag, this raises instead of training on wrong gradients.
    """
    active = torch.is_grad_enabled()
    layers = [m for m in _checkpointed_layers(decoder) if m.training]
    if active and (refusal := _checkpointing_refusal(layers)):
        raise PromptSharingError(refusal)
    flagged = [m for m in layers if not m._can_checkpoint_with_cache] if active else []
    for m in flagged:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in flagged:
            del m._can_checkpoint_with_cache


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    temperatures: torch.Tensor,
    compute_entropy: bool,
    chunk_size: int | None,
    share_prompts: bool,
    value_head: torch.nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One micro-batch: log softmax(z / T)[y] at completion positions, H(softmax(z)), and with
    ``value_head`` PPO's values V(s_t) from the same states (docs/algorithms.md §4c).

    The decoder gives the states (`_completion_states`); the output head then runs over
    ``chunk_size`` completion positions at a time (None: all at once), so full-vocabulary logits
    exist for one chunk only. With grad, each chunk is checkpointed: backward recomputes its
    logits instead of keeping them. The state that predicts completion token t is s_t, the
    state V(s_t) values (TRL's and verl's ``values[:, prompt_length - 1 : -1]``).
    """
    completion_width = input_ids.shape[1] - prompt_length
    lm = causal_lm(model)
    states = _completion_states(lm, input_ids, attention_mask, prompt_length, share_prompts)
    targets = input_ids[:, prompt_length:]
    head = _output_head(lm)
    step = chunk_size or completion_width + 1
    recompute = chunk_size is not None and torch.is_grad_enabled()
    logps, entropies = [], []
    for start in range(0, completion_width, step):
        args = (head, states[:, start : start + step], targets[:, start : start + step])
        if recompute:
            logp, entropy = torch.utils.checkpoint.checkpoint(
                _chunk_logprobs, *args, temperatures, compute_entropy, use_reentrant=False
            )
        else:
            logp, entropy = _chunk_logprobs(*args, temperatures, compute_entropy)
        logps.append(logp)
        entropies.append(entropy)
    values = None
    if value_head is not None:
        weight = value_head.weight
        values = value_head(states[:, :completion_width].to(weight.dtype)).squeeze(-1)
    if len(logps) == 1:
        return logps[0], entropies[0], values
    entropy = torch.cat(entropies, dim=1) if compute_entropy else None
    return torch.cat(logps, dim=1), entropy, values


def sequence_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    temperatures: torch.Tensor | None = None,
    compute_entropy: bool = False,
    micro_batch_size: int | None = None,
    chunk_size: int | None = None,
    share_prompts: bool = False,
    micro_pass: torch.nn.Module | None = None,
    value_head: torch.nn.Module | None = None,
) -> (
    tuple[torch.Tensor, torch.Tensor | None]
    | tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]
):
    """Per-token log π(y_t | x, y_<t) at each row's temperature, [B, Lc] (docs/algorithms.md §3, §4).

    `temperatures` [B] (None = 1 for every row) scale the logits before the softmax, matching
    how the completions were sampled. With `compute_entropy`, also returns the entropy (nats)
    of the full-vocabulary distribution at T = 1 (docs/algorithms.md §3 step 4), without grad. Positions
    outside `completion_mask` are 0. Runs with grad unless the caller wraps it in no_grad.
    Position ids follow the attention mask, so left padding does not shift positions.
    Memory: ``micro_batch_size`` rows go through the model at a time and the output head sees
    ``chunk_size`` completion positions at a time (None: all of them), so the largest
    full-vocabulary tensor is [micro_batch_size, chunk_size, V]. ``share_prompts``: rows of a
    micro-batch with the same prompt share its forward (`_completion_states`). ``micro_pass``:
    the module whose forward runs one micro-batch of ``model`` (a DDP- or FSDP2-wrapped
    :class:`rlkit.parallel.LogProbPass`, so that gradients synchronise); None: `token_logprobs`.
    ``value_head``: also return PPO's values [B, Lc] from the same forward (0 at padding), a
    third element (a wrapped ``micro_pass`` holds the policy's head itself).
    """
    rows = len(batch)
    device = model_device(model)
    if temperatures is None:
        temperatures = torch.ones(rows)
    temperatures = torch.as_tensor(temperatures, dtype=torch.float32).to(device)
    if temperatures.shape != (rows,) or not bool((temperatures > 0).all()):
        raise ValueError(
            f"temperatures must be [{rows}] values > 0, got shape {tuple(temperatures.shape)}"
        )
    step = micro_batch_size or rows
    if step < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 (or None), got {chunk_size}")

    batch = batch.to(device)
    if micro_pass is not None:
        run = partial(micro_pass, with_values=value_head is not None)
    else:
        run = partial(token_logprobs, model, value_head=value_head)
    logps, entropies, values = [], [], []
    for start in range(0, rows, step):
        part = slice(start, start + step)
        logp, entropy, value = run(
            batch.input_ids[part],
            batch.attention_mask[part],
            batch.prompt_length,
            temperatures[part],
            compute_entropy,
            chunk_size,
            share_prompts,
        )
        logps.append(logp)
        entropies.append(entropy)
        values.append(value)
    mask = batch.completion_mask
    logp = torch.cat(logps).masked_fill(~mask, 0.0)
    entropy = torch.cat(entropies).masked_fill(~mask, 0.0) if compute_entropy else None
    if value_head is None:
        return logp, entropy
    return logp, entropy, torch.cat(values).masked_fill(~mask, 0.0)


class PolicyForward:
    """`sequence_logprobs` in the configured memory bounds, as the step's passes: ``micro`` rows
    per pass (default the no-grad log-prob micro-batch) and ``optim.logprob_chunk_size``
    positions per head call, sharing each prompt's forward across its rows with
    ``share_prompts`` (`PassPlan.share_prompts`, resolved for the policy). ``parallel``: the
    policy's data-parallel log-prob pass (``rlkit.parallel.wrap``), which every pass of the
    policy then runs through."""

    def __init__(
        self,
        policy: Policy,
        cfg: TrainConfig,
        phases: Phases,
        parallel: torch.nn.Module | None = None,
        *,
        share_prompts: bool,
    ):
        self.policy, self.phases, self.parallel = policy, phases, parallel
        self.opt, self.ratio_temperature = cfg.optim, cfg.loss.ratio_temperature
        self.share_prompts = share_prompts

    def __call__(self, model, rollouts, temps, compute_entropy=False, micro=None, values=False):
        """(log-probs, entropy) of ``model``; ``values``: and the policy's values, a third."""
        opt = self.opt
        micro = micro or opt.logprob_micro_batch_size or opt.micro_batch_size or None
        return sequence_logprobs(
            model,
            rollouts,
            temps,
            compute_entropy,
            micro,
            opt.logprob_chunk_size or None,
            self.share_prompts,
            self.parallel if model is self.policy.model else None,
            self.policy.value_head if values else None,
        )

    def ratio_temperatures(self, rollouts: RolloutBatch) -> torch.Tensor:
        """Temperature of the importance ratio: each row's sampling τ (default) or a constant
        (``1.0`` reproduces AGPO's code, docs/algorithms.md §3 known flaws)."""
        t = self.ratio_temperature
        return (
            rollouts.temperatures.float()
            if t == "sampling"
            else torch.full((len(rollouts),), float(t))
        )

    @torch.no_grad()
    def old(
        self, rollouts: RolloutBatch, temps: torch.Tensor, entropy: bool, values: bool = False
    ) -> PolicyPass:
        """π_old before the update, in eval mode (it samples without dropout); ``values``: and
        the value head's V_old (PPO, docs/algorithms.md §4c)."""
        with self.phases("old"), eval_mode(self.policy.model):
            return PolicyPass(*self(self.policy.model, rollouts, temps, entropy, values=values))

    @torch.no_grad()
    def reference(self, rollouts: RolloutBatch, temps: torch.Tensor) -> torch.Tensor:
        with self.phases("reference"), self.policy.reference() as ref_model:
            return self(ref_model, rollouts, temps)[0]

    def train(
        self, rollouts: RolloutBatch, temps: torch.Tensor, entropy: bool, values: bool = False
    ):
        """The training forward, with grad, over exactly these rows (one micro-batch): log-probs,
        entropy (or None) and values (or None)."""
        out = self(self.policy.model, rollouts, temps, entropy, len(rollouts), values)
        return out if values else (*out, None)

    @torch.no_grad()
    def after(self, rollouts: RolloutBatch, temps: torch.Tensor) -> torch.Tensor:
        """The updated policy's log-probs, in eval mode (AGPO's step KL, docs/algorithms.md §3
        step 5)."""
        with self.phases("step_kl"), eval_mode(self.policy.model):
            return self(self.policy.model, rollouts, temps)[0]
