"""oracles.receipt_files: a test record is encoded once, for its partial-log line, and the receipt
writes that same text; both read back as the record."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from oracles.receipt_files import PartialLog, dump_json, encode_item
from oracles.receipts import TestRecord, load_records

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


def test_receipt_with_encoded_items_is_byte_identical() -> None:
    tests = [r.to_json() for r in RECORDS]
    receipt = {"run_id": "ab", "tests": tests, "not_run": [{"nodeid": "t.py::c", "reason": "deadline passed"}],
               "checks": {}, "all_ok": False}
    known = {id(item): encode_item(item) for item in tests}
    assert dump_json(receipt, known) == dump_json(receipt)
    assert json.loads(dump_json(receipt, known)) == receipt


def test_receipt_writes_the_encoded_text_it_is_given() -> None:
    """Positive control of the reuse: a text given for an item is what is written (the caller keeps it equal
    to the item), so the test above compares two paths, not one."""
    tests = [r.to_json() for r in RECORDS]
    written = dump_json({"tests": tests}, {id(tests[0]): '{"nodeid": "given"}'}).decode()
    assert '    {"nodeid": "given"},' in written.splitlines()
    assert f"    {encode_item(tests[1])}" in written.splitlines()


def test_partial_test_line_reads_back_as_its_record(tmp_path: Path) -> None:
    path = tmp_path / "run.partial.jsonl"
    log = PartialLog(path)
    log.write({"event": "start", "run_id": "ab"})
    for r in RECORDS:
        log.write_test(encode_item(r.to_json()))
    log.close(sync=False)
    # split on newlines only, as the reader does: str.splitlines would also split at the U+2028 in the data
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]
    assert lines[1:] == [{"event": "test", **r.to_json()} for r in RECORDS]
    assert load_records(path) == {r.nodeid: r for r in RECORDS}
