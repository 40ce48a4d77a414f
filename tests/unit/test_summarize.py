"""``oracles summarize``: the d1 summary of a receipt (JSON created exclusively, table, PNG)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.cli import main
from oracles.commands.summarize import RED_LEGEND, percentile, summarize, table
from oracles.receipts.table import SCHEMA_VERSION, Receipt
from oracles.receipts.units import attach_unit

PIN = "smollm2-135m-instruct"
R = Path("r.json")

#: The PNG test imports matplotlib (seconds): it is not dry; the rest is.
pytestmark = [pytest.mark.d1]


def _readout(rid: str, qid: str, bucket: int, probs: list[float], gold: str, keys: list[str], typ: str = "noul",
             path: str = "row", pin: str = PIN) -> dict[str, Any]:
    """A test_readout record: its d1-row unit (attached by the writer) and the figures beside it."""
    top = max(range(len(probs)), key=probs.__getitem__)
    gap = sorted(probs)[-1] - sorted(probs)[-2]
    nodeid = f"tests/oracles/test_d1.py::test_readout[{rid}/{qid}-torch]" + ("" if pin == PIN else f"-{pin}")
    data: dict[str, Any] = {}
    attach_unit(Receipt(data, None, nodeid), "d1-row", request_sha256="a" * 64, pin=pin, engine="torch", record=rid,
                unit=qid, ids=[1, 2], keys=keys, probs=probs, arrays={"slot_logits": np.zeros((1, 8), np.float32)})
    data.update({"source": "facts", "type": typ, "bucket": bucket, "path": path, "row_len": bucket // 2,
                 "gold_key": gold, "gold_match": keys[top] == gold, "top2_gap": gap, "near_tie": gap <= 0.02,
                 "seconds": 0.5})
    return {"nodeid": nodeid, "check": "test_readout", "record_id": f"{rid}/{qid}-torch", "outcome": "passed",
            "data": data}


def _receipt() -> dict[str, Any]:
    tests = [_readout("a", "q", 64, [0.9, 0.1], "true", ["true", "false"]),
             _readout("b", "q", 64, [0.505, 0.495], "false", ["true", "false"]),
             _readout("c", "x", 512, [0.2, 0.7, 0.1], "n", ["m", "n", "o"], typ="choice", path="tree"),
             _readout("c", "y", 512, [0.6, 0.4], "false", ["true", "false"], path="tree"),
             {"nodeid": "t::test_tree_vs_row[c/x-torch]", "check": "test_tree_vs_row", "record_id": "c/x-torch",
              "outcome": "passed",
              "data": {"engine": "torch", "pin": PIN, "record": "c", "qid": "x", "max_abs_dp": 3e-6, "gold_match_tree": True}},
             {"nodeid": "t::test_tree_vs_row[c/y-torch]", "check": "test_tree_vs_row", "record_id": "c/y-torch",
              "outcome": "passed",
              "data": {"engine": "torch", "pin": PIN, "record": "c", "qid": "y", "max_abs_dp": 5e-6, "gold_match_tree": False}},
             {"nodeid": "t::test_tree_split[c-torch]", "check": "test_tree_split", "record_id": "c-torch", "outcome": "passed",
              "data": {"engine": "torch", "pin": PIN, "tree_seconds": 1.0, "rows_seconds": 2.0}},
             {"nodeid": "t::test_red_arm[arm1-torch]", "check": "test_red_arm", "record_id": "arm1-torch", "outcome": "passed",
              "data": {"engine": "torch", "pin": PIN, "kind": "word_flip", "base": "a/q", "max_abs_dp": 0.3, "threshold": 0.02,
                       "argmax_base": "true", "argmax_arm": "false"}},
             {"nodeid": "t::test_dry_request[d]", "check": "test_dry_request", "record_id": "d", "outcome": "passed",
              "data": {"rejected": [{"qid": "z", "field": "questions.z.type", "reason": "unknown type"}]}}]
    return {"schema_version": SCHEMA_VERSION, "run_id": "r", "tests": tests, "checks": {}}


@pytest.mark.dry
def test_summary_figures() -> None:
    s = summarize(_receipt(), R)
    e = s["pins"][PIN]["torch"]
    assert e["questions"] == 4
    assert e["gold_overall"] == {"questions": 4, "near_tie": 1, "gold_n": 4, "gold_match": 2, "gold_rate": 0.5}
    assert e["near_ties"] == {"count": 1, "ids": ["b/q"]}
    assert e["by_bucket"]["64"]["gold_match"] == 1 and e["by_bucket"]["512"]["gold_match"] == 1
    assert e["by_type"]["choice"]["gold_rate"] == 1.0
    assert e["by_path"]["tree"] == {"questions": 2, "near_tie": 0, "gold_n": 2, "gold_match": 1, "gold_rate": 0.5}
    assert e["tree_vs_row"]["tree_over_rows"] == 0.5 and e["tree_vs_row"]["max_abs_dp"] == 5e-6
    assert e["red_arms"][0]["red"] is True and e["seconds_by_bucket"]["64"] == {"rows": 2, "seconds": 1.0, "tokens": 64}
    assert s["rejected"] == [{"record": "d", "qid": "z", "field": "questions.z.type", "reason": "unknown type"}]
    assert e["top2_gap"]["p00"] == pytest.approx(0.01) and e["top2_gap"]["p50"] == pytest.approx(0.2)


@pytest.mark.dry
def test_percentile_nearest_rank() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0 and percentile([1.0, 2.0], 0.0) == 1.0
    assert percentile([], 0.5) is None


def test_command_writes_once_prints_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "20260101T000000Z-r.json"
    path.write_text(json.dumps(_receipt()))
    assert main(["summarize", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gold agreement 2/4 = 0.5" in out and "red arm" in out and "rejected" in out
    summary = tmp_path / "20260101T000000Z-r.d1-summary.json"
    png = tmp_path / "20260101T000000Z-r.d1-summary.png"
    assert json.loads(summary.read_text())["pins"][PIN]["torch"]["questions"] == 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["summarize", str(path)]) == 2  # never overwritten
    assert "already exists" in capsys.readouterr().err


@pytest.mark.dry
def test_without_matplotlib_the_summary_is_written_and_the_png_said_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """No matplotlib: the JSON and the table, one line saying why there is no PNG, exit 0 (before:
    ModuleNotFoundError, exit 1, nothing written)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_receipt()))
    assert main(["summarize", str(path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.d1-summary.json", "r.json"]
    out, err = capsys.readouterr()
    assert err == "PNG not written: matplotlib is not installed (pip install 'pytest-oracles[plots]')\n"
    assert "gold agreement 2/4 = 0.5" in out and f"summary: {tmp_path / 'r.d1-summary.json'}\n" in out
    assert "plot:" not in out


@pytest.mark.dry
def test_receipt_without_d1_records_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "tests": [], "checks": {}}))
    assert main(["summarize", str(path)]) == 2
    err = capsys.readouterr().err
    assert "r.json: no d1 row units" in err and err.count("\n") == 1


