"""Math benchmarks and training sets as `Problem` lists, from the hub or local files.

`load_math_problems(source)` accepts a short name from `DATASETS` (loaded with
`datasets.load_dataset`) or a path to a local ``.jsonl`` / ``.json`` / ``.parquet`` file. Each row
becomes a `Problem` whose prompt is the question rendered with a template from `TEMPLATES`; the
answer is cleaned by `clean_answer` (GSM8K keeps only what follows ``####``).
Field names can be dotted paths into nested rows (``reward_model.ground_truth``, ``prompt.0.content``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlkit.tasks.base import Problem

TEMPLATES = {
    "boxed": "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    "plain": "{question}",
    "qa": "Question: {question}\nAnswer:",
}
QUESTION_FIELDS = ("question", "problem", "prompt")
ANSWER_FIELDS = ("answer", "final_answer", "solution")
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def clean_answer(answer) -> str:
    """Reference answer as a string.

    GSM8K-style solutions ending in ``#### 1,234`` keep that number without thousands separators;
    lists (OlympiadBench's ``final_answer``) are joined with ", "; anything else is stripped.
    """
    if isinstance(answer, list):
        return ", ".join(str(v).strip().strip("$") for v in answer)
    text = str(answer).strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().replace(",", "")
    return text


_DAPO_WRAPPER = re.compile(r"^Solve the following math problem.*?\n\n(.*)\n\nRemember to put", re.S)


def clean_dapo_question(question: str) -> str:
    """DAPO-Math-17k wraps each problem in an "Answer: $Answer" instruction: keep the problem."""
    match = _DAPO_WRAPPER.match(question)
    return match.group(1).strip() if match else question.strip()


@dataclass(frozen=True)
class DatasetSpec:
    """Where a named dataset lives on the hub and how to read one row."""

    hub_id: str
    split: str
    question_field: str
    answer_field: str
    config: str | None = None
    clean_question: Callable[[str], str] = str.strip
    topic_field: str | None = None
    difficulty_field: str | None = None


DATASETS = {
    "gsm8k": DatasetSpec("openai/gsm8k", "test", "question", "answer", "main"),
    "math500": DatasetSpec(
        "HuggingFaceH4/MATH-500",
        "test",
        "problem",
        "answer",
        topic_field="subject",
        difficulty_field="level",
    ),
    "aime24": DatasetSpec("HuggingFaceH4/aime_2024", "train", "problem", "answer"),
    "aime25": DatasetSpec("yentinglin/aime_2025", "train", "problem", "answer"),
    "amc23": DatasetSpec("math-ai/amc23", "test", "question", "answer"),
    "olympiadbench": DatasetSpec(
        "Hothan/OlympiadBench",
        "train",
        "question",
        "final_answer",
        "OE_TO_maths_en_COMP",
    ),
    "dapo-math-17k": DatasetSpec(
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "train",
        "prompt.0.content",
        "reward_model.ground_truth",
        clean_question=clean_dapo_question,
    ),
}


def resolve_spec(name: str) -> DatasetSpec:
    """The `DatasetSpec` of a short name; a `ValueError` lists the known names."""
    key = name.lower()
    if key not in DATASETS:
        raise ValueError(
            f"dataset: unknown dataset {name!r}; known: {sorted(DATASETS)} "
            f"(or a path to a {'/'.join(LOCAL_FORMATS)} file)"
        )
    return DATASETS[key]


def _field(row: dict, path: str):
    value = row
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _detect(row: dict, candidates: tuple[str, ...], role: str, source: str) -> str:
    for name in candidates:
        if name in row:
            return name
    raise ValueError(
        f"{source}: no {role} field found among {candidates}; columns are {sorted(row)} "
        f"(pass {role}_field=...)"
    )


def load_math_problems(
    source: str | Path,
    split: str | None = None,
    template: str = "boxed",
    limit: int | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
) -> list[Problem]:
    """Problems of a named dataset or a local file, in file order, deduplicated by question.

    Args:
        source: a key of `DATASETS`, or a path to a ``.jsonl`` / ``.json`` / ``.parquet`` file.
        split: overrides the named dataset's split (local files have one split, ``train``).
        template: a key of `TEMPLATES`, applied to the (cleaned) question.
        limit: keep at most this many problems.
        question_field, answer_field: dotted field paths; default to the dataset's spec, or
            for local files to the first of `QUESTION_FIELDS` / `ANSWER_FIELDS` present.
    """
    if template not in TEMPLATES:
        raise ValueError(f"template: unknown template {template!r}; known: {sorted(TEMPLATES)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    import datasets  # heavy (about 2 s): loaded only when a dataset is actually read

    path = Path(source)
    if path.suffix in LOCAL_FORMATS:
        if not path.exists():
            raise FileNotFoundError(f"dataset file not found: {path}")
        rows = datasets.load_dataset(
            LOCAL_FORMATS[path.suffix], data_files=str(path), split="train"
        )
        spec, name = None, path.stem
    else:
        spec, name = resolve_spec(str(source)), str(source).lower()
        rows = datasets.load_dataset(spec.hub_id, spec.config, split=split or spec.split)
    if len(rows) == 0:
        return []
    first = rows[0]
    question_field = question_field or (
        spec.question_field if spec else _detect(first, QUESTION_FIELDS, "question", name)
    )
    answer_field = answer_field or (
        spec.answer_field if spec else _detect(first, ANSWER_FIELDS, "answer", name)
    )
    clean_question = spec.clean_question if spec else str.strip
    problems, seen = [], set()
    for index, row in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        question = clean_question(_field(row, question_field))
        if question in seen:
            continue
        seen.add(question)
        problems.append(
            Problem(
                id=f"{name}/{index}",
                prompt=TEMPLATES[template].format(question=question),
                answer=clean_answer(_field(row, answer_field)),
                topic=str(row[spec.topic_field]) if spec and spec.topic_field else "",
                difficulty=int(row[spec.difficulty_field]) if spec and spec.difficulty_field else 0,
            )
        )
    return problems
