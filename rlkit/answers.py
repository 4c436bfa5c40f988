"""Final-answer extraction and vote entropy over a group's answers (docs/algorithms.md §3 step 1)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import torch

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_WHITESPACE = re.compile(r"\s+")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced: no complete boxed answer


def normalize_answer(text: str) -> str:
    """Lower-case, strip, collapse whitespace, drop a trailing period and thousands separators."""
    text = _WHITESPACE.sub(" ", text.strip().lower()).rstrip(".")
    return text.replace(",", "") if _NUMBER.fullmatch(text) else text


def extract_answer(text: str) -> str:
    """Answer key of a completion: last ``\\boxed{…}``, else text after the last ``####``,
    else the last number, else the normalised whole text."""
    boxed = last_boxed(text)
    if boxed is not None:
        return normalize_answer(boxed)
    if "####" in text:
        return normalize_answer(text.rsplit("####", 1)[1])
    numbers = _NUMBER.findall(text)
    if numbers:
        return normalize_answer(numbers[-1])
    return normalize_answer(text)


def vote_entropy(answers: Sequence[Sequence[str]]) -> torch.Tensor:
    """Shannon entropy (nats) of the empirical distribution of each group's answer keys.

    ``answers[p]`` holds the G completions (or already-extracted keys) of prompt p; each is
    mapped through :func:`extract_answer`. The maximum is ln G (all answers different).
    """
    out = []
    for group in answers:
        counts = Counter(extract_answer(a) for a in group)
        n = sum(counts.values())
        out.append(-sum(c / n * math.log(c / n) for c in counts.values()) if n else 0.0)
    return torch.tensor(out, dtype=torch.float32)
