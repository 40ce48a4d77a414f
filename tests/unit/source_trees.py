"""The parsed source of a file, once per process: several dry checks read the package's modules (the import
graph, the written bounds, the suite's tests and attach calls, the docs' names), each parse ~1 ms a module."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def tree_of(path: Path) -> ast.Module:
    """The ``ast`` of ``path`` (UTF-8 Python source), shared: a caller must not change the tree.

    Raises:
        OSError: the file cannot be read. SyntaxError: it is not Python.
    """
    return _tree(Path(path).resolve())
