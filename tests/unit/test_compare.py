"""``oracles compare``: units matched pin by pin, the table, the comparison JSON (exclusive), exit codes.

Every receipt here is written through ``attach_unit`` (tests/unit/units_fake.py), as a run writes one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from units_fake import PIN, SHA, TWIN, decode, logits, near, probs, readout, slot, write

from oracles.checks.tolerance import FLOAT32
from oracles.cli import main
from oracles.receipts.table import SCHEMA_VERSION

KEY_MARGIN, MAX_ABS_DP, MAX_ABS_LOGIT = FLOAT32.key_margin, FLOAT32.max_abs_dp, FLOAT32.max_abs_logit

pytestmark = [pytest.mark.dry]


def _compare(ref: Path, port: Path, out: Path, *extra: str) -> int:
    return main(["compare", str(ref), str(port), "--out", str(out), *extra])


def test_compare_within_thresholds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = logits()
    ref = write(tmp_path / "a", "ref", [decode("torch", base, [5, 6, 2])])
    port = write(tmp_path / "b", "port", [decode("mlx", base + np.float32(1e-4), [5, 6, 2])])
    out = tmp_path / "cmp.json"
    assert _compare(ref, port, out) == 0
    text = capsys.readouterr().out
    assert "1 units matched on 1 pins" in text and f"== pin {PIN}: torch vs mlx: 1 units matched (decode 1)" in text
    assert "max|Δlogit|" in text
    result = json.loads(out.read_text())
    row = result["rows"][0]
    assert result["all_ok"] and row["ids_equal"] and row["first_divergent_token"] is None
    assert row["max_abs"] == pytest.approx(1e-4, rel=0.05) and row["argmax_agreement"] == 1.0
    assert (row["ref_engine"], row["port_engine"], row["ref_pin"], row["port_pin"]) == ("torch", "mlx", PIN, PIN)
    exact = {"kind": "exact", "dtype": "float32", "why": f"port pin {PIN} computes in float32 on the weights of {PIN}"}
    assert result["pins"] == [{"ref_pin": PIN, "port_pin": PIN, "ref_engine": "torch", "port_engine": "mlx",
                               "judgment": exact, "figures": result["figures"]}]


def test_compare_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = write(tmp_path / "a", "ref", [decode("torch", logits(), [5, 2])])
    port = write(tmp_path / "b", "port", [decode("mlx", logits(), [5, 2])])
    out = tmp_path / "cmp.json"
    out.write_text("keep")
    assert _compare(ref, port, out) == 2
    assert out.read_text() == "keep" and "never overwritten" in capsys.readouterr().err


@pytest.mark.parametrize(("port_tokens", "expected"), [([5, 7, 2], "greedy tokens diverge at 1"),
                                                      ([5, 6, 2], "max |Δlogit|")], ids=["tokens", "logits"])
def test_compare_threshold_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str], port_tokens: list[int],
                                  expected: str) -> None:
    base = logits()
    ref = write(tmp_path / "a", "ref", [decode("torch", base, [5, 6, 2])])
    port = write(tmp_path / "b", "port", [decode("mlx", base + np.float32(10 * MAX_ABS_LOGIT), port_tokens)])
    assert _compare(ref, port, tmp_path / "c.json") == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and expected in text


def test_compare_nan_port_names_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port's NaN logits are evidence: attached as they are, and the comparison names the position."""
    base = logits()
    bad = base.copy()
    bad[9] = np.nan
    ref = write(tmp_path / "a", "ref", [decode("torch", base, [5, 2])])
    port = write(tmp_path / "b", "port", [decode("mlx", bad, [5, 2])])
    assert _compare(ref, port, tmp_path / "c.json") == 1
    assert "token id 9" in capsys.readouterr().out


def test_compare_unmatched_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = write(tmp_path / "a", "ref", [decode("torch", logits(), [5, 2])])
    port = write(tmp_path / "b", "port", [decode("mlx", logits(), [5, 2], sha="b" * 64)])
    assert _compare(ref, port, tmp_path / "c.json") == 1  # nothing matched: not ok
    text = capsys.readouterr().out
    assert "0 units matched on 0 pins, 1 only in the reference, 1 only in the port" in text and "no unit matched" in text


