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
import warnings
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
CACHE_FORMAT = 2  # bump when the cached rows (cleaning, fields, checks) change


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


def _column(table, path: str):
    """A dotted field path (``prompt.0.content``) of every row, as one Arrow array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    first, *rest = path.split(".")
    try:
        values = table.column(first).combine_chunks()
        for part in rest:
            if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
                values = pc.list_element(values, int(part))
            else:
                values = pc.struct_field(values, part)
    except (KeyError, ValueError, pa.ArrowException) as err:
        raise ValueError(
            f"field {path!r} is not in the dataset (columns {table.column_names}): {err}"
        ) from None
    return values


def _codes(values) -> tuple:
    """(code of each row, -1 where null; the distinct values in order of first appearance)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        encoded = pc.dictionary_encode(values)
        codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
        return codes.astype(np.int64), encoded.dictionary.to_pylist()
    except pa.ArrowNotImplementedError:  # lists, structs: hash a JSON rendering instead
        import pandas as pd

        objects = values.to_pylist()
        keys = [None if v is None else json.dumps(v, sort_keys=True, default=str) for v in objects]
        codes, uniques = pd.factorize(pd.Series(keys, dtype=object), use_na_sentinel=True)
        first = {code: i for i, code in reversed(list(enumerate(codes))) if code >= 0}
        return codes.astype(np.int64), [objects[first[c]] for c in range(len(uniques))]


def _detect(row: dict, candidates: tuple[str, ...], role: str, source: str) -> str:
    for name in candidates:
        if name in row:
            return name
    raise ValueError(
        f"{source}: no {role} field found among {candidates}; columns are {sorted(row)} "
        f"(pass {role}_field=...)"
    )


def _check_local_file(path: Path) -> None:
    """A local dataset file exists, is not empty and (JSON/JSONL) parses; a ValueError names the
    file and, for a malformed JSON Lines record, its line number. A ``.json`` file may hold one
    JSON document or JSON Lines (as `datasets` accepts)."""
    if not path.is_file():
        raise ValueError(f"dataset file not found: {path}")
    if path.suffix == ".parquet":
        return
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"dataset file {path} is empty")
    if path.suffix == ".json":
        try:
            json.loads(text)
            return
        except json.JSONDecodeError:
            pass  # not one document: it must be JSON Lines
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"dataset file {path}, line {number}: malformed JSON: {err.msg}"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"dataset file {path}, line {number}: expected a JSON object, "
                f"got {type(record).__name__}"
            )


def _load_hub(spec: DatasetSpec, name: str, split: str):
    """``datasets.load_dataset`` for a hub dataset; a download or cache failure (offline, unknown
    split, no access) is one ValueError line instead of a traceback."""
    import datasets

    try:
        return datasets.load_dataset(spec.hub_id, spec.config, split=split)
    except Exception as err:  # noqa: BLE001 - datasets raises many types; all mean "not loaded"
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise ValueError(
            f"dataset {name}: could not load {spec.hub_id} (split {split}) from the Hugging Face "
            f"hub or its cache: {type(err).__name__}: {first}"
        ) from None


