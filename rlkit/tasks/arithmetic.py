"""Built-in synthetic verifiable task: multi-operand integer arithmetic.

Each problem is a plain-text expression such as ``7+5*3=`` whose reference answer is the integer
value (``22``), written for a character-level tokenizer. Problems carry two cluster labels
(docs/algorithms.md §2, "Clustered sampling"):

- topic = operation type: ``add`` (only ``+``), ``sub`` (only ``-``), ``mul`` (only ``*``) or
  ``mix`` (random ``+ - *``, usual precedence);
- difficulty = the operand shape in `DIFFICULTY_SHAPES`, the number of digits of each operand:
  difficulty d has d + 1 one-digit operands (``3+5`` is difficulty 1, ``3-5-2-8-1`` difficulty 4).

One-digit operands keep the task learnable by a tiny model in a short warm-up: held-out problems
share their single-digit facts with training problems, so accuracy on them measures a skill, not
memorisation. The four difficulties are not strictly ordered by how hard the model finds them
(``mul`` and ``mix`` are much harder than ``add``); curricula should rank by measured pass rate.

The right-hand factor of every ``*`` has one digit (2-9), so products stay a few digits long.

Train and eval splits never overlap: a stable hash of the expression (salted with the task seed)
decides which split an expression belongs to, so the split of a problem does not depend on the
requested sizes. Both splits are balanced over (topic, difficulty) cells and fully determined by
the task's fields.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, fields

from rlkit.tasks.base import Problem
from rlkit.tasks.registry import register_task

OPERATORS = {"add": "+", "sub": "-", "mul": "*"}
TOPICS = ("add", "sub", "mul", "mix")
# The built-in default task. `mul` and `mix` are left out: multi-digit products are beyond what
# the 0.2M-parameter model learns without worked solutions, so those cells sit near 10% and give
# RL almost no signal (measured in docs/tiny-default.md); add them back with task.arithmetic.topics.
BUILTIN_TOPICS = ("add", "sub")
# difficulty -> digits of each operand (the rest of the module handles any shape)
DIFFICULTY_SHAPES = {1: (1, 1), 2: (1, 1, 1), 3: (1, 1, 1, 1), 4: (1, 1, 1, 1, 1)}
SPLITS = ("train", "eval")
ALPHABET = "0123456789+-*="
MAX_FRUITLESS_DRAWS = 2000  # a cell is exhausted after this many draws without a new problem


@dataclass(frozen=True)
class ArithmeticTask:
    """A family of arithmetic problems over topics x difficulties.

    Args:
        seed: salts the split hash and seeds generation; a different seed is a different task.
        topics: subset of `TOPICS`.
        difficulties: subset of `DIFFICULTY_SHAPES`.
        train_size, eval_size: requested split sizes, spread evenly over the cells. A cell with
            fewer distinct expressions than requested (e.g. one-digit addition has 100) yields
            all it can find, so a split may be slightly smaller than requested.
        eval_fraction: share of all expressions reserved for the eval split.
        worked_solution: if True the SFT completion shows the intermediate reductions
            (``7+5*3=`` -> ``7+15=22``); the answer is always the last number.
    """

    seed: int = 0
    topics: tuple[str, ...] = BUILTIN_TOPICS
    difficulties: tuple[int, ...] = (1, 2, 3, 4)
    train_size: int = 8000
    eval_size: int = 1024
    eval_fraction: float = 0.2
    worked_solution: bool = False

    def __post_init__(self):
        object.__setattr__(self, "topics", tuple(self.topics))  # YAML gives lists
        object.__setattr__(self, "difficulties", tuple(self.difficulties))
        for topic in self.topics:
            if topic not in TOPICS:
                raise ValueError(f"topics: unknown topic {topic!r}; known: {TOPICS}")
        for difficulty in self.difficulties:
            if difficulty not in DIFFICULTY_SHAPES:
                raise ValueError(
                    f"difficulties: unknown difficulty {difficulty!r}; "
                    f"known: {tuple(DIFFICULTY_SHAPES)}"
                )
        if not self.topics or not self.difficulties:
            raise ValueError("topics and difficulties must be non-empty")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        for name in ("train_size", "eval_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def alphabet(self) -> str:
        """Every character a prompt or completion can contain."""
        return ALPHABET

    def problems(self, split: str) -> list[Problem]:
        """The split's distinct problems, ordered cell by cell (topic-major, then difficulty)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        size = self.train_size if split == "train" else self.eval_size
        cells = [(t, d) for t in self.topics for d in self.difficulties]
        problems: list[Problem] = []
        seen: set[str] = set()  # shared by the cells: a "mix" draw may repeat an "add" one
        for index, (topic, difficulty) in enumerate(cells):
            count = size // len(cells) + (index < size % len(cells))
            problems += self._cell_problems(split, topic, difficulty, count, seen)
        return problems

    def sft_example(self, problem: Problem) -> tuple[str, str]:
        """(prompt, target completion) for supervised warm-up; the caller appends EOS."""
        if not self.worked_solution:
            return problem.prompt, problem.answer
        steps = reduction_steps(problem.prompt.removesuffix("="))
        return problem.prompt, "=".join(steps[1:])

    def _cell_problems(self, split, topic, difficulty, count, seen: set[str]) -> list[Problem]:
        rng = random.Random(f"{self.seed}/{split}/{topic}/{difficulty}")
        problems = []
        fruitless = 0
        while len(problems) < count and fruitless < MAX_FRUITLESS_DRAWS:
            expression = _sample_expression(rng, topic, DIFFICULTY_SHAPES[difficulty])
            if expression in seen or self._split_of(expression) != split:
                fruitless += 1
                continue
            fruitless = 0
            seen.add(expression)
            problems.append(
                Problem(
                    id=f"{topic}/d{difficulty}/{expression}",
                    prompt=expression + "=",
                    answer=str(evaluate(expression)),
                    topic=topic,
                    difficulty=difficulty,
                )
            )
        return problems

    def _split_of(self, expression: str) -> str:
        digest = hashlib.blake2b(f"{self.seed}|{expression}".encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest, "big") / 2**64
        return "eval" if bucket < self.eval_fraction else "train"


