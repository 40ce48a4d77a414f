"""``oracles receipts`` on a partial log (a killed run's evidence), the checks table's xfailed and
not-run columns, the ``--pin`` selection a resume is held to, the npz keys a record names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracles.cli import main
from oracles.receipts.report import format_checks
from oracles.receipts.resume import npz_keys, pin_selection
from oracles.receipts.table import SCHEMA_VERSION

pytestmark = pytest.mark.dry


def _partial(folder: Path, end: dict[str, object] | None, torn: bool = False) -> Path:
    path = folder / "20261201T114136Z-09491ed8.partial.jsonl"
    lines = [{"event": "start", "run_id": "09491ed8", "started": "2026-12-01T11:41:36.0Z",
              "schema_version": SCHEMA_VERSION, "reference": "torch", "port": "auto", "pin": None},
             {"event": "test", "nodeid": "t.py::test_a[p]", "family": "d1", "outcome": "passed"},
             {"event": "test", "nodeid": "t.py::test_a[q]", "family": "d1", "outcome": "xfailed"}]
    text = "".join(json.dumps(obj) + "\n" for obj in lines + ([end] if end else []))
    path.write_text(text + ('{"event": "test", "nodeid": "t.py::te' if torn else ""))
    return path


def test_receipts_prints_a_killed_runs_partial_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _partial(tmp_path, None, torn=True)
    assert main(["receipts", str(path)]) == 1, "a killed run is not all ok: its unstarted tests are unknown"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"partial log: {path}"
    assert out[1].startswith("run 09491ed8 started 2026-12-01T11:41:36.0Z; 2 tests finished; no end line: the run "
                             "was killed"), out[1]
    assert out[2] == f"resume from it: pytest ... --resume={path} (runs what did not pass)"
    (row,) = [ln.split() for ln in out if ln.startswith("test_a")]
    assert row == ["test_a", "d1", "yes", "1", "1", "0", "0"], row
    assert out[-1] == "all_ok: not known from a partial log"


def test_receipts_prints_an_ended_partial_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _partial(tmp_path, {"event": "end", "receipt": "20261201T114136Z-09491ed8.json", "error": None})
    assert main(["receipts", str(path)]) == 1, "a cut run's partial log lists no not-run test: never all ok"
    out = capsys.readouterr().out.splitlines()
    assert out[1].endswith(f"the run ended; its receipt: {tmp_path / '20261201T114136Z-09491ed8.json'}"), out[1]
    assert out[-1] == "all_ok: not known from a partial log: see its receipt"


def test_receipts_bad_partial_line_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.partial.jsonl"
    path.write_text('{"event": "start"}\nnot json\n{"event": "test", "nodeid": "t.py::test_a", "outcome": "passed"}\n')
    assert main(["receipts", str(path)]) == 2
    assert capsys.readouterr().err == f"oracles receipts: error: {path}:2:1: not valid JSON: Expecting value\n"


def test_format_checks_shows_xfailed_and_not_run_and_old_rows() -> None:
    lines = format_checks({
        "test_new": {"family": "cohort", "ok": True, "passed": 4, "failed": [], "skipped": 0, "xfailed": 4, "not_run": 0},
        "test_old": {"family": "d1", "ok": True, "passed": 2, "failed": [], "skipped": 1},  # written before the columns
    }, True)
    assert lines[0].split() == ["check", "family", "ok", "passed", "xfailed", "skipped", "not", "run", "failed"]
    assert lines[1].split() == ["test_new", "cohort", "yes", "4", "4", "0", "0"]
    assert lines[2].split() == ["test_old", "d1", "yes", "2", "?", "1", "?"]


def test_receipts_command_holds_new_columns_to_int(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "20261130T010203Z-0123abcd.json"
    row = {"family": "d1", "ok": True, "passed": 1, "failed": [], "skipped": 0, "xfailed": "1", "not_run": 0}
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "tests": [], "checks": {"test_a": row},
                                "all_ok": True}))
    assert main(["receipts", str(path)]) == 2
    assert capsys.readouterr().err == f"oracles receipts: error: {path}: field 'checks.test_a.xfailed' is missing or not int\n"


def test_pin_selection_is_the_set_of_pins() -> None:
    assert pin_selection("b, a,") == pin_selection("a,b") == ["a", "b"]
    assert pin_selection(None) is None and pin_selection(" , ") is None
    assert pin_selection("a") != pin_selection("a,b")


def test_npz_keys_of_arrays_and_units() -> None:
    data = {"arrays": {"x": {"npz_key": "k1", "shape": [2], "dtype": "<f4"}},
            "units": [{"arrays": {"logits": "k1"}}, {"arrays": {"logits": "k2"}}, "junk"], "other": {"npz_key": "no"}}
    assert npz_keys(data) == {"k1", "k2"}
    assert npz_keys({}) == set() and npz_keys(None) == set()


def test_resume_finds_a_renamed_receipts_sidecar_as_readers_do(tmp_path: Path) -> None:
    """A receipt copied as R.json + R.npz (its recorded sidecar name gone) still gives its arrays to a
    resume, as oracles compare finds them; with no sidecar at all, none (those passes run again)."""
    import io

    import numpy as np

    from oracles.receipts.resume import ArraySource

    buf = io.BytesIO()
    np.savez(buf, k1=np.zeros(2, "<f4"))
    (tmp_path / "R.npz").write_bytes(buf.getvalue())
    (tmp_path / "R.json").write_text(json.dumps({"arrays": "20261201T000000Z-old.npz", "tests": []}))
    assert ArraySource(tmp_path / "R.json").keys == {"k1"}
    (tmp_path / "R.npz").unlink()
    assert ArraySource(tmp_path / "R.json").keys == set()
