"""``--resume`` of a cut run: the carried passes bring their arrays into the new receipt's npz, the
cut receipt counts its not-run tests under their own family, and a resume on another ``--pin``
selection is refused.

Not ``dry``: inner pytest sessions cost seconds (one ``-n 2`` subprocess).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from inner_runs import DEADLINE

from oracles.families import DEFAULT_PIN
from oracles.receipts.resume import npz_keys

#: test_0 attaches arrays and passes, test_1 outlasts the deadline, test_2 (family d1) is never
#: started in the first run; a strict xfail shows in its own column.
CUT_SUITE = f"""
import time
import numpy as np
import pytest

def test_0_arrays(receipt):
    receipt.array("logits", np.arange(6, dtype=np.float32).reshape(2, 3))
    receipt.array("ids", np.array([7, 8, 9]))

@pytest.mark.xfail(strict=True, reason="declared")
def test_0_xfail():
    raise AssertionError("as declared")

def test_1_long():
    time.sleep({DEADLINE + 0.15})

@pytest.mark.d1
@pytest.mark.parametrize("i", [1, 2, 3])
def test_2_after(receipt, i):
    receipt.array("row", np.full(4, i, dtype=np.float64))
"""


def _every_key_in_npz(path: Path, receipt: dict[str, Any]) -> dict[str, np.ndarray]:
    """Assert every npz key the receipt's records name is in its sidecar; return the sidecar's arrays."""
    named = set().union(*(npz_keys(t["data"]) for t in receipt["tests"]))
    assert named, "the suite attaches arrays: the receipt should name some"
    assert receipt.get("arrays"), "a receipt naming arrays has no sidecar"
    with np.load(path.with_name(receipt["arrays"]), allow_pickle=False) as packed:
        arrays = {k: packed[k] for k in packed.files}
    assert named <= set(arrays), f"keys named but not in the npz: {sorted(named - set(arrays))}"
    return arrays


def _cut(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> tuple[Path, dict[str, Any]]:
    pytester.makepyfile(test_suite=CUT_SUITE)
    result = pytester.runpytest("--receipts-dir", "one", "--deadline", str(DEADLINE))
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    return only_receipt(pytester.path / "one")


def test_cut_receipt_counts_not_run_under_its_family_and_xfails_apart(
        pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> None:
    pytester.makepyfile(test_suite=CUT_SUITE)
    result = pytester.runpytest("--receipts-dir", "one", "--deadline", str(DEADLINE))
    result.stdout.fnmatch_lines(["check * family * ok * passed * xfailed * skipped * not run * failed",
                                 "test_0_xfail * unit * yes * 0 * 1 * 0 * 0 *",
                                 "test_2_after * d1 * NO * 0 * 0 * 0 * 3 *"])
    _, receipt = only_receipt(pytester.path / "one")
    assert receipt["checks"]["test_2_after"] == {"family": "d1", "ok": False, "passed": 0, "failed": [], "skipped": 0,
                                                 "xfailed": 0, "not_run": 3}
    assert receipt["checks"]["test_0_xfail"] == {"family": "unit", "ok": True, "passed": 0, "failed": [],
                                                 "skipped": 0, "xfailed": 1, "not_run": 0}
    assert {t["family"] for t in receipt["tests"] if t["check"] == "test_2_after"} == {"d1"}


def test_resumed_receipt_holds_every_array_it_names(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                                    by_check: Callable[..., Any]) -> None:
    path1, one = _cut(pytester, only_receipt)
    first = _every_key_in_npz(path1, one)
    result = pytester.runpytest("--receipts-dir", "two", f"--resume={path1}")
    result.assert_outcomes(passed=3, skipped=2, xfailed=1)
    path2, two = only_receipt(pytester.path / "two")
    second = _every_key_in_npz(path2, two)
    tests = by_check(two)
    assert tests["test_0_arrays"]["resumed_from"] == str(path1)
    for meta in tests["test_0_arrays"]["data"]["arrays"].values():  # carried bit for bit
        key = meta["npz_key"]
        assert second[key].dtype == first[key].dtype and second[key].tobytes() == first[key].tobytes()
    assert two["resume_not_carried"] == [] and two["all_ok"] is True


def test_resume_from_partial_log_carries_arrays_or_runs_again(
        pytester: pytest.Pytester, only_receipt: Callable[..., Any], receipt_files: Callable[..., Any],
        by_check: Callable[..., Any]) -> None:
    """A partial log holds no arrays: they are taken from its run's sidecar, or from the staging folder a
    killed run leaves; with neither, the pass is run again (listed in resume_not_carried), never carried
    naming arrays the new receipt lacks."""
    path1, _ = _cut(pytester, only_receipt)
    (partial,) = receipt_files(pytester.path / "one")["partial"]
    stem = partial.name.removesuffix(".partial.jsonl")
    npz = partial.with_name(f"{stem}.npz")

    # the run ended: its sidecar sits beside the log
    pytester.runpytest("--receipts-dir", "two", f"--resume={partial}").assert_outcomes(passed=3, skipped=2, xfailed=1)
    path2, two = only_receipt(pytester.path / "two")
    _every_key_in_npz(path2, two)
    assert by_check(two)["test_0_arrays"]["resumed_from"] == str(partial)

    # killed before packing: the staging folder holds one .npy per key
    staging = partial.with_name(f".{stem}.arrays")
    staging.mkdir()
    with zipfile.ZipFile(npz) as zf:
        zf.extractall(staging)
    npz.unlink()
    path1.unlink()
    pytester.runpytest("--receipts-dir", "three", f"--resume={partial}").assert_outcomes(passed=3, skipped=2, xfailed=1)
    path3, three = only_receipt(pytester.path / "three")
    _every_key_in_npz(path3, three)

    # no arrays anywhere: test_0_arrays runs again, test_1_long (no arrays) is still carried
    shutil.rmtree(staging)
    result = pytester.runpytest("--receipts-dir", "four", f"--resume={partial}")
    result.assert_outcomes(passed=4, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(["resume: 1 passes run again, not carried: *"])
    path4, four = only_receipt(pytester.path / "four")
    _every_key_in_npz(path4, four)
    tests = by_check(four)
    assert tests["test_0_arrays"]["resumed_from"] is None and tests["test_1_long"]["resumed_from"] == str(partial)
    (row,) = four["resume_not_carried"]
    assert row["nodeid"] == "test_suite.py::test_0_arrays" and "no npz sidecar" in row["reason"], row


def test_resume_on_another_pin_selection_is_refused(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                                    receipt_files: Callable[..., Any]) -> None:
    """A pass on pin A has another nodeid than on pin B: carried silently it would carry nothing."""
    pytester.makepyfile("def test_a():\n    pass\n")
    pytester.runpytest("--receipts-dir", "one", f"--pin={DEFAULT_PIN}").assert_outcomes(passed=1)
    path, receipt = only_receipt(pytester.path / "one")
    (partial,) = receipt_files(pytester.path / "one")["partial"]
    assert json.loads(partial.read_text().splitlines()[0])["pin"] == DEFAULT_PIN
    for source in (path, partial):
        result = pytester.runpytest(f"--resume={source}", "--receipts-dir", "two")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        errors = [ln for ln in result.stderr.lines if ln.startswith("ERROR:")]
        assert errors == [f"ERROR: --resume {source}: invocation.pin {DEFAULT_PIN!r} differs from this run's None; "
                          "resume only from a run of the same setting"], result.stderr.str()
    # the same selection written another way is the same setting
    result = pytester.runpytest(f"--resume={path}", "--receipts-dir", "three", f"--pin= {DEFAULT_PIN},")
    result.assert_outcomes(skipped=1)


def test_not_run_family_under_xdist(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> None:
    """The xdist controller collects no items: the workers tell it the families of theirs."""
    pytester.makepyfile("import time, pytest\n\n@pytest.mark.d1\n@pytest.mark.parametrize('i', range(4))\n"
                        "def test_long(i):\n    time.sleep(0.6)\n")
    result = pytester.runpytest_subprocess("--receipts-dir", "out", "-n", "2", "--deadline", "0.3")
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    _, receipt = only_receipt(pytester.path / "out")
    row = receipt["checks"]["test_long"]
    assert row["family"] == "d1" and row["not_run"] >= 2 and row["ok"] is False, row
    assert {t["family"] for t in receipt["tests"]} == {"d1"}
