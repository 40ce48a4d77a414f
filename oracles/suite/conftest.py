"""Fixtures the suite's modules share beyond the plugin's (which every project gets: oracles/plugin/fixtures.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from oracles.families.clef import records as clef


@pytest.fixture
def clef_root(verified_snapshot: Callable[[str], Path], pin: str) -> Path:
    """This test's pin's verified snapshot folder."""
    return verified_snapshot(pin)


@pytest.fixture(scope="session")
def manifest() -> dict[str, Any]:
    """The clef pictures' manifest (oracles/builtin/images/manifest.json): names, sizes, digests."""
    return clef.load_manifest()
