"""Fused LoRA for sampling (``rollout.fuse_lora``; docs/training.md's 8B QLoRA path, docs/algorithms.md §4).

peft's LoRA layer runs, per projection, the base layer and then about seven small kernels (a
defensive clone on 4-bit layers, casts to the adapter's float32, two matmuls, the scaling, the
cast back, the add). In a launch-bound decode step that is most of the LoRA cost. While sampling,
:func:`fused_lora` replaces the forward of every plain LoRA linear layer of a peft model by

    y = base(x);  y += s · (x A_cat^T)[:, slice] B^T   (one ``addmm_`` with alpha = s)

where the layers that read the same input — a decoder layer's q/k/v, and its MLP gate/up — share
one ``x @ cat(A_q, A_k, A_v)^T``; every other LoRA layer (o, down) is a group of one. A and B are
copies in the model's compute dtype (the input embeddings' dtype: bfloat16 on the 8B presets),
kept per model and refreshed from the live adapter weights each time the context is entered:
after every optimizer step, checkpoint load or FSDP2 unshard, the next sampling call reads the new
weights (a stale copy is the one way this could go wrong; tests/test_fused_lora.py checks it).

It is invisible to training: the fused forward runs only in no-grad, eval-mode calls without extra
arguments (so LoRA dropout, which only acts in training mode, never applies) and peft's own forward
runs otherwise; the forwards are restored on exit. The sampler then differs from the training
forward by the bf16 LoRA arithmetic (against peft's float32), which truncated importance sampling
(`rlkit.tis`) corrects like the rest of the static loop's rounding. Layers that fusion would get
wrong keep peft's forward, with a warning naming the layer and the reason: an adapter merged into
the base or switched off, more than one active adapter, a LoRA variant (DoRA, ...), a LoRA bias,
or a layer type other than a linear one. Unsloth fuses the same way (its ``matmul_lora``).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Iterator

import torch
from peft.tuners.lora import LoraLayer

from rlkit.engines import get_engine

# projections of one module that read the same input (Llama, Qwen, Mistral, ... names)
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def resolve_fuse_lora(value: bool | str, engine: str, mode: str) -> bool:
    """Whether ``rollout.fuse_lora`` fuses: ``auto`` on the static decode loop of a LoRA/QLoRA
    model (`rlkit.config.ignored_settings` refuses an explicit value that cannot act)."""
    if value == "auto":
        return get_engine(engine).fuses_lora and mode != "full"
    return bool(value)


def _linear_lora_types() -> tuple[type, ...]:
    """peft's LoRA layers over a linear base whose forward is base(x) + s·B(A(dropout(x)))."""
    from peft.tuners.lora import Linear, bnb

    return (
        Linear,
        *(getattr(bnb, name) for name in ("Linear4bit", "Linear8bitLt") if hasattr(bnb, name)),
    )


def _unfusable(layer: torch.nn.Module) -> tuple[str | None, str | None]:
    """(the active adapter, None) for a layer fusion handles exactly, else (None, why not)."""
    if not isinstance(layer, _linear_lora_types()):
        return None, f"{type(layer).__name__} is not a linear LoRA layer"
    if layer.merged:
        return None, "its adapter is merged into the base weights"
    if layer.disable_adapters:
        return None, "its adapters are switched off"
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if len(active) != 1:
        return None, f"it has {len(active)} active adapters (fusion takes one)"
    adapter = active[0]
    variant = getattr(layer, "lora_variant", {}).get(adapter)  # peft >= 0.16
    if variant is not None:
        return None, f"adapter {adapter!r} is a {type(variant).__name__}"
    if getattr(layer, "use_dora", {}).get(adapter, False):  # peft < 0.16 marks DoRA here
        return None, f"adapter {adapter!r} is a DoRA adapter"
    if layer.lora_B[adapter].bias is not None:
        return None, f"adapter {adapter!r} has a LoRA bias"
    return adapter, None


