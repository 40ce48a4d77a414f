"""The receipt as one typed object (oracles.receipts.schema.RunReceipt): built in one place, written with
the layout receipts of schema 3 had, and a receipt written before the fields added since still loads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from oracles.errors import FixtureError
from oracles.receipts.schema import RunFacts, RunReceipt
from oracles.receipts.table import SCHEMA_VERSION, TestRecord, load_receipt

pytestmark = pytest.mark.dry

#: The keys of a schema-3 receipt as the plugin wrote them before the receipt was a dataclass, in order.
SCHEMA_3_KEYS = ["schema_version", "run_id", "started", "finished", "seconds", "exitstatus", "invocation", "environment",
                 "pins", "engines", "resumed_from", "resume_unchecked", "resume_not_carried", "collection_errors",
                 "not_run", "tests", "checks", "all_ok", "left_out", "arrays"]


def record(nodeid: str, outcome: str, summary: str | None = None) -> TestRecord:
    check, _, rest = nodeid.partition("[")
    return TestRecord(nodeid=nodeid, family="port", check=check.rsplit("::", 1)[-1], record_id=rest.rstrip("]"),
                      outcome=outcome, duration=0.1, summary=summary)


def build(records: list[TestRecord], engine_of: dict[str, tuple[str, str]] | None = None,
          arrays: str | None = "x.npz", not_run: list[dict[str, str]] | None = None) -> RunReceipt:
    facts = RunFacts(invocation={"args": []}, environment={}, engine_of=engine_of or {},
                     left_out=[{"engine": "mlx-vlm", "pin": "p", "reason": "text pin"}])
    return RunReceipt.build("abcd0123", "2026-01-01T00:00:00.000000Z", time.time(), 0, records, not_run or [], facts,
                            arrays)


def test_the_layout_is_schema_3s_with_the_new_fields_after_it() -> None:
    out = build([record("t.py::test_a[x]", "passed")]).to_json()
    keys = list(out)
    assert [k for k in keys if k in SCHEMA_3_KEYS] == SCHEMA_3_KEYS, keys
    assert set(keys) - set(SCHEMA_3_KEYS) == {"ran_nothing"}, "plugin_fields, port_scope only when there are some"
    assert out["schema_version"] == SCHEMA_VERSION and out["all_ok"] is True and out["arrays"] == "x.npz"
    assert "arrays" not in build([record("t.py::test_a[x]", "passed")], arrays=None).to_json()
    json.dumps(out, allow_nan=False)  # strict JSON as it is


def test_a_receipt_without_the_fields_added_since_still_loads(tmp_path: Path) -> None:
    old = {k: v for k, v in build([record("t.py::test_a[x]", "passed")]).to_json().items()
           if k in SCHEMA_3_KEYS and k not in ("left_out", "arrays")}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    loaded = RunReceipt.from_json(load_receipt(path), path)
    assert loaded.ran_nothing == [] and loaded.left_out == [] and loaded.arrays is None and loaded.plugin_fields == {}
    assert loaded.checks == old["checks"] and loaded.tests == old["tests"]


@pytest.mark.parametrize(("edit", "message"), [
    ({"tests": None}, "field 'tests' is missing from the receipt"),
    ({"schema_version": 3}, "field 'schema_version' is 3, not 4"),
])
def test_a_receipt_missing_a_field_or_of_another_schema_is_refused(tmp_path: Path, edit: dict[str, Any],
                                                                   message: str) -> None:
    obj = build([record("t.py::test_a[x]", "passed")]).to_json()
    for key, value in edit.items():
        if value is None:
            del obj[key]
        else:
            obj[key] = value
    with pytest.raises(FixtureError, match=f"^{tmp_path / 'r.json'}: {message}"):
        RunReceipt.from_json(obj, tmp_path / "r.json")


def test_not_all_ok_when_an_engine_ran_nothing_or_a_test_did_not_run() -> None:
    ran = {"t.py::test_a[p-ref]": ("ref", "p"), "t.py::test_a[p-port]": ("port", "p"),
           "t.py::test_b[q-port]": ("port", "q")}
    records = [record("t.py::test_a[p-ref]", "passed"), record("t.py::test_a[p-port]", "skipped", "unsupported: x"),
               record("t.py::test_b[q-port]", "skipped", "unsupported: x")]
    receipt = build(records, ran)
    assert receipt.ran_nothing == [{"engine": "port", "pins": ["p", "q"], "tests": 2, "reasons": {"unsupported: x": 2}}]
    assert receipt.all_ok is False
    control = build([*records[:2], record("t.py::test_b[q-port]", "failed", "boom")], ran)
    assert control.ran_nothing == [] and control.all_ok is False  # it ran (and failed): not "nothing"
    assert build(records[:1], ran).all_ok is True  # the port's tests deselected: asked nothing
    cut = build(records[:1], ran, not_run=[{"nodeid": "t.py::test_c", "reason": "deadline passed"}])
    assert cut.all_ok is False
