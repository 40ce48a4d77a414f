"""``oracles faults RECEIPT`` and the matrix's outcome rules (oracles.faults.matrix.run_checks), on
synthetic receipts and runs: no weights."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from oracles.cli import main
from oracles.engines.base import Unsupported
from oracles.faults.matrix import CAUGHT, CHECKS, NOT_APPLICABLE, PASSED, UNTOUCHED, run_checks
from oracles.receipts.table import SCHEMA_VERSION

pytestmark = pytest.mark.dry

FAMILIES = ("forward", "decode", "generation", "speculative", "chat", "d1", "cohort")


def cells(status: dict[str, str], default: str = "passed") -> dict[str, dict[str, Any]]:
    return {c: {"status": status.get(c, default), "message": f"{c} says no" if status.get(c) == "caught" else None}
            for c in CHECKS}


def receipt(tmp_path: Path, rows: list[tuple[str, str, dict[str, dict[str, Any]]]],
            bisects: list[tuple[str, str, str | None, str | None]]) -> Path:
    tests = [{"nodeid": f"oracles/suite/test_fault_panel.py::test_detection[{p}-{f}]", "outcome": "passed",
              "data": {"kind": "fault-detection", "pin": p, "fault": f, "title": f"{f} title", "checks": c,
                       "order": [i]}} for i, (p, f, c) in enumerate(rows)]
    tests += [{"nodeid": f"oracles/suite/test_fault_panel.py::test_bisect_names_injected_stage[{p}-{f}]",
               "outcome": "passed", "data": {"kind": "fault-bisect", "pin": p, "fault": f, "expected": e, "named": n}}
              for p, f, e, n in bisects]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION,
                                "tests": [{"nodeid": "tests/unit/x.py::t", "outcome": "passed", "data": {}}, *tests]}))
    return path


def test_matrix_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = receipt(tmp_path, [("pinA", "gate_up_swapped", cells({"forward:port": "caught", "cohort:serial": "n/a"})),
                              ("pinA", "faithful", cells({}))],
                   [("pinA", "gate_up_swapped", "layer 15", "layer 15"), ("pinA", "faithful", None, None)])
    assert main(["faults", str(path), "--details"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    faithful = next(i for i, line in enumerate(lines) if line.startswith("pinA faithful"))
    fault = next(i for i, line in enumerate(lines) if line.startswith("pinA gate_up_swapped"))
    assert fault < faithful, "rows keep the panel's order (the receipt's 'order'), not the receipt's"
    assert "  X " in lines[fault] and "layer 15 ok" in lines[fault] and "first: forward:port: forward:port says no" in out
    assert "ok: 1 fault rows each caught, 1 faithful rows caught by none, 2 bisects on their stage" in out


def test_matrix_failures_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = receipt(tmp_path, [("pinA", "rms_eps", cells({})), ("pinA", "faithful", cells({"chat:port": "caught"}))],
                   [("pinA", "rms_eps", "layer 0", "layer 3")])
    assert main(["faults", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL pinA rms_eps: missed by every check" in out
    assert "FAIL pinA faithful: false alarm by chat:port" in out
    assert "FAIL pinA rms_eps: bisect named layer 3, injected at layer 0" in out


def test_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = receipt(tmp_path, [("pinA", "trim_keeps_stale_row",
                               cells({"speculative:port": "caught"}, default="untouched"))], [])
    assert main(["faults", str(path), "--markdown"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| pinA")][0]
    assert row.count("| ~ ") == len(CHECKS) - 1 and "| X |" in row and "speculative:port says no" in row


@pytest.mark.parametrize("doc, message", [
    ({"tests": [{"nodeid": "a", "outcome": "passed", "data": {"kind": "fault-detection", "fault": "x", "checks": {}}}]},
     "tests[0] (a): field 'pin' is missing or not str"),
    ({"tests": [{"nodeid": "a", "outcome": "passed", "data": {"kind": "fault-detection", "pin": "p", "fault": "x",
                                                                "checks": {"fwd": {"status": "maybe"}}}}]},
     "field 'checks.fwd' is not"),
    ({"tests": []}, "no fault panel records"),
    ([1, 2], "not a receipt"),
    ({"schema_version": SCHEMA_VERSION + 1, "tests": []},
     f"field 'schema_version' is {SCHEMA_VERSION + 1}, not {SCHEMA_VERSION}: a receipt of another schema"),
])
def test_bad_receipt_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, **doc} if isinstance(doc, dict) else doc))
    assert main(["faults", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_another_schema_names_the_schema_not_missing_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A panel receipt of another schema is refused for its schema (one line: file, field, both versions),
    not reported as holding no panel records."""
    path = receipt(tmp_path, [("pinA", "faithful", cells({}))], [])
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "schema_version": SCHEMA_VERSION + 1}))
    assert main(["faults", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"oracles faults: error: {path}: field 'schema_version' is {SCHEMA_VERSION + 1}, not {SCHEMA_VERSION}: "
        f"a receipt of another schema, which this plugin does not read\n")


def forward_runs(logits: np.ndarray) -> dict[str, Any]:
    return {"forward": SimpleNamespace(logits=logits)}


def test_run_checks_outcomes() -> None:
    """Caught / passed on the forward check; n/a where the reference cannot run a family; an error of
    the port's run is caught; a family off the fault's path is untouched; an error of the reference's
    own run is raised, never counted as a detection."""
    ref_logits = np.zeros((3, 7), "<f4")
    ref_logits[:, 2] = 5.0
    no = Unsupported("torch", "decode a cohort of lanes in one batch")
    ref = {f: no for f in FAMILIES} | forward_runs(ref_logits)
    out = run_checks(ref, forward_runs(ref_logits.copy()), {})
    assert out["forward:port"]["status"] == PASSED and out["cohort:port"]["status"] == UNTOUCHED
    moved = ref_logits.copy()
    moved[1, 4] = 0.5
    out = run_checks(ref, forward_runs(moved) | {"cohort": RuntimeError("boom")}, {})
    assert out["forward:port"]["status"] == CAUGHT and "at (row, token) [1, 4]" in out["forward:port"]["message"]
    assert out["cohort:serial"] == {"status": CAUGHT, "message": "cohort on the port: RuntimeError: boom"}
    assert out["cohort:port"]["status"] == NOT_APPLICABLE and "cannot decode a cohort" in out["cohort:port"]["message"]
    with pytest.raises(ValueError, match="reference broke"):
        run_checks({**ref, "forward": ValueError("reference broke")}, forward_runs(moved), {})
