"""The plugin across processes: dry import hygiene of the real suite, a killed run's partial log and
--resume from it, ``-n 2`` against serial, a crashed xdist worker, a pytest-timeout timeout.

These start subprocesses (seconds each), so they are not ``dry``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "mlx", "mlx_lm")

PROBE = """
import json
import os
import sys


def pytest_unconfigure(config):
    with open(os.environ["ORACLES_PROBE_OUT"], "w") as fh:
        json.dump(sorted(sys.modules), fh)
"""


def test_dry_suite_imports_no_heavy_library(tmp_path: Path) -> None:
    """Run the project's real ``pytest -m dry`` and list sys.modules when the session ends."""
    (tmp_path / "oracles_probe.py").write_text(PROBE)
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
           "ORACLES_PROBE_OUT": str(out)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "dry", "-p", "oracles_probe", "-q",
                           "--receipts-dir", str(tmp_path / "receipts")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    tail = "\n".join(done.stdout.splitlines()[-15:])
    assert done.returncode in (0, 1), f"the dry run did not run its tests (exit {done.returncode}):\n{tail}\n{done.stderr}"
    assert " passed" in tail, tail
    modules = json.loads(out.read_text())
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert heavy == [], f"pytest -m dry imported {len(heavy)} heavy modules, e.g. {heavy[:5]}"
    assert "oracles.plugin" in modules and "numpy" in modules, "the probe did not see the plugin load"


KILL_SUITE = """
import os
import signal

def test_1():
    pass

def test_2(receipt):
    receipt["kept"] = [1, 2]

def test_3_kill():
    if os.environ.get("ORACLES_TEST_KILL") == "1":
        os.kill(os.getpid(), signal.SIGKILL)

def test_4():
    pass
"""


def test_killed_run_leaves_partial_log_and_resumes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                   receipt_files: Callable[..., Any], only_receipt: Callable[..., Any],
                                                   by_check: Callable[..., Any]) -> None:
    pytester.makepyfile(test_suite=KILL_SUITE)
    monkeypatch.setenv("ORACLES_TEST_KILL", "1")
    killed = pytester.runpytest_subprocess("--receipts-dir", "one", "-p", "no:xdist")
    assert killed.ret == -9, f"the run was not killed: {killed.ret}"
    files = receipt_files(pytester.path / "one")
    assert files["json"] == [] and files["npz"] == [] and files["other"] == [], files
    (partial,) = files["partial"]
    lines = [json.loads(ln) for ln in partial.read_text().splitlines()]
    assert [ln["event"] for ln in lines] == ["start", "test", "test"], lines
    assert [(ln["check"], ln["outcome"]) for ln in lines[1:]] == [("test_1", "passed"), ("test_2", "passed")]
    assert lines[2]["data"] == {"kept": [1, 2]}

    monkeypatch.setenv("ORACLES_TEST_KILL", "0")
    resumed = pytester.runpytest("--receipts-dir", "two", f"--resume={partial}", "-rs")
    resumed.assert_outcomes(passed=2, skipped=2)
    resumed.stdout.fnmatch_lines([f"SKIPPED [[]2[]] *resume: passed in {partial}"])
    _, receipt = only_receipt(pytester.path / "two")
    tests = by_check(receipt)
    assert {name: (t["outcome"], t["resumed_from"]) for name, t in tests.items()} == {
        "test_1": ("passed", str(partial)), "test_2": ("passed", str(partial)),
        "test_3_kill": ("passed", None), "test_4": ("passed", None)}
    assert tests["test_2"]["data"] == {"kept": [1, 2]}
    assert receipt["all_ok"] is True


XDIST_SUITE = """
import numpy as np
import pytest

@pytest.mark.mtplx
@pytest.mark.parametrize("record", [f"r{i}" for i in range(6)])
def test_rows(record, receipt):
    receipt.array("row", np.full(3, int(record[1:]), dtype=np.float32))
    assert record != "r4", "r4 is wrong"

@pytest.mark.d1
@pytest.mark.parametrize("record", ["a", "b", "c"])
def test_readout(record):
    if record == "b":
        pytest.skip("b has no answer slot")

@pytest.mark.xfail(strict=True, reason="known gap")
def test_gap():
    assert False

class TestGroup:
    @pytest.mark.parametrize("record", ["x", "y"])
    def test_rows(self, record):
        pass
"""


