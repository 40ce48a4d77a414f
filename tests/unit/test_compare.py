"""``oracles compare``: matching by request sha256, the table, the comparison JSON (exclusive), exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oracles.checks.port import KEY_MARGIN, MAX_ABS_DP, MAX_ABS_LOGIT
from oracles.checks.readout import group_probabilities, log_softmax
from oracles.cli import main

pytestmark = [pytest.mark.dry]

V = 64


def _receipt(folder: Path, name: str, engine: str, last: np.ndarray, tokens: list[int], sha: str = "a" * 64) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / f"{name}.npz", k_last=last.astype("<f4"))
    data = {"kind": "decode", "engine": engine, "request_sha256": sha, "ids": [1, 2, 3], "tokens": tokens,
            "argmax": [int(t) for t in tokens], "arrays": {"last_logits": {"npz_key": "k_last", "shape": [V], "dtype": "<f4"}}}
    receipt = {"invocation": {"reference": "torch"}, "arrays": f"{name}.npz",
               "tests": [{"nodeid": f"t.py::test_decode_to_stop[arith-{engine}]", "outcome": "passed", "data": data},
                         {"nodeid": "t.py::test_other", "outcome": "passed", "data": {"x": 1}}]}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(receipt))
    return path


def _logits(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, V).astype("<f4")


def test_compare_within_thresholds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _logits()
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 6, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", base + np.float32(1e-4), [5, 6, 2])
    out = tmp_path / "cmp.json"
    assert main(["compare", str(ref), str(port), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 units matched" in text and "decode" in text and "max|Δlogit|" in text
    result = json.loads(out.read_text())
    row = result["rows"][0]
    assert result["all_ok"] and row["ids_equal"] and row["first_divergent_token"] is None
    assert row["max_abs"] == pytest.approx(1e-4, rel=0.05) and row["argmax_agreement"] == 1.0
    assert result["port_engine"] == "mlx" and result["ref_engine"] == "torch"


def test_compare_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _logits()
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 2])
    out = tmp_path / "cmp.json"
    out.write_text("keep")
    assert main(["compare", str(ref), str(ref), "--out", str(out)]) == 2
    assert out.read_text() == "keep" and "never overwritten" in capsys.readouterr().err


def test_compare_threshold_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _logits()
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 6, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", base + np.float32(10 * MAX_ABS_LOGIT), [5, 7, 2])
    assert main(["compare", str(ref), str(port), "--out", str(tmp_path / "c.json")]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "greedy tokens diverge at 1" in text


def test_compare_logit_threshold_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _logits()
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 6, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", base + np.float32(10 * MAX_ABS_LOGIT), [5, 6, 2])
    assert main(["compare", str(ref), str(port), "--out", str(tmp_path / "c.json")]) == 1
    assert "max |Δlogit|" in capsys.readouterr().out


def test_compare_nan_port_names_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _logits()
    bad = base.copy()
    bad[9] = np.nan
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", bad, [5, 2])
    assert main(["compare", str(ref), str(port), "--out", str(tmp_path / "c.json")]) == 1
    assert "token id 9" in capsys.readouterr().out


def test_compare_unmatched_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = _receipt(tmp_path / "a", "ref", "torch", _logits(), [5, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", _logits(), [5, 2], sha="b" * 64)
    assert main(["compare", str(ref), str(port), "--out", str(tmp_path / "c.json")]) == 1  # nothing matched: not ok
    text = capsys.readouterr().out
    assert "0 units matched, 1 only in the reference, 1 only in the port" in text and "no unit matched" in text


def test_compare_not_a_receipt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert main(["compare", str(bad), str(bad), "--out", str(tmp_path / "c.json")]) == 2
    assert "field 'tests' is missing" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# d1 read-out units: (kind, request_sha256, unit = question id), slot logits [1, V] in the npz

KEYS = ["true", "false"]
GROUPS = [[3, 7], [4]]
SHA = "c" * 64


def _probs(logits: np.ndarray) -> list[float]:
    return group_probabilities(log_softmax(logits[0]), GROUPS)


def _slot(seed: int = 1, gap: float = 2.0) -> np.ndarray:
    """[1, V] logits whose answer tokens 3 ("true") and 4 ("false") lead by ``gap`` ("true" wins)."""
    x = np.random.default_rng(seed).normal(0, 1, (1, V)).astype("<f4")
    x[0, 3], x[0, 4] = 10 + gap, 10
    return x


def _d1_receipt(folder: Path, name: str, units: list[tuple[str, str, np.ndarray]], sha: str = SHA,
                kind: str = "d1-row", prefix: str = "tests/oracles") -> Path:
    """A receipt holding one read-out record per (engine, question id, slot logits)."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays, tests = {}, []
    for n, (engine, qid, logits) in enumerate(units):
        probs = _probs(logits)
        arrays[f"k{n}"] = logits.astype("<f4")
        data = {"kind": kind, "engine": engine, "request_sha256": sha, "unit": qid, "record": "fact_water", "qid": qid,
                "ids": [1, 2, 3, 5], "keys": KEYS, "probs": probs, "argmax_key": KEYS[int(np.argmax(probs))],
                "arrays": {"slot_logits": {"npz_key": f"k{n}", "shape": [1, V], "dtype": "<f4"}}}
        tests.append({"nodeid": f"{prefix}/test_d1.py::test_readout[fact_water/{qid}-{engine}]", "outcome": "passed",
                      "data": data})
    np.savez(folder / f"{name}.npz", **arrays)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"invocation": {"reference": "torch"}, "arrays": f"{name}.npz", "tests": tests}))
    return path


