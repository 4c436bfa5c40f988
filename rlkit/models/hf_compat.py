"""Where transformers and peft differ by release or by wrapper: one answer each for the rest of
rlkit (the training forward, the static decoder, the data-parallel wrappers, the loader)."""

from __future__ import annotations

import inspect

import torch


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The HF causal LM inside ``model`` (a peft wrapper's base model, with its LoRA layers)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_keyword(decoder: torch.nn.Module) -> str:
    """The decoder's name for a key/value cache argument: ``cache`` (transformers 5.x) or
    ``past_key_values`` (4.x; deprecated in 5.x)."""
    parameters = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in backward (non-reentrant: no input-grad hooks needed under LoRA)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
