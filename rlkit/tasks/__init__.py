"""Tasks: verifiable problems with reference answers (built-in arithmetic, math datasets).

Every module of this package is imported with it, so a new file here that decorates its builder
with :func:`~rlkit.tasks.registry.register_task` is a new ``task.name`` (docs/contributing.md).
"""

import importlib
import pkgutil

from rlkit.tasks.arithmetic import ArithmeticTask
from rlkit.tasks.base import Problem
from rlkit.tasks.math_datasets import load_math_problems
from rlkit.tasks.registry import TASKS, register_task

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["TASKS", "ArithmeticTask", "Problem", "load_math_problems", "register_task"]
