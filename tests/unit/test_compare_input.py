"""``oracles compare`` on bad input (one line naming the file, the record and the field; exit 2, nothing
written) and its honest output: what is not compared is said, never passed off as held."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from units_fake import PIN, decode, edit, logits, readout, slot, write

from oracles.cli import main

pytestmark = [pytest.mark.dry]


def _compare(ref: Path, port: Path, out: Path, *extra: str) -> int:
    return main(["compare", str(ref), str(port), "--out", str(out), *extra])


def _set(field: str, value: Any, n: int = 1) -> Any:
    def spoil(doc: dict[str, Any]) -> None:
        if value is None:
            del doc["tests"][n]["data"]["units"][0][field]
        else:
            doc["tests"][n]["data"]["units"][0][field] = value
    return spoil


def _npz_key(doc: dict[str, Any]) -> None:
    doc["tests"][1]["data"]["units"][0]["arrays"]["slot_logits"] = "nowhere"


def _units_text(doc: dict[str, Any]) -> None:
    doc["tests"][1]["data"]["units"] = "q1"


def _unit_list(doc: dict[str, Any]) -> None:
    doc["tests"][1]["data"]["units"] = [["d1-row"]]


MALFORMED = {
    "no-array": (_set("arrays", {}),
                 "field 'units[0].arrays.slot_logits' is missing: a d1-row unit carries its slot_logits [1, V]"),
    "probs": (_set("probs", ["0.5", 0.5]), "field 'units[0].probs' is missing or not 2 finite numbers"),
    "argmax-key": (_set("argmax_key", "maybe"), "field 'units[0].argmax_key' is 'maybe', not"),
    "no-unit": (_set("unit", None), "field 'units[0].unit' is None, not a non-empty string (the question id)"),
    "npz-key": (_npz_key, "unit d1-row fact_water/q1: field 'arrays.slot_logits' names npz key 'nowhere'"),
    "kind-int": (_set("kind", 5), "field 'units[0].kind' is 5, not one of the declared kinds"),
    "kind-unknown": (_set("kind", "word_flip"), "field 'units[0].kind' is 'word_flip', not one of the declared kinds"),
    "sha-missing": (_set("request_sha256", None), "field 'units[0].request_sha256' is missing, not 64 lowercase hex digits"),
    "sha-short": (_set("request_sha256", "abc"), "field 'units[0].request_sha256' is 'abc', not 64 lowercase hex digits"),
    "engine-list": (_set("engine", ["mlx"]), "field 'units[0].engine' is ['mlx'], not a non-empty string"),
    "pin-missing": (_set("pin", None), "field 'units[0].pin' is None, not a non-empty string"),
    "ids-text": (_set("ids", "1 2 3"), "field 'units[0].ids' is missing or not a list of ints"),
    "tokens-on-readout": (_set("tokens", [1]), "field 'units[0].tokens' is given, but a d1-row unit holds no tokens"),
    "extra-field": (_set("qid", "q1"), "field 'units[0].qid' is not a field of a unit"),
    "units-text": (_units_text, "field 'units' is a JSON str, not a list"),
    "unit-list": (_unit_list, "field 'units[0]' is a JSON list, not a unit (an object)"),
}


@pytest.mark.parametrize(("spoil", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_compare_malformed_unit_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: Any, message: str) -> None:
    """A malformed unit is bad input, never skipped: one line naming the file, the record and the field."""
    path = write(tmp_path, "r", [readout("torch", "q1", slot(1)), readout("mlx", "q1", slot(1))])
    edit(path, spoil)
    assert _compare(path, path, tmp_path / "c.json") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and f"test_readout[{PIN}-fact_water/q1-mlx]" in err, err
    assert message in err, err
    assert not (tmp_path / "c.json").exists()


def test_compare_decode_tokens_malformed_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = write(tmp_path / "a", "ref", [decode("torch", logits(), [5, 6, 2])])
    port = write(tmp_path / "b", "port", [decode("mlx", logits(), [5, 6, 2])])
    edit(port, _set("tokens", "5 6 2", n=0))
    assert _compare(ref, port, tmp_path / "c.json") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"record t.py::test_decode_to_stop[{PIN}-arith-mlx]: field 'units[0].tokens' is " \
                                     f"missing or not a list of ints" in err


def test_compare_missing_npz_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "r", [readout("torch", "q1", slot(1)), readout("mlx", "q1", slot(1))])
    (tmp_path / "r.npz").unlink()
    assert _compare(path, path, tmp_path / "c.json") == 2
    err = capsys.readouterr().err
    assert str(path) in err and "npz sidecar" in err and "r.npz" in err


def test_compare_not_a_receipt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert _compare(bad, bad, tmp_path / "c.json") == 2
    assert "field 'tests' is missing" in capsys.readouterr().err


def test_compare_npz_given_as_json_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = write(tmp_path, "ref", [decode("torch", logits(), [5, 2])])
    assert _compare(ref.with_suffix(".npz"), ref, tmp_path / "c.json") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oracles compare: error: {ref.with_suffix('.npz')}: not a UTF-8 text file") and err.count("\n") == 1


def test_compare_test_record_not_an_object_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = write(tmp_path, "ref", [decode("torch", logits(), [5, 2])], others=[{"nodeid": "t.py::x", "outcome": "passed"}])
    edit(ref, lambda doc: doc["tests"].__setitem__(1, "t.py::test_other"))
    assert _compare(ref, ref, tmp_path / "c.json") == 2
    assert capsys.readouterr().err == (f"oracles compare: error: {ref}: field 'tests[1]' is a JSON str, not a test "
                                       f"record (an object)\n")


def test_records_without_units_are_not_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record is a unit's because it holds ``units``: a d1 red arm (``kind`` word_flip with ``engine``)
    and a port test's figures (``kind`` and ``request_sha256``) are a test's own fields, never read as units."""
    base = logits()
    ref = write(tmp_path / "a", "ref", [decode("torch", base, [5, 6, 2])])
    port = write(tmp_path / "b", "port", [decode("mlx", base, [5, 6, 2])], others=[
        {"nodeid": "t.py::test_red_arm[a-mlx]", "outcome": "passed", "data": {"kind": "word_flip", "engine": "mlx"}},
        {"nodeid": "t.py::test_decode_vs_reference[mlx-arith]", "outcome": "passed",
         "data": {"kind": "decode", "request_sha256": "a" * 64, "engine": "mlx", "max_abs": 0.0}}])
    assert _compare(ref, port, tmp_path / "c.json") == 0
    assert "1 units matched on 1 pins, 0 only in the reference, 0 only in the port\n" in capsys.readouterr().out


