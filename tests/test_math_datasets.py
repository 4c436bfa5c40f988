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


@pytest.fixture(autouse=True)
def dataset_cache(tmp_path, monkeypatch):
    """Every test gets an empty dataset cache."""
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def naive_dedup(rows, clean):
    """The row-by-row reference: first row of each distinct cleaned question, in file order."""
    seen, out = set(), []
    for index, row in enumerate(rows):
        question = clean(row["prompt"][0]["content"])
        if question not in seen:
            seen.add(question)
            out.append((index, question, str(row["reward_model"]["ground_truth"])))
    return out


def dapo_rows(repeats=5):
    """DAPO-Math-17k-shaped rows: each prompt wrapped, repeated and interleaved; two different
    wrappings of one problem clean to the same question."""
    wrap = (
        "Solve the following math problem step by step. The last line of your response should "
        "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
        'problem.\n\n{q}\n\nRemember to put your answer on its own line after "Answer:".'
    )
    questions = [f"What is {i} + {i}?" for i in range(7)]
    rows = []
    for r in range(repeats):
        for i, q in enumerate(questions[r % 2 :] + questions[: r % 2]):
            content = wrap.format(q=q) if (i + r) % 3 else q + "  "
            rows.append(
                {
                    "prompt": [{"role": "user", "content": content}],
                    "reward_model": {"ground_truth": str(2 * int(q.split()[2]))},
                }
            )
    return rows


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_dapo_style_dedup_matches_the_row_by_row_reference_and_is_cached(
    tmp_path, monkeypatch, dataset_cache, suffix
):
    import datasets

    rows = dapo_rows()
    path = tmp_path / f"dapo{suffix}"
    if suffix == ".jsonl":
        write_jsonl(path, rows)
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    fields = {"question_field": "prompt.0.content", "answer_field": "reward_model.ground_truth"}
    problems = load_math_problems(path, template="plain", **fields)
    expected = naive_dedup(rows, str.strip)
    assert [(p.id, p.prompt, p.answer) for p in problems] == [
        (f"dapo/{i}", q, a) for i, q, a in expected
    ]
    assert len({p.prompt for p in problems}) == len(problems)
    assert len(list(dataset_cache.glob("datasets/*.json"))) == 1

    def no_reading(*args, **kwargs):
        raise AssertionError("the second load must come from the cache")

    monkeypatch.setattr(datasets, "load_dataset", no_reading)
    again = load_math_problems(path, template="boxed", limit=3, **fields)
    assert [p.id for p in again] == [p.id for p in problems[:3]]
    assert again[0].prompt.endswith("\\boxed{}.")


def test_named_dapo_cleans_the_wrapper_before_deduplicating(monkeypatch):
    import datasets

    rows = dapo_rows()
    calls = []

    def fake_load(hub_id, config=None, split=None):
        calls.append((hub_id, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    problems = load_math_problems("dapo-math-17k", template="plain")
    assert calls == [("BytedTsinghua-SIA/DAPO-Math-17k", "train")]
    expected = naive_dedup(rows, clean_dapo_question)
    assert len(expected) == 7  # wrapped and bare copies of a problem are one question
    assert [(p.id, p.prompt, p.answer) for p in problems] == [
        (f"dapo-math-17k/{i}", q, a) for i, q, a in expected
    ]


def test_gsm8k_trains_on_train_and_evaluates_on_test(monkeypatch):
    import datasets

    from rlkit.config import load_config
    from rlkit.tasks.loader import load_problems

    def fake_load(hub_id, config=None, split=None):
        assert (hub_id, config) == ("openai/gsm8k", "main")
        return datasets.Dataset.from_list(
            [{"question": f"{split} question {i}", "answer": f"#### {i}"} for i in range(6)]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    cfg = load_config("llama3-8b-qlora", ["task.num_train=4", "task.num_eval=3"])
    train, evaluation = load_problems(cfg.task)
    assert len(train) == 4 and all(p.prompt.startswith("train question") for p in train)
    assert len(evaluation) == 3 and all(p.prompt.startswith("test question") for p in evaluation)


def test_a_missing_field_path_names_the_field_and_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "nested.jsonl", [{"prompt": [{"content": "1+1?"}], "answer": 2}])
    with pytest.raises(
        ValueError, match=r"'prompt.0.text' is not in the dataset \(columns \['prompt', 'answer'\]"
    ):
        load_math_problems(path, question_field="prompt.0.text")
    with pytest.raises(ValueError, match="'problem' is not in the dataset"):
        load_math_problems(path, question_field="problem")
