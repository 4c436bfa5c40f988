"""Data parallelism: the log-prob pass as the forward a DDP or FSDP2 wrapper sees.

``rlkit.logprobs`` runs the decoder and the output head itself, not the model's ``forward``. A
DDP-wrapped model would then never synchronise: DDP reduces the gradients of what ran through
*its* forward, and the ranks would drift apart without an error. :class:`LogProbPass` makes the
log-prob pass of one micro-batch a module's forward, and that module is what is wrapped:

- ``ddp``: ``DistributedDataParallel(LogProbPass(model))``. Gradients are **summed** over ranks
  (a comm hook), not averaged: the loss is already normalised by the global token or row count
  (``rlkit.update``), so the summed gradient is the one-process gradient of the whole batch.
  Frozen weights (a LoRA base, 4-bit or not) are left out of DDP's synchronisation; the
  trainable ones start from rank 0's (DDP broadcasts them), so a LoRA initialised from each
  rank's own seed still starts identical everywhere.
- ``fsdp2``: ``fully_shard`` on every decoder layer and on the :class:`LogProbPass` root, with
  gradients summed as above (divide factor 1, a plain sum-reduction). Generation and saving run the model outside
  that root, so :func:`unsharded` gathers the full weights around them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rlkit.dist import Collective
from rlkit.logprobs import token_logprobs
from rlkit.models.hf_compat import causal_lm

STRATEGIES = ("ddp", "fsdp2")


class LogProbPass(torch.nn.Module):
    """:func:`rlkit.logprobs.token_logprobs` of ``model`` as this module's forward; ``value_head``
    (PPO's, docs/algorithms.md §4c) is a submodule, so its gradients synchronise too."""

    def __init__(self, model: torch.nn.Module, value_head: torch.nn.Module | None = None):
        super().__init__()
        self.model, self.value_head = model, value_head

    def forward(self, *args, with_values: bool = False):
        return token_logprobs(self.model, *args, self.value_head if with_values else None)


def _sum_allreduce(group, bucket):  # DDP checks these annotations as objects: none given
    """DDP comm hook: the sum of every rank's gradient bucket (DDP's default averages it)."""
    work = torch.distributed.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def wrap(
    model: torch.nn.Module,
    strategy: str,
    dist: Collective,
    value_head: torch.nn.Module | None = None,
) -> torch.nn.Module:
    """The data-parallel log-prob pass of ``model`` and its ``value_head`` (see the module
    docstring)."""
    module = LogProbPass(model, value_head)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        frozen = [n for n, p in module.named_parameters() if not p.requires_grad]
        DDP._set_params_and_buffers_to_ignore_for_model(module, frozen)
        device = next(model.parameters()).device
        ddp = DDP(module, device_ids=[device] if device.type == "cuda" else None)
        ddp.register_comm_hook(None, _sum_allreduce)
        return ddp
    if strategy == "fsdp2":
        import torch.distributed as tdist
        from torch.distributed.fsdp import fully_shard

        for p in module.parameters():  # every rank starts from rank 0's weights (LoRA init)
            if p.requires_grad:
                tdist.broadcast(p.data, src=0)
        for layer in _decoder_layers(model):
            fully_shard(layer)
        fully_shard(module)
        # FSDP2 takes the first module to run forward for its root; generation runs the layers
        # before any log-prob pass does, so the root is settled here (torch's own lazy init)
        module._get_fsdp_state()._lazy_init()
        for sharded in _fsdp_modules(module):  # a plain sum (gloo has no pre-scaled sum)
            sharded.set_gradient_divide_factor(1.0)
            sharded.set_force_sum_reduction_for_comms(True)
        return module
    raise ValueError(f"parallel.strategy={strategy!r}; known: {list(STRATEGIES)}")


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    decoder = causal_lm(model).get_decoder()
    return list(getattr(decoder, "layers", []))


def _fsdp_modules(module: torch.nn.Module | None) -> list:
    if module is None:
        return []
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def sharded(wrapped: torch.nn.Module | None) -> bool:
    """Whether ``wrapped`` shards the weights (FSDP2)."""
    return bool(_fsdp_modules(wrapped))


@contextlib.contextmanager
def unsharded(wrapped: torch.nn.Module | None) -> Iterator[None]:
    """The full weights in place for code that runs the model outside the FSDP2 root
    (generation, evaluation, saving); nothing to do for DDP or one process."""
    shards = _fsdp_modules(wrapped)
    if not shards:
        yield
        return
    for m in shards:  # kept whole through every forward: ranks may run different numbers
        m.unshard()
        m.set_reshard_after_forward(False)
    try:
        yield
    finally:
        for m in shards:
            m.set_reshard_after_forward(True)
            m.reshard()


def _full() -> object:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_weights_state(wrapped: torch.nn.Module) -> dict[str, torch.Tensor]:
    """FSDP2: the policy's whole state dict (rank 0 holds it; a collective), keys as the
    unwrapped model names them."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(wrapped, options=_full())
    return {name.removeprefix("model."): value for name, value in state.items()}


def optimizer_state(wrapped: torch.nn.Module | None, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state as a checkpoint holds it once: FSDP2's shards gathered into the
    whole state (keyed by parameter name; a collective), else the optimizer's own."""
    if not sharded(wrapped):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(wrapped, optimizer, options=_full())


def load_optimizer_state(
    wrapped: torch.nn.Module | None, optimizer: torch.optim.Optimizer, state: dict
) -> None:
    """Inverse of :func:`optimizer_state` (every rank passes the whole state)."""
    if not sharded(wrapped):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(wrapped, optimizer, optim_state_dict=state, options=options)