def test_compare_reference_with_itself_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--port-engine naming the reference's engine in the same run compares records with themselves (max 0,
    a check that cannot fail): refused, exit 2. The same engine in another run (another machine) compares."""
    base = logits()
    both = write(tmp_path / "a", "both", [readout("torch", "q1", slot(1)), readout("mlx", "q1", slot(1))])
    assert _compare(both, both, tmp_path / "c.json", "--port-engine", "torch") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"would be the reference's own ('torch' on pin {PIN} of the same run)" in err
    only = write(tmp_path / "b", "only", [decode("torch", base, [5, 2])])  # one engine: no port on any pin
    assert _compare(only, only, tmp_path / "c.json") == 2
    assert "cannot fail" in capsys.readouterr().err and not (tmp_path / "c.json").exists()
    other = write(tmp_path / "c", "other", [decode("torch", base + np.float32(1e-4), [5, 2])])
    assert _compare(only, other, tmp_path / "c.json") == 0


@pytest.mark.parametrize("option", ["--port-engine", "--ref-engine"])
def test_compare_unknown_engine_names_those_present(tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str) -> None:
    both = write(tmp_path, "both", [readout("torch", "q1", slot(1)), readout("mlx", "q1", slot(1))])
    assert _compare(both, both, tmp_path / "c.json", option, "nosuch") == 2
    assert capsys.readouterr().err == (f"oracles compare: error: {both}: holds no comparable units of engine 'nosuch'; "
                                       f"engines present: mlx, torch (choose one with {option})\n")


def test_compare_unmatched_reference_units_said_and_require_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Reference units the port did not run pass by default (a sample), and the summary line says so;
    --require-all fails on them (exit 1) and says how many."""
    a, b = slot(1), slot(2)
    ref = write(tmp_path / "r", "ref", [readout("torch", "q1", a), readout("torch", "q2", b)])
    port = write(tmp_path / "p", "port", [readout("mlx", "q1", a)])
    assert _compare(ref, port, tmp_path / "c1.json") == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("1 units matched on 1 pins, 1 only in the reference, 0 only in the port (not compared, not "
                          "failed: a port may run a sample; --require-all fails on them)")
    assert _compare(ref, port, tmp_path / "c2.json", "--require-all") == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("; FAIL (--require-all): 1 reference units have no port unit")
    result = json.loads((tmp_path / "c2.json").read_text())
    assert result["require_all"] and not result["all_ok"] and result["rows"][0]["ok"]


