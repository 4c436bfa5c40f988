"""Math benchmarks and training sets as `Problem` lists, from the hub or local files.

`load_math_problems(source)` accepts a short name from `DATASETS` (loaded with
`datasets.load_dataset`) or a path to a local ``.jsonl`` / ``.json`` / ``.parquet`` file. Each row
becomes a `Problem` whose prompt is the question rendered with a template from `TEMPLATES`; the
answer is cleaned by `clean_answer` (GSM8K keeps only what follows ``####``).
Field names can be dotted paths into nested rows (``reward_model.ground_truth``, ``prompt.0.content``).
"""

from __future__ import annotations

import json
import re
import warnings
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
        import datasets  # heavy (about 2 s): loaded only when a dataset is actually read

        rows = datasets.load_dataset(
            LOCAL_FORMATS[path.suffix], data_files=str(path), split="train"
        )
        spec, name = None, path.stem
    else:
        spec, name = resolve_spec(str(source)), str(source).lower()
        rows = _load_hub(spec, name, split or spec.split)
    if len(rows) == 0:
        raise ValueError(f"dataset {source} has no rows")
    first = rows[0]
    question_field = question_field or (
        spec.question_field if spec else _detect(first, QUESTION_FIELDS, "question", name)
    )
    answer_field = answer_field or (
        spec.answer_field if spec else _detect(first, ANSWER_FIELDS, "answer", name)
    )
    clean_question = spec.clean_question if spec else str.strip
    problems, answers, missing, conflicts = [], {}, [], 0
    for index, row in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        raw_question, raw_answer = _field(row, question_field), _field(row, answer_field)
        if _blank(raw_question) or _blank(raw_answer):
            missing.append(index)
            continue
        question, answer = clean_question(str(raw_question)), clean_answer(raw_answer)
        if question in answers:
            conflicts += answers[question] != answer
            continue
        answers[question] = answer
        problems.append(
            Problem(
                id=f"{name}/{index}",
                prompt=TEMPLATES[template].format(question=question),
                answer=answer,
                topic=str(row[spec.topic_field]) if spec and spec.topic_field else "",
                difficulty=int(row[spec.difficulty_field]) if spec and spec.difficulty_field else 0,
            )
        )
    if missing:
        warnings.warn(
            f"dataset {source}: skipped {len(missing)} rows without a question or answer "
            f"(first: row {missing[0]})",
            stacklevel=2,
        )
    if conflicts:
        warnings.warn(
            f"dataset {source}: {conflicts} repeated questions have a different answer than their "
            "first occurrence; kept the first",
            stacklevel=2,
        )
    if not problems:
        raise ValueError(f"dataset {source} has no row with both a question and an answer")
    return problems


def _blank(value) -> bool:
    """A missing field: None, an empty or whitespace-only string, or a list of only those."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list):
        return all(_blank(v) for v in value)
    return False
