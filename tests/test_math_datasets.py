"""Math dataset loading from local files, and the hub-name table (no network)."""

import json
from pathlib import Path

import pytest

from rlkit.tasks.math_datasets import (
    DATASETS,
    TEMPLATES,
    clean_answer,
    clean_dapo_question,
    load_math_problems,
    resolve_spec,
)

DATA = Path(__file__).parent / "data"
GSM8K_ANSWERS = ["72", "10", "1500", "21", "4"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_local_jsonl_gsm8k_style():
    problems = load_math_problems(DATA / "gsm8k_sample.jsonl")
    assert [p.answer for p in problems] == GSM8K_ANSWERS
    first = problems[0]
    assert first.id == "gsm8k_sample/0"
    assert first.prompt.startswith("Natalia sold clips")
    assert first.prompt.endswith("put your final answer within \\boxed{}.")


def test_parquet_matches_jsonl_and_plain_template():
    from_parquet = load_math_problems(DATA / "gsm8k_sample.parquet", template="plain")
    from_jsonl = load_math_problems(DATA / "gsm8k_sample.jsonl", template="plain")
    assert [(p.prompt, p.answer) for p in from_parquet] == [
        (p.prompt, p.answer) for p in from_jsonl
    ]
    assert (
        from_parquet[3].prompt
        == "Tom has 3 boxes with 7 pencils each. How many pencils does he have?"
    )


def test_limit():
    problems = load_math_problems(DATA / "gsm8k_sample.jsonl", limit=2)
    assert [p.answer for p in problems] == GSM8K_ANSWERS[:2]


def test_field_detection_and_overrides(tmp_path):
    rows = [
        {"problem": "What is 2+2?", "solution": "4", "prompt": "ignored"},
        {"problem": "What is 2+2?", "solution": "4", "prompt": "ignored"},  # duplicate
        {"problem": "What is 3*3?", "solution": "9", "prompt": "ignored"},
    ]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    problems = load_math_problems(path, template="qa")
    assert [(p.prompt, p.answer) for p in problems] == [
        ("Question: What is 2+2?\nAnswer:", "4"),
        ("Question: What is 3*3?\nAnswer:", "9"),
    ]
    overridden = load_math_problems(path, template="plain", question_field="prompt")
    assert [p.prompt for p in overridden] == ["ignored"]


def test_nested_fields(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": 2}}]
    path = write_jsonl(tmp_path / "nested.jsonl", rows)
    problems = load_math_problems(
        path,
        template="plain",
        question_field="prompt.0.content",
        answer_field="reward_model.ground_truth",
    )
    assert [(p.prompt, p.answer) for p in problems] == [("1+1?", "2")]


def test_missing_fields_name_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "x", "label": "y"}])
    with pytest.raises(ValueError, match="question.*label"):
        load_math_problems(path)


def test_unknown_names_list_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="gsm8k.*math500"):
        load_math_problems("not-a-dataset")
    with pytest.raises(ValueError, match="boxed"):
        load_math_problems(DATA / "gsm8k_sample.jsonl", template="fancy")
    with pytest.raises(ValueError, match="dataset file not found"):
        load_math_problems(tmp_path / "missing.jsonl")


def test_hub_names_resolve_without_downloading():
    assert resolve_spec("GSM8K").hub_id == "openai/gsm8k"
    assert resolve_spec("gsm8k").config == "main"
    assert resolve_spec("math500").hub_id == "HuggingFaceH4/MATH-500"
    assert resolve_spec("dapo-math-17k").answer_field == "reward_model.ground_truth"
    expected = {"gsm8k", "math500", "aime24", "aime25", "amc23", "olympiadbench", "dapo-math-17k"}
    assert set(DATASETS) == expected
    assert set(TEMPLATES) >= {"boxed", "plain"}


def test_answer_and_question_cleaning():
    assert clean_answer("She pays 3 * 4 = 12 dollars.\n#### 1,234") == "1234"
    assert clean_answer(" 17 ") == "17"
    assert clean_answer(42) == "42"
    assert clean_answer(["$\\frac{1}{2}$", "3"]) == "\\frac{1}{2}, 3"
    wrapped = (
        "Solve the following math problem step by step. The last line of your response should "
        "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
        "problem.\n\nFind $x$ if $2x=6$.\n\nRemember to put your answer on its own line after "
        '"Answer:".'
    )
    assert clean_dapo_question(wrapped) == "Find $x$ if $2x=6$."
    assert clean_dapo_question("  plain question ") == "plain question"
