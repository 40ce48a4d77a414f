"""``oracles receipts``: print a receipt's checks table, list a folder, find the latest receipt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracles.cli import main

pytestmark = pytest.mark.dry


def _receipt(folder: Path, stem: str, ok: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.json"
    path.write_text(json.dumps({
        "run_id": stem[-8:], "seconds": 1.5, "tests": [{"nodeid": "t.py::test_a[p]", "outcome": "passed"}],
        "engines": [{"name": "torch", "worker": "main", "load_count": 1}], "not_run": [],
        "checks": {"test_a": {"family": "mtplx", "ok": ok, "passed": 1, "failed": [] if ok else ["q"], "skipped": 0}},
        "all_ok": ok}))
    return path


def test_print_one_receipt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=False)
    assert main(["receipts", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"receipt: {path}" and out[1] == "engines: torch@main loads=1; not run: 0"
    assert out[-1] == "all_ok: False" and any(line.startswith("test_a") and line.endswith("q") for line in out)


def test_latest_ignores_summaries_and_comparisons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _receipt(tmp_path / "oracle", "20261130T010203Z-0123abcd", ok=False)
    newest = _receipt(tmp_path / "oracle", "20261130T020000Z-89abcdef", ok=True)
    (tmp_path / "oracle" / "20261130T020000Z-89abcdef.d1-summary.json").write_text("{}")
    (tmp_path / "compare").mkdir()
    (tmp_path / "compare" / "20261130T030000Z-a-vs-b.json").write_text("[]")
    assert main(["receipts", "--latest", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"receipt: {newest}"
    assert main(["receipts", str(tmp_path)]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [str(tmp_path / "oracle" / "20261130T010203Z-0123abcd.json"), str(newest)]


@pytest.mark.parametrize(("content", "message"), [
    ("{\n  \"checks\": \n}", ":3:1: not valid JSON"),
    ('{"checks": {}}', ": not a receipt: field 'all_ok' is missing or not a bool"),
    ("[1]", ": not a receipt: field 'checks' is missing or not a dict"),
])
def test_bad_receipt_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                       message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    assert main(["receipts", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"oracles receipts: error: {path}{message}" + err[len(f"oracles receipts: error: {path}{message}"):]
    assert err.count("\n") == 1, err


def test_latest_in_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["receipts", "--latest", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"oracles receipts: error: {tmp_path}: no receipt found\n"
