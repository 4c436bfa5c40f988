"""Tasks generated in code, registered by name: ``task.name=<name>`` chooses one (adding one:
docs/contributing.md, "Adding a task").

An entry is a function of the run's ``task`` config section (`rlkit.config.TaskConfig`) returning
a task: an object whose ``problems(split)`` gives the ``train`` or ``eval`` split's
`rlkit.tasks.base.Problem` list, the same list for the same config. The built-in entries are
``arithmetic`` (:mod:`rlkit.tasks.arithmetic`) and ``word_problems``
(:mod:`rlkit.tasks.word_problems`); a ``task.name`` that is not registered names a math dataset
or a local file (:mod:`rlkit.tasks.math_datasets`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlkit.registry import Registry

# task.name → the task built from the task section; a name registered twice is a ValueError
TASKS: Registry[Callable[[Any], Any]] = Registry("task", sort_known=True)
register_task = TASKS.register  # decorator: ``build(task_cfg) -> task`` as the task ``name``
