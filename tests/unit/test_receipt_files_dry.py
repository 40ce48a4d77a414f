"""oracles.receipts.files: json's C encoder made once writes what ``json.dumps`` writes (the receipt's
items, the partial log's lines), and both files read back as the records."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from oracles.receipts.files import PartialLog, dump_json, encode_item
from oracles.receipts.table import TestRecord, load_records

pytestmark = pytest.mark.dry

RECORDS = [TestRecord(nodeid="t.py::test_a[é::x]", family="d1", check="test_a", record_id="é::x", outcome="passed",
                      duration=0.000123, data={"probs": [0.25, 0.75], "s": "line\n\"quoted\"\u2028", "n": None}),
           TestRecord(nodeid="t.py::test_b", family="unit", check="test_b", record_id="", outcome="failed",
                      duration=2.0, summary="AssertionError: 1 != 2", worker="gw1")]


@pytest.mark.parametrize("value", [
    {"a": 1.5, "b": [1, 2, {"c": None, "d": True}], "é": "x\n\"y\u2028", "big": 10**30, "tiny": 1e-300, "neg": -0.0},
    {}, [], [1.0, 2], {"t": (1, 2)}, 3, 2.5, None, True, "str",
])
def test_encode_item_is_the_receipts_one_line_json(value: Any) -> None:
    assert encode_item(value) == json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


@pytest.mark.parametrize("value", [{"x": float("nan")}, [float("inf")], {"d": {"e": -float("inf")}}])
def test_encode_item_refuses_non_finite(value: Any) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode_item(value)


def test_record_json_follows_the_declaration() -> None:
    assert list(RECORDS[1].to_json()) == [f.name for f in fields(TestRecord)]
    assert RECORDS[1].to_json()["worker"] == "gw1" and RECORDS[1].to_json()["summary"] == "AssertionError: 1 != 2"


def test_receipt_items_and_partial_lines_are_json_dumps() -> None:
    tests = [r.to_json() for r in RECORDS]
    text = dump_json({"run_id": "ab", "tests": tests}).decode()
    lines = [json.dumps(item, ensure_ascii=False, separators=(", ", ": ")) for item in tests]
    assert '  "tests": [\n    ' + ",\n    ".join(lines) + "\n  ]" in text


def test_partial_test_line_reads_back_as_its_record(tmp_path: Path) -> None:
    path = tmp_path / "run.partial.jsonl"
    log = PartialLog(path)
    log.write({"event": "start", "run_id": "ab"})
    for r in RECORDS:
        log.write({"event": "test", **r.to_json()})
    log.close(sync=False)
    # split on newlines only, as the reader does: str.splitlines would also split at the U+2028 in the data
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[1:] == [json.dumps({"event": "test", **r.to_json()}, ensure_ascii=False, separators=(",", ":"))
                         for r in RECORDS] + [""]
    assert load_records(path) == {r.nodeid: r for r in RECORDS}
