"""Built-in synthetic word problems in natural language, for pretrained chat models
(``task.name=word_problems``; made for ``builtin:smollm2-135m-instruct``, docs/smollm2.md).

A problem is a short story of one to three arithmetic steps and a question, e.g. "Mia has 3 boxes
with 7 crayons in each box. Then Mia gives 5 crayons to a friend. How many crayons does Mia have
now? Put the final answer in \\boxed{}." with the integer answer ``16``. Problems carry two
cluster labels (docs/algorithms.md §2, "Clustered sampling"):

- topic = the template (`TEMPLATES`): ``collect`` (a count that grows and shrinks), ``groups``
  (a product first), ``share`` (an exact quotient first) or ``shop`` (a price times a quantity);
- difficulty = `LEVELS`: the number of steps and the operand range (1-3: one to three steps with
  operands 2-9; 4-6: the same with operands 10-99). Multipliers and divisors stay 2-9.

Every step after the template's first adds or removes a quantity (a removal never takes the
count below zero). Names and items vary; they are not part of a problem's identity: the split
of a problem is decided by a stable hash of its template, level and numbers (salted with the
task seed), so a held-out problem's arithmetic never appears in training under other names.
Both splits are balanced over (topic, difficulty) cells and fully determined by the task's fields.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, fields

from rlkit.tasks.base import Problem
from rlkit.tasks.registry import register_task

INSTRUCTION = "Put the final answer in \\boxed{}."
NAMES = ("Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Emma", "Noah", "Zoe")


@dataclass(frozen=True)
class Template:
    """One story shape: the first step's sentence (operands ``a`` and ``b``, value `first`), the
    sentences of a later addition or removal (operand ``c``) and the question."""

    first: str
    operation: str  # "+", "*" or "/": how the first sentence combines a and b
    more: str
    less: str
    question: str
    items: tuple[str, ...]


TEMPLATES = {
    "collect": Template(
        "{name} has {a} {items}. {name} finds {b} more {items}.",
        "+",
        "Then {name} finds {c} more {items}.",
        "Then {name} gives {c} {items} to a friend.",
        "How many {items} does {name} have now?",
        ("apples", "marbles", "stickers", "shells", "cards"),
    ),
    "groups": Template(
        "{name} has {a} boxes with {b} {items} in each box.",
        "*",
        "Then {name} buys {c} more {items}.",
        "Then {name} gives {c} {items} to a friend.",
        "How many {items} does {name} have now?",
        ("pencils", "cookies", "crayons", "eggs", "buttons"),
    ),
    "share": Template(
        "{name} shares {ab} {items} equally among {b} friends.",
        "/",
        "Then each friend gets {c} more {items}.",
        "Then each friend eats {c} of the {items}.",
        "How many {items} does each friend have now?",
        ("candies", "grapes", "strawberries", "nuts", "cherries"),
    ),
    "shop": Template(
        "{name} buys {a} {items} at {b} dollars each.",
        "*",
        "{name} also pays {c} dollars for a bag.",
        "{name} has a coupon for {c} dollars off.",
        "How many dollars does {name} pay in total?",
        ("notebooks", "books", "tickets", "toys", "plants"),
    ),
}
# difficulty -> (steps, largest operand); the smallest operand is 2 (largest 9) or 10 (99)
LEVELS = {1: (1, 9), 2: (2, 9), 3: (3, 9), 4: (1, 99), 5: (2, 99), 6: (3, 99)}
SPLITS = ("train", "eval")
MAX_FRUITLESS_DRAWS = 2000  # a cell is exhausted after this many draws without a new problem


@dataclass(frozen=True)
class WordProblemTask:
    """A family of word problems over templates × levels (``task.word_problems`` fields).

    Args:
        seed: salts the split hash and seeds generation; a different seed is a different task.
        templates: subset of `TEMPLATES` (the topics).
        difficulties: subset of `LEVELS`.
        train_size, eval_size: requested split sizes, spread evenly over the cells (a cell with
            fewer distinct problems yields all it finds).
        eval_fraction: share of all problems reserved for the eval split.
    """

    seed: int = 0
    templates: tuple[str, ...] = tuple(TEMPLATES)
    difficulties: tuple[int, ...] = (1,)  # the cells where the model's groups are mixed
    train_size: int = 2000
    eval_size: int = 400
    eval_fraction: float = 0.2

    def __post_init__(self):
        object.__setattr__(self, "templates", tuple(self.templates))  # YAML gives lists
        object.__setattr__(self, "difficulties", tuple(self.difficulties))
        for name in self.templates:
            if name not in TEMPLATES:
                raise ValueError(f"templates: unknown template {name!r}; known: {tuple(TEMPLATES)}")
        for level in self.difficulties:
            if level not in LEVELS:
                raise ValueError(
                    f"difficulties: unknown difficulty {level!r}; known: {tuple(LEVELS)}"
                )
        if not self.templates or not self.difficulties:
            raise ValueError("templates and difficulties must be non-empty")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        for name in ("train_size", "eval_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def problems(self, split: str) -> list[Problem]:
        """The split's distinct problems, ordered cell by cell (template-major, then level)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        size = self.train_size if split == "train" else self.eval_size
        cells = [(t, d) for t in self.templates for d in self.difficulties]
        problems: list[Problem] = []
        for index, (template, level) in enumerate(cells):
            count = size // len(cells) + (index < size % len(cells))
            problems += self._cell_problems(split, template, level, count)
        return problems

    def _cell_problems(self, split: str, template: str, level: int, count: int) -> list[Problem]:
        rng = random.Random(f"{self.seed}/{split}/{template}/{level}")
        problems, seen, fruitless = [], set(), 0
        while len(problems) < count and fruitless < MAX_FRUITLESS_DRAWS:
            numbers, signs = _sample_numbers(rng, TEMPLATES[template], *LEVELS[level])
            key = f"{template}/d{level}/{','.join(map(str, numbers))}{signs}"
            if key in seen or self._split_of(key) != split:
                fruitless += 1
                continue
            fruitless = 0
            seen.add(key)
            text, answer = _render(rng, TEMPLATES[template], numbers, signs)
            problems.append(
                Problem(
                    id=key,
                    prompt=text,
                    answer=str(answer),
                    topic=template,
                    difficulty=level,
                )
            )
        return problems

    def _split_of(self, key: str) -> str:
        digest = hashlib.blake2b(f"{self.seed}|{key}".encode(), digest_size=8).digest()
        return "eval" if int.from_bytes(digest, "big") / 2**64 < self.eval_fraction else "train"


