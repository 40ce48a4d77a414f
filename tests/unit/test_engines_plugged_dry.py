"""The installed ``oracles.engines`` entry points are read once per state of the import path
(:func:`oracles.engines.plugged`): a registry made again in the same process (one per command, one per
session) does not open every installed distribution's metadata again, and a distribution installed since,
into a new folder of ``sys.path`` or into one already on it, is seen by the next registry.

A ``NAME-0.1.dist-info`` folder (METADATA + entry_points.txt) on ``sys.path`` is an installed distribution to
``importlib.metadata``; ``importlib.metadata.entry_points`` is counted, not replaced.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Any

import pytest

import oracles.engines as engines

pytestmark = pytest.mark.dry


def dist(folder: Path, name: str) -> None:
    """One distribution ``NAME`` in ``folder`` registering engine ``NAME`` (module ``NAME``, class ``Port``)."""
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[oracles.engines]\n{name} = {name}:Port\n")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the entry points were read (one element per reading), from a cache emptied first."""
    out: list[int] = []
    real = importlib.metadata.entry_points

    def counted(**kwargs: Any) -> Any:
        out.append(1)
        return real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    monkeypatch.setattr(engines, "_PLUGGED", [])
    return out


def test_read_once_while_the_import_path_is_unchanged(reads: list[int]) -> None:
    first = engines.plugged()
    assert engines.plugged() is first and len(reads) == 1
    table = engines.Registry().table
    assert len(reads) == 1, "a registry takes the entry points already read"
    assert all(table[name] == value for name, value in first if name not in engines.BUILTIN)


def test_a_distribution_installed_since_is_seen(reads: list[int], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "site"
    dist(folder, "firstport")
    assert "firstport" not in dict(engines.plugged())
    monkeypatch.syspath_prepend(str(folder))  # a folder added to the path
    assert dict(engines.plugged())["firstport"] == "firstport:Port" and len(reads) == 2
    assert "firstport" in engines.Registry().table and len(reads) == 2
    dist(folder, "secondport")  # installed into a folder already on the path: its modification time moves
    stat = folder.stat()
    os.utime(folder, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # past the clock's granularity
    assert dict(engines.plugged())["secondport"] == "secondport:Port" and len(reads) == 3