def test_compare_taken_out_refused_before_computing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A taken --out is refused first: no table printed, the file untouched, and it is called a comparison."""
    base = logits()
    ref = write(tmp_path / "a", "ref", [decode("torch", base, [5, 2])])
    port = write(tmp_path / "b", "port", [decode("mlx", base, [5, 2])])
    out = tmp_path / "cmp.json"
    out.write_text("keep")
    assert _compare(ref, port, out) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and out.read_text() == "keep"
    assert captured.err == (f"oracles compare: error: {out}: already exists; "
                            "a comparison is never overwritten (choose another --out)\n")


def test_compare_renamed_pair_uses_the_namesake_npz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """R.json + R.npz renamed from another run's names: the JSON's namesake sidecar is used, and said."""
    base = logits()
    ref = write(tmp_path / "a", "ref", [decode("torch", base, [5, 6, 2])])
    port = write(tmp_path / "b", "20261130T082303Z-c1f9296b", [decode("mlx", base, [5, 6, 2])])
    renamed = port.with_name("R.json")
    port.rename(renamed)
    port.with_suffix(".npz").rename(renamed.with_suffix(".npz"))
    out = tmp_path / "c.json"
    assert _compare(ref, renamed, out) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == (f"{renamed}: npz sidecar {renamed.with_suffix('.npz')} (the recorded "
                                    f"20261130T082303Z-c1f9296b.npz is missing; using the JSON's namesake)")
    assert json.loads(out.read_text())["port_arrays"] == str(renamed.with_suffix(".npz"))
    renamed.with_suffix(".npz").unlink()
    assert _compare(ref, renamed, tmp_path / "c2.json") == 2
    err = capsys.readouterr().err
    assert "20261130T082303Z-c1f9296b.npz is missing, and so is" in err and "R.npz" in err


def test_compare_sampled_generation_holds_its_first_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sampled generation holds its first step's logits only, as test_sampled_generation_recorded
    does (it comes from the prompt alone; later steps follow a draw): diverging tokens are recorded,
    not failed, and a later step off is not held. The headers name what the token columns compare."""
    base = logits()
    ref = write(tmp_path / "a", "ref", [decode("torch", base, [5, 6, 2], kind="generate-sampled")])
    port = write(tmp_path / "b", "port", [decode("mlx", base + np.float32(1.0), [7, 2], kind="generate-sampled")])
    out = tmp_path / "c.json"
    assert _compare(ref, port, out) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "prompt ids" in lines[2] and "gen tokens" in lines[2] and lines[2].endswith("status")
    assert lines[4].split()[-2:] == ["div@0", "ok"]
    assert any(line.startswith("prompt ids: the input token ids are equal; gen tokens: the generated tokens")
               for line in lines)
    row = json.loads(out.read_text())["rows"][0]
    assert row["held"] == ["logits"] and row["logits_at"] == "step 0" and row["max_abs"] == 0.0
    first_off = np.stack([logits(100) + np.float32(1.0), base])
    bad = write(tmp_path / "c", "port", [decode("mlx", first_off, [7, 2], kind="generate-sampled")])
    assert _compare(ref, bad, tmp_path / "c2.json") == 1
    assert json.loads((tmp_path / "c2.json").read_text())["rows"][0]["failures"][0].startswith(
        "step_logits of step 0: max |Δlogit|")


def test_compare_generation_without_a_step_is_recorded_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A generation without a step holds nothing to a threshold: "recorded only" (ok null in the JSON),
    never "ok"; a comparison holding only such rows is not a pass (exit 1)."""
    ref = write(tmp_path / "a", "ref", [decode("torch", logits(), [], kind="generate-sampled")])
    port = write(tmp_path / "b", "port", [decode("mlx", logits(), [], kind="generate-sampled")])
    out = tmp_path / "c.json"
    assert _compare(ref, port, out) == 1
    assert capsys.readouterr().out.splitlines()[4].split()[-3:] == ["same", "recorded", "only"]
    row = json.loads(out.read_text())["rows"][0]
    assert row["status"] == "recorded only" and row["ok"] is None and row["held"] == [] and row["failures"] == []
