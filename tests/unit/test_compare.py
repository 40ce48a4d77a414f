"""``oracles compare``: matching by request sha256, the table, the comparison JSON (exclusive), exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oracles.checks.port import MAX_ABS_LOGIT
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
    assert "1 matched" in text and "decode" in text and "max|Δlogit|" in text
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
    assert "0 matched, 1 reference records without a port record" in capsys.readouterr().out


def test_compare_not_a_receipt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert main(["compare", str(bad), str(bad), "--out", str(tmp_path / "c.json")]) == 2
    assert "field 'tests' is missing" in capsys.readouterr().err
