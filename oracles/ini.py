"""pytest's configuration files, read as pytest reads them: the one a run started in a folder uses (the
first of ``pytest.ini``, ``.pytest.ini``, ``pyproject.toml`` with a ``[tool.pytest.ini_options]`` table,
``tox.ini`` with ``[pytest]``, ``setup.cfg`` with ``[tool:pytest]``, in that folder or the nearest parent;
pytest's "rootdir and configfile" documentation), and its options.

What a project's folders (:mod:`oracles.pins.project`) and its far sides (:mod:`oracles.engines.wire.config`)
are read from. Imported by the plugin in every pytest run: the standard library only, and its parsers only
when a file is read.
"""

from __future__ import annotations

from pathlib import Path

#: The ini keys naming a project's folders (:mod:`oracles.pins.project`), and their defaults, relative to the
#: ini file's folder. Here, not there: the plugin declares them in every pytest run, on or off.
PINS_KEY, RECORDS_KEY = "oracles_pins", "oracles_records"
DEFAULTS = {PINS_KEY: "fixtures/pins", RECORDS_KEY: "fixtures/records"}


def ini_options(path: Path) -> dict[str, str] | None:
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
            if path.is_file() and (options := ini_options(path)) is not None:
                return path, options
    return None
