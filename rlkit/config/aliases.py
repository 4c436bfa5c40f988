"""The one method switch, ``algo.method``, and its older keys read as aliases when a config is
loaded (docs/algorithms.md, "Choosing a method").

Before ``algo.method`` a method was chosen by ``agpo.enabled=true`` (AGPO) or by its own
estimator (``algo.estimator=ppo``, ``algo.estimator=dpo``). Saved run configs, the committed
sweep specs and the summaries' spec overrides still say so: :func:`resolve_method` rewrites a
config mapping's older keys into ``algo.method`` before it becomes a
:class:`~rlkit.config.schema.TrainConfig` (`rlkit.config.loading.config_from_dict`, the one
place every preset, file, saved config and override passes), so each chooses the method it chose
before. A method that trains on an estimator of its own (its ``own_estimator``: PPO's ``ppo``,
DPO's ``dpo``) sets ``algo.estimator`` to it where the config leaves the estimator at its
default; settings that choose different methods, or a method with another estimator than its
own, are refused naming both.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.schema import AlgoConfig
from rlkit.methods.registry import METHODS, get_method
from rlkit.settings import show

# the older key that chose AGPO (true) or nothing (false), section and field
AGPO_SWITCH = ("agpo", "enabled")
AGPO_KEY = ".".join(AGPO_SWITCH)


def _estimator_owners() -> dict[str, str]:
    """Estimator name → the method that trains on it alone (its ``own_estimator``)."""
    return {cls.own_estimator: name for name, cls in METHODS.items() if cls.own_estimator}


def method_settings(data: dict) -> dict[str, str]:
    """The settings of config mapping ``data`` that choose a method, as ``key=value`` → the
    method's name: ``agpo.enabled=true``, an estimator a method owns, and ``algo.method``."""
    algo, agpo = data.get("algo"), data.get("agpo")
    chosen = {}
    if isinstance(agpo, dict) and AGPO_SWITCH[1] in agpo:
        enabled = agpo[AGPO_SWITCH[1]]
        if not isinstance(enabled, bool):
            raise ValueError(f"{AGPO_KEY} must be true or false, got {enabled!r}")
        if enabled:
            chosen[show(AGPO_KEY, True)] = "agpo"
    if isinstance(algo, dict):
        owner = _estimator_owners().get(algo.get("estimator"))
        if owner is not None:
            chosen[show("algo.estimator", algo["estimator"])] = owner
        if "method" in algo:
            if not isinstance(algo["method"], str):
                raise ValueError(f"algo.method must be a string, got {algo['method']!r}")
            chosen[show("algo.method", algo["method"])] = algo["method"]
    return chosen


def older_keys() -> str:
    """The older keys for ``algo.method``, for messages."""
    owned = (show("algo.estimator", estimator) for estimator in _estimator_owners())
    return ", ".join([show(AGPO_KEY, True), *owned])


def resolve_method(data: dict) -> dict:
    """``data`` with its method chosen by ``algo.method`` alone: the older keys rewritten into it
    (AGPO's older key dropped), and ``algo.estimator`` set to the method's own estimator where
    left at its default. An unknown method is a ValueError listing the known ones; settings
    choosing different methods, or another estimator than the method's own, name both keys."""
    chosen = method_settings(data)
    if len(set(chosen.values())) > 1:
        raise ValueError(
            f"{' and '.join(chosen)} choose different methods "
            f"({', '.join(dict.fromkeys(chosen.values()))}); set algo.method alone "
            f"({older_keys()} are older keys for it)"
        )
    resolved = dict(data)
    section, name = AGPO_SWITCH
    if isinstance(data.get(section), dict):
        resolved[section] = {key: v for key, v in data[section].items() if key != name}
    if not chosen or not isinstance(data.get("algo", {}), dict):
        return resolved
    method = next(iter(chosen.values()))
    try:
        own = get_method(method).own_estimator
    except ValueError as err:
        raise ValueError(f"algo.method: {err}") from None
    algo: dict[str, Any] = {**data.get("algo", {}), "method": method}
    estimator = algo.get("estimator", AlgoConfig.estimator)
    if own is not None and estimator == AlgoConfig.estimator:
        algo["estimator"] = own
    elif own is not None and estimator != own:
        raise ValueError(
            f"algo.method={method} with algo.estimator={estimator}: the {method} method trains "
            f"on its own estimator; set algo.estimator={own} or leave it at its default"
        )
    resolved["algo"] = algo
    return resolved
