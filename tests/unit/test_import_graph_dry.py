"""The modules of ``oracles`` import one another without a circle, counting every import statement
wherever it is (module level, inside a function, under ``if TYPE_CHECKING:``): a module below another
never reaches back up to it. The families never import the plugin (the plugin imports the families).

The graph is read from the source with ``ast`` (no module is imported): an edge from a module to each
module of the package an import statement in it names (``import a.b``, ``from a import b`` where ``a.b`` is
a module, else ``a``; relative imports resolved). A package's ``__init__`` is not counted as imported by
its submodules' imports: it is the module an import names that is read. Names looked up in a table and
imported by string (the engine registry, the artifact kinds, the twins, the subcommands) are not import
statements and are not edges. A circle is a strongly connected component of two or more modules, named
as one path around it. Positive controls run the same search on small packages with a circle of
function-level and ``TYPE_CHECKING`` imports across subpackages, and with a family importing a plugin.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.dry

ROOT = Path(__file__).resolve().parents[2]


def modules_of(folder: Path, package: str) -> dict[str, Path]:
    """Module name -> file of every module under ``folder`` (subpackages included; a package is its
    ``__init__.py``)."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute module name of ``from <level dots><module> import ...`` written in ``importer``."""
    if level == 0:
        return module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _known(name: str, known: set[str]) -> str | None:
    """``name`` or its nearest enclosing module among ``known`` (``a.b.f`` where ``f`` is a name in ``a.b``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_statements(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth: an import is a statement, so only statement bodies
    are searched (a function's, a class's, an ``if``'s, a ``try``'s handlers, a ``match``'s cases), never the
    expressions, which are most of a tree's nodes."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
            continue
        for key in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo.extend(getattr(node, key, ()))
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules among ``known`` that ``path`` (module ``name``) imports, by any import statement."""
    out: set[str] = set()
    for node in import_statements(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(m for alias in node.names if (m := _known(alias.name, known)))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, name, path.name == "__init__.py")
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found = target if target in known else _known(base, known)  # a submodule, else a name in one
                if found:
                    out.add(found)
    out.discard(name)
    return out


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules it imports, over every module under ``folder`` (package ``package``)."""
    modules = modules_of(folder, package)
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of ``graph``: its strongly connected components of two or more modules, each sorted,
    the list sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def path_around(graph: dict[str, set[str]], circle: list[str]) -> list[str]:
    """One path around ``circle`` (a strongly connected component): ``[a, b, ..., a]``, from its first module
    by the shortest way back (breadth-first search inside the circle)."""
    start, members = circle[0], set(circle)
    parent: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while (up := parent[path[-1]]) is not None:
                        path.append(up)
                    return [*reversed(path), start]
                if nxt not in parent:
                    parent[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{circle} is not a circle of the graph")


def described(graph: dict[str, set[str]]) -> list[str]:
    """Each circle of ``graph`` as one line: its size and a path around it."""
    return [f"{len(c)} modules: {' -> '.join(path_around(graph, c))}" for c in circles(graph)]


def importers_of(graph: dict[str, set[str]], importer_package: str, imported_package: str) -> list[str]:
    """``a -> b`` for each module ``a`` of ``importer_package`` that imports a module ``b`` of ``imported_package``."""
    def inside(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    return [f"{a} -> {b}" for a in sorted(graph) if inside(a, importer_package)
            for b in sorted(graph[a]) if inside(b, imported_package)]


@pytest.fixture(scope="module")
def oracles_graph() -> dict[str, set[str]]:
    return import_graph(ROOT / "oracles", "oracles")


def test_the_package_imports_itself_without_a_circle(oracles_graph: dict[str, set[str]]) -> None:
    graph = oracles_graph
    assert len(graph) > 200 and {"oracles", "oracles.plugin", "oracles.pins.pin", "oracles.engines.torch.reference",
                                  "oracles.families.execution.judged"} <= set(graph), sorted(graph)[:5]
    # the walk reads function-level and TYPE_CHECKING imports: edges the tree has only in those forms
    assert "oracles.plugin.session" in graph["oracles.plugin"], "the plugin makes the session (inside a function)"
    assert "oracles.plugin.state" in graph["oracles.plugin.session"], "the session makes the state"
    assert "oracles.pins.pin" in graph["oracles.families"], "the families name Pin (under TYPE_CHECKING)"
    assert "oracles.pins.materialize" in graph["oracles.pins.artifact_pin"]
    found = described(graph)
    assert not found, f"{len(found)} import circles among oracles modules:\n" + "\n".join(found)


def test_the_families_never_import_the_plugin(oracles_graph: dict[str, set[str]]) -> None:
    """The plugin imports the families (their table, their runs); a family importing the plugin would
    tie the library to pytest's hooks. The families' own view of the session is oracles.families.callables."""
    assert importers_of(oracles_graph, "oracles.plugin", "oracles.families"), "control: the plugin imports families"
    wrong = importers_of(oracles_graph, "oracles.families", "oracles.plugin")
    assert not wrong, "families import the plugin: " + ", ".join(wrong)


def test_the_plugin_modules_import_each_other_without_a_cycle(oracles_graph: dict[str, set[str]]) -> None:
    """The plugin makes the session, the session makes the state, and reading the state never reaches back
    to the plugin (the plugin's own part of the whole package's graph)."""
    plugin = {a: {b for b in bs if b.startswith("oracles.plugin")} for a, bs in oracles_graph.items()
              if a == "oracles.plugin" or a.startswith("oracles.plugin.")}
    assert {"oracles.plugin", "oracles.plugin.session", "oracles.plugin.state"} <= set(plugin), sorted(plugin)
    assert not circles(plugin), described(plugin)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path / "pkg"


def test_a_circle_of_function_level_and_type_checking_imports_is_found(tmp_path: Path) -> None:
    """Positive control: a circle across subpackages made only of an import inside a function, one under
    ``TYPE_CHECKING`` and a relative one, beside a module imported one way only and a registry's string."""
    folder = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "from pkg.a.x import run\n",
        "pkg/a/x.py": "def run():\n    from pkg.b.y import helper\n    return helper\n",
        "pkg/b/__init__.py": "",
        "pkg/b/y.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .z import Z\n\nimport pkg.low\n",
        "pkg/b/z.py": "from pkg.a import x\n",
        "pkg/low.py": "import importlib\n\nTABLE = {'x': 'pkg.a.x'}\nimportlib.import_module(TABLE['x'])\n",
    })
    graph = import_graph(folder, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.a.x"}, "pkg.a.x": {"pkg.b.y"}, "pkg.b": set(),
                     "pkg.b.y": {"pkg.b.z", "pkg.low"}, "pkg.b.z": {"pkg.a.x"}, "pkg.low": set()}, graph
    assert circles(graph) == [["pkg.a.x", "pkg.b.y", "pkg.b.z"]]
    assert described(graph) == ["3 modules: pkg.a.x -> pkg.b.y -> pkg.b.z -> pkg.a.x"]
    assert circles({**graph, "pkg.b.z": set()}) == []  # the control's control: one edge less, no circle
    assert described({"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": set()}) == ["2 modules: p.a -> p.b -> p.a"]


def test_a_family_importing_the_plugin_is_found(tmp_path: Path) -> None:
    """Positive control: a family module naming the plugin's fixtures under ``TYPE_CHECKING`` is listed."""
    folder = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/plugin/__init__.py": "import pkg.families\n",
        "pkg/plugin/fixtures.py": "",
        "pkg/families/__init__.py": "",
        "pkg/families/run.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                               "    from pkg.plugin.fixtures import Runs\n",
    })
    graph = import_graph(folder, "pkg")
    assert importers_of(graph, "pkg.families", "pkg.plugin") == ["pkg.families.run -> pkg.plugin.fixtures"]
    assert importers_of(graph, "pkg.plugin", "pkg.families") == ["pkg.plugin -> pkg.families"]
