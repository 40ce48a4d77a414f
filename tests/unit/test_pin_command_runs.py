"""A project's own pin in a pytest run: ``--pin`` naming it, naming no pin, and its snapshot changed
since it was pinned. Each bad input is one line, and no receipt is half-written: a refused run writes
none, a run that goes on writes a whole one. No weights load (the inner tests ask the pin fixtures only).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
from test_pin_command_dry import make_snapshot

from oracles.pins.writer import write_pin

USES_PIN = """
def test_pin_is_the_project_one(pin, pin_file):
    assert pin == "tiny" and pin_file.untrained and pin_file.source.startswith("local:")

def test_snapshot_verifies(verified_snapshot):
    verified_snapshot("tiny")
"""


@pytest.fixture
def tiny(pytester: pytest.Pytester, tmp_path: Path) -> Path:
    """A local, untrained pin ``tiny`` in the inner project's pins folder; returns its snapshot folder."""
    snap = make_snapshot(tmp_path / "snap")
    write_pin("tiny", str(snap), pytester.path / "fixtures" / "pins", trained=False, progress=_Quiet())
    pytester.makepyfile(test_uses_pin=USES_PIN)
    return snap


class _Quiet:
    def start(self, name: str, size: int) -> None: ...
    def update(self, n: int) -> None: ...
    def finish_file(self) -> None: ...
    def close(self) -> None: ...


def test_pin_option_runs_on_the_project_pin(pytester: pytest.Pytester, tiny: Path,
                                            only_receipt: Callable[..., Any]) -> None:
    result = pytester.runpytest("--pin", "tiny", "--receipts-dir=receipts")
    result.assert_outcomes(passed=2)
    _, receipt = only_receipt(pytester.path / "receipts")
    assert [p["name"] for p in receipt["pins"]] == ["tiny"] and receipt["pins"][0]["source"].startswith("local:")


def test_pin_naming_no_pin_is_one_line_and_no_receipt(pytester: pytest.Pytester, tiny: Path) -> None:
    result = pytester.runpytest("--pin", "nope", "--receipts-dir=receipts")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.errlines
    assert errors[0].startswith("ERROR: --pin nope: unknown pin 'nope': no nope.json in ") and "known pins: " in errors[0]
    assert "smollm2-135m-instruct" in errors[0] and "tiny" in errors[0], errors[0]
    assert not (pytester.path / "receipts").exists(), "a refused run writes no receipt and no partial log"


def test_snapshot_changed_since_pinned_fails_in_one_line_with_a_whole_receipt(
        pytester: pytest.Pytester, tiny: Path, only_receipt: Callable[..., Any]) -> None:
    (tiny / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 3}))
    result = pytester.runpytest("--pin", "tiny", "--receipts-dir=receipts", "-k", "verifies")
    result.assert_outcomes(failed=1, deselected=1)
    failure = [line for line in result.outlines if "mismatch" in line and not line.startswith("FAILED")]
    assert len(failure) == 1, result.outlines
    assert f"pin tiny: {tiny.resolve()}/config.json: sha256 mismatch: expected " in failure[0]
    assert "the snapshot changed since pin 'tiny' was written" in failure[0]
    _, receipt = only_receipt(pytester.path / "receipts")  # whole, valid JSON, no stray file
    (test,) = receipt["tests"]
    assert test["outcome"] == "failed" and "sha256 mismatch" in test["summary"] and receipt["all_ok"] is False


def test_snapshot_option_folder_that_differs_is_blamed_on_the_option(pytester: pytest.Pytester, tiny: Path,
                                                                     tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(tiny, other)
    (other / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 3}))
    result = pytester.runpytest("--pin", "tiny", "--receipts-dir=receipts", "-k", "verifies", f"--snapshot=tiny={other}")
    result.assert_outcomes(failed=1, deselected=1)
    (failure,) = [line for line in result.outlines if "mismatch" in line and not line.startswith("FAILED")]
    assert "given by --snapshot" in failure and "the snapshot changed since" not in failure, failure
