"""``oracles receipts``: print a receipt's checks table, list a folder, find the latest receipt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oracles.cli import main
from oracles.receipts.table import SCHEMA_VERSION


def _receipt(folder: Path, stem: str, ok: bool, schema: int = SCHEMA_VERSION) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.json"
    path.write_text(json.dumps({
        "schema_version": schema, "run_id": stem[-8:], "seconds": 1.5,
        "tests": [{"nodeid": "t.py::test_a[p]", "outcome": "passed"}],
        "engines": [{"name": "torch", "worker": "main", "load_count": 1}], "not_run": [],
        "checks": {"test_a": {"family": "mtplx", "ok": ok, "passed": 1, "failed": [] if ok else ["q"], "skipped": 0}},
        "all_ok": ok}))
    return path


@pytest.mark.dry
def test_print_one_receipt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=False)
    assert main(["receipts", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"receipt: {path}" and out[1] == "engines: torch@main loads=1; not run: 0"
    assert out[-1] == "all_ok: False" and any(line.startswith("test_a") and line.endswith("q") for line in out)


@pytest.mark.dry
def test_print_names_an_engine_that_ran_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=False)
    receipt = json.loads(path.read_text())
    receipt["ran_nothing"] = [{"engine": "facts-only", "pins": ["p"], "tests": 8,
                               "reasons": {"unsupported: facts-only cannot decode": 8}}]
    path.write_text(json.dumps(receipt))
    assert main(["receipts", str(path)]) == 1
    out = capsys.readouterr().out
    assert "engine facts-only ran no check: 8 tests on pin p" in out and "unsupported: facts-only cannot decode" in out


@pytest.mark.dry
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
    (f'{{"schema_version": {SCHEMA_VERSION}, "checks": {{}}}}', ": not a receipt: field 'all_ok' is missing or not a bool"),
    (f'{{"schema_version": {SCHEMA_VERSION}}}', ": not a receipt: field 'checks' is missing or not a dict"),
    ("[1]", ": not a receipt: a JSON list, not an object"),
])
@pytest.mark.dry
def test_bad_receipt_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                       message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    assert main(["receipts", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"oracles receipts: error: {path}{message}" + err[len(f"oracles receipts: error: {path}{message}"):]
    assert err.count("\n") == 1, err


@pytest.mark.dry
def test_empty_folder_says_no_receipt_found_in_both_forms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Listing an empty folder and --latest on it say the same thing, with the same exit status."""
    (tmp_path / "compare").mkdir()
    (tmp_path / "compare" / "20261130T030000Z-a-vs-b.json").write_text("{}")  # not a receipt name
    for argv in (["receipts", "--latest", str(tmp_path)], ["receipts", str(tmp_path)]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.err == f"oracles receipts: error: no receipt found under {tmp_path}\n" and captured.out == ""


@pytest.mark.dry
def test_listing_marks_a_truncated_receipt_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One truncated receipt is one line naming it and the error; the others are listed; exit 2 at the end."""
    first = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=True)
    torn = tmp_path / "20261130T020000Z-89abcdef.json"
    torn.write_text(first.read_text()[:40])
    last = _receipt(tmp_path, "20261130T030000Z-00000000", ok=False)
    assert main(["receipts", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert [line.split()[0] for line in lines] == [str(first), str(torn), str(last)]
    assert lines[1].startswith(f"{torn}  unreadable: 1:") and "not valid JSON" in lines[1] and "all_ok=False" in lines[2]
    assert captured.err == f"oracles receipts: error: {tmp_path}: 1 of 3 receipts unreadable (marked above)\n"


@pytest.mark.dry
@pytest.mark.parametrize("schema", [SCHEMA_VERSION + 1, 1])
def test_another_schema_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: int) -> None:
    """The README says a reader refuses another schema: printing one names the file, the field and both versions."""
    path = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=True, schema=schema)
    for argv in (["receipts", str(path)], ["receipts", "--latest", str(tmp_path)]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (f"oracles receipts: error: {path}: field 'schema_version' is {schema}, not "
                                f"{SCHEMA_VERSION}: a receipt of another schema, which this plugin does not read\n")


@pytest.mark.dry
def test_receipt_without_schema_version_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=True)
    doc = json.loads(path.read_text())
    del doc["schema_version"]
    path.write_text(json.dumps(doc))
    assert main(["receipts", str(path)]) == 2
    assert f"{path}: field 'schema_version' is missing, not {SCHEMA_VERSION}: " in capsys.readouterr().err


@pytest.mark.dry
def test_listing_marks_another_schema_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A receipt of another schema in a folder is marked like a truncated one; the others are listed; exit 2."""
    first = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=True)
    other = _receipt(tmp_path, "20261130T020000Z-89abcdef", ok=True, schema=SCHEMA_VERSION + 1)
    last = _receipt(tmp_path, "20261130T030000Z-00000000", ok=False)
    assert main(["receipts", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert [line.split()[0] for line in lines] == [str(first), str(other), str(last)]
    assert lines[1] == (f"{other}  unreadable: field 'schema_version' is {SCHEMA_VERSION + 1}, not {SCHEMA_VERSION}: "
                        f"a receipt of another schema, which this plugin does not read")
    assert "all_ok=True" in lines[0] and "all_ok=False" in lines[2]
    assert captured.err == f"oracles receipts: error: {tmp_path}: 1 of 3 receipts unreadable (marked above)\n"


@pytest.mark.dry
def test_engines_line_names_the_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A draft twin loaded on the same worker is a second pin, not a double load: the pin is shown."""
    path = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=True)
    doc = json.loads(path.read_text())
    doc["engines"] = [{"name": "mlx", "pin": "smollm2-135m-instruct", "worker": "gw0", "load_count": 1},
                      {"name": "mlx", "pin": "smollm2-draft-twin", "worker": "gw0", "load_count": 1}]
    path.write_text(json.dumps(doc))
    assert main(["receipts", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == ("engines: mlx/smollm2-135m-instruct@gw0 loads=1, "
                                                      "mlx/smollm2-draft-twin@gw0 loads=1; not run: 0")


@pytest.mark.dry
def test_npz_sidecar_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An npz (binary, not UTF-8) given where the receipt JSON belongs: one line naming it, exit 2."""
    path = tmp_path / "20261130T010203Z-0123abcd.npz"
    path.write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x00\x00\x8f\xff\xfe")
    assert main(["receipts", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oracles receipts: error: {path}: not a UTF-8 text file (byte 0x8f at offset 10)")
    assert err.count("\n") == 1


@pytest.mark.dry
def test_malformed_checks_row_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=True)
    doc = json.loads(path.read_text())
    doc["checks"]["test_a"]["passed"] = "1"
    path.write_text(json.dumps(doc))
    assert main(["receipts", str(path)]) == 2
    assert capsys.readouterr().err == (f"oracles receipts: error: {path}: field 'checks.test_a.passed' is missing "
                                       f"or not int\n")


def test_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """``oracles receipts --latest DIR | head -1``: the reader closes the pipe early; no traceback, no
    "Exception ignored" at exit, status 141 (128 + SIGPIPE). The checks table is ~1 MB, far more than
    a pipe buffer (64 KiB on Linux), so the write after the close must fail. Not dry: it starts the command."""
    path = _receipt(tmp_path, "20261130T010203Z-0123abcd", ok=True)
    doc = json.loads(path.read_text())
    doc["checks"] = {f"test_{i:05d}_{'x' * 60}": {"family": "f", "ok": True, "passed": 1, "failed": [], "skipped": 0}
                     for i in range(10000)}
    path.write_text(json.dumps(doc))
    proc = subprocess.Popen([sys.executable, "-m", "oracles.cli", "receipts", "--latest", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[2])
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"receipt: ")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err
