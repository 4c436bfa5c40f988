"""Policies: the built-in tiny Llama and its character tokenizer."""
