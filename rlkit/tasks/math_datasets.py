"""Math benchmarks and training sets as `Problem` lists, from the hub or local files.

`load_math_problems(source)` accepts a short name from `DATASETS` (loaded with
`datasets.load_dataset`) or a path to a local ``.jsonl`` / ``.json`` / ``.parquet`` file. Each row
becomes a `Problem` whose prompt is the question rendered with a template from `TEMPLATES`; the
answer is cleaned by `clean_answer` (GSM8K keeps only what follows ``####``).
Field names can be dotted paths into nested rows (``reward_model.ground_truth``, ``prompt.0.content``).
Rows are deduplicated by cleaned question, column-wise (DAPO-Math-17k repeats each prompt about
100 times), and the result is cached in ``$RLKIT_CACHE/datasets`` after the first load.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlkit.cache import default_cache_dir
from rlkit.tasks.base import Problem

TEMPLATES = {
    "boxed": "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    "plain": "{question}",
    "qa": "Question: {question}\nAnswer:",
}
QUESTION_FIELDS = ("question", "problem", "prompt")
ANSWER_FIELDS = ("answer", "final_answer", "solution")
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
CACHE_FORMAT = 1  # bump when the cached rows (cleaning, fields) change


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
    eval_split: str | None = None  # a held-out split to evaluate on (GSM8K trains on train)


DATASETS = {
    "gsm8k": DatasetSpec("openai/gsm8k", "train", "question", "answer", "main", eval_split="test"),
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


def eval_split(source: str | Path) -> str | None:
    """The split to evaluate a named dataset on (None: its only split, or a local file)."""
    if Path(source).suffix in LOCAL_FORMATS:
        return None
    return resolve_spec(str(source)).eval_split


def _column(table, path: str) -> list:
    """A dotted field path (``prompt.0.content``) of every row, read column-wise with Arrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    first, *rest = path.split(".")
    values = table.column(first).combine_chunks()
    for part in rest:
        if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            values = pc.list_element(values, int(part))
        else:
            values = pc.struct_field(values, part)
    return values


def _unique_rows(table, question_field: str, clean_question) -> list[tuple[int, str]]:
    """(row index, cleaned question) of the first row of each distinct cleaned question, in
    file order. Hashing runs column-wise (DAPO-Math-17k repeats each of its ~17k prompts about
    100 times in ~1.8 M rows); ``clean_question`` then runs once per distinct raw question."""
    import pandas as pd

    raw = pd.Series(_column(table, question_field).to_pandas()).drop_duplicates()
    first: dict[str, int] = {}
    for index, question in zip(raw.index.tolist(), raw.tolist()):
        first.setdefault(clean_question(question), index)
    return [(index, question) for question, index in first.items()]


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
    path = Path(source)
    if path.suffix in LOCAL_FORMATS:
        if not path.exists():
            raise FileNotFoundError(f"dataset file not found: {path}")
        stat = path.stat()
        spec, name = None, path.stem
        origin = [str(path.resolve()), stat.st_size, stat.st_mtime_ns]
    else:
        spec, name = resolve_spec(str(source)), str(source).lower()
        split = split or spec.split
        origin = [spec.hub_id, spec.config, split]
    payload = json.dumps([CACHE_FORMAT, origin, question_field, answer_field])
    cache = (
        default_cache_dir()
        / "datasets"
        / f"{name}-{hashlib.sha256(payload.encode()).hexdigest()[:16]}.json"
    )
    if cache.exists():
        rows = json.loads(cache.read_text())
    else:
        rows = _distinct_rows(
            path if spec is None else spec, split, name, question_field, answer_field
        )
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rows))
        tmp.replace(cache)
    return [
        Problem(
            id=f"{name}/{row['index']}",
            prompt=TEMPLATES[template].format(question=row["question"]),
            answer=row["answer"],
            topic=row["topic"],
            difficulty=row["difficulty"],
        )
        for row in rows[:limit]
    ]


def _distinct_rows(
    source: Path | DatasetSpec,
    split: str | None,
    name: str,
    question_field: str | None,
    answer_field: str | None,
) -> list[dict]:
    """Index, cleaned question and answer, topic and difficulty of the first row of each
    distinct question, in file order."""
    import datasets  # heavy (about 2 s): loaded only when a dataset is actually read

    spec = source if isinstance(source, DatasetSpec) else None
    if spec is None:
        rows = datasets.load_dataset(
            LOCAL_FORMATS[source.suffix], data_files=str(source), split="train"
        )
    else:
        rows = datasets.load_dataset(spec.hub_id, spec.config, split=split)
    if len(rows) == 0:
        return []
    first = rows[0]
    question_field = question_field or (
        spec.question_field if spec else _detect(first, QUESTION_FIELDS, "question", name)
    )
    answer_field = answer_field or (
        spec.answer_field if spec else _detect(first, ANSWER_FIELDS, "answer", name)
    )
    table = rows.with_format("arrow")[:]
    kept = _unique_rows(table, question_field, spec.clean_question if spec else str.strip)
    take = [index for index, _ in kept]

    def column(field: str | None) -> list:
        return _column(table, field).take(take).to_pylist() if field else [None] * len(take)

    answers = column(answer_field)
    topics = column(spec.topic_field if spec else None)
    difficulties = column(spec.difficulty_field if spec else None)
    return [
        {
            "index": index,
            "question": question,
            "answer": clean_answer(answer),
            "topic": "" if topic is None else str(topic),
            "difficulty": 0 if difficulty is None else int(difficulty),
        }
        for (index, question), answer, topic, difficulty in zip(kept, answers, topics, difficulties)
    ]
