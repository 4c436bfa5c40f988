"""One registry shape for rlkit's plug-ins: advantage estimators (`rlkit.advantages`), losses
(`rlkit.losses`), methods (`rlkit.methods`), rollout engines (`rlkit.engines`) and tasks
(`rlkit.tasks`); adding one of each: docs/contributing.md.

A :class:`Registry` maps names to entries, refuses a name registered twice (naming both
entries) and answers an unknown name with the known ones; :func:`import_all` imports every
module of a plug-in package, so a new file there registers itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def qualname(obj: Any) -> str:
    """How an error message names a registered class or function."""
    return getattr(obj, "__qualname__", repr(obj))


class Registry(Mapping[str, T]):
    """Entries of one ``kind`` ("loss", "method", "task", ...) by name, in registration
    order; ``sort_known``: an unknown name's message lists the known ones sorted (else in
    registration order). A mapping, whose entries a test may also delete (``del``)."""

    def __init__(self, kind: str, sort_known: bool = False):
        self.kind, self.sort_known = kind, sort_known
        self.entries: dict[str, T] = {}
        self.sources: dict[str, Any] = {}  # name → the class or function that registered it

    def add(self, name: str, entry: T, source: Any = None) -> None:
        """Register ``entry`` under ``name``, made from ``source`` (None: the entry itself); a
        taken name is a ValueError naming both sources."""
        source = entry if source is None else source
        if name in self.entries:
            raise ValueError(
                f"{self.kind} {name!r} is already registered (by {qualname(self.sources[name])}); "
                f"{qualname(source)} needs a name of its own"
            )
        self.entries[name], self.sources[name] = entry, source

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering the class or function it decorates under ``name``."""

        def add(entry: T) -> T:
            self.add(name, entry)
            return entry

        return add

    def get(self, name: str) -> T:  # type: ignore[override]
        """The entry ``name``; an unknown name is a ValueError listing the known ones."""
        if name not in self.entries:
            known = sorted(self.entries) if self.sort_known else list(self.entries)
            raise ValueError(f"unknown {self.kind} {name!r}; known: {known}")
        return self.entries[name]

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order."""
        return tuple(self.entries)

    def __getitem__(self, name: str) -> T:
        return self.entries[name]

    def __delitem__(self, name: str) -> None:
        del self.entries[name], self.sources[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def import_all(package: str, path: Iterable[str]) -> None:
    """Import every module of ``package`` (found on its ``__path__``, ``path``), so each file's
    registrations run when the package is imported."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
