"""Methods as registered plug-ins (docs/algorithms.md §1–§4; adding one: docs/contributing.md).

Every module of this package is imported with it, so a new file here that decorates its
:class:`~rlkit.methods.base.Method` subclass with :func:`register_method` is a new method. The
built-in entries: ``grpo`` (the GRPO family, :mod:`rlkit.methods.base`), ``agpo``
(:mod:`rlkit.methods.agpo`), ``ppo`` (:mod:`rlkit.methods.ppo`) and ``dpo``
(:mod:`rlkit.methods.dpo`); :func:`build_method` builds the one a config chooses.
"""

from __future__ import annotations

from rlkit.methods.agpo import AGPO
from rlkit.methods.base import Method, Sampler, Update
from rlkit.methods.dpo import DPO
from rlkit.methods.ppo import PPO
from rlkit.methods.registry import (
    METHODS,
    build_method,
    get_method,
    method_name,
    method_switches,
    register_method,
)
from rlkit.registry import import_all

import_all(__name__, __path__)

__all__ = [
    "AGPO",
    "DPO",
    "METHODS",
    "PPO",
    "Method",
    "Sampler",
    "Update",
    "build_method",
    "get_method",
    "method_name",
    "method_switches",
    "register_method",
]
