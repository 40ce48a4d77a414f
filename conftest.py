"""This repository's own tests drive the plugin through pytester (tests/unit); the shared oracle
fixtures live in the plugin (oracles/plugin/fixtures.py), so a project with pytest-oracles installed has them
too. pytest refuses ``pytest_plugins`` in a non-root conftest, hence here."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
#: How this repository's test files mark a dry test (``pytest.mark.dry``, as ``pytestmark`` or a decorator).
DRY_MARK = "mark.dry"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m dry`` exactly, a test file that never names the mark is not imported: it holds no dry test
    (71 of this repository's 161 test files), and importing them (assertion rewriting, their imports) was
    most of the smoke's collection. tests/unit/test_dry_collection.py holds the shortcut to what a full
    collection selects."""
    if (config.getoption("markexpr", "") == "dry" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and DRY_MARK not in collection_path.read_text("utf-8")):
        return True
    return None
