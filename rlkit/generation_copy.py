"""A dequantized generation copy of a QLoRA policy's base (``rollout.generation_copy: dequantized``).

On the 4-bit path every sampling step runs each base linear through bitsandbytes (a dequantize,
or its fused inference kernel, behind a Python-registered op): at 8B about a third of a decode
step. This copy dequantizes every ``bnb.nn.Linear4bit`` of the model **once**, at start, into a
plain linear in the layer's compute dtype (bf16 on the 8B presets), and swaps those in only while
sampling (:meth:`GenerationCopy.sampling`); the training forward, its gradients and π_old stay
NF4.

- **Exact base, live adapter.** The copy's weight is ``dequantize_4bit(W_nf4).to(compute dtype)``,
  the very matrix the NF4 training forward multiplies by, and only the base layer is swapped:
  peft's LoRA layer around it, with its ``lora_A``/``lora_B`` parameters, scaling and dropout, is
  the trained one. An optimizer step therefore reaches the sampler with nothing to refresh, and
  the adapter stays *unmerged*: merging W + s·BA into bf16 would lose the part of ΔW below half
  an ulp of W (most of it early in training).
- **Not the training forward.** Plain ``F.linear`` where bitsandbytes runs its own kernels (and
  at one token a fused 4-bit GEMV) rounds differently, so the sampler's log-probs are recorded and
  truncated importance sampling corrects the gap (`rlkit.tis`, docs/algorithms.md §4).
- **Memory.** The dense linears cost 2 bytes a weight in bf16 (+12.9 GiB for Qwen3-8B, 19 GiB
  resident with the NF4 base): ``rlkit plan`` counts it (`rlkit.plan.MemoryPlan.generation_copy`);
  :class:`GenerationCopy` refuses to build when the device has not that much free. Where a
  bf16 base fits anyway, ``model.mode=lora`` is the better choice: 15.9 GiB resident at 8B, a
  sampler that is the training forward, and no dequantization in training.

The copy is a function of the peft model alone (the 4-bit layers it finds in it), so other
sampling-only rewrites of the same model (fused LoRA projections) compose with it by running
inside :meth:`GenerationCopy.sampling`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

GIB = 1024**3


class DequantizedLinear(torch.nn.Linear):
    """A 4-bit linear's dequantized weight as a frozen ``nn.Linear``, casting its input to the
    weight's dtype and the output back, as ``bnb.nn.Linear4bit.forward`` does around its matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


def _four_bit_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent, attribute, layer) of every ``bnb.nn.Linear4bit`` in ``model``: under a peft LoRA
    layer the attribute is its ``base_layer``; a linear the adapter does not target is swapped too,
    so sampling runs no bitsandbytes kernel at all."""
    import bitsandbytes as bnb

    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, bnb.nn.Linear4bit)
    ]


def _compute_dtype(layer: torch.nn.Module) -> torch.dtype:
    """The dtype the layer's training forward multiplies in (its input is cast to it)."""
    return layer.compute_dtype or layer.weight.quant_state.dtype


def copy_bytes(model: torch.nn.Module) -> int:
    """Bytes the dequantized weights of ``model``'s 4-bit linears take (biases are shared)."""
    return sum(
        layer.out_features * layer.in_features * _compute_dtype(layer).itemsize
        for _, _, layer in _four_bit_layers(model)
    )


def dequantized(layer: torch.nn.Module) -> DequantizedLinear:
    """``layer`` (a ``bnb.nn.Linear4bit``) as a :class:`DequantizedLinear` holding exactly the
    matrix its training forward uses (``MatMul4Bit``: ``dequantize_4bit(W, state).to(dtype)``),
    sharing its bias."""
    from bitsandbytes.functional import dequantize_4bit

    weight = dequantize_4bit(layer.weight.data, layer.weight.quant_state).to(_compute_dtype(layer))
    dense = DequantizedLinear(
        layer.in_features, layer.out_features, bias=False, device="meta", dtype=weight.dtype
    )
    dense.weight = torch.nn.Parameter(weight, requires_grad=False)
    dense.bias = layer.bias  # shared with the 4-bit layer (frozen; None when it has none)
    return dense


def check_room(needed: int, device: torch.device) -> None:
    """Refuse, naming ``rollout.generation_copy``, a copy of ``needed`` bytes that the CUDA
    ``device`` has not free (the CPU: no limit is known)."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    if needed > free:
        raise ValueError(
            f"rollout.generation_copy=dequantized needs {needed / GIB:.1f} GiB for the "
            f"dequantized linears but only {free / GIB:.1f} of the {total / GIB:.1f} GiB on "
            f"{device} are free: set rollout.generation_copy=none (`rlkit plan --gpu-mem "
            f"{total / GIB:.0f} rollout.generation_copy=dequantized` lists what fits), or "
            "model.mode=lora where its compute-dtype base fits"
        )


class GenerationCopy:
    """The dequantized base of ``model`` (a peft QLoRA model), swapped in by :meth:`sampling`.

    Built once; raises a ValueError naming ``rollout.generation_copy`` when the model has no
    4-bit linear, or when a CUDA device has less free memory than the copy needs."""

    def __init__(self, model: torch.nn.Module):
        layers = _four_bit_layers(model)
        if not layers:
            raise ValueError(
                "rollout.generation_copy=dequantized: the model has no 4-bit linear to "
                "dequantize (it needs model.mode=qlora)"
            )
        needed = copy_bytes(model)
        check_room(needed, layers[0][2].weight.device)
        self.nbytes = needed
        with torch.no_grad():
            self.swaps = [
                (parent, name, layer, dequantized(layer)) for parent, name, layer in layers
            ]

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        """The dequantized linears in place of the 4-bit ones for the duration; the 4-bit ones
        are back afterwards, also on an error."""
        self._swap(on=True)
        try:
            yield
        finally:
            self._swap(on=False)

    def _swap(self, on: bool) -> None:
        for parent, name, four_bit, dense in self.swaps:
            parent._modules[name] = dense if on else four_bit  # setattr would re-register
