"""Final-answer extraction and vote entropy over a group's answers (docs/algorithms.md §3 step 1)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import torch

# A number in free text: a fraction a/b (a and b integers or decimals without thousands
# separators, an optional minus before a, no spaces around the slash), else an integer or decimal
# with optional minus and thousands separators. The fraction comes first so that "3/4" is read
# whole, not as "3" and "4".
_UNSIGNED = r"(?:\d+(?:\.\d+)?|\.\d+)"
_FRACTION = re.compile(rf"(-?{_UNSIGNED})/({_UNSIGNED})")
_NUMBER = re.compile(rf"{_FRACTION.pattern}|-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
# A whole delimited answer (boxed, after ####) may space its slash: "3 / 4" is the key "3/4".
_SPACED_FRACTION = re.compile(rf"(-?{_UNSIGNED})\s*/\s*({_UNSIGNED})")
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
    """Lower-case, strip, collapse whitespace, drop a trailing period and thousands separators;
    a whole-text fraction loses the spaces around its slash (``" -3 / 4. "`` -> ``"-3/4"``)."""
    text = _WHITESPACE.sub(" ", text.strip().lower()).rstrip(".")
    fraction = _SPACED_FRACTION.fullmatch(text)
    if fraction:
        return f"{fraction[1]}/{fraction[2]}"
    return text.replace(",", "") if _NUMBER.fullmatch(text) else text


def numeric_value(key: str) -> float | None:
    """The number an answer key denotes, or None: an integer, a decimal, or a fraction ``a/b``
    (``"3/4"`` and ``"6/8"`` are both 0.75; the quotient is exact, then rounded once to a float).
    A zero denominator, or a fraction too large for a float, is no number, so such keys are
    compared as text."""
    fraction = _FRACTION.fullmatch(key)
    if fraction:
        try:
            return float(Fraction(fraction[1]) / Fraction(fraction[2]))
        except (ZeroDivisionError, OverflowError, ValueError):  # ValueError: over int's digit limit
            return None
    try:
        return float(key)
    except ValueError:
        return None


def extract_answer(text: str) -> str:
    """Answer key of a completion: last ``\\boxed{…}``, else text after the last ``####``,
    else the last number (a fraction ``a/b`` counts as one number), else the normalised whole
    text. Keys are text: ``"3/4"``, ``"6/8"`` and ``"0.75"`` are distinct votes; the reward
    (`rlkit.rewards.exact_match_reward`) compares them by `numeric_value`."""
    boxed = last_boxed(text)
    if boxed is not None:
        return normalize_answer(boxed)
    if "####" in text:
        return normalize_answer(text.rsplit("####", 1)[1])
    numbers = [match[0] for match in _NUMBER.finditer(text)]
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
