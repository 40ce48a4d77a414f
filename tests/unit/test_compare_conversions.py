"""``oracles compare`` on the built-in conversions, from a real port-family receipt: a port test run of
"ping" with the MLX port on the 4-bit, 8-bit and bfloat16 artifacts (``--port-pin``), then the command on
that receipt: the 4-bit and 8-bit ports against their dequantized references pass the float32 bounds, the bfloat16
port against the float32 original passes its band (the band engine's units are in the receipt), and the
4-bit port against the float32 original is refused, or with ``--graded`` recorded with no verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oracles.checks.tolerance import FLOAT32

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
Q4, Q4_DEQUANT, BF16, FP32 = "smollm2-mlx-q4", "smollm2-mlx-q4-dequant", "smollm2-mlx-bf16", "smollm2-135m-instruct"
Q8, Q8_DEQUANT = "smollm2-mlx-q8", "smollm2-mlx-q8-dequant"


@pytest.fixture(scope="module")
def receipt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conversions")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--runslow", "--oracle-threads", "1",
                          "--port", "mlx", "--pin", FP32, "--port-pin", f"{Q4},{Q8},{BF16}", "-m", "port or mtplx",
                          "-k", "(prefill_vs_reference and ping) or (prefill_comparable and ping and torch)",
                          f"--receipts-dir={out}",
                          "oracles/suite/test_port.py", "oracles/suite/test_decode.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=800, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    (found,) = [p for p in out.rglob("*.json") if not p.name.startswith(".")]
    return found


def _compare(receipt: Path, tmp_path: Path, ref: str, port: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / f"{ref}-{port}.json"
    got = subprocess.run([sys.executable, "-m", "oracles.cli", "compare", str(receipt), str(receipt), "--ref-pin", ref,
                          "--port-pin", port, f"--out={out}", *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return got.returncode, (json.loads(out.read_text()) if out.exists() else {}), got.stdout + got.stderr


@pytest.mark.parametrize(("dequantized", "artifact"), [(Q4_DEQUANT, Q4), (Q8_DEQUANT, Q8)])
def test_a_quantized_port_passes_float32_against_its_dequantized_reference(receipt: Path, tmp_path: Path,
                                                                           dequantized: str, artifact: str) -> None:
    code, result, text = _compare(receipt, tmp_path, dequantized, artifact)
    assert code == 0 and result["all_ok"], text
    assert result["pins"][0]["judgment"]["kind"] == "exact" and result["rows"][0]["tolerance"] == "float32", text
    _decided_from_stored_rows(result)


def _decided_from_stored_rows(result: dict[str, Any]) -> None:
    """The receipt stores the logits coded (each row has its error and bounds), and every threshold is
    decided by them: the verdict is the one the port test gave on the float32 rows (its run passed)."""
    for row in result["rows"]:
        assert "stored_error" in row and not any("undecided" in f for f in row["failures"]), row
        assert row["bounds"]["max_abs"][1] < FLOAT32.max_abs_logit or row["tolerance"] != "float32", row


def test_the_bfloat16_port_passes_its_band(receipt: Path, tmp_path: Path) -> None:
    code, result, text = _compare(receipt, tmp_path, FP32, BF16)
    assert code == 0 and result["all_ok"], text
    assert result["pins"][0]["judgment"]["kind"] == "band" and result["rows"][0]["tolerance"].startswith("band"), text
    _decided_from_stored_rows(result)


def test_the_4bit_port_against_float32_is_graded_not_judged(receipt: Path, tmp_path: Path) -> None:
    code, _, text = _compare(receipt, tmp_path, FP32, Q4)
    assert code == 2 and f"pin {Q4} holds affine weights" in text, text
    code, result, text = _compare(receipt, tmp_path, FP32, Q4, "--graded")
    assert code == 0, text
    row = result["rows"][0]
    assert row["status"] == "graded" and row["max_abs"] > 1, row  # quantization noise, measured 24.4 on "ping"