def test_out_folder_is_created_and_a_taken_png_leaves_no_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "20260101T000000Z-r.json"
    path.write_text(json.dumps(_receipt()))
    out = tmp_path / "new" / "summaries"
    assert main(["summarize", str(path), "--out", str(out)]) == 0
    assert (out / "20260101T000000Z-r.d1-summary.png").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "20260101T000000Z-r.d1-summary.png").write_bytes(b"taken")
    assert main(["summarize", str(path), "--out", str(other)]) == 2
    assert "d1-summary.png: already exists" in capsys.readouterr().err
    assert not (other / "20260101T000000Z-r.d1-summary.json").exists()  # nothing half-written


@pytest.mark.dry
def test_red_arm_line_has_its_threshold_and_a_legend() -> None:
    """RED means a probability moved by more than the threshold, not that the answer flipped: the line
    shows the comparison and a legend under the arms says so."""
    doc = _receipt()
    doc["tests"][7]["data"]["argmax_arm"] = "true"  # red (0.3 > 0.02) with the answer unchanged
    lines = table(summarize(doc, R))
    arm = next(i for i, line in enumerate(lines) if line.startswith("red arm"))
    assert "max|dp| 0.3000 > 0.02 answer true -> true RED (passed)" in lines[arm]
    assert lines[arm + 1] == RED_LEGEND and "more than the threshold" in RED_LEGEND and "need not flip" in RED_LEGEND


