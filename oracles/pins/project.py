"""A project's own folders: where its pins and per-tokenizer token ids live.

Two pytest ini options name them, relative to the ini file's folder: ``oracles_pins`` (default
``fixtures/pins``) and ``oracles_records`` (default ``fixtures/records``). The plugin reads them from
pytest's config; the ``oracles`` command finds the ini file the way pytest does for a run started in
the current folder (the first of ``pytest.ini``, ``.pytest.ini``, ``pyproject.toml`` with a
``[tool.pytest.ini_options]`` table, ``tox.ini`` with ``[pytest]``, ``setup.cfg`` with ``[tool:pytest]``,
in this folder or the nearest parent; pytest's "rootdir and configfile" documentation) and reads the
same two keys. Without an ini file the folders are taken relative to the current folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PINS_KEY, RECORDS_KEY = "oracles_pins", "oracles_records"
DEFAULTS = {PINS_KEY: "fixtures/pins", RECORDS_KEY: "fixtures/records"}


@dataclass(frozen=True)
class ProjectDirs:
    """The project's pins and records folders (absolute) and the ini file they came from (None: none found)."""

    pins: Path
    records: Path
    ini: Path | None


def _ini_options(path: Path) -> dict[str, str] | None:
    """The pytest options of ``path`` when it is a pytest configuration file, else None."""
    import configparser  # here, not at module import: the plugin imports this module in every pytest run
    import tomllib

    try:
        if path.name == "pyproject.toml":
            table = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {}).get("pytest", {})
            options = table.get("ini_options") if isinstance(table, dict) else None
            return {k: str(v) for k, v in options.items()} if isinstance(options, dict) else None
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(path, encoding="utf-8")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, configparser.Error):
        return None
    section = {"pytest.ini": "pytest", ".pytest.ini": "pytest", "tox.ini": "pytest", "setup.cfg": "tool:pytest"}[path.name]
    if parser.has_section(section):
        return dict(parser.items(section))
    return {} if path.name in ("pytest.ini", ".pytest.ini") else None  # pytest.ini counts even when empty


def find_ini(start: Path) -> tuple[Path, dict[str, str]] | None:
    """The pytest configuration file pytest would use for a run started in ``start``, and its options."""
    for folder in [start.resolve(), *start.resolve().parents]:
        for name in ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"):
            path = folder / name
            if path.is_file() and (options := _ini_options(path)) is not None:
                return path, options
    return None


def project_dirs(start: Path | None = None) -> ProjectDirs:
    """The project folders for a run started in ``start`` (default the current folder)."""
    start = start or Path.cwd()
    found = find_ini(start)
    base, options, ini = (found[0].parent, found[1], found[0]) if found else (start.resolve(), {}, None)
    pick = {k: (base / (options.get(k) or default)).resolve() for k, default in DEFAULTS.items()}
    return ProjectDirs(pins=pick[PINS_KEY], records=pick[RECORDS_KEY], ini=ini)


def use_project(dirs: ProjectDirs) -> None:
    """Make the project's folders (then the built-in ones) the stores pins and token ids are read from."""
    from oracles.families.records import RecordStore, use_records
    from oracles.pins.pin import PinStore, use_store

    use_store(PinStore.with_project(dirs.pins))
    use_records(RecordStore.with_project(dirs.records))
