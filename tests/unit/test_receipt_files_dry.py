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
    texts = [log.write_test(r.to_json()) for r in RECORDS]
    log.close(sync=False)
    # split on newlines only, as the reader does: str.splitlines would also split at the U+2028 in the data
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines == [json.dumps(line, ensure_ascii=False, separators=(", ", ": ")) for line in
                     [{"event": "start", "run_id": "ab"}, *({"event": "test", **r.to_json()} for r in RECORDS)]] + [""]
    assert texts == [encode_item(r.to_json()) for r in RECORDS]
    assert load_records(path) == {r.nodeid: r for r in RECORDS}


def test_a_receipt_reuses_the_texts_given_for_its_items() -> None:
    """The tests list takes the partial log's text where given and encodes the rest; a count that does
    not match the items is refused, not silently misaligned."""
    tests = [r.to_json() for r in RECORDS]
    given = dump_json({"tests": tests}, {"tests": ['{"reused": 1}', None]}).decode()
    assert '    {"reused": 1},\n    ' + encode_item(tests[1]) + "\n  ]" in given
    with pytest.raises(ValueError, match="shorter|longer"):
        dump_json({"tests": tests}, {"tests": [None]})
