"""oracles.receipts.table without pytester: the checks table, all_ok, nodeid splitting, JSON safety, the
``receipt`` fixture's object, exclusive writes and reading receipts and partial logs back."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.errors import FixtureError, ReceiptError
from oracles.receipts.files import write_exclusive
from oracles.receipts.table import (
    SCHEMA_VERSION,
    Receipt,
    TestRecord,
    all_ok,
    check_json_safe,
    checks_table,
    load_receipt,
    load_records,
    split_nodeid,
)

pytestmark = pytest.mark.dry


def rec(nodeid: str, outcome: str, family: str = "unit") -> TestRecord:
    check, record_id = split_nodeid(nodeid)
    return TestRecord(nodeid=nodeid, family=family, check=check, record_id=record_id, outcome=outcome, duration=0.1)


@pytest.mark.parametrize(("nodeid", "check", "record_id"), [
    ("tests/x.py::test_a", "test_a", ""),
    ("tests/x.py::test_a[ping-torch]", "test_a", "ping-torch"),
    ("tests/x.py::TestK::test_a[readme/q1]", "test_a", "readme/q1"),
    ("tests/x.py::test_a[x::y]", "test_a", "x::y"),
    ("tests/x.py::test_a[a[1]]", "test_a", "a[1]"),
])
def test_split_nodeid(nodeid: str, check: str, record_id: str) -> None:
    assert split_nodeid(nodeid) == (check, record_id)


def test_checks_table_rows() -> None:
    records = [
        rec("t/a.py::test_rows[ping]", "passed", "mtplx"), rec("t/a.py::test_rows[readme]", "failed", "mtplx"),
        rec("t/a.py::test_rows[long]", "skipped", "mtplx"),
        rec("t/a.py::test_ok[ping]", "passed"), rec("t/a.py::test_ok[gap]", "xfailed"),
        rec("t/a.py::test_none[x]", "skipped"), rec("t/a.py::test_none[y]", "not_run"),
        rec("t/a.py::test_bad", "crashed"),
    ]
    assert checks_table(records) == {
        "test_bad": {"family": "unit", "ok": False, "passed": 0, "failed": ["t/a.py::test_bad"], "skipped": 0,
                     "xfailed": 0, "not_run": 0},
        # a test not run leaves its check undone: not ok, not "nothing ran"
        "test_none": {"family": "unit", "ok": False, "passed": 0, "failed": [], "skipped": 1, "xfailed": 0, "not_run": 1},
        # an expected (strict) xfail is ok, counted apart from passes
        "test_ok": {"family": "unit", "ok": True, "passed": 1, "failed": [], "skipped": 0, "xfailed": 1, "not_run": 0},
        "test_rows": {"family": "mtplx", "ok": False, "passed": 1, "failed": ["readme"], "skipped": 1, "xfailed": 0,
                      "not_run": 0},
    }


@pytest.mark.parametrize("outcome", ["failed", "error", "xpassed", "crashed", "timeout"])
def test_every_failing_outcome_fails_its_check(outcome: str) -> None:
    table = checks_table([rec("t.py::test_a[p]", "passed"), rec("t.py::test_a[q]", outcome)])
    assert table["test_a"]["ok"] is False and table["test_a"]["failed"] == ["q"]


def test_same_check_name_in_two_owners_is_qualified() -> None:
    table = checks_table([rec("t/a.py::test_x[p]", "passed"), rec("t/b.py::test_x[p]", "failed"),
                          rec("t/b.py::TestK::test_x[p]", "passed")])
    assert set(table) == {"a::test_x", "b::test_x", "b::TestK::test_x"}
    assert table["b::test_x"]["ok"] is False and table["a::test_x"]["ok"] is True


def test_checks_table_ignores_order() -> None:
    records = [rec(f"t/a.py::test_{c}[r{i}]", random.Random(i).choice(["passed", "failed", "skipped"]))
               for c in "abc" for i in range(8)]
    shuffled = records[:]
    random.Random(7).shuffle(shuffled)
    assert json.dumps(checks_table(shuffled)) == json.dumps(checks_table(records))


@pytest.mark.parametrize(("oks", "expected"), [
    ([True, True], True), ([True, None], True), ([True, False], False), ([None, None], False), ([], False),
])
def test_all_ok(oks: list[bool | None], expected: bool) -> None:
    assert all_ok({f"c{i}": {"ok": ok} for i, ok in enumerate(oks)}) is expected


@pytest.mark.parametrize(("value", "where", "hint"), [
    ({1, 2}, "k", "a set"),
    (frozenset(), "k", "a set"),
    (np.float32(1.5), "k", "a numpy scalar"),
    (np.int64(3), "k", "a numpy scalar"),
    (np.zeros(2), "k", "an array; attach it with receipt.array"),
    (float("nan"), "k", "float nan is not finite"),
    (float("-inf"), "k", "float -inf is not finite"),
    (b"raw", "k", "builtins.bytes"),
    ({"a": [1, {"b": {3}}]}, "k.a[1].b", "a set"),
    ({"a": {1: 2}}, "k.a", "dict key 1 is a int"),
])
def test_check_json_safe_refuses_naming_the_key(value: object, where: str, hint: str) -> None:
    with pytest.raises(TypeError) as info:
        check_json_safe(value, "k")
    assert str(info.value).startswith(f"receipt data {where!r}: ") and hint in str(info.value), str(info.value)


def test_check_json_safe_accepts_json() -> None:
    check_json_safe({"a": [1, 2.5, None, True, "x", (3, 4)], "b": {"c": -0.0}}, "k")


def test_receipt_object_validates_on_attach() -> None:
    data: dict[str, Any] = {}
    r = Receipt(data, None, "t.py::test_a")
    r["ids"] = [1, 2]
    r.update({"n": 1}, m=2.5)
    with pytest.raises(TypeError, match="receipt data 'bad'"):
        r["bad"] = {3}
    with pytest.raises(TypeError, match="receipt data 'worse'"):
        r.update(ok=1, worse=np.float64(2.0))
    with pytest.raises(TypeError, match="receipt data key 3 is a int, not a str"):
        r[3] = 1  # type: ignore[index]  # a key that is no str, on purpose: the refusal under test
    assert data == {"ids": [1, 2], "n": 1, "m": 2.5, "ok": 1}


def test_receipt_array_stages_npy(tmp_path: Path) -> None:
    data: dict[str, Any] = {}
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    Receipt(data, tmp_path / "stage", "t.py::test_a[p]").array("hidden", a)
    meta = data["arrays"]["hidden"]
    assert meta["shape"] == [2, 3] and meta["dtype"] == "<f4"
    assert np.load(tmp_path / "stage" / f"{meta['npz_key']}.npy").tobytes() == a.tobytes()


def test_receipt_array_refuses_objects(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"receipt array 'ids': refused an object array"):
        Receipt({}, tmp_path, "t.py::test_a").array("ids", np.array([1, "x", None], dtype=object))
    assert not list(tmp_path.iterdir())


def test_write_exclusive_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    write_exclusive(target, b"first")
    with pytest.raises(ReceiptError, match=r"r\.json: already exists; receipts are never overwritten"):
        write_exclusive(target, b"second")
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"], "a temporary file was left behind"


def test_write_exclusive_into_a_file_path_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ReceiptError, match=r"file/r\.json: cannot be written: Not a directory"):
        write_exclusive(tmp_path / "file" / "r.json", b"data")


def _line(nodeid: str, outcome: str = "passed") -> str:
    return json.dumps({"event": "test", "nodeid": nodeid, "outcome": outcome, "duration": 0.5})


def test_load_partial_ignores_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "run.partial.jsonl"
    path.write_text("\n".join([json.dumps({"event": "start"}), _line("t.py::test_a[p]"), _line("t.py::test_b", "failed"),
                               _line("t.py::test_c")[:25]]))
    got = load_records(path)
    assert {k: v.outcome for k, v in got.items()} == {"t.py::test_a[p]": "passed", "t.py::test_b": "failed"}
    assert (got["t.py::test_a[p]"].check, got["t.py::test_a[p]"].record_id) == ("test_a", "p")


def test_load_partial_bad_middle_line_names_path_and_line(tmp_path: Path) -> None:
    path = tmp_path / "run.partial.jsonl"
    path.write_text("\n".join([_line("t.py::a"), "{not json", _line("t.py::b")]) + "\n")
    with pytest.raises(FixtureError, match=rf"^{path}:2:2: not valid JSON: Expecting property name enclosed in double quotes$"):
        load_records(path)


def test_load_partial_bad_line_gives_its_column(tmp_path: Path) -> None:
    """An unterminated string: the message says where it starts, line and column (before: "...:2: not
    valid JSON: Unterminated string starting at", json's message without its position)."""
    path = tmp_path / "run.partial.jsonl"
    path.write_text("\n".join([_line("t.py::a"), '{"nodeid": "t.py::b', _line("t.py::c")]) + "\n")
    with pytest.raises(FixtureError) as info:
        load_records(path)
    assert str(info.value) == f"{path}:2:12: not valid JSON: Unterminated string starting at"


@pytest.mark.parametrize(("obj", "message"), [
    ({"outcome": "passed"}, "field 'nodeid' is missing or not a str"),
    ({"nodeid": "t.py::a", "outcome": "won"}, "field 'outcome' is 'won', not one of passed"),
    (["t.py::a"], "a test record must be a JSON object, got list"),
])
def test_load_partial_bad_record_names_path_line_field(tmp_path: Path, obj: object, message: str) -> None:
    path = tmp_path / "run.partial.jsonl"
    path.write_text(_line("t.py::ok") + "\n" + json.dumps(obj) + "\n")
    with pytest.raises(FixtureError) as info:
        load_records(path)
    assert str(info.value).startswith(f"{path}:2: ") and message in str(info.value), str(info.value)


def test_load_receipt_errors_name_path(tmp_path: Path) -> None:
    bad_json = tmp_path / "a.json"
    bad_json.write_text('{\n  "tests": [\n    {"nodeid": }\n  ]\n}\n')
    with pytest.raises(FixtureError, match=rf"^{bad_json}:3:16: not valid JSON"):
        load_records(bad_json)
    no_tests = tmp_path / "b.json"
    no_tests.write_text('{"checks": {}}')
    with pytest.raises(FixtureError, match=rf"^{no_tests}: not a receipt: field 'tests' is missing"):
        load_records(no_tests)
    bad_rec = tmp_path / "c.json"
    bad_rec.write_text(json.dumps({"tests": [{"nodeid": "t.py::a", "outcome": "passed"}, {"nodeid": "t.py::b"}]}))
    with pytest.raises(FixtureError, match=rf"^{bad_rec}: tests\[1\]: field 'outcome' is missing"):
        load_records(bad_rec)


def test_dump_json_round_trips_and_refuses_nan() -> None:
    from oracles.receipts.files import dump_json

    receipt = {"run_id": "ab", "tests": [{"nodeid": "t.py::a[x::y]", "data": {"ids": [1, 2], "s": "é\n\"q\""}},
                                         {"nodeid": "t.py::b", "data": {}}],
               "not_run": [], "checks": {"a": {"ok": True, "failed": []}}, "all_ok": True}
    text = dump_json(receipt).decode()
    assert json.loads(text) == receipt
    assert '    {"nodeid": "t.py::b", "data": {}}' in text.splitlines(), "a test record is not one line"
    with pytest.raises(ValueError):
        dump_json({"tests": [{"x": float("nan")}]})


@pytest.mark.parametrize(("version", "shown"), [(SCHEMA_VERSION + 1, str(SCHEMA_VERSION + 1)), (1, "1"),
                                                (str(SCHEMA_VERSION), repr(str(SCHEMA_VERSION))),
                                                (float(SCHEMA_VERSION), repr(float(SCHEMA_VERSION))), (True, "True"),
                                                (None, "None")])
def test_load_receipt_refuses_another_schema(tmp_path: Path, version: Any, shown: str) -> None:
    """Only the int SCHEMA_VERSION reads: a float or bool equal to it in Python is not a schema this plugin wrote."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema_version": version, "tests": []}))
    with pytest.raises(FixtureError) as info:
        load_receipt(path)
    assert str(info.value) == (f"{path}: field 'schema_version' is {shown}, not {SCHEMA_VERSION}: a receipt of another "
                               f"schema, which this plugin does not read")


def test_load_receipt_reads_this_schema(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "tests": []}))
    assert load_receipt(path) == {"schema_version": SCHEMA_VERSION, "tests": []}
