"""The C harness (harness/, oracles-wire-llama over libllama) on the F32 GGUF: ``oracles wire-check`` passes on
it and fails, naming the call, on it with an injected fault (``ORACLES_HARNESS_FAULT``); and a session whose
far sides crash and hang: each failing test says in one line which engine, call and field, with the
harness's last stderr lines, the session goes on (other tests pass), the receipt is whole and names the
failures, and no harness process outlives the session (two xdist workers)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from processes import alive

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness" / "build" / "oracles-wire-llama"
PIN = "smollm2-gguf-f32"
#: The session's pin and tests: the smaller GGUF (its 98 MB verified per worker, not 540 MB); a test each far
#: side fails and one the hanging one passes before its hang (the session goes on).
SESSION_PIN = "smollm2-gguf-q4_1"
SESSION_TESTS = "(test_prefill_finite and ping) or (test_prefill_fingerprints and ping) or test_decode_matches_recompute"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def harness() -> Path:
    """The harness, built by ``make -C harness`` (a no-op when up to date; one build at a time across workers)."""
    (ROOT / "harness" / "build").mkdir(exist_ok=True)
    with open(ROOT / "harness" / "build" / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = subprocess.run(["make", "-s", "-C", str(ROOT / "harness"), f"PYTHON={sys.executable}"],
                              capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    return HARNESS


def _wire_check(harness: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                fault: str | None = None) -> tuple[int, list[str]]:
    from oracles.cli import main

    if fault:
        monkeypatch.setenv("ORACLES_HARNESS_FAULT", fault)
    code = main(["wire-check", str(harness), "--pin", PIN, "--timeout", "60"])
    return code, capsys.readouterr().out.splitlines()


def test_wire_check_passes_on_the_harness(harness: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    code, lines = _wire_check(harness, capsys, monkeypatch)
    assert code == 0 and lines[-1].startswith("wire-check: 12 passed, 0 failed"), lines


@pytest.mark.parametrize(("fault", "named"), [
    ("dtype:forward", "engine wire:check forward(): field result.logits: is i32"),
    ("shape:snapshot_buffers", "snapshot_buffers: layers.0.keys is [1, 3, 4, 63], layers.0.values [1, 3, 4, 64]"),
])
def test_wire_check_names_the_call_of_an_injected_fault(harness: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, fault: str, named: str) -> None:
    code, lines = _wire_check(harness, capsys, monkeypatch, fault)
    failures = [line for line in lines if not line.startswith("wire-check: ") or " failed, " not in line]
    assert code == 1 and failures and all(named in line for line in failures[:1]), lines
    assert f"injecting fault {fault.replace(':', ' at ')}" in failures[0], failures[0]


def test_a_session_with_failing_far_sides_goes_on_and_leaves_none(harness: Path, tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\noracles = true\noracles_wire =\n"
        f"    crashes = env ORACLES_HARNESS_FAULT=crash:forward {harness}\n"
        f"    hangs = env ORACLES_HARNESS_FAULT=hang:make_cache {harness}\n"
        "    hangs.timeout = 3\n    hangs.hello-timeout = 120\n")
    out = tmp_path / "receipts"
    run = subprocess.run([sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), f"--rootdir={tmp_path}",
                          "-p", "no:cacheprovider", "-q", "--runslow", "--oracle-threads", "1", "-n", "2",
                          "--pin", SESSION_PIN, "--port", "wire:crashes,wire:hangs", f"--receipts-dir={out}", "-k", SESSION_TESTS,
                          str(ROOT / "oracles/suite/test_forward.py"), str(ROOT / "oracles/suite/test_decode.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=500)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    (path,) = [p for p in out.rglob("*.json") if not p.name.startswith(".")]
    receipt: dict[str, Any] = json.loads(path.read_text())
    tests = {t["nodeid"]: t for t in receipt["tests"]}
    assert not receipt["all_ok"] and len(tests) == 6, sorted(tests)
    passed = [n for n, t in tests.items() if t["outcome"] == "passed"]
    assert any("wire:hangs" in n for n in passed), "the session did not go on: nothing passed on the hanging far side"
    crashed = next(t for n, t in tests.items() if "crashes" in n and "test_prefill_finite" in n)
    hung = next(t for n, t in tests.items() if "hangs" in n and "test_decode_matches_recompute" in n)
    for record, call, what in ((crashed, "forward", "killed by signal 6"), (hung, "make_cache", "within the time-out (3 s)")):
        assert record["outcome"] == "failed", record
        text = json.dumps(record)
        assert f"engine wire:{'crashes' if call == 'forward' else 'hangs'} {call}()" in text and what in text, text
        assert f"injecting fault {'crash' if call == 'forward' else 'hang'} at {call}" in text, text
    pids = [e["wire"]["pid"] for e in receipt["engines"] if e.get("wire", {}).get("pid")]
    assert len(pids) >= 2, receipt["engines"]
    assert not [pid for pid in pids if alive(pid)], f"harness processes outlived the session: {pids}"
    assert os.environ.get("ORACLES_HARNESS_FAULT") is None
