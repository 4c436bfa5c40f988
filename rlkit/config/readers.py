"""Who reads each config setting, and the one rule for settings that cannot act (issue 44 §3).

Every registered estimator (``algo.estimator``), loss (``loss.loss_mode``), rollout engine
(``rollout.engine``) and method (``algo.method``) declares the settings it reads and those its
mechanism replaces (`rlkit.settings`); a config section declares the fields it reads only under
another of its settings (``read_when``). A setting changed from its default is refused when an
active component replaces it, when no active component reads it, or when its reader's condition
does not hold; the message names the setting, who would read it and the setting that would
activate them. A setting nothing declares (``optim.lr``) is always read.

A changed setting must act or be refused: dropping it without a word (AGPO's adaptive clip
replacing the 8B presets' clip-higher ``loss.eps_high=0.28``) gives a run that is not the one
asked for (docs/algorithms.md §4).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

from rlkit.advantages import ESTIMATORS
from rlkit.config.schema import TrainConfig
from rlkit.engines import ENGINES
from rlkit.losses import get_loss, loss_modes
from rlkit.methods.registry import METHODS
from rlkit.settings import Replaces, When, equals, setting, show


@dataclass(frozen=True)
class Component:
    """A registered entry as the rule sees it: its kind and name, the setting that chooses it
    (``chosen``), and its declarations."""

    kind: str  # estimator | loss | engine | method
    name: str
    chosen: When
    reads: dict[str, When | None]
    replaces: tuple[Replaces, ...] = ()


def method_choice(name: str) -> When:
    """The setting that chooses method ``name``: ``algo.method``."""
    return equals("algo.method", name)


def components() -> list[Component]:
    """Every registered component, estimators, losses, engines and methods in that order."""
    chosen_by = (
        ("estimator", "algo.estimator", ESTIMATORS),
        ("loss", "loss.loss_mode", {name: get_loss(name) for name in loss_modes()}),
        ("engine", "rollout.engine", ENGINES),
    )
    found = [
        Component(kind, name, equals(key, name), entry.reads)
        for kind, key, registry in chosen_by
        for name, entry in registry.items()
    ]
    return found + [
        Component("method", name, method_choice(name), cls.reads, cls.replaces)
        for name, cls in METHODS.items()
    ]


def section_conditions() -> dict[str, When]:
    """The fields each config section reads only under another setting (``read_when``), by
    dotted key."""
    return {
        f"{section.name}.{name}": when
        for section in dataclasses.fields(TrainConfig)
        for name, when in getattr(section.default_factory, "read_when", {}).items()
    }


def _has(cfg: TrainConfig, keys: tuple[str, ...]) -> str:
    """What ``cfg`` sets ``keys`` to, and what to do."""
    values = " and ".join(show(key, setting(cfg, key)) for key in dict.fromkeys(keys))
    return f"this config has {values}: change that or leave it at its default"


def _names(readers: list[tuple[Component, When | None]]) -> str:
    """``the loss clip_cov (loss.loss_mode=clip_cov)``; ``the methods grpo (…), agpo (…)``."""
    kinds = {}
    for component, when in readers:
        condition = f" with {when.text}" if when is not None else ""
        kinds.setdefault(component.kind, []).append(
            f"{component.name} ({component.chosen.text}){condition}"
        )
    return " and ".join(
        f"the {kind if len(names) == 1 else kind + ('es' if kind.endswith('s') else 's')} "
        + ", ".join(names)
        for kind, names in kinds.items()
    )


def unread(cfg: TrainConfig, key: str, every: list[Component] | None = None) -> str | None:
    """Why setting ``key`` cannot act in ``cfg`` (what follows ``key=value`` in the refusal), or
    None where it is read."""
    every = components() if every is None else every
    active = [c for c in every if c.chosen(cfg)]
    for component in active:
        for replaced in component.replaces:
            if key in replaced.keys and (replaced.when is None or replaced.when(cfg)):
                under = component.chosen.text
                under += f" and {replaced.when.text}" if replaced.when is not None else ""
                return f"has no effect with {under}: {replaced.because}; {replaced.fix}"
    readers = [(c, c.reads[key]) for c in every if key in c.reads]
    if not readers:
        when = section_conditions().get(key)
        if when is None or when(cfg):
            return None
        return f"is read only with {when.text}; {_has(cfg, when.keys)}"
    reading = [(c, when) for c, when in readers if c in active]
    if any(when is None or when(cfg) for _, when in reading):
        return None
    if reading:  # an active reader, under a condition that does not hold
        whens = list(dict.fromkeys(when for _, when in reading))
        texts = " or ".join(when.text for when in whens)
        keys = tuple(k for when in whens for k in when.keys)
        by = " and ".join(f"the {c.kind} {c.name}" for c, _ in reading)
        return f"is read only with {texts} (by {by}); {_has(cfg, keys)}"
    kinds = dict.fromkeys(c.kind for c, _ in readers)
    this = "this config's " + " and its ".join(
        f"{kind} is {', '.join(c.name for c in active if c.kind == kind)}" for kind in kinds
    )
    switches = list(dict.fromkeys(c.chosen.text for c, _ in readers))
    simple = all(" " not in text for text in switches)
    choose = " or ".join(switches) if simple else "one of: " + "; ".join(switches) + ";"
    return f"is read only by {_names(readers)}; {this}: set {choose} or leave it at its default"


def _position(key: str, order: list[str]) -> tuple[int, str]:
    """Where ``key`` comes in the config: its field's place (``algo.options``' for
    ``algo.options.prior``), then its name."""
    return order.index(".".join(key.split(".")[:2])), key


def changed(cfg: TrainConfig, key: str) -> tuple[bool, Any]:
    """Whether ``key`` differs from its default, and its value. An ``algo.options`` entry is
    changed where given with another value than the estimator's default."""
    section, name, *option = key.split(".")
    value = getattr(getattr(cfg, section), name)
    if option:  # algo.options.<name>: options the estimator takes (check_combination)
        if option[0] not in value:
            return False, None
        default = inspect.signature(ESTIMATORS[cfg.algo.estimator]).parameters[option[0]]
        return value[option[0]] != default.default, value[option[0]]
    part = getattr(cfg, section)
    spec = next(f for f in dataclasses.fields(part) if f.name == name)
    default = spec.default_factory() if spec.default is dataclasses.MISSING else spec.default
    return value != default, value


def ignored_settings(cfg: TrainConfig) -> list[str]:
    """Settings changed from their default that cannot act, in the config's order: one message
    per setting, naming who would read it and what activates them (:func:`unread`)."""
    every = components()
    declared = {key for c in every for key in c.reads}
    declared |= {key for c in every for r in c.replaces for key in r.keys}
    declared |= set(section_conditions())
    order = [
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(TrainConfig)
        if dataclasses.is_dataclass(getattr(cfg, section.name))
        for f in dataclasses.fields(getattr(cfg, section.name))
    ]
    found = []
    for key in sorted(declared, key=lambda k: _position(k, order)):
        is_changed, value = changed(cfg, key)
        if is_changed and (why := unread(cfg, key, every)) is not None:
            found.append(f"{key}={value!r} {why}")
    return found
