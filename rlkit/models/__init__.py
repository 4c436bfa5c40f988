"""Policies: loading, the built-in tiny Llama and its character tokenizer, GGUF checkpoints, and
the one home of transformers/peft version shims (:mod:`rlkit.models.hf_compat`)."""
