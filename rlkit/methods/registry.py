"""The method registry and the one method switch (docs/algorithms.md §1–§4; adding a method:
docs/contributing.md, "Adding a method").

A method is a :class:`~rlkit.methods.base.Method` subclass registered under a name with
:func:`register_method`, chosen by that name in ``algo.method`` (the older keys
``agpo.enabled=true`` and ``algo.estimator=ppo``/``dpo`` are rewritten into it when a config is
loaded, `rlkit.config.aliases`). :func:`method_name` reads it, the only place a config becomes a
method's name; :func:`build_method` builds it with its ``from_config``.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.schema import AlgoConfig, TrainConfig
from rlkit.dist import Collective
from rlkit.registry import Registry

# algo.method's default, grpo: GRPO, Dr. GRPO, RLOO, EBPO, …, the estimator's advantages alone
DEFAULT_METHOD = AlgoConfig.method
METHODS: Registry[type] = Registry("method", sort_known=True)  # name → Method subclass
# class decorator adding a method under a name; a name registered twice names both classes
register_method = METHODS.register
get_method = METHODS.get  # the method class registered as a name; an unknown one lists the known


def method_name(cfg: TrainConfig) -> str:
    """The registered method ``cfg`` chooses (``algo.method``); an unknown one is a ValueError
    listing the known."""
    get_method(cfg.algo.method)
    return cfg.algo.method


def build_method(cfg: TrainConfig, dist: Collective | None = None) -> Any:
    """The configured method (``rlkit.methods.base.Method``), built by its ``from_config``;
    ``dist`` is the run's ``rlkit.dist.Collective`` (None: one process)."""
    return get_method(method_name(cfg)).from_config(cfg, dist)


def method_switches(cfg: TrainConfig) -> dict[str, bool]:
    """Which of the methods' mechanisms ``cfg`` switches on, by name, for code that describes
    runs without building them (`rlkit.reanalysis`' one manipulation rule per mechanism): EBPO's
    shrinkage, AGPO's adaptive clip and adaptive temperature (AGPO's controllers on AGPO's
    advantage), Dr. GRPO's normalisation, SPO's per-prompt value tracker."""
    on = get_method(method_name(cfg)).mechanisms(cfg)
    return {
        name: name in on
        for name in ("ebpo", "agpo_adaptive_clip", "agpo_adaptive_temperature", "dr_grpo", "spo")
    }