def _string_test(doc: dict[str, Any]) -> None:
    doc["tests"][0] = "test_readout"


def _gap_text(doc: dict[str, Any]) -> None:
    doc["tests"][1]["data"]["top2_gap"] = "0.01"


def _unit_pin(doc: dict[str, Any]) -> None:
    doc["tests"][1]["data"]["units"][0]["pin"] = 5


def _arm_no_pin(doc: dict[str, Any]) -> None:
    del doc["tests"][7]["data"]["pin"]


def _arm_no_threshold(doc: dict[str, Any]) -> None:
    del doc["tests"][7]["data"]["threshold"]


def _rejected_not_object(doc: dict[str, Any]) -> None:
    doc["tests"][8]["data"]["rejected"] = ["z"]


@pytest.mark.dry
@pytest.mark.parametrize(("spoil", "message"), [
    (_string_test, ": field 'tests[0]' is a JSON str, not a test record (an object)"),
    (_gap_text,
     ": record tests/oracles/test_d1.py::test_readout[b/q-torch]: field 'data.top2_gap' is missing or not int or float"),
    (_unit_pin, ": record tests/oracles/test_d1.py::test_readout[b/q-torch]: field 'units[0].pin' is 5, not a non-empty string"),
    (_arm_no_pin, ": record t::test_red_arm[arm1-torch]: field 'data.pin' is missing or not str"),
    (_arm_no_threshold, ": record t::test_red_arm[arm1-torch]: field 'data.threshold' is missing or not int or float"),
    (_rejected_not_object, ": record t::test_dry_request[d]: field 'data.rejected[0].qid' is missing or not str"),
], ids=["test-is-a-string", "gap-is-text", "unit-pin", "arm-without-pin", "arm-without-threshold", "rejected-not-object"])
def test_malformed_record_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil,
                                              message: str) -> None:
    """A malformed record is exit 2 and one line naming the file, the record and the field; nothing is written."""
    doc = _receipt()
    spoil(doc)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    assert main(["summarize", str(path)]) == 2
    assert capsys.readouterr().err == f"oracles summarize: error: {path}{message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


@pytest.mark.dry
def test_out_naming_a_file_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--out`` is a folder; an existing file there is refused before anything is computed or written."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_receipt()))
    taken = tmp_path / "taken.txt"
    taken.write_text("keep")
    assert main(["summarize", str(path), "--out", str(taken)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"oracles summarize: error: {taken}: --out names a file") and captured.err.count("\n") == 1
    assert taken.read_text() == "keep" and captured.out == ""


@pytest.mark.dry
def test_two_pins_of_one_engine_are_two_blocks() -> None:
    """SmolLM2 and its twin on torch in one receipt: each pin's questions, trees and arms apart, never mixed."""
    doc = _receipt()
    twin = "smollm2-hybrid-twin"
    doc["tests"].append(_readout("a", "q", 64, [0.3, 0.7], "true", ["true", "false"], pin=twin))
    s = summarize(doc, R)
    assert list(s["pins"]) == [PIN, twin] and s["pins"][PIN]["torch"]["questions"] == 4
    t = s["pins"][twin]["torch"]
    assert t["questions"] == 1 and t["gold_overall"]["gold_match"] == 0 and t["red_arms"] == []
    assert t["tree_vs_row"]["requests"] == 0 and s["pins"][PIN]["torch"]["tree_vs_row"]["requests"] == 1
    assert f"== d1 summary: pin {twin}, engine torch: 1 questions" in table(s)
