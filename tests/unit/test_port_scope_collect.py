"""``--port-records`` at collection: a port's test of a record the scope leaves out is never made (deselected,
not skipped one by one), the reference's is; the terminal says once a port how many were left out, and the
receipt's ``port_scope`` lists them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oracles.families.d1.params import ArmKey, Bucket, QuestionKey, RequestId
from oracles.families.port_scope import D1_SAMPLE_TOKENS, LeftOut, PortScope
from oracles.receipts.schema import RunFacts, RunReceipt

ROOT = Path(__file__).resolve().parents[2]
PIN = "smollm2-135m-instruct"


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--no-receipt", "-p", "no:cacheprovider",
                           "--port", "mlx", "--pin", PIN, "oracles/suite/test_port.py", "oracles/suite/test_d1.py",
                           "-k", "prefill_vs_reference or test_readout", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_record_out_of_scope_is_not_collected_for_a_port_and_is_for_the_reference() -> None:
    got = _collect()
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr
    ids = [line for line in got.stdout.splitlines() if "::" in line]
    # the README prompt (1,294 ids) is past the execution sample: the port's test is never made
    assert f"oracles/suite/test_port.py::test_prefill_vs_reference[{PIN}-mlx-readme]" not in ids
    assert f"oracles/suite/test_port.py::test_prefill_vs_reference[{PIN}-mlx-ping]" in ids
    d1_port = [i for i in ids if "test_d1.py" in i and f"[{PIN}-mlx-" in i]
    d1_ref = [i for i in ids if "test_d1.py" in i and f"[{PIN}-torch-" in i]
    assert d1_port and len(d1_port) < len(d1_ref), (len(d1_port), len(d1_ref))
    # said once a port, with how many, and how to run them
    line = next((x for x in got.stdout.splitlines() if x.startswith("oracles: port mlx: ")), None)
    assert line is not None and "left out by --port-records sample" in line and "--port-records all" in line, \
        got.stdout[-2000:]
    assert not [x for x in got.stdout.splitlines() if "is not in --port-records" in x]
    # --port-records all: every record, nothing said
    every = _collect("--port-records", "all")
    assert f"oracles/suite/test_port.py::test_prefill_vs_reference[{PIN}-mlx-readme]" in every.stdout
    assert "oracles: port mlx: " not in every.stdout


def test_the_d1_parameters_know_their_requests_size() -> None:
    key = QuestionKey("arith_add", "answer")
    assert key == ("arith_add", "answer") and key.rid == "arith_add" and key.sample_tokens == D1_SAMPLE_TOKENS
    rows: dict[tuple[str, str], int] = {("arith_add", "answer"): 1}
    assert rows[key] == 1  # indexes as the tuple it is
    assert RequestId("x") == "x" and RequestId("x").id == "x" and ArmKey("b", "a").id == "b"
    assert Bucket(64) == 64 and Bucket(64).id == "bucket 64"


def test_left_out_counts_merge_and_go_to_the_receipt() -> None:
    a, b = LeftOut("sample"), LeftOut("sample")
    a.add("mlx", "readme", 1294)
    a.add("mlx", "readme", 1294)
    b.add("mlx", "readme", 1294)
    b.add("llamacpp", "readme", 1294)
    merged = LeftOut.from_json(a.to_json())
    merged.merge(b.to_json())
    doc = merged.to_json()
    assert doc["setting"] == "sample" and doc["ports"]["mlx"]["tests"] == 2 and doc["ports"]["llamacpp"]["tests"] == 1
    assert doc["ports"]["mlx"]["records"] == {"readme": 1294} and "reference runs them" in doc["ports"]["mlx"]["why"]
    assert len(merged.lines()) == 2 and LeftOut.from_json({}).lines() == []
    assert PortScope.parse("512").setting == "512"
    facts = RunFacts(invocation={}, environment={}, port_scope=doc)
    receipt = RunReceipt.build("r", "2026-12-03T00:00:00.000000Z", 0.0, 0, [], [], facts, None)
    assert receipt.to_json()["port_scope"] == doc
    assert "port_scope" not in RunReceipt.build("r", "2026-12-03T00:00:00.000000Z", 0.0, 0, [], [],
                                                RunFacts(invocation={}, environment={}), None).to_json()
