"""Helpers for the plugin's pytester tests: find and read the receipt files an inner run wrote.

(``pytester`` itself is loaded by the root conftest: pytest refuses ``pytest_plugins`` here.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy  # noqa: F401 - imported before any in-process pytester run: numpy cannot be loaded twice
import pytest

from oracles.pins.pin import PinStore

ROOT = Path(__file__).resolve().parents[2]


def receipt_files(folder: Path) -> dict[str, list[Path]]:
    """Every file under ``folder`` by kind: ``json`` receipts, ``partial`` logs, ``npz``, ``other``."""
    out: dict[str, list[Path]] = {"json": [], "partial": [], "npz": [], "other": []}
    for p in sorted(folder.rglob("*")) if folder.exists() else []:
        if p.is_dir():
            continue
        if p.name.endswith(".partial.jsonl"):
            out["partial"].append(p)
        elif p.suffix == ".json" and not p.name.startswith("."):
            out["json"].append(p)
        elif p.suffix == ".npz":
            out["npz"].append(p)
        else:
            out["other"].append(p)
    return out


@pytest.fixture(autouse=True)
def _oracles_on(request: pytest.FixtureRequest) -> None:
    """Every inner project a pytester test makes turns pytest-oracles on in its ini file, as this
    repository's pytest.ini does (the plugin is opt-in); tests of the opt-in itself remove the file."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester").makeini("[pytest]\noracles = true\n")


@pytest.fixture
def only_receipt() -> Callable[[Path], tuple[Path, dict[str, Any]]]:
    """``only_receipt(folder) -> (path, receipt)``: the single receipt under ``folder``, parsed."""

    def get(folder: Path) -> tuple[Path, dict[str, Any]]:
        files = receipt_files(folder)
        assert len(files["json"]) == 1, f"expected one receipt under {folder}, found {files}"
        assert not files["other"], f"stray files under {folder}: {files['other']}"
        path = files["json"][0]
        return path, json.loads(path.read_text())

    return get


def tests_by_check(receipt: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The receipt's test records keyed by ``check[record_id]`` (or ``check``)."""
    return {(f"{t['check']}[{t['record_id']}]" if t["record_id"] else t["check"]): t for t in receipt["tests"]}


@pytest.fixture(name="receipt_files")
def receipt_files_fixture() -> Callable[[Path], dict[str, list[Path]]]:
    """:func:`receipt_files` as a fixture (test modules cannot import from a conftest reliably)."""
    return receipt_files


@pytest.fixture
def by_check() -> Callable[[dict[str, Any]], dict[str, dict[str, Any]]]:
    return tests_by_check


@pytest.fixture
def pin_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with an ini file (default pins folder ``fixtures/pins``), made the current folder
    for the in-process ``oracles`` command (which opens that project's stores for each call and leaves
    them after it); ``$ORACLES_HOME`` points into tmp_path."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\noracles = true\n")
    monkeypatch.chdir(folder)
    monkeypatch.setenv("ORACLES_HOME", str(tmp_path / "home"))
    return folder


@pytest.fixture
def project_pins(pin_project: Path) -> PinStore:
    """The pins :func:`pin_project`'s ``oracles`` commands read: its ``fixtures/pins``, then the built-in ones."""
    return PinStore.with_project(pin_project / "fixtures" / "pins")


@pytest.fixture
def oracles_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``oracles_cli(*args) -> (exit status, stdout, stderr)`` of the ``oracles`` command, in-process."""
    from oracles.cli import main

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    return call
