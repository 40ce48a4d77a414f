"""The hooks a project implements from outside the package (oracles/plugin/hookspecs.py), each from a
conftest.py of an inner pytester project: receipt fields, and a family of its own that works like a
built-in one (marker, default pins, xdist group, receipt column).

Not ``dry``: inner pytest sessions cost seconds.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

import oracles.families

FIELDS = """
def pytest_oracles_receipt_fields(config):
    return {"board": "bench-7", "cores": 2, "tags": ["a", "b"]}
"""
BAD_FIELDS = """
def pytest_oracles_receipt_fields(config):
    return {"board": "bench-7", "seen": {1, 2}}
"""
FAMILY = """
from oracles.families import Family

def pytest_oracles_families():
    return [Family("asr", "speech oracle family: transcripts of the reference and the port agree", runs="asr",
                   default_pins=("smollm2-135m-instruct",))]
"""
FAMILY_SUITE = """
import pytest
from oracles.plugin.groups import record_group

@pytest.mark.asr
@pytest.mark.parametrize("record", ["r1", "r2"])
def test_transcript(pin, record, receipt):
    receipt["group"] = record_group({"asr"}, {"pin": pin, "record": record})
"""


def test_receipt_fields_from_a_conftest(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> None:
    pytester.makeconftest(FIELDS)
    pytester.makepyfile("def test_a():\n    pass\n")
    pytester.runpytest("--receipts-dir=out").assert_outcomes(passed=1)
    _, receipt = only_receipt(pytester.path / "out")
    assert receipt["plugin_fields"] == {"conftest.py": {"board": "bench-7", "cores": 2, "tags": ["a", "b"]}}


def test_no_receipt_fields_without_the_hook(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> None:
    """Control: a receipt of a project that implements no hook has no such field (its layout as before)."""
    pytester.makepyfile("def test_a():\n    pass\n")
    pytester.runpytest("--receipts-dir=out").assert_outcomes(passed=1)
    _, receipt = only_receipt(pytester.path / "out")
    assert "plugin_fields" not in receipt


def test_receipt_fields_that_json_cannot_hold_keep_the_receipt_unwritten(
        pytester: pytest.Pytester, receipt_files: Callable[..., Any]) -> None:
    pytester.makeconftest(BAD_FIELDS)
    pytester.makepyfile("import numpy as np\n\ndef test_a(receipt):\n    receipt.array('a', np.ones(2))\n")
    result = pytester.runpytest("--receipts-dir=out")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    result.stdout.fnmatch_lines(["*oracles receipt NOT written*",
                                 "receipt data 'plugin_fields.conftest.py.seen': refused a set; JSON has no sets*"])
    files = receipt_files(pytester.path / "out")
    assert files["json"] == [] and files["npz"] == [], files


def test_a_family_from_a_conftest_works_like_a_built_in_one(pytester: pytest.Pytester,
                                                             only_receipt: Callable[..., Any]) -> None:
    pytester.makeconftest(FAMILY)
    pytester.makepyfile(test_suite=FAMILY_SUITE)
    result = pytester.runpytest("--receipts-dir=out", "--strict-markers", "-m", "asr")
    result.assert_outcomes(passed=2)
    _, receipt = only_receipt(pytester.path / "out")
    assert receipt["checks"]["test_transcript"]["family"] == "asr"
    tests = {t["record_id"]: t for t in receipt["tests"]}
    assert set(tests) == {"smollm2-135m-instruct-r1", "smollm2-135m-instruct-r2"}, set(tests)  # its default pin
    assert tests["smollm2-135m-instruct-r1"]["data"]["group"] == "asr:smollm2-135m-instruct:r1"
    markers = pytester.runpytest("--markers").stdout.lines
    assert [line for line in markers if line.startswith("@pytest.mark.asr:")] == [
        "@pytest.mark.asr: speech oracle family: transcripts of the reference and the port agree"]
    assert "asr" not in oracles.families.BY_NAME and all(f.name != "asr" for f in oracles.families.FAMILIES), \
        "the inner session's family outlived it"


def test_without_the_hook_the_marker_is_unknown(pytester: pytest.Pytester) -> None:
    """Control: the same suite without the conftest is refused by --strict-markers. In a subprocess:
    pytest's mark generator keeps every marker name it once found registered for the process."""
    pytester.makepyfile(test_suite=FAMILY_SUITE)
    result = pytester.runpytest_subprocess("--no-receipt", "--strict-markers")
    result.stdout.fnmatch_lines(["*'asr' not found in `markers` configuration option*"])


def test_a_family_whose_name_is_taken_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAMILY.replace('Family("asr"', 'Family("d1"'))
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--no-receipt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest_oracles_families of conftest.py: family 'd1' is taken (by "
                                 "pytest-oracles); give it another name"])
