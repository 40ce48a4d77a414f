"""The receipt's environment: installed versions read from dist-info folder names (dry)."""

from __future__ import annotations

import importlib.metadata

import pytest

from oracles.environment import VERSIONED, installed_versions

pytestmark = pytest.mark.dry


def test_versions_equal_importlib_metadata() -> None:
    names = [*VERSIONED[1:], "no-such-distribution-here"]
    got = installed_versions(names)
    assert list(got) == names
    for name in VERSIONED[1:]:
        try:
            want = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            want = None
        assert got[name] == want, name
    assert got["no-such-distribution-here"] is None