def arithmetic_task(options: dict, key: str = "task.arithmetic") -> ArithmeticTask:
    """`ArithmeticTask(**options)`; an error names the config ``key`` the options came from
    (``task.arithmetic``, or ``task.shift.arithmetic``), e.g. ``task.arithmetic.<field>``."""
    known = {f.name for f in fields(ArithmeticTask)}
    for name in options:
        if name not in known:
            raise ValueError(f"unknown config key {key}.{name}; known: {sorted(known)}")
    try:
        return ArithmeticTask(**options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{key}: {err}") from None


@register_task("arithmetic")
def from_config(task_cfg) -> ArithmeticTask:
    """``task.name=arithmetic``: the task with the fields of ``task.arithmetic``."""
    return arithmetic_task(task_cfg.arithmetic)


def _sample_number(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _sample_expression(rng: random.Random, topic: str, shape: tuple[int, ...]) -> str:
    text = str(_sample_number(rng, shape[0]))
    for digits in shape[1:]:
        operator = rng.choice("+-*") if topic == "mix" else OPERATORS[topic]
        operand = rng.randint(2, 9) if operator == "*" else _sample_number(rng, digits)
        text += f"{operator}{operand}"
    return text


def _tokenize(expression: str) -> tuple[list[int], list[str]]:
    """Split ``a op b op c`` (non-negative operands, a may carry a leading minus)."""
    numbers, operators, current = [], [], ""
    for position, char in enumerate(expression):
        if char in "+-*" and not (char == "-" and position == 0):
            numbers.append(int(current))
            operators.append(char)
            current = ""
        else:
            current += char
    numbers.append(int(current))
    return numbers, operators


def _format(numbers: list[int], operators: list[str]) -> str:
    return str(numbers[0]) + "".join(f"{op}{n}" for op, n in zip(operators, numbers[1:]))


def reduction_steps(expression: str) -> list[str]:
    """The expression rewritten one operation at a time: ``*`` first, then left to right.

    ``reduction_steps("17+5*3-2") == ["17+5*3-2", "17+15-2", "32-2", "30"]``.
    """
    numbers, operators = _tokenize(expression)
    steps = [expression]
    while operators:
        index = operators.index("*") if "*" in operators else 0
        left, right, op = numbers[index], numbers[index + 1], operators[index]
        value = left * right if op == "*" else left + right if op == "+" else left - right
        numbers[index : index + 2] = [value]
        del operators[index]
        steps.append(_format(numbers, operators))
    return steps


def evaluate(expression: str) -> int:
    """Integer value of an expression with ``+ - *`` and the usual precedence."""
    return int(reduction_steps(expression)[-1])