class _Group:
    """LoRA layers that read the same input: ``x @ cat(A)^T`` once, then each layer's slice
    times its B, added to its base output in place."""

    def __init__(self, layers: list[tuple[torch.nn.Module, str]], dtype: torch.dtype):
        self.layers = layers
        ranks = [layer.lora_A[adapter].out_features for layer, adapter in layers]
        self.slices = [slice(sum(ranks[:i]), sum(ranks[: i + 1])) for i in range(len(ranks))]
        first, adapter = layers[0]
        device = first.lora_A[adapter].weight.device
        self.a = torch.empty(
            sum(ranks), first.lora_A[adapter].in_features, dtype=dtype, device=device
        )
        self.b = [
            torch.empty_like(layer.lora_B[name].weight, dtype=dtype, device=device)
            for layer, name in layers
        ]
        self.scaling = [0.0] * len(layers)
        self.originals: list = [None] * len(layers)  # the forwards peft runs in training
        self.own: list = [None] * len(layers)  # a forward set on the instance before ours
        self.forwards = [self._forward_of(i) for i in range(len(layers))]
        self._clear()

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the live adapter weights (and scalings) into the compute-dtype copies."""
        for i, (layer, adapter) in enumerate(self.layers):
            self.a[self.slices[i]].copy_(layer.lora_A[adapter].weight)
            self.b[i].copy_(layer.lora_B[adapter].weight)
            self.scaling[i] = float(layer.scaling[adapter])

    def _clear(self) -> None:
        self.input = self.xa = None
        self.pending: set[int] = set()

    def _forward_of(self, i: int):
        layer = self.layers[i][0]

        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            if args or kwargs or layer.training or torch.is_grad_enabled():
                return self.originals[i](x, *args, **kwargs)
            result = layer.base_layer(x)
            if x is not self.input or i not in self.pending:  # a new input: its A product
                self.input, self.pending = x, set(range(len(self.layers)))
                self.xa = x.reshape(-1, x.shape[-1]).to(self.a.dtype) @ self.a.T
            xa = self.xa[:, self.slices[i]]
            self.pending.discard(i)
            if not self.pending:  # every layer of the group has its part: hold nothing
                self._clear()
            result.view(-1, result.shape[-1]).addmm_(xa, self.b[i].T, alpha=self.scaling[i])
            return result

        return forward

    def swap(self) -> None:
        for i, (layer, _) in enumerate(self.layers):
            self.originals[i], self.own[i] = layer.forward, layer.__dict__.get("forward")
            layer.forward = self.forwards[i]

    def restore(self) -> None:
        self._clear()
        for i, (layer, _) in enumerate(self.layers):
            del layer.forward
            if self.own[i] is not None:
                layer.forward = self.own[i]
            self.originals[i] = self.own[i] = None


class FusedLoRA:
    """The fused groups of one model, with their compute-dtype copies, and the layers left to
    peft's forward (``skipped``: name → reason)."""

    def __init__(self, model: torch.nn.Module):
        self.dtype = model.get_input_embeddings().weight.dtype
        self.skipped: dict[str, str] = {}
        groups: dict[tuple, list[tuple[torch.nn.Module, str]]] = {}
        for name, module in model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            adapter, reason = _unfusable(module)
            if reason is not None:
                self.skipped[name] = reason
                continue
            parent, _, leaf = name.rpartition(".")
            shared = next((i for i, names in enumerate(SHARED_INPUT) if leaf in names), None)
            width = module.lora_A[adapter].in_features
            key = (parent, shared, width) if shared is not None else (name,)
            groups.setdefault(key, []).append((module, adapter))
        self.groups = [_Group(layers, self.dtype) for layers in groups.values()]
        self.signature = _signature(model)
        self.swapped = False

    @contextlib.contextmanager
    def active(self) -> Iterator[FusedLoRA]:
        """Refresh the copies and swap the fused forwards in (a nested entry: as it is)."""
        if self.swapped:
            yield self
            return
        for group in self.groups:
            group.refresh()
        for group in self.groups:
            group.swap()
        self.swapped = True
        try:
            yield self
        finally:
            self.swapped = False
            for group in self.groups:
                group.restore()


def _signature(model: torch.nn.Module) -> tuple:
    """What the fused groups depend on: each LoRA layer, its state and its adapters' shapes."""
    return tuple(
        (
            id(module),
            _unfusable(module),
            tuple((k, tuple(a.weight.shape)) for k, a in module.lora_A.items()),
            tuple((k, tuple(b.weight.shape)) for k, b in module.lora_B.items()),
        )
        for module in model.modules()
        if isinstance(module, LoraLayer)
    ) + (model.get_input_embeddings().weight.dtype,)


_BUILT: weakref.WeakKeyDictionary[torch.nn.Module, FusedLoRA] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def fused_lora(model: torch.nn.Module) -> Iterator[FusedLoRA]:
    """Sample ``model`` (a peft LoRA/QLoRA model) through the fused LoRA path (module docstring)
    inside the context; peft's forwards come back on exit. The groups are built once per model
    (again if its LoRA layers change) and their copies refreshed on every entry."""
    fused = _BUILT.get(model)
    if fused is None or fused.signature != _signature(model):
        fused = _BUILT[model] = FusedLoRA(model)
    if fused.skipped:
        name, reason = next(iter(fused.skipped.items()))
        warnings.warn(
            f"rollout.fuse_lora: {len(fused.skipped)} LoRA layer(s) keep peft's forward, e.g. "
            f"{name}: {reason}",
            stacklevel=3,
        )
    with fused.active():
        yield fused
