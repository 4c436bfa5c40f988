"""Synthetic word problems (rlkit.tasks.word_problems): answers, splits, clusters and config."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from rlkit.config import load_config
from rlkit.rewards import math_verify_reward
from rlkit.tasks.loader import load_problems
from rlkit.tasks.word_problems import INSTRUCTION, LEVELS, TEMPLATES, WordProblemTask

ALL_LEVELS = tuple(LEVELS)
FIRST = {"collect": lambda a: a, "groups": lambda a, b: a * b, "shop": lambda a, b: a * b}
ADDS, REMOVES = ("more", "bag"), ("gives", "eats", "off")


def answer_from_text(problem) -> int:
    """An independent reading of the story: the first sentence's rule by template (``collect``
    starts with a count), then each sentence adds or removes its number (by its verb); every
    count along the way is >= 0."""
    sentences = [s for s in re.split(r"(?<=\.) ", problem.prompt) if re.search(r"\d", s)]
    first = [int(x) for x in re.findall(r"\d+", sentences[0])]
    if problem.topic == "share":
        total, friends = first
        assert total % friends == 0
        value = total // friends
    else:
        value = FIRST[problem.topic](*first)
    for sentence in sentences[1:]:
        (number,) = (int(x) for x in re.findall(r"\d+", sentence))
        adds = any(word in sentence for word in ADDS)
        assert adds != any(word in sentence for word in REMOVES), sentence
        value += number if adds else -number
        assert value >= 0, problem.prompt
    return value


@pytest.fixture(scope="module")
def task():
    return WordProblemTask(difficulties=ALL_LEVELS, train_size=960, eval_size=240)


def test_answers_match_the_story_and_math_verify_accepts_them(task):
    for problem in task.problems("train") + task.problems("eval"):
        assert int(problem.answer) == answer_from_text(problem), problem.prompt
        steps, largest = LEVELS[problem.difficulty]
        assert len(re.findall(r"\d+", problem.prompt)) == steps + 1
        assert problem.prompt.endswith(INSTRUCTION)
    problem = task.problems("eval")[0]
    assert math_verify_reward(f"So the answer is \\boxed{{{problem.answer}}}.", problem.answer)


def test_splits_share_no_arithmetic_and_are_balanced_over_cells(task):
    train, evaluation = task.problems("train"), task.problems("eval")
    assert {p.id for p in train}.isdisjoint(p.id for p in evaluation)
    assert len({p.id for p in train}) == len(train) == 960
    cells = {(t, d) for t in TEMPLATES for d in ALL_LEVELS}
    assert Counter((p.topic, p.difficulty) for p in evaluation) == dict.fromkeys(cells, 10)
    assert Counter((p.topic, p.difficulty) for p in train) == dict.fromkeys(cells, 40)


def test_the_split_of_a_problem_does_not_depend_on_the_sizes_or_the_names(task):
    small = WordProblemTask(difficulties=ALL_LEVELS, train_size=96, eval_size=24)
    assert {p.id for p in small.problems("eval")} <= {p.id for p in task.problems("eval")}
    assert WordProblemTask(seed=1).problems("eval") != WordProblemTask(seed=0).problems("eval")
    assert WordProblemTask().problems("train") == WordProblemTask().problems("train")


@pytest.mark.parametrize(
    "override, message",
    [
        ("task.word_problems.templates=[nope]", "task.word_problems: templates: unknown template"),
        ("task.word_problems.difficulties=[7]", "task.word_problems: difficulties: unknown"),
        ("task.word_problems.size=3", "unknown config key task.word_problems.size"),
    ],
)
def test_bad_fields_are_named(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, ["task.name=word_problems", override, f"output_dir={tmp_path}"])


def test_fields_only_apply_to_the_word_problem_task(tmp_path):
    with pytest.raises(ValueError, match="task.word_problems only applies"):
        load_config(None, ["task.word_problems.seed=1", f"output_dir={tmp_path}"])


def test_a_run_loads_the_configured_cells(tmp_path):
    overrides = [
        "model.name_or_path=org/chat-model",  # the tiny model knows only arithmetic
        "task.name=word_problems",
        "task.word_problems={templates: [groups, shop], difficulties: [1, 4]}",
        "task.num_train=50",
        "task.num_eval=20",
        f"output_dir={tmp_path}",
    ]
    train, evaluation = load_problems(load_config(None, overrides).task)
    assert (len(train), len(evaluation)) == (50, 20)
    assert {p.topic for p in train} == {"groups", "shop"}
    assert {p.difficulty for p in evaluation} == {1, 4}
    assert {p.id for p in train}.isdisjoint(p.id for p in evaluation)
