"""Tasks: verifiable problems with reference answers (built-in arithmetic, math datasets)."""

from rlkit.tasks.arithmetic import ArithmeticTask
from rlkit.tasks.base import Problem
from rlkit.tasks.math_datasets import load_math_problems

__all__ = ["ArithmeticTask", "Problem", "load_math_problems"]