# ---------------------------------------------------------------------------------------------
# read-out units: (kind, request_sha256, unit = question id, pin), slot logits [1, V] in the npz


def test_compare_d1_units_within_thresholds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One receipt with both engines compares with itself; another machine's receipt (other nodeid
    paths, other folder) matches the same units."""
    a, b = slot(1), slot(2, gap=-3.0)
    units = [readout("torch", "q1", a), readout("torch", "q2", b), readout("mlx", "q1", a + np.float32(1e-4)),
             readout("mlx", "q2", b - np.float32(2e-4))]
    both = write(tmp_path / "a", "both", units)
    out = tmp_path / "cmp.json"
    assert _compare(both, both, out) == 0
    text = capsys.readouterr().out
    assert "2 units matched on 1 pins, 0 only in the reference, 0 only in the port" in text
    assert "fact_water/q1" in text and "fact_water/q2" in text and "max|Δp|" in text and "= false" in text
    result = json.loads(out.read_text())
    assert result["all_ok"] and [r["unit"] for r in result["rows"]] == ["q1", "q2"]
    row = result["rows"][1]
    assert row["kind"] == "d1-row" and row["ids_equal"] and row["key_equal"] and row["argmax_agreement"] == 1.0
    assert near(row, "max_abs", 2e-4) and 0 < row["max_abs_dp"] < row["max_abs"]
    assert result["figures"]["answers_equal"] == "2/2" and result["figures"]["by_kind"] == {"d1-row": 2}
    other = write(tmp_path / "elsewhere", "port", [{**u, "test": u["test"].replace("tests/oracles", "/home/x/tests")}
                                                   for u in units[2:]])
    assert _compare(both, other, tmp_path / "cmp2.json") == 0


def test_compare_d1_perturbed_row_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port whose slot logits of one question move by 10x the threshold fails, naming that question."""
    a, b = slot(1), slot(2)
    bad = b.copy()
    bad[0, 4] += np.float32(10 * MAX_ABS_LOGIT)
    both = write(tmp_path, "r", [readout("torch", "q1", a), readout("torch", "q2", b), readout("mlx", "q1", a),
                                 readout("mlx", "q2", bad)])
    out = tmp_path / "cmp.json"
    assert _compare(both, both, out) == 1
    failing = [line for line in capsys.readouterr().out.splitlines() if "FAIL" in line]
    assert len(failing) == 1 and "fact_water/q2" in failing[0] and "max |Δlogit|" in failing[0]
    assert "token) [0, 4]" in failing[0]
    rows = {r["unit"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["q1"]["ok"] and not rows["q2"]["ok"] and near(rows["q2"], "max_abs", 10 * MAX_ABS_LOGIT, rel=1e-3)


def _top2(p: list[float]) -> float:
    ordered = sorted(p, reverse=True)
    return ordered[0] - ordered[1]


def test_compare_d1_answer_flip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A flipped answer fails when the reference's top-2 gap exceeds KEY_MARGIN; a near tie within the
    logit thresholds may flip (recorded, not a failure)."""
    clear = slot(1, gap=0.5)
    flipped = clear.copy()
    flipped[0, 4] += np.float32(1.0)
    tie = slot(2, gap=0.0)
    tie[0, 3] += np.float32(1e-4)  # reference: "true" by a gap of ~2.5e-5 in p
    tie_port = tie.copy()
    tie_port[0, 3] -= np.float32(2e-4)  # port: "false", 2e-4 away in logits
    assert _top2(probs(tie)) < KEY_MARGIN < _top2(probs(clear))
    both = write(tmp_path, "r", [readout("torch", "clear", clear), readout("torch", "tie", tie),
                                 readout("mlx", "clear", flipped), readout("mlx", "tie", tie_port)])
    out = tmp_path / "cmp.json"
    assert _compare(both, both, out) == 1
    text = capsys.readouterr().out
    assert "answer differs: reference 'true' vs port 'false'" in text and "≠ true->false" in text
    rows = {r["unit"]: r for r in json.loads(out.read_text())["rows"]}
    assert not rows["clear"]["ok"] and not rows["clear"]["key_equal"]
    assert rows["tie"]["ok"] and not rows["tie"]["key_equal"] and rows["tie"]["max_abs_dp"] <= MAX_ABS_DP


def test_compare_d1_unmatched_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port that ran a sample: the reference's other questions are listed, not failed."""
    a, b = slot(1), slot(2)
    ref = write(tmp_path / "r", "ref", [readout("torch", "q1", a), readout("torch", "q2", b)])
    port = write(tmp_path / "p", "port", [readout("mlx", "q1", a), readout("mlx", "q9", b)])
    out = tmp_path / "cmp.json"
    assert _compare(ref, port, out) == 0
    text = capsys.readouterr().out
    assert "1 units matched on 1 pins, 1 only in the reference, 1 only in the port" in text
    assert f"only in the reference (pin {PIN}), d1-row (1): fact_water/q2" in text
    assert f"only in the port (pin {PIN}), d1-row (1): fact_water/q9" in text
    assert json.loads(out.read_text())["unmatched"]["ref_only"] == [["d1-row", SHA, "q2", PIN, "fact_water/q2"]]


def test_compare_d1_zero_matches_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Same question ids on other requests, the tree path vs the row path, or another pin match nothing."""
    a = slot(1)
    ref = write(tmp_path / "r", "ref", [readout("torch", "q1", a)])
    others = [write(tmp_path / "p", "port", [readout("mlx", "q1", a, sha="d" * 64)]),
              write(tmp_path / "t", "tree", [readout("mlx", "q1", a, kind="d1-tree")]),
              write(tmp_path / "w", "twin", [readout("mlx", "q1", a, pin=TWIN)])]
    for n, other in enumerate(others):
        assert _compare(ref, other, tmp_path / f"c{n}.json") == 1
        assert "no unit matched" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# pins: two per engine in one receipt, and across pins


def _two_pins(tmp_path: Path, twin_port: np.ndarray | None = None) -> Path:
    """One receipt, torch and mlx on two pins, the same request (its sha256 names the messages only)."""
    base, twin = logits(1), logits(2)
    return write(tmp_path, "both", [decode("torch", base, [5, 6, 2]), decode("mlx", base + np.float32(1e-4), [5, 6, 2]),
                                    decode("torch", twin, [9, 9], pin=TWIN),
                                    decode("mlx", twin if twin_port is None else twin_port, [9, 9], pin=TWIN)])


def test_two_pins_per_engine_compare_pin_by_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A receipt holding SmolLM2 and its twin on torch and MLX: each pin's units are held against their
    own pin's (never refused as one unit twice), and a fault on one pin fails that pin's row only."""
    both = _two_pins(tmp_path)
    out = tmp_path / "c.json"
    assert _compare(both, both, out) == 0
    text = capsys.readouterr().out
    assert "2 units matched on 2 pins, 0 only in the reference, 0 only in the port" in text
    assert f"== pin {PIN}: torch vs mlx: 1 units matched (decode 1)" in text
    assert f"== pin {TWIN}: torch vs mlx: 1 units matched (decode 1)" in text
    result = json.loads(out.read_text())
    assert sorted((r["ref_pin"], r["port_pin"]) for r in result["rows"]) == [(PIN, PIN), (TWIN, TWIN)]
    assert [p["figures"]["matched"] for p in result["pins"]] == [1, 1]
    got = {r["ref_pin"]: r for r in result["rows"]}
    assert near(got[PIN], "max_abs", 1e-4) and got[TWIN]["max_abs"] == 0.0 and got[TWIN]["bit_equal"]
    bad = _two_pins(tmp_path / "bad", twin_port=logits(2) + np.float32(10 * MAX_ABS_LOGIT))
    assert _compare(bad, bad, tmp_path / "c2.json") == 1
    rows = {r["ref_pin"]: r["ok"] for r in json.loads((tmp_path / "c2.json").read_text())["rows"]}
    assert rows == {PIN: True, TWIN: False}


def test_compare_across_pins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--ref-pin/--port-pin hold one pin's reference units against another pin's, even of the same engine
    in the same run (a converted pin against the fp32 one); a pin the receipt lacks is named."""
    both = _two_pins(tmp_path)
    out = tmp_path / "c.json"
    assert _compare(both, both, out, "--ref-pin", PIN, "--port-pin", TWIN, "--port-engine", "torch") == 1
    text = capsys.readouterr().out
    assert f"== pin {PIN} (torch) vs pin {TWIN} (torch): 1 units matched (decode 1)" in text
    row = json.loads(out.read_text())["rows"][0]
    assert (row["ref_pin"], row["port_pin"], row["port_engine"]) == (PIN, TWIN, "torch")
    assert "greedy tokens diverge at 0" in row["failures"]
    assert _compare(both, both, tmp_path / "c2.json", "--ref-pin", PIN, "--port-pin", "nosuch") == 2
    assert capsys.readouterr().err == (f"oracles compare: error: {both}: holds no units of pin 'nosuch' (--port-pin); "
                                       f"pins present: {PIN}, {TWIN}\n")
    assert _compare(both, both, tmp_path / "c3.json", "--ref-pin", TWIN) == 0  # the same pin on both sides
    assert f"== pin {TWIN}: torch vs mlx: 1 units matched" in capsys.readouterr().out


def test_default_port_engine_per_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each pin's port is the one other engine on it (mlx on one pin, mlx-vlm on another: no option
    needed); a pin only the reference ran lists its units as only in the reference; two other engines on
    one pin are refused, naming both."""
    x = slot(1)
    mixed = write(tmp_path, "m", [readout("torch", "q1", x), readout("mlx", "q1", x), readout("torch", "q1", x, pin=TWIN),
                                  readout("mlx-vlm", "q1", x, pin=TWIN), readout("torch", "q1", x, pin="lonely")])
    assert _compare(mixed, mixed, tmp_path / "c.json") == 0
    text = capsys.readouterr().out
    assert f"== pin {PIN}: torch vs mlx: 1" in text and f"== pin {TWIN}: torch vs mlx-vlm: 1" in text
    assert "== pin lonely: torch vs no port units: 0 units matched, 1 only in the reference" in text
    assert "vs port mlx, mlx-vlm (" in text
    crowded = write(tmp_path / "x", "x", [readout("torch", "q1", x), readout("mlx", "q1", x), readout("mlx-vlm", "q1", x)])
    assert _compare(crowded, crowded, tmp_path / "c2.json") == 2
    assert f"pin {PIN} holds units of engines ['mlx', 'mlx-vlm']; choose one with --port-engine" in capsys.readouterr().err


def test_schema_1_receipt_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A receipt of schema 1 (units as loose fields of a test's data) is refused, never guessed at."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema_version": 1, "tests": [{"nodeid": "t::a", "outcome": "passed", "data": {
        "kind": "decode", "engine": "torch", "request_sha256": "a" * 64, "ids": [1], "tokens": [2]}}]}))
    assert _compare(old, old, tmp_path / "c.json") == 2
    assert capsys.readouterr().err == (f"oracles compare: error: {old}: field 'schema_version' is 1, not {SCHEMA_VERSION}: "
                                       f"its comparable units are not the records this plugin declares "
                                       f"(oracles/receipts/units.py); re-run its tests with this plugin to read them\n")
    assert not (tmp_path / "c.json").exists()


def test_argmax_agreement_counts_rows_of_a_shared_prefix_only() -> None:
    """After generated tokens diverge, rows condition on different prefixes: argmax agreement counts the
    rows through the first divergent one (its prefix is still shared), never the rows after it."""
    from oracles.receipts.compare import compare_pair
    from oracles.receipts.units import Unit

    def gen(tokens: list[int], argmax: list[int]) -> Unit:
        return Unit("generate-sampled", SHA, "", PIN, "e", "arith", (1, 2), tuple(tokens), tuple(argmax))

    row = compare_pair(gen([5, 6, 7, 8], [5, 6, 1, 1]), gen([5, 6, 9, 9], [5, 6, 1, 2]), None, None)
    assert row["first_divergent_token"] == 2 and row["argmax_agreement"] == 1.0  # rows 0..2; row 3 left out
    row = compare_pair(gen([5, 6], [5, 6]), gen([5, 6], [5, 4]), None, None)
    assert row["argmax_agreement"] == 0.5 and row["status"] == "recorded only"
