"""oracles.commands.plots where matplotlib cannot be imported: one line naming what is missing and the extra that
brings it, for the commands to print instead of a PNG (no matplotlib is imported here)."""

from __future__ import annotations

import sys
import types

import pytest

from oracles.commands.plots import PlotsUnavailable, pyplot, unavailable

pytestmark = pytest.mark.dry


def test_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert unavailable() == "PNG not written: matplotlib is not installed (pip install 'pytest-oracles[plots]')"
    with pytest.raises(PlotsUnavailable):
        pyplot()


def test_installed_but_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib imports but pyplot does not (a missing dependency of it): its error's first line."""
    fake = types.ModuleType("matplotlib")
    fake.use = lambda backend: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", fake)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    assert unavailable() == ("PNG not written: matplotlib cannot be imported: ModuleNotFoundError: import of "
                             "matplotlib.pyplot halted; None in sys.modules (pip install 'pytest-oracles[plots]')")
