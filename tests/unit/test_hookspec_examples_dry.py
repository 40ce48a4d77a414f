"""Each hookspec's docstring example is paste-ready: its ``conftest.py`` block, dedented, runs as a module
and its hook returns what the spec says (pytest-benchmark's hookspec.py keeps its examples so)."""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

import pytest

from oracles.families import Family
from oracles.plugin import hookspecs

pytestmark = pytest.mark.dry


def example(hook: Any) -> dict[str, Any]:
    """The namespace of ``hook``'s docstring example after running it (the indented block after ``::``)."""
    doc = inspect.getdoc(hook) or ""
    assert "Example (``conftest.py``)::" in doc, f"{hook.__name__} has no conftest.py example"
    after = doc.split("Example (``conftest.py``)::", 1)[1].lstrip("\n")
    block = []
    for line in after.splitlines():
        if line and not line.startswith(" "):
            break
        block.append(line)
    code = textwrap.dedent("\n".join(block))
    namespace: dict[str, Any] = {}
    exec(compile(code, f"<{hook.__name__} example>", "exec"), namespace)  # noqa: S102 - our own docstring
    return namespace


def test_receipt_fields_example_runs() -> None:
    fields = example(hookspecs.pytest_oracles_receipt_fields)["pytest_oracles_receipt_fields"](config=None)
    assert isinstance(fields, dict) and fields["firmware"] == "2.4.1"


def test_families_example_runs() -> None:
    families = example(hookspecs.pytest_oracles_families)["pytest_oracles_families"]()
    assert [f.name for f in families] == ["asr"] and all(isinstance(f, Family) for f in families)


def test_a_broken_example_is_caught() -> None:
    """Positive control: an example whose definition is not indented under its decorator does not run."""

    def broken() -> None:
        """Example (``conftest.py``)::

            @pytest.hookspec()
        def f():
                return 1
        """

    with pytest.raises((SyntaxError, IndentationError, NameError)):
        example(broken)
