"""How a component declares the config settings it reads (issue 44 §3).

Each registered estimator, loss, engine and method declares, by dotted key, the settings it reads
(``reads``: key → the :class:`When` it reads it under, None for always) and the settings its
mechanism replaces (``replaces``: :class:`Replaces`); a config section declares the fields it
reads only under another of its settings (``read_when``). `rlkit.config.checks.ignored_settings`
reads these declarations: a setting changed from its default that no active component reads, or
that an active one replaces, is refused, naming who would read it and what activates them. A
setting no component declares (``optim.lr``) is always read.

A leaf module: the registries and the config schema import it, and it imports nothing of rlkit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from typing import Any


def setting(cfg: Any, key: str) -> Any:
    """The value of dotted config key ``key`` (``algo.method``, ``algo.options.prior``) in
    ``cfg``; an option not given is None."""
    return reduce(
        lambda node, part: node.get(part) if isinstance(node, dict) else getattr(node, part),
        key.split("."),
        cfg,
    )


def show(key: str, value: Any) -> str:
    """``key=value`` as a config or override writes it (``algo.method=agpo``)."""
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


@dataclass(frozen=True)
class When:
    """A condition on a config's settings: ``text`` says it (``agpo.adaptive_clip=true``),
    ``test(cfg)`` decides it, ``keys`` are the settings it reads (named, with their values, when
    it does not hold)."""

    text: str
    test: Callable[[Any], bool]
    keys: tuple[str, ...]

    def __call__(self, cfg: Any) -> bool:
        return self.test(cfg)

    def __or__(self, other: When) -> When:
        return When(
            f"{self.text} or {other.text}",
            lambda cfg: self(cfg) or other(cfg),
            (*self.keys, *other.keys),
        )

    def __and__(self, other: When) -> When:
        return When(
            f"{self.text} and {other.text}",
            lambda cfg: self(cfg) and other(cfg),
            (*self.keys, *other.keys),
        )


def equals(key: str, *values: Any) -> When:
    """``key`` is one of ``values``."""
    text = show(key, " or ".join(show("", v)[1:] for v in values))
    return When(text, lambda cfg: setting(cfg, key) in values, (key,))


def differs(key: str, value: Any) -> When:
    """``key`` is anything but ``value``."""
    return When(
        f"{key} other than {show('', value)[1:]}", lambda cfg: setting(cfg, key) != value, (key,)
    )


def positive(key: str) -> When:
    """``key`` > 0."""
    return When(f"{key} > 0", lambda cfg: setting(cfg, key) > 0, (key,))


def given(key: str) -> When:
    """``key`` is set (not None)."""
    return When(f"{key} set", lambda cfg: setting(cfg, key) is not None, (key,))


def reads(*keys: str, when: When | None = None) -> dict[str, When | None]:
    """``keys``, each read under ``when`` (None: whenever the component is active)."""
    return dict.fromkeys(keys, when)


@dataclass(frozen=True)
class Replaces:
    """An active component's mechanism taking the place of ``keys`` (under ``when``, None:
    always), ``because`` saying how, ``fix`` what to do instead."""

    keys: tuple[str, ...]
    because: str
    when: When | None = None
    fix: str = "leave it at its default"


@dataclass(frozen=True)
class Refuses:
    """A combination a component cannot run: under ``when``, ``because`` says why, ``fix`` what
    to do instead."""

    when: When
    because: str
    fix: str