def test_compare_d1_units_within_thresholds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One receipt with both engines compares with itself; another machine's receipt (other nodeid
    paths, other folder) matches the same units."""
    a, b = _slot(1), _slot(2, gap=-3.0)
    units = [("torch", "q1", a), ("torch", "q2", b), ("mlx", "q1", a + np.float32(1e-4)), ("mlx", "q2", b - np.float32(2e-4))]
    both = _d1_receipt(tmp_path / "a", "both", units)
    out = tmp_path / "cmp.json"
    assert main(["compare", str(both), str(both), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 units matched, 0 only in the reference, 0 only in the port" in text
    assert "fact_water/q1" in text and "fact_water/q2" in text and "max|Δp|" in text and "= false" in text
    result = json.loads(out.read_text())
    assert result["all_ok"] and [r["unit"] for r in result["rows"]] == ["q1", "q2"]
    row = result["rows"][1]
    assert row["kind"] == "d1-row" and row["ids_equal"] and row["key_equal"] and row["argmax_agreement"] == 1.0
    assert row["max_abs"] == pytest.approx(2e-4, rel=0.05) and 0 < row["max_abs_dp"] < row["max_abs"]
    assert result["figures"]["answers_equal"] == "2/2"
    other = _d1_receipt(tmp_path / "elsewhere", "port", units[2:], prefix="/home/someone/checkout/tests")
    assert main(["compare", str(both), str(other), "--out", str(tmp_path / "cmp2.json")]) == 0


def test_compare_d1_perturbed_row_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port whose slot logits of one question move by 10x the threshold fails, naming that question."""
    a, b = _slot(1), _slot(2)
    bad = b.copy()
    bad[0, 4] += np.float32(10 * MAX_ABS_LOGIT)
    both = _d1_receipt(tmp_path, "r", [("torch", "q1", a), ("torch", "q2", b), ("mlx", "q1", a), ("mlx", "q2", bad)])
    out = tmp_path / "cmp.json"
    assert main(["compare", str(both), str(both), "--out", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    failing = [line for line in lines if "FAIL" in line]
    assert len(failing) == 1 and "fact_water/q2" in failing[0] and "max |Δlogit|" in failing[0] and "token) [0, 4]" in failing[0]
    rows = {r["unit"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["q1"]["ok"] and not rows["q2"]["ok"] and rows["q2"]["max_abs"] == pytest.approx(10 * MAX_ABS_LOGIT, rel=1e-3)


def test_compare_d1_answer_flip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A flipped answer fails when the reference's top-2 gap exceeds KEY_MARGIN; a near tie within the
    logit thresholds may flip (recorded, not a failure)."""
    clear = _slot(1, gap=0.5)
    flipped = clear.copy()
    flipped[0, 4] += np.float32(1.0)
    tie = _slot(2, gap=0.0)
    tie[0, 3] += np.float32(1e-4)  # reference: "true" by a gap of ~2.5e-5 in p
    tie_port = tie.copy()
    tie_port[0, 3] -= np.float32(2e-4)  # port: "false", 2e-4 away in logits
    assert readout_top2(_probs(tie)) < KEY_MARGIN < readout_top2(_probs(clear))
    both = _d1_receipt(tmp_path, "r", [("torch", "clear", clear), ("torch", "tie", tie), ("mlx", "clear", flipped),
                                       ("mlx", "tie", tie_port)])
    out = tmp_path / "cmp.json"
    assert main(["compare", str(both), str(both), "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "answer differs: reference 'true' vs port 'false'" in text and "≠ true->false" in text
    rows = {r["unit"]: r for r in json.loads(out.read_text())["rows"]}
    assert not rows["clear"]["ok"] and not rows["clear"]["key_equal"]
    assert rows["tie"]["ok"] and not rows["tie"]["key_equal"] and rows["tie"]["max_abs_dp"] <= MAX_ABS_DP


def readout_top2(probs: list[float]) -> float:
    ordered = sorted(probs, reverse=True)
    return ordered[0] - ordered[1]


def test_compare_d1_unmatched_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port that ran a sample: the reference's other questions and the tree units are listed, not failed."""
    a, b = _slot(1), _slot(2)
    ref = _d1_receipt(tmp_path / "r", "ref", [("torch", "q1", a), ("torch", "q2", b)])
    port = _d1_receipt(tmp_path / "p", "port", [("mlx", "q1", a), ("mlx", "q9", b)])
    out = tmp_path / "cmp.json"
    assert main(["compare", str(ref), str(port), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 units matched, 1 only in the reference, 1 only in the port" in text
    assert "only in the reference, d1-row (1): fact_water/q2" in text and "only in the port, d1-row (1): fact_water/q9" in text
    assert json.loads(out.read_text())["unmatched"]["ref_only"] == [["d1-row", SHA, "q2", "fact_water/q2"]]


def test_compare_d1_zero_matches_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Same question ids on other requests (or the tree path vs the row path) match nothing: exit 1, said so."""
    a = _slot(1)
    ref = _d1_receipt(tmp_path / "r", "ref", [("torch", "q1", a)])
    port = _d1_receipt(tmp_path / "p", "port", [("mlx", "q1", a)], sha="d" * 64)
    tree = _d1_receipt(tmp_path / "t", "tree", [("mlx", "q1", a)], kind="d1-tree")
    for other, name in ((port, "c1.json"), (tree, "c2.json")):
        assert main(["compare", str(ref), str(other), "--out", str(tmp_path / name)]) == 1
        assert "no unit matched" in capsys.readouterr().out


def _drop_array(doc: dict) -> None:
    del doc["tests"][1]["data"]["arrays"]


def _bad_probs(doc: dict) -> None:
    doc["tests"][1]["data"]["probs"] = ["0.5", 0.5]


def _wrong_key(doc: dict) -> None:
    doc["tests"][1]["data"]["argmax_key"] = "maybe"


def _no_unit(doc: dict) -> None:
    del doc["tests"][1]["data"]["unit"]


def _npz_key(doc: dict) -> None:
    doc["tests"][1]["data"]["arrays"]["slot_logits"]["npz_key"] = "nowhere"


@pytest.mark.parametrize(("spoil", "field"), [(_drop_array, "'arrays.slot_logits' is missing"), (_bad_probs, "'probs'"),
                                              (_wrong_key, "'argmax_key' is 'maybe'"), (_no_unit, "'unit'"),
                                              (_npz_key, "'arrays.slot_logits' names npz key 'nowhere'")],
                         ids=["no-array", "probs", "argmax-key", "no-unit", "npz-key"])
def test_compare_d1_malformed_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil, field: str) -> None:
    """A malformed read-out unit is bad input: exit 2, one line naming the file, the record and the field."""
    a = _slot(1)
    path = _d1_receipt(tmp_path, "r", [("torch", "q1", a), ("mlx", "q1", a)])
    doc = json.loads(path.read_text())
    spoil(doc)
    path.write_text(json.dumps(doc))
    assert main(["compare", str(path), str(path), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "test_readout[fact_water/q1-mlx]" in err and field in err
    assert not (tmp_path / "c.json").exists()


def test_compare_missing_npz_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _slot(1)
    path = _d1_receipt(tmp_path, "r", [("torch", "q1", a), ("mlx", "q1", a)])
    (tmp_path / "r.npz").unlink()
    assert main(["compare", str(path), str(path), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "npz sidecar" in err and "r.npz" in err


# ---------------------------------------------------------------------------------------------
# bad input and honest output (a fresh user's trial)

def _spoil(path: Path, index: int, **fields: object) -> None:
    """Set (value) or delete (None) fields of ``tests[index].data`` in the receipt at ``path``."""
    doc = json.loads(path.read_text())
    data = doc["tests"][index]["data"]
    for k, v in fields.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(("fields", "message"), [
    ({"kind": 5}, "field 'kind' is 5, not a non-empty string"),
    ({"request_sha256": None}, "field 'request_sha256' is missing, not 64 lowercase hex digits"),
    ({"request_sha256": "abc"}, "field 'request_sha256' is 'abc', not 64 lowercase hex digits"),
    ({"engine": ["mlx"]}, "field 'engine' is ['mlx'], not a non-empty string"),
    ({"tokens": "5 6 2"}, "field 'tokens' is missing or not a list of ints"),
], ids=["kind-int", "sha-missing", "sha-short", "engine-list", "tokens-text"])
def test_compare_malformed_unit_record_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict,
                                              message: str) -> None:
    """A record that starts to be a unit but is malformed is bad input, never silently dropped."""
    ref = _receipt(tmp_path / "a", "ref", "torch", _logits(), [5, 6, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", _logits(), [5, 6, 2])
    _spoil(port, 0, **fields)
    assert main(["compare", str(ref), str(port), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(port) in err and "record t.py::test_decode_to_stop[arith-mlx]" in err, err
    assert message in err and not (tmp_path / "c.json").exists()


def test_compare_skips_records_that_are_not_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Per-engine records of another kind (a d1 red arm) and a port test's own figures (kind and sha256,
    no engine) are not units: skipped, as before."""
    base = _logits()
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 6, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", base, [5, 6, 2])
    _spoil(port, 1, engine="mlx", kind="word_flip", x=None)
    doc = json.loads(port.read_text())
    doc["tests"].append({"nodeid": "t.py::test_decode_vs_reference[mlx-arith]", "outcome": "passed",
                         "data": {"kind": "decode", "request_sha256": "a" * 64, "max_abs": 0.0}})
    port.write_text(json.dumps(doc))
    assert main(["compare", str(ref), str(port), "--out", str(tmp_path / "c.json")]) == 0
    assert "1 units matched, 0 only in the reference, 0 only in the port\n" in capsys.readouterr().out


def test_compare_reference_with_itself_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--port-engine naming the reference's engine in the same run compares records with themselves (max 0,
    a check that cannot fail): refused, exit 2. The same engine in another run (another machine) compares."""
    base = _logits()
    both = _d1_receipt(tmp_path / "a", "both", [("torch", "q1", _slot(1)), ("mlx", "q1", _slot(1))])
    assert main(["compare", str(both), str(both), "--port-engine", "torch", "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would be the reference's own ('torch' of the same run)" in err
    only = _receipt(tmp_path / "b", "only", "torch", base, [5, 2])  # one engine: the default port is the same
    assert main(["compare", str(only), str(only), "--out", str(tmp_path / "c.json")]) == 2
    assert "cannot fail" in capsys.readouterr().err and not (tmp_path / "c.json").exists()
    other = _receipt(tmp_path / "c", "other", "torch", base + np.float32(1e-4), [5, 2])
    assert main(["compare", str(only), str(other), "--out", str(tmp_path / "c.json")]) == 0


@pytest.mark.parametrize("option", ["--port-engine", "--ref-engine"])
def test_compare_unknown_engine_names_those_present(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    option: str) -> None:
    both = _d1_receipt(tmp_path, "both", [("torch", "q1", _slot(1)), ("mlx", "q1", _slot(1))])
    assert main(["compare", str(both), str(both), option, "nosuch", "--out", str(tmp_path / "c.json")]) == 2
    assert capsys.readouterr().err == (f"oracles compare: error: {both}: holds no comparable records of engine 'nosuch'; "
                                       f"engines present: mlx, torch (choose one with {option})\n")


def test_compare_unmatched_reference_units_said_and_require_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Reference units the port did not run pass by default (a sample), and the summary line says so;
    --require-all fails on them (exit 1) and says how many."""
    a, b = _slot(1), _slot(2)
    ref = _d1_receipt(tmp_path / "r", "ref", [("torch", "q1", a), ("torch", "q2", b)])
    port = _d1_receipt(tmp_path / "p", "port", [("mlx", "q1", a)])
    assert main(["compare", str(ref), str(port), "--out", str(tmp_path / "c1.json")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("1 units matched, 1 only in the reference, 0 only in the port (not compared, not failed: "
                          "a port may run a sample; --require-all fails on them)")
    assert main(["compare", str(ref), str(port), "--require-all", "--out", str(tmp_path / "c2.json")]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("; FAIL (--require-all): 1 reference units have no port unit")
    result = json.loads((tmp_path / "c2.json").read_text())
    assert result["require_all"] and not result["all_ok"] and result["rows"][0]["ok"]


def test_compare_taken_out_refused_before_computing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A taken --out is refused first: no table printed, the file untouched, and it is called a comparison."""
    base = _logits()
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", base, [5, 2])
    out = tmp_path / "cmp.json"
    out.write_text("keep")
    assert main(["compare", str(ref), str(port), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and out.read_text() == "keep"
    assert captured.err == f"oracles compare: error: {out}: already exists; a comparison is never overwritten (choose another --out)\n"


def test_compare_renamed_pair_uses_the_namesake_npz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """R.json + R.npz renamed from another run's names: the JSON's namesake sidecar is used, and said."""
    base = _logits()
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 6, 2])
    port = _receipt(tmp_path / "b", "20261130T082303Z-c1f9296b", "mlx", base, [5, 6, 2])
    renamed = port.with_name("R.json")
    port.rename(renamed)
    port.with_suffix(".npz").rename(renamed.with_suffix(".npz"))
    out = tmp_path / "c.json"
    assert main(["compare", str(ref), str(renamed), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == (f"{renamed}: npz sidecar {renamed.with_suffix('.npz')} (the recorded "
                                    f"20261130T082303Z-c1f9296b.npz is missing; using the JSON's namesake)")
    assert json.loads(out.read_text())["port_arrays"] == str(renamed.with_suffix(".npz"))
    renamed.with_suffix(".npz").unlink()
    assert main(["compare", str(ref), str(renamed), "--out", str(tmp_path / "c2.json")]) == 2
    err = capsys.readouterr().err
    assert "20261130T082303Z-c1f9296b.npz is missing, and so is" in err and "R.npz" in err


def test_compare_diverged_sampled_generation_is_recorded_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A sampled generation whose tokens diverge holds nothing to a threshold: "recorded only" (ok null in
    the JSON), never "ok"; a comparison holding only such rows is not a pass (exit 1). The headers name
    what the token columns compare."""
    base = _logits()
    ref = _receipt(tmp_path / "a", "ref", "torch", base, [5, 6, 2])
    port = _receipt(tmp_path / "b", "port", "mlx", base, [7, 2])
    for path in (ref, port):
        _spoil(path, 0, kind="generate-sampled")
    out = tmp_path / "c.json"
    assert main(["compare", str(ref), str(port), "--out", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "prompt ids" in lines[1] and "gen tokens" in lines[1] and lines[1].endswith("status")
    assert lines[3].split()[-3:] == ["div@0", "recorded", "only"] and " ok" not in lines[3] and "FAIL" not in lines[3]
    assert lines[4].startswith("prompt ids: the input token ids are equal; gen tokens: the generated tokens")
    row = json.loads(out.read_text())["rows"][0]
    assert row["status"] == "recorded only" and row["ok"] is None and row["held"] == [] and row["failures"] == []
    # the same tokens: the last logits are comparable and held
    _spoil(port, 0, tokens=[5, 6, 2], argmax=[5, 6, 2])
    assert main(["compare", str(ref), str(port), "--out", str(tmp_path / "c2.json")]) == 0
    assert json.loads((tmp_path / "c2.json").read_text())["rows"][0]["held"] == ["logits"]


def test_compare_npz_given_as_json_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = _receipt(tmp_path, "ref", "torch", _logits(), [5, 2])
    assert main(["compare", str(ref.with_suffix(".npz")), str(ref), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oracles compare: error: {ref.with_suffix('.npz')}: not a UTF-8 text file") and err.count("\n") == 1


def test_compare_test_record_not_an_object_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = _receipt(tmp_path, "ref", "torch", _logits(), [5, 2])
    doc = json.loads(ref.read_text())
    doc["tests"][1] = "t.py::test_other"
    ref.write_text(json.dumps(doc))
    assert main(["compare", str(ref), str(ref), "--out", str(tmp_path / "c.json")]) == 2
    assert capsys.readouterr().err == (f"oracles compare: error: {ref}: field 'tests[1]' is a JSON str, not a test "
                                       f"record (an object)\n")
