"""Train and eval problems for a run, from the ``task`` section of the config."""

from __future__ import annotations

import random
import warnings

from rlkit.tasks.base import Problem
from rlkit.tasks.registry import TASKS

EVAL_SUBSET_SEED = 0


def subset(problems: list[Problem], n: int) -> list[Problem]:
    """``n`` problems drawn without replacement under a fixed seed (splits are ordered cell by
    cell, so a plain prefix would cover only the first topics)."""
    if n >= len(problems):
        return problems
    return random.Random(EVAL_SUBSET_SEED).sample(problems, n)


def load_problems(task_cfg) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) problems. The run's seed does not change the task (it only orders it): by
    default the arithmetic task is the one the built-in tiny model was warm-started on, and
    ``task.arithmetic`` changes its fields (topics, difficulties, split sizes); the same for the
    word problems (``task.word_problems``). A registered task (`rlkit.tasks.registry.TASKS`)
    gives its own splits; any other ``task.name`` is a math dataset or a local file."""
    if task_cfg.name in TASKS:
        task = TASKS[task_cfg.name](task_cfg)
        train, evaluation = task.problems("train"), task.problems("eval")
        return subset(train, task_cfg.num_train), subset(evaluation, task_cfg.num_eval)

    from rlkit.tasks.math_datasets import eval_split, load_math_problems

    # split=None: each dataset's own split (MATH-500 ships only "test", AIME only "train").
    train = load_math_problems(task_cfg.name, template=task_cfg.template)
    eval_name = task_cfg.eval_name or (task_cfg.name if eval_split(task_cfg.name) else None)
    if eval_name is not None:
        evaluation = load_math_problems(
            eval_name, split=eval_split(eval_name), template=task_cfg.template
        )
        return subset(train, task_cfg.num_train), subset(evaluation, task_cfg.num_eval)
    # no separate eval set: hold out num_eval problems of the training data
    if len(train) <= task_cfg.num_eval:
        raise ValueError(
            f"task.name={task_cfg.name}: {len(train)} problems are too few to hold out "
            f"task.num_eval={task_cfg.num_eval} for evaluation and train on the rest; lower "
            "task.num_eval or give a separate task.eval_name"
        )
    held_out = subset(train, task_cfg.num_eval)
    held_ids = {p.id for p in held_out}
    return subset([p for p in train if p.id not in held_ids], task_cfg.num_train), held_out


def _given(section: str, settings: dict) -> str:
    """`` with SECTION.KEY=VALUE, …``: the fields a config gave a built-in task's section (they
    size its splits), for a message about a split; empty when it gave none."""
    keys = [f"{section}.{name}={value}" for name, value in settings.items()]
    return f" with {', '.join(keys)}" if keys else ""


def _task_settings(task) -> str:
    """:func:`_given` of ``task.arithmetic`` or ``task.word_problems``, whichever section sizes
    the built-in task ``task.name`` (empty for a dataset)."""
    if task.name in ("arithmetic", "word_problems"):
        return _given(f"task.{task.name}", getattr(task, task.name))
    return ""


def check_sizes(
    cfg,
    evaluation: list[Problem],
    train: list[Problem] | None = None,
    shifted: list[Problem] | None = None,
) -> None:
    """Before any work: the run's problems cover what ``cfg`` (a TrainConfig) asks of them.

    The eval split must hold the ``min(task.num_eval, eval.num_problems)`` problems asked for
    (fewer would be evaluated without a word), and each training set given (the task's, and
    ``shifted``, the problems of ``task.shift.arithmetic``) at least ``rollout.num_prompts``
    (a batch would repeat prompts). Each shortfall is a ValueError naming the keys and sizes;
    an empty split names the settings that sized it."""
    task = cfg.task
    source = f"task.eval_name={task.eval_name}" if task.eval_name else f"task.name={task.name}"
    wanted = min(task.num_eval, cfg.eval.num_problems)
    if not evaluation:
        raise ValueError(
            f"the eval split of {source} is empty{_task_settings(task)}: evaluation needs problems"
        )
    if len(evaluation) < wanted:
        raise ValueError(
            f"eval.num_problems={cfg.eval.num_problems} (task.num_eval={task.num_eval}) asks for "
            f"more problems than the eval split of {source} holds ({len(evaluation)}): set "
            f"eval.num_problems={len(evaluation)} or lower"
        )
    sets = [  # (the set, its note for the batch size, the settings that sized it, its problems)
        (f"task.name={task.name}", f"task.num_train={task.num_train}", _task_settings(task), train),
        (
            "task.shift.arithmetic",
            f"from step {task.shift.get('step')}",
            _given("task.shift.arithmetic", task.shift.get("arithmetic", {})),
            shifted,
        ),
    ]
    num_prompts = cfg.rollout.num_prompts
    for where, note, given, problems in sets:
        if problems is None:
            continue
        if not problems:
            raise ValueError(
                f"the training split of {where} is empty{given}: training needs problems"
            )
        if len(problems) < num_prompts:
            raise ValueError(
                f"rollout.num_prompts={num_prompts} is more than the {len(problems)} training "
                f"problems of {where} ({note}): every batch would repeat prompts; set "
                f"rollout.num_prompts={len(problems)} or lower"
            )


def check_context(max_new_tokens: int, context: int | None, model: str) -> None:
    """``rollout.max_new_tokens`` leaves room for a prompt in the context of ``model`` (``context``
    None: unknown, no check); a ValueError names both."""
    if context and max_new_tokens >= context:
        raise ValueError(
            f"rollout.max_new_tokens={max_new_tokens} does not fit the context of "
            f"model.name_or_path={model} ({context} tokens, max_position_embeddings, the prompt "
            f"included): set rollout.max_new_tokens below {context}"
        )


def warn_long_prompts(problems, tokenizer, context: int | None, max_new_tokens: int) -> int:
    """Warn, with the count, about prompts that leave fewer than ``max_new_tokens`` positions of
    the model's context (``context`` None: unknown, no check). Returns the count."""
    if not context or not problems:
        return 0
    limit = context - max_new_tokens
    lengths = [len(ids) for ids in tokenizer([p.prompt for p in problems])["input_ids"]]
    too_long = sum(n > limit for n in lengths)
    if too_long:
        warnings.warn(
            f"{too_long} of {len(problems)} prompts are longer than {limit} tokens: with "
            f"rollout.max_new_tokens={max_new_tokens} they exceed the model's context of "
            f"{context} tokens (generation past the context is unreliable)",
            stacklevel=2,
        )
    return too_long


def shifted_train_problems(task_cfg) -> list[Problem]:
    """The training problems from step ``task.shift.step`` on: the train split of the arithmetic
    task ``task.shift.arithmetic``, subset to ``task.num_train`` like the original."""
    from rlkit.tasks.arithmetic import arithmetic_task

    task = arithmetic_task(task_cfg.shift["arithmetic"], "task.shift.arithmetic")
    return subset(task.problems("train"), task_cfg.num_train)
