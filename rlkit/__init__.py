"""rlkit: reinforcement learning of language models with verifiable rewards.

GRPO and its relatives, EBPO (empirical-Bayes shrinkage baseline, arXiv 2602.05165) and AGPO
(adaptive clipping and adaptive sampling temperature, arXiv 2605.20722). The formulas follow
``docs/algorithms.md``; each function's docstring names the section it implements.
"""

__version__ = "0.1.0"