def word_problem_task(options: dict) -> WordProblemTask:
    """`WordProblemTask(**options)`, with an unknown field named as ``task.word_problems.<field>``."""
    known = {f.name for f in fields(WordProblemTask)}
    for key in options:
        if key not in known:
            raise ValueError(f"unknown config key task.word_problems.{key}; known: {sorted(known)}")
    try:
        return WordProblemTask(**options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"task.word_problems: {err}") from None


@register_task("word_problems")
def from_config(task_cfg) -> WordProblemTask:
    """``task.name=word_problems``: the task with the fields of ``task.word_problems``."""
    return word_problem_task(task_cfg.word_problems)


def _first_value(operation: str, a: int, b: int) -> int:
    return a + b if operation == "+" else a * b if operation == "*" else a


def _sample_numbers(
    rng: random.Random, template: Template, steps: int, largest: int
) -> tuple[tuple[int, ...], str]:
    """(a, b, c...) and the signs of the later steps: ``+`` adds c, ``-`` removes it. For ``/``
    the story divides a·b by b; multipliers and divisors are 2-9."""
    smallest = 2 if largest < 10 else 10
    a = rng.randint(smallest, largest)
    b = rng.randint(2, 9) if template.operation in "*/" else rng.randint(smallest, largest)
    value = _first_value(template.operation, a, b)
    numbers, signs = [a, b], ""
    for _ in range(steps - 1):
        c = rng.randint(smallest, largest)
        sign = rng.choice("+-") if c <= value else "+"
        value += c if sign == "+" else -c
        numbers.append(c)
        signs += sign
    return tuple(numbers), signs


def _render(
    rng: random.Random, template: Template, numbers: tuple[int, ...], signs: str
) -> tuple[str, int]:
    """The problem's text (name and items drawn from ``rng``) and its answer."""
    names = {"name": rng.choice(NAMES), "items": rng.choice(template.items)}
    a, b = numbers[:2]
    sentences = [template.first.format(a=a, b=b, ab=a * b, **names)]
    value = _first_value(template.operation, a, b)
    for c, sign in zip(numbers[2:], signs):
        sentences.append((template.more if sign == "+" else template.less).format(c=c, **names))
        value += c if sign == "+" else -c
    sentences += [template.question.format(**names), INSTRUCTION]
    return " ".join(sentences), value
