"""The receipt the plugin writes, driven through pytester in-process: fields, exclusive create,
refused data, the npz sidecar, --resume from a receipt, --deadline.

Not ``dry``: inner pytest sessions cost seconds, and ``make smoke`` has a 10 s budget.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import numpy as np
import pytest
from inner_runs import DEADLINE

STEM = re.compile(r"(?P<stamp>\d{8}T\d{6}Z)-(?P<run_id>[0-9a-f]{8})")


def test_existing_receipt_name_is_never_overwritten(pytester: pytest.Pytester, receipt_files: Callable[..., Any]) -> None:
    """The receipt's final name is taken before the session ends: the plugin refuses to write over it."""
    pytester.makeconftest("""
        from oracles.plugin.state import STATE_KEY as STATE

        def pytest_sessionstart(session):
            state = session.config.stash[STATE]
            (state.folder / f"{state.stem}.json").write_text("sentinel")
    """)
    pytester.makepyfile("""
        import numpy as np

        def test_a(receipt):
            receipt.array("a", np.ones(3, dtype=np.float32))
    """)
    result = pytester.runpytest("--receipts-dir", "out")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR, "a run without its receipt must not exit 0"
    result.stdout.fnmatch_lines(["*oracles receipt NOT written*", "*.json: already exists; receipts are never overwritten"])
    files = receipt_files(pytester.path / "out")
    assert [p.read_text() for p in files["json"]] == ["sentinel"]
    assert files["npz"] == [], "the npz sidecar of a receipt that was not written is left behind"
    assert files["other"] == [], f"temporary files left behind: {files['other']}"
    (partial,) = files["partial"]
    lines = [json.loads(ln) for ln in partial.read_text().splitlines()]
    assert [ln["event"] for ln in lines] == ["start", "test", "end"]
    assert "already exists" in lines[-1]["error"]


REFUSED = {
    "a_set": ("{1, 2}", "a set"),
    "np_scalar": ("np.float32(1.5)", "a numpy scalar"),
    "np_array": ("np.zeros(3, dtype=np.float32)", "an array; attach it with receipt.array"),
    "nan": ("float('nan')", "float nan is not finite"),
    "nested": ("{'ok': [1, {2}]}", "a set"),
}


def test_non_json_data_fails_the_test_naming_the_key(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                                    by_check: Callable[..., Any]) -> None:
    cases = ", ".join(f"({name!r}, {expr})" for name, (expr, _) in REFUSED.items())
    pytester.makepyfile(f"""
        import numpy as np
        import pytest

        @pytest.mark.parametrize(("key", "value"), [{cases}], ids=lambda v: v if isinstance(v, str) else "v")
        def test_attach(receipt, key, value):
            receipt["fine"] = 1
            receipt[key] = value
    """)
    result = pytester.runpytest("--receipts-dir", "out")
    result.assert_outcomes(failed=len(REFUSED))
    _, receipt = only_receipt(pytester.path / "out")
    tests = by_check(receipt)
    for name, (_, hint) in REFUSED.items():
        rec = tests[f"test_attach[{name}-v]"]
        where = "nested.ok[1]" if name == "nested" else name
        assert rec["outcome"] == "failed"
        assert f"receipt data '{where}'" in rec["summary"] and hint in rec["summary"], rec["summary"]
        assert rec["data"] == {"fine": 1}, "a refused value must not reach the receipt"


def test_array_round_trips_through_npz(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                       by_check: Callable[..., Any], receipt_files: Callable[..., Any]) -> None:
    pytester.makepyfile("""
        import numpy as np
        import pytest

        ARRAYS = {
            "f4": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
            "f8": np.linspace(-1, 1, 5),
            "i8": np.array([[1, -2], [3, 2**40]], dtype=np.int64),
        }

        @pytest.mark.parametrize("kind", sorted(ARRAYS))
        def test_attach(receipt, kind):
            receipt.array("logits", ARRAYS[kind])
            receipt.array("logits/T", ARRAYS[kind].T)  # a name that is not a file name; non-contiguous
    """)
    result = pytester.runpytest("--receipts-dir", "out")
    result.assert_outcomes(passed=3)
    path, receipt = only_receipt(pytester.path / "out")
    (npz,) = receipt_files(pytester.path / "out")["npz"]
    assert receipt["arrays"] == npz.name and npz.name == path.name.replace(".json", ".npz")
    assert not list((pytester.path / "out").rglob("*.arrays")), "the staging folder was not removed"
    expected = {"f4": np.arange(12, dtype=np.float32).reshape(3, 4) / 7, "f8": np.linspace(-1, 1, 5),
                "i8": np.array([[1, -2], [3, 2**40]], dtype=np.int64)}
    tests = by_check(receipt)
    with np.load(npz, allow_pickle=False) as packed:
        assert len(packed.files) == 6
        for kind, want in expected.items():
            for name, value in (("logits", want), ("logits/T", want.T)):
                meta = tests[f"test_attach[{kind}]"]["data"]["arrays"][name]
                got = packed[meta["npz_key"]]
                assert got.dtype == value.dtype and meta["dtype"] == value.dtype.str
                assert list(got.shape) == meta["shape"] == list(value.shape)
                assert got.tobytes() == np.ascontiguousarray(value).tobytes(), f"{kind}/{name} changed in the npz"


