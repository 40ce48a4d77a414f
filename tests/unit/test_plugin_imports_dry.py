"""The modules of ``oracles.plugin`` import one another without a cycle, counting every import statement
wherever it is (module level, inside a function, under ``if TYPE_CHECKING:``): the plugin makes the
session, the session makes the state, and reading the state never reaches back to the plugin.

The graph is read from the source with ``ast``; a positive control runs the same search on a small
package with a cycle made only of function-level imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.dry

ROOT = Path(__file__).resolve().parents[2]


def modules_of(folder: Path, package: str) -> dict[str, Path]:
    """Module name -> file of every module directly in ``folder`` (the package itself for ``__init__.py``)."""
    return {(package if p.stem == "__init__" else f"{package}.{p.stem}"): p for p in sorted(folder.glob("*.py"))}


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute module name of ``from <level dots><module> import ...`` written in ``importer``."""
    if level == 0:
        return module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules among ``known`` that ``path`` (module ``name``) imports, by any import statement."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, name, path.stem == "__init__")
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:  # ``from pkg import submodule``
                    out.add(target)
                elif base in known:  # ``from pkg.module import name``
                    out.add(base)
    out.discard(name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, else None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    modules = modules_of(folder, package)
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def test_the_plugin_modules_import_each_other_without_a_cycle() -> None:
    graph = import_graph(ROOT / "oracles" / "plugin", "oracles.plugin")
    assert {"oracles.plugin", "oracles.plugin.session", "oracles.plugin.state"} <= set(graph), sorted(graph)
    assert "oracles.plugin.session" in graph["oracles.plugin"], "the plugin makes the session"
    assert "oracles.plugin.state" in graph["oracles.plugin.session"], "the session makes the state"
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle among oracles.plugin modules: {' -> '.join(cycle)}"


def test_a_cycle_of_function_level_imports_is_found(tmp_path: Path) -> None:
    """Positive control: the plugin -> activation -> state -> plugin shape, each import inside a function."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def configure():\n    from pkg.activation import activate\n")
    (pkg / "activation.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                       "    from . import state\n")
    (pkg / "state.py").write_text("def state_of():\n    from pkg import ensure_active\n")
    (pkg / "clean.py").write_text("import os\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg": {"pkg.activation"}, "pkg.activation": {"pkg.state"}, "pkg.state": {"pkg"},
                     "pkg.clean": set()}, graph
    assert find_cycle(graph) == ["pkg", "pkg.activation", "pkg.state", "pkg"]
    assert find_cycle({**graph, "pkg.state": set()}) is None
