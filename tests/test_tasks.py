"""The built-in arithmetic task: splits, answers and labels."""

import re

import pytest

from rlkit.tasks import ArithmeticTask, Problem
from rlkit.tasks.arithmetic import DIFFICULTY_SHAPES, reduction_steps

TASK = ArithmeticTask(train_size=2000, eval_size=160)


@pytest.fixture(scope="module")
def splits():
    return TASK.problems("train"), TASK.problems("eval")


def operands_and_operators(prompt):
    expression = prompt.removesuffix("=")
    return re.split(r"[+\-*]", expression), re.findall(r"[+\-*]", expression)


def test_splits_are_disjoint_and_deterministic(splits):
    train, evaluation = splits
    assert not {p.prompt for p in train} & {p.prompt for p in evaluation}
    assert len({p.prompt for p in evaluation}) == len(evaluation)  # no duplicates
    again = ArithmeticTask(train_size=2000, eval_size=160)
    assert again.problems("train") == train and again.problems("eval") == evaluation
    assert ArithmeticTask(seed=1, train_size=2000, eval_size=160).problems("eval") != evaluation


def test_split_membership_does_not_depend_on_sizes(splits):
    _, evaluation = splits
    larger_train = ArithmeticTask(train_size=6000, eval_size=160).problems("train")
    assert not {p.prompt for p in larger_train} & {p.prompt for p in evaluation}


def test_answers_match_an_independent_evaluation(splits):
    for problem in splits[0] + splits[1]:
        assert problem.answer == str(eval(problem.prompt.removesuffix("=")))  # noqa: S307


def test_topics_and_difficulties_are_as_labelled(splits):
    train, evaluation = splits
    cells = {(t, d) for t in TASK.topics for d in TASK.difficulties}
    assert {(p.topic, p.difficulty) for p in evaluation} == cells
    assert len(evaluation) == 160  # 10 per cell, every cell has enough problems
    for problem in train + evaluation:
        operands, operators = operands_and_operators(problem.prompt)
        shape = DIFFICULTY_SHAPES[problem.difficulty]
        assert [len(o) for o in operands] == list(shape)
        if problem.topic == "mix":
            assert set(operators) <= set("+-*")
        else:
            assert set(operators) == {{"add": "+", "sub": "-", "mul": "*"}[problem.topic]}
        for operator, right in zip(operators, operands[1:]):
            if operator == "*":
                assert 2 <= int(right) <= 9


def test_cell_selection_and_validation():
    task = ArithmeticTask(topics=("mul",), difficulties=(2,), train_size=50, eval_size=10)
    problems = task.problems("train")
    assert len(problems) == 50
    assert {(p.topic, p.difficulty) for p in problems} == {("mul", 2)}
    with pytest.raises(ValueError, match="topics"):
        ArithmeticTask(topics=("div",))
    with pytest.raises(ValueError, match="difficulties"):
        ArithmeticTask(difficulties=(9,))
    with pytest.raises(ValueError, match="split"):
        task.problems("test")


def test_sft_example_direct_and_worked():
    problem = Problem(id="x", prompt="7+5*3-2=", answer="20", topic="mix", difficulty=3)
    assert ArithmeticTask().sft_example(problem) == ("7+5*3-2=", "20")
    prompt, completion = ArithmeticTask(worked_solution=True).sft_example(problem)
    assert prompt == "7+5*3-2="
    assert completion == "7+15-2=22-2=20"


def test_reduction_steps_keep_the_value(splits):
    for problem in splits[1]:
        steps = reduction_steps(problem.prompt.removesuffix("="))
        assert len(steps) == problem.difficulty + 1
        assert all(str(eval(step)) == problem.answer for step in steps)  # noqa: S307
        assert steps[-1] == problem.answer