RESUME_SUITE = """
import pytest
from pathlib import Path

def test_a():
    pass

@pytest.mark.parametrize("rec", ["p1", "p2"])
def test_b(rec):
    assert not (rec == "p2" and Path(__file__).with_name("fail_p2").exists()), "p2 fails on the first run"

@pytest.mark.skip(reason="never runs")
def test_c():
    pass
"""


def test_resume_from_receipt_skips_what_passed(pytester: pytest.Pytester, receipt_files: Callable[..., Any],
                                               by_check: Callable[..., Any]) -> None:
    pytester.makepyfile(test_suite=RESUME_SUITE)
    (pytester.path / "fail_p2").write_text("")
    first = pytester.runpytest("--receipts-dir", "one")
    first.assert_outcomes(passed=2, failed=1, skipped=1)
    (receipt1,) = receipt_files(pytester.path / "one")["json"]
    (pytester.path / "fail_p2").unlink()

    second = pytester.runpytest("--receipts-dir", "two", f"--resume={receipt1}", "-rs")
    second.assert_outcomes(passed=1, skipped=3)
    second.stdout.fnmatch_lines([f"resumed: 2 tests carried over as passed from {receipt1}",
                                 f"SKIPPED [[]1[]] *resume: passed in {receipt1}",
                                 f"SKIPPED [[]1[]] *resume: passed in {receipt1}"])
    (path2,) = receipt_files(pytester.path / "two")["json"]
    receipt2 = json.loads(path2.read_text())
    tests = by_check(receipt2)
    assert receipt2["resumed_from"] == str(receipt1)
    for name in ("test_a", "test_b[p1]"):
        assert tests[name]["outcome"] == "passed" and tests[name]["resumed_from"] == str(receipt1), tests[name]
    assert tests["test_b[p2]"]["outcome"] == "passed" and tests["test_b[p2]"]["resumed_from"] is None
    assert tests["test_c"]["outcome"] == "skipped"
    assert receipt2["checks"]["test_b"] == {"family": "unit", "ok": True, "passed": 2, "failed": [], "skipped": 0,
                                         "xfailed": 0, "not_run": 0}
    assert receipt2["all_ok"] is True


def test_resume_from_missing_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--resume", "nowhere.json", "--receipts-dir", "out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --resume: nowhere.json: cannot be read: No such file or directory"])


def test_deadline_lists_unstarted_tests_as_not_run(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                                   by_check: Callable[..., Any]) -> None:
    pytester.makepyfile(f"""
        import time
        import pytest

        def test_0_long():
            time.sleep({DEADLINE + 0.15})

        @pytest.mark.parametrize("i", [1, 2, 3])
        def test_1_after(i):
            pass
    """)
    result = pytester.runpytest("--receipts-dir", "out", "--deadline", str(DEADLINE))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["not run: 3 tests (deadline passed); listed in the receipt"])
    _, receipt = only_receipt(pytester.path / "out")
    assert [(n["nodeid"].split("::")[1], n["reason"]) for n in receipt["not_run"]] == [
        (f"test_1_after[{i}]", "deadline passed") for i in (1, 2, 3)]
    tests = by_check(receipt)
    assert tests["test_0_long"]["outcome"] == "passed"
    assert {tests[f"test_1_after[{i}]"]["outcome"] for i in (1, 2, 3)} == {"not_run"}
    assert receipt["checks"]["test_1_after"]["ok"] is False and receipt["checks"]["test_1_after"]["not_run"] == 3
