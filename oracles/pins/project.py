"""A project's own folders: where its pins and per-tokenizer token ids live.

Two pytest ini options name them, relative to the ini file's folder: ``oracles_pins`` (default
``fixtures/pins``) and ``oracles_records`` (default ``fixtures/records``; keys and defaults in
:mod:`oracles.ini`). The plugin reads them from pytest's config; the ``oracles`` command finds the ini
file the way pytest does for a run started in the current folder (the first of ``pytest.ini``,
``.pytest.ini``, ``pyproject.toml`` with a ``[tool.pytest.ini_options]`` table, ``tox.ini`` with
``[pytest]``, ``setup.cfg`` with ``[tool:pytest]``, in this folder or the nearest parent; pytest's "rootdir
and configfile" documentation: :mod:`oracles.ini`) and reads the same two keys. Without an ini file the
folders are taken relative to the current folder.

A :class:`Project` is what one run reads: those folders' pin and record stores (each before the
built-in one) and the engine registry. The test session and the ``oracles`` command each open one,
hold it, pass its stores where they are needed, and enter it for the span of the run so that code
asking by name alone (``load_pin(name)``) reads the same stores; nothing outlives the run.

Imported by the plugin's session (a run that uses pytest-oracles) and the ``oracles`` command: nothing here
imports more than the standard library until a project is opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from oracles.ini import DEFAULTS, PINS_KEY, RECORDS_KEY, find_ini

if TYPE_CHECKING:
    from oracles.engines import Registry
    from oracles.families.records import RecordStore
    from oracles.pins.pin import PinStore


@dataclass(frozen=True)
class ProjectDirs:
    """The project's pins and records folders (absolute) and the ini file they came from (None: none found)."""

    pins: Path
    records: Path
    ini: Path | None


def project_dirs(start: Path | None = None) -> ProjectDirs:
    """The project folders for a run started in ``start`` (default the current folder)."""
    start = start or Path.cwd()
    found = find_ini(start)
    base, options, ini = (found[0].parent, found[1], found[0]) if found else (start.resolve(), {}, None)
    pick = {k: (base / (options.get(k) or default)).resolve() for k, default in DEFAULTS.items()}
    return ProjectDirs(pins=pick[PINS_KEY], records=pick[RECORDS_KEY], ini=ini)


class Project:
    """The stores of one run: ``pins`` and ``records`` (the project's folder, then the built-in one)
    and ``engines`` (the built-in adapters and the entry points, read once); ``dirs``: where the
    project's folders are. (A plain class: this module is imported in every run that uses
    pytest-oracles, and a dataclass costs about a millisecond to make.)"""

    __slots__ = ("dirs", "pins", "records", "engines")

    def __init__(self, dirs: ProjectDirs, pins: "PinStore", records: "RecordStore", engines: "Registry") -> None:
        self.dirs, self.pins, self.records, self.engines = dirs, pins, records, engines

    @classmethod
    def open(cls, dirs: ProjectDirs) -> "Project":
        """The stores of ``dirs`` (each with the built-in one after it) and a registry read now."""
        from oracles.engines import Registry
        from oracles.families.records import RecordStore
        from oracles.pins.pin import PinStore

        return cls(dirs, PinStore.with_project(dirs.pins), RecordStore.with_project(dirs.records),
                   Registry(ini=dirs.ini))  # issue 25: the ini's oracles_wire far sides

    def enter(self) -> None:
        """Make these stores the ones a lookup by name alone reads, until :meth:`leave` (a run in
        progress; a run nested in it enters its own and leaves it again)."""
        import oracles.engines
        import oracles.families.records
        import oracles.pins.pin

        oracles.pins.pin.entered(self.pins)
        oracles.families.records.entered(self.records)
        oracles.engines.entered(self.engines)

    def leave(self) -> None:
        """Undo :meth:`enter` (the run ends); a project not entered is ignored."""
        import oracles.engines
        import oracles.families.records
        import oracles.pins.pin

        oracles.pins.pin.left(self.pins)
        oracles.families.records.left(self.records)
        oracles.engines.left(self.engines)

    @contextmanager
    def entered(self) -> Iterator["Project"]:
        """``with project.entered():`` :meth:`enter` for the block, :meth:`leave` after it (even on error)."""
        self.enter()
        try:
            yield self
        finally:
            self.leave()
