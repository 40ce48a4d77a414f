"""This repository's own tests drive the plugin through pytester (tests/unit); the shared oracle
fixtures live in the plugin (oracles/plugin/fixtures.py), so a project with pytest-oracles installed has them
too. pytest refuses ``pytest_plugins`` in a non-root conftest, hence here."""

from __future__ import annotations

import gc
import os
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
#: The garbage collector's first threshold in this repository's sessions (CPython's default is 700 new container
#: objects). A session keeps its modules, items and fixtures alive to the end, and every full collection walked
#: them again: the dry smoke spent 0.86 s of its ~7.5 s in 2,655 collections, 0.08 s in 77 with this threshold
#: and the collected session frozen (below). Young garbage is still collected every 100,000 allocations.
GC_FIRST_THRESHOLD = 100_000
#: Where a dry session's temporary folders go when the machine has it with :data:`SCRATCH_ROOM` free: a dry
#: session writes thousands of small scratch files (pin snapshots, receipts, each fsynced), and on this
#: project's virtual disks that filesystem work was a fifth of the smoke (5.3 s against 4.2 s on tmpfs, side
#: by side). TMPDIR or ``--basetemp``, when given, decide instead; other sessions keep the usual place.
SCRATCH = Path("/dev/shm")
#: The free room SCRATCH must have: pytest keeps its last three sessions' folders (~85 MB each for the smoke).
SCRATCH_ROOM = 1 << 30
#: How this repository's test files mark a dry test (``pytest.mark.dry``, as ``pytestmark`` or a decorator).
DRY_MARK = "mark.dry"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m dry`` exactly, a test file that never names the mark is not imported: it holds no dry test
    (73 of this repository's 163 test files), and importing them (assertion rewriting, their imports) was
    most of the smoke's collection. tests/unit/test_dry_collection.py holds the shortcut to what a full
    collection selects."""
    if (config.getoption("markexpr", "") == "dry" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and DRY_MARK not in collection_path.read_text("utf-8")):
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Collect garbage less often in this repository's sessions (:data:`GC_FIRST_THRESHOLD`); a dry session's
    temporary folders on :data:`SCRATCH`."""
    gc.set_threshold(GC_FIRST_THRESHOLD, *gc.get_threshold()[1:])
    if config.getoption("markexpr", "") == "dry" and not os.environ.get("TMPDIR") and not config.option.basetemp:
        try:
            room = os.statvfs(SCRATCH)
        except OSError:
            return
        if os.access(SCRATCH, os.W_OK) and room.f_bavail * room.f_frsize >= SCRATCH_ROOM:
            tempfile.tempdir = str(SCRATCH)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (modules, items, their marks) lives to the session's end: freeze it out of the
    collector's walks. Reference counting still frees any of it that is dropped."""
    gc.freeze()
