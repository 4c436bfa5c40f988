"""rlkit's import graph has no cycle, counting every import a module can run.

The graph is read from the source (nothing is imported): an edge from module A to module B for each
``import``/``from … import`` in A that names B, at module level, inside a function or class, under
``if TYPE_CHECKING:`` or in a ``try`` block alike. A function-level or ``TYPE_CHECKING`` import
hides a cycle from Python at import time but not from the reader: both modules still need each
other, so neither can be read, tested or moved alone. ``from rlkit.x import y`` names the submodule
``rlkit.x.y`` when there is one, else the module ``rlkit.x``; relative imports resolve against the
importing module's package. Importing ``rlkit.x.y`` also runs ``rlkit/x/__init__.py``, an edge
this test leaves out unless the import names the package itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "rlkit"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name)."""
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def named_module(dotted: str, known: dict[str, Path]) -> str | None:
    """The package module ``dotted`` names: itself, or the longest enclosing module that exists
    (``rlkit.x.f`` for a function ``f`` of ``rlkit.x`` named as ``import rlkit.x.f`` cannot
    happen, but ``rlkit.x.Name`` in a ``from`` import can)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                targets.add(named_module(alias.name, known))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name.split(".")
                package = package if is_package else package[:-1]
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in known else named_module(source, known))
    return {target for target in targets if target is not None and target != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def elementary_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every simple cycle, each once, starting at its smallest module (enough for a graph of a
    few dozen modules with few cycles)."""
    cycles: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for target in sorted(graph[path[-1]]):
            if target == path[0]:
                cycles.append(list(path))
            elif target > path[0] and target not in path:
                walk(path + [target])

    for start in sorted(graph):
        walk([start])
    return cycles


def test_the_graph_reads_imports_at_every_level(tmp_path):
    """The reader sees module-level, function-level, TYPE_CHECKING, submodule and relative
    imports (on the real package: each of these edges exists in some form there)."""
    known = modules()
    assert "rlkit.models.tiny" in known and "rlkit.tasks" in known
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import rlkit.stats\n"
        "from rlkit.models import tiny\n"
        "from rlkit.tasks import Problem\n"
        "if TYPE_CHECKING:\n"
        "    from rlkit.config import Config\n"
        "def f():\n"
        "    from rlkit.metrics import row_tokens\n"
        "    from .loading import load_policy\n"
    )
    assert imported_modules("rlkit.models.probe", source, known) == {
        "rlkit.stats",
        "rlkit.models.tiny",
        "rlkit.tasks",
        "rlkit.config",
        "rlkit.metrics",
        "rlkit.models.loading",
    }


def test_the_cycle_finder_names_every_cycle():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert elementary_cycles(graph) == [["a", "b"], ["a", "b", "c"]]


def test_no_import_cycle():
    graph = import_graph()
    cycles = elementary_cycles(graph)
    assert not cycles, (
        "import cycles in rlkit (function-level and TYPE_CHECKING imports count):\n"
        + ("\n".join(" -> ".join(cycle + cycle[:1]) for cycle in cycles))
    )
