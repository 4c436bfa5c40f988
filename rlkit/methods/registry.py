"""The method registry and the one method switch (docs/algorithms.md §1–§4; adding a method:
docs/contributing.md, "Adding a method").

A method is a :class:`~rlkit.methods.base.Method` subclass registered under a name with
:func:`register_method`. Each declares the config setting that chooses it (``switch``, a dotted
key and its value): today's keys, ``algo.estimator=ppo``, ``algo.estimator=dpo`` and
``agpo.enabled=true``, so every saved config, preset and sweep spec chooses the method it chose
before. :func:`method_name` reads those declarations, the only place a config becomes a method's
name; :func:`build_method` builds it with its ``from_config``.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.schema import TrainConfig
from rlkit.dist import Collective
from rlkit.registry import Registry
from rlkit.settings import setting, show

DEFAULT_METHOD = "grpo"  # GRPO, Dr. GRPO, RLOO, EBPO, …: the estimator's advantages alone
METHODS: Registry[type] = Registry("method", sort_known=True)  # name → Method subclass
# class decorator adding a method under a name; a name registered twice names both classes
register_method = METHODS.register
get_method = METHODS.get  # the method class registered as a name; an unknown one lists the known


def method_name(cfg: TrainConfig) -> str:
    """The registered method ``cfg`` chooses: the one whose ``switch`` it sets, else the GRPO
    family's; two methods chosen at once is a ValueError naming both settings."""
    chosen = {
        name: cls.switch
        for name, cls in METHODS.items()
        if cls.switch is not None and setting(cfg, cls.switch[0]) == cls.switch[1]
    }
    if len(chosen) > 1:
        settings = " and ".join(show(*switch) for switch in chosen.values())
        raise ValueError(f"{settings} choose different methods ({', '.join(chosen)}); set one")
    return next(iter(chosen), DEFAULT_METHOD)


def build_method(cfg: TrainConfig, dist: Collective | None = None) -> Any:
    """The configured method (``rlkit.methods.base.Method``), built by its ``from_config``;
    ``dist`` is the run's ``rlkit.dist.Collective`` (None: one process)."""
    return get_method(method_name(cfg)).from_config(cfg, dist)


def method_switches(cfg: TrainConfig) -> dict[str, bool]:
    """Which of the methods' mechanisms ``cfg`` switches on, by name, for code that describes
    runs without building them (`rlkit.reanalysis`' one manipulation rule per mechanism): EBPO's
    shrinkage, AGPO's adaptive clip and adaptive temperature (AGPO's controllers on AGPO's
    advantage), Dr. GRPO's normalisation."""
    on = get_method(method_name(cfg)).mechanisms(cfg)
    return {
        name: name in on
        for name in ("ebpo", "agpo_adaptive_clip", "agpo_adaptive_temperature", "dr_grpo")
    }