def test_xdist_checks_table_equals_serial(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                          receipt_files: Callable[..., Any]) -> None:
    pytester.makepyfile(test_suite=XDIST_SUITE)
    serial = pytester.runpytest("--receipts-dir", "serial", "-p", "no:xdist")
    serial.assert_outcomes(passed=9, failed=1, skipped=1, xfailed=1)
    parallel = pytester.runpytest_subprocess("--receipts-dir", "n2", "-n", "2")
    parallel.assert_outcomes(passed=9, failed=1, skipped=1, xfailed=1)
    _, one = only_receipt(pytester.path / "serial")
    _, two = only_receipt(pytester.path / "n2")
    assert two["checks"] == one["checks"]
    assert two["checks"]["test_suite::test_rows"]["failed"] == ["r4"], two["checks"]
    assert two["checks"]["test_suite::TestGroup::test_rows"]["passed"] == 2, two["checks"]
    assert {t["nodeid"]: t["outcome"] for t in two["tests"]} == {t["nodeid"]: t["outcome"] for t in one["tests"]}
    assert {t["worker"] for t in two["tests"]} == {"gw0", "gw1"}
    serial_receipt, _ = only_receipt(pytester.path / "serial")
    resumed = pytester.runpytest_subprocess("--receipts-dir", "n2r", "-n", "2", f"--resume={serial_receipt}")
    resumed.assert_outcomes(skipped=10, failed=1, xfailed=1)  # the 9 that passed are skipped on the workers
    _, three = only_receipt(pytester.path / "n2r")
    assert three["checks"] == one["checks"]
    assert sum(1 for t in three["tests"] if t["resumed_from"] == str(serial_receipt)) == 9
    (npz,) = receipt_files(pytester.path / "n2")["npz"]
    import numpy as np

    with np.load(npz) as packed:
        for t in two["tests"]:
            if t["check"] == "test_rows" and "TestGroup" not in t["nodeid"]:
                meta = t["data"]["arrays"]["row"]
                assert packed[meta["npz_key"]].tolist() == [float(t["record_id"][1:])] * 3, t["nodeid"]


def test_worker_dying_mid_test_is_recorded_as_crashed(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                                      by_check: Callable[..., Any]) -> None:
    pytester.makepyfile(test_suite="""
        import os

        def test_ok():
            pass

        def test_dies():
            os._exit(3)

        def test_after():
            pass
    """)
    result = pytester.runpytest_subprocess("--receipts-dir", "out", "-n", "2")
    result.assert_outcomes(passed=2, failed=1)
    _, receipt = only_receipt(pytester.path / "out")
    tests = by_check(receipt)
    assert tests["test_dies"]["outcome"] == "crashed" and "crashed" in tests["test_dies"]["summary"]
    assert tests["test_ok"]["outcome"] == tests["test_after"]["outcome"] == "passed"
    assert receipt["checks"]["test_dies"]["ok"] is False and receipt["all_ok"] is False


def test_timeout_is_recorded_as_timeout(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                        by_check: Callable[..., Any]) -> None:
    pytester.makepyfile(test_suite="""
        import time
        import pytest

        @pytest.fixture
        def slow_load():
            time.sleep(1.5)  # a model load: not charged to the test with timeout_func_only

        def test_after_slow_load(slow_load):
            pass

        def test_hangs():
            time.sleep(30)

        def test_after():
            pass
    """)
    result = pytester.runpytest_subprocess("--receipts-dir", "out", "-p", "no:xdist", "--timeout", "1",
                                           "-o", "timeout_func_only=true", "-o", "timeout_method=signal")
    result.assert_outcomes(passed=2, failed=1)
    _, receipt = only_receipt(pytester.path / "out")
    tests = by_check(receipt)
    assert tests["test_hangs"]["outcome"] == "timeout", tests["test_hangs"]
    assert "Timeout (>1.0s)" in tests["test_hangs"]["summary"]
    assert tests["test_hangs"]["duration"] < 10
    assert tests["test_after_slow_load"]["outcome"] == tests["test_after"]["outcome"] == "passed"
    assert receipt["checks"]["test_hangs"] == {"family": "unit", "ok": False, "passed": 0,
                                               "failed": ["test_suite.py::test_hangs"], "skipped": 0, "xfailed": 0,
                                               "not_run": 0}