def load_math_problems(
    source: str | Path,
    split: str | None = None,
    template: str = "boxed",
    limit: int | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
) -> list[Problem]:
    """Problems of a named dataset or a local file, in file order, deduplicated by question.

    Rows without a question or answer (null or empty) are skipped with a warning giving their
    count; so are questions repeated with a different answer (the first is kept).

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
        _check_local_file(path)
        stat = path.stat()
        spec, name = None, path.stem
        origin = [str(path.resolve()), stat.st_size, stat.st_mtime_ns]
    else:
        spec, name = resolve_spec(str(source)), str(source).lower()
        split = split or spec.split
        origin = [spec.hub_id, spec.config, split]
    key = json.dumps([CACHE_FORMAT, origin, question_field, answer_field])
    cache = (
        default_cache_dir()
        / "datasets"
        / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    )
    if cache.exists():
        found = json.loads(cache.read_text())
    else:
        found = _distinct_rows(
            path if spec is None else spec, split, name, question_field, answer_field
        )
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(cache)
    if found["missing"]:
        warnings.warn(
            f"dataset {source}: skipped {found['missing']} rows without a question or answer "
            f"(first: row {found['first_missing']})",
            stacklevel=2,
        )
    if found["conflicts"]:
        warnings.warn(
            f"dataset {source}: {found['conflicts']} repeated questions have a different answer "
            "than their first occurrence; kept the first",
            stacklevel=2,
        )
    if not found["rows"]:
        raise ValueError(f"dataset {source} has no row with both a question and an answer")
    return [
        Problem(
            id=f"{name}/{row['index']}",
            prompt=TEMPLATES[template].format(question=row["question"]),
            answer=row["answer"],
            topic=row["topic"],
            difficulty=row["difficulty"],
        )
        for row in found["rows"][:limit]
    ]


def _distinct_rows(
    source: Path | DatasetSpec,
    split: str | None,
    name: str,
    question_field: str | None,
    answer_field: str | None,
) -> dict:
    """The first row of each distinct cleaned question, in file order (index, question, answer,
    topic, difficulty), with the count of rows lacking a question or answer and of repeated
    questions whose answer differs from their first occurrence.

    Column-wise: questions and answers are dictionary-encoded by Arrow, blank checks and cleaning
    run once per distinct value, and duplicates are counted per distinct (question, answer) pair.
    """
    import numpy as np

    if isinstance(source, DatasetSpec):
        spec, rows = source, _load_hub(source, name, split)
    else:
        import datasets  # heavy (about 2 s): loaded only when a dataset is actually read

        spec = None
        rows = datasets.load_dataset(
            LOCAL_FORMATS[source.suffix], data_files=str(source), split="train"
        )
    if len(rows) == 0:
        raise ValueError(f"dataset {source} has no rows")
    first = rows[0]
    question_field = question_field or (
        spec.question_field if spec else _detect(first, QUESTION_FIELDS, "question", name)
    )
    answer_field = answer_field or (
        spec.answer_field if spec else _detect(first, ANSWER_FIELDS, "answer", name)
    )
    table = rows.with_format("arrow")[:]
    q_codes, q_values = _codes(_column(table, question_field))
    a_codes, a_values = _codes(_column(table, answer_field))
    q_ok = np.array([not _blank(v) for v in q_values] + [False])  # code -1 (null) -> False
    a_ok = np.array([not _blank(v) for v in a_values] + [False])
    valid = q_ok[q_codes] & a_ok[a_codes]
    missing = np.flatnonzero(~valid)
    row_index = np.flatnonzero(valid)
    pairs = q_codes[valid] * max(1, len(a_values)) + a_codes[valid]
    distinct, first_at, counts = np.unique(pairs, return_index=True, return_counts=True)
    clean_question = spec.clean_question if spec else str.strip
    kept, answers, conflicts = [], {}, 0
    for k in np.argsort(first_at):
        q, a = divmod(int(distinct[k]), max(1, len(a_values)))
        question, answer = clean_question(str(q_values[q])), clean_answer(a_values[a])
        if question in answers:
            conflicts += int(counts[k]) if answers[question] != answer else 0
            continue
        answers[question] = answer
        kept.append((int(row_index[first_at[k]]), question, answer))
    take = [index for index, _, _ in kept]

    def column(field: str | None) -> list:
        return _column(table, field).take(take).to_pylist() if field else [None] * len(take)

    topics = column(spec.topic_field if spec else None)
    difficulties = column(spec.difficulty_field if spec else None)
    return {
        "rows": [
            {
                "index": index,
                "question": question,
                "answer": answer,
                "topic": "" if topic is None else str(topic),
                "difficulty": 0 if difficulty is None else int(difficulty),
            }
            for (index, question, answer), topic, difficulty in zip(kept, topics, difficulties)
        ],
        "missing": len(missing),
        "first_missing": int(missing[0]) if len(missing) else None,
        "conflicts": conflicts,
    }


def _blank(value) -> bool:
    """A missing field: None, an empty or whitespace-only string, or a list of only those."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list):
        return all(_blank(v) for v in value)
    return False
