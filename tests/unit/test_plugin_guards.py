"""Option values the plugin must refuse at configure, or outcomes it must not report as green: a run cut
by --deadline, a path option pytest took for a test path, a resume source from another run's setting, an
explicitly requested port that cannot run here, a non-finite deadline, a tag that leaves the receipts
folder, a --snapshot that names no folder.

Not ``dry``: inner pytest sessions (and one ``-n 2`` subprocess) cost seconds.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any, Callable

import pytest
from inner_runs import DEADLINE

from oracles.families import DEFAULT_PIN
from oracles.pins.pin import BUILTIN_PINS, load_pin
from oracles.receipts.table import SCHEMA_VERSION

DEADLINE_SUITE = f"""
import time
import pytest

def test_0_long():
    time.sleep({DEADLINE + 0.3})

@pytest.mark.parametrize("i", [1, 2, 3])
def test_1_after(i):
    pass
"""


def _usage_error(result: pytest.RunResult) -> str:
    """The single ``ERROR:`` line of a run refused at configure."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (result.ret, result.stdout.str(), result.stderr.str())
    errors = [ln for ln in result.stderr.lines if ln.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    return errors[0]


# -- 1. a run cut by --deadline is not green ------------------------------------------------------

def test_deadline_cut_exits_nonzero_without_receipt(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(DEADLINE_SUITE)
    result = pytester.runpytest("--no-receipt", "-q", "--deadline", str(DEADLINE))
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    result.stdout.fnmatch_lines(["not run: 3 tests (deadline passed)"])


def test_deadline_cut_exits_nonzero_with_receipt(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> None:
    pytester.makepyfile(DEADLINE_SUITE)
    result = pytester.runpytest("--receipts-dir", "out", "--deadline", str(DEADLINE))
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    result.stdout.fnmatch_lines(["not run: 3 tests (deadline passed); listed in the receipt"])
    _, receipt = only_receipt(pytester.path / "out")
    assert receipt["exitstatus"] == int(pytest.ExitCode.INTERRUPTED) and receipt["all_ok"] is False


def test_deadline_not_reached_exits_zero(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--no-receipt", "--deadline", "600")
    assert result.ret == pytest.ExitCode.OK
    assert "not run:" not in result.stdout.str()


def test_deadline_cut_under_xdist_exits_nonzero(pytester: pytest.Pytester) -> None:
    # Four tests of 0.6 s on two workers against a 0.3 s deadline: each worker starts at most one.
    pytester.makepyfile("import time, pytest\n\n@pytest.mark.parametrize('i', range(4))\n"
                        "def test_long(i):\n    time.sleep(0.6)\n")
    result = pytester.runpytest_subprocess("--no-receipt", "-n", "2", "--deadline", "0.3")
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    result.stdout.fnmatch_lines(["not run: * tests (deadline passed)"])


# -- 2. a path option given as a separate word -----------------------------------------------------

@pytest.mark.parametrize("option", ["--resume", "--receipts-dir"])
def test_path_option_as_separate_word_is_refused(pytester: pytest.Pytester, option: str) -> None:
    """pytest picks rootdir and ini file before plugins load: an existing path after a plugin option is
    then taken for a test path, and a pytest.ini beside the tests is dropped. Refuse, naming the fix."""
    pytester.makepyfile("def test_a():\n    pass\n")
    target = pytester.path / "elsewhere" / "r.json"
    target.parent.mkdir()
    target.write_text("{}")
    value = target if option == "--resume" else target.parent
    error = _usage_error(pytester.runpytest(option, str(value)))
    assert error.startswith(f"ERROR: {option} {value}: write {option}={value}"), error
    assert "rootdir" in error, error


def test_path_option_joined_with_equals_is_accepted(pytester: pytest.Pytester,
                                                    only_receipt: Callable[..., Any]) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    (pytester.path / "out").mkdir()
    result = pytester.runpytest("--receipts-dir=out")
    result.assert_outcomes(passed=1)
    only_receipt(pytester.path / "out")


def test_new_receipts_dir_as_separate_word_is_accepted(pytester: pytest.Pytester) -> None:
    """A folder that does not exist yet cannot move the rootdir: no reason to refuse it."""
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--receipts-dir", "fresh")
    result.assert_outcomes(passed=1)


# -- 3. --resume only from a run of the same schema, reference, port and pins ----------------------

def _first_receipt(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> tuple[Path, dict[str, Any]]:
    pytester.makepyfile("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    pytester.runpytest("--receipts-dir", "one").assert_outcomes(passed=2)
    return only_receipt(pytester.path / "one")


def _pin_row(**override: Any) -> dict[str, Any]:
    pin = load_pin(DEFAULT_PIN)
    return {"worker": "main", "at": 0.0, "name": pin.name, "digest": pin.digest, "root": "/x", "files": len(pin.files),
            "bytes": 1, "seconds": 0.1, "source": pin.source, "override": False, **override}


@pytest.mark.parametrize(("edit", "expected"), [
    ({"schema_version": 999}, f"schema_version 999 differs from this plugin's {SCHEMA_VERSION}"),
    ({"invocation.reference": "mlx"}, "invocation.reference 'mlx' differs from this run's 'torch'"),
    ({"invocation.port": "none"}, "invocation.port 'none' differs from this run's 'auto'"),
    ({"pins": [_pin_row(digest="0" * 64)]},
     f"pins[{DEFAULT_PIN}].digest '{'0' * 64}' differs from {load_pin(DEFAULT_PIN).path}'s "
     f"'{load_pin(DEFAULT_PIN).digest}'"),
    ({"pins": [_pin_row(name="gone-pin")]}, f"pins[gone-pin]: no pin file gone-pin.json in {{project}}/fixtures/pins then "
                                            f"{BUILTIN_PINS}"),
], ids=["schema", "reference", "port", "pin-digest", "pin-gone"])
def test_resume_from_another_setting_is_refused(pytester: pytest.Pytester, only_receipt: Callable[..., Any],
                                                edit: dict[str, Any], expected: str) -> None:
    path, receipt = _first_receipt(pytester, only_receipt)
    for key, value in edit.items():
        head, _, leaf = key.partition(".")
        if leaf:
            receipt[head][leaf] = value
        else:
            receipt[head] = value
    edited = pytester.path / "edited.json"
    edited.write_text(json.dumps(receipt))
    error = _usage_error(pytester.runpytest(f"--resume={edited}", "--receipts-dir", "two"))
    expected = expected.replace("{project}", str(pytester.path))
    assert error == f"ERROR: --resume {edited}: {expected}; resume only from a run of the same setting", error


def test_resume_with_matching_pins_is_accepted(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> None:
    path, receipt = _first_receipt(pytester, only_receipt)
    receipt["pins"] = [_pin_row(), _pin_row(worker="gw1")]
    edited = pytester.path / "edited.json"
    edited.write_text(json.dumps(receipt))
    result = pytester.runpytest(f"--resume={edited}", "--receipts-dir", "two")
    result.assert_outcomes(skipped=2)
    _, second = only_receipt(pytester.path / "two")
    assert second["resumed_from"] == str(edited) and second["resume_unchecked"] is None
    assert [t["outcome"] for t in second["tests"]] == ["passed", "passed"]


def test_resume_from_partial_log_checks_its_header_and_records_unchecked_pins(
        pytester: pytest.Pytester, receipt_files: Callable[..., Any], only_receipt: Callable[..., Any]) -> None:
    _first_receipt(pytester, only_receipt)
    (partial,) = receipt_files(pytester.path / "one")["partial"]
    lines = partial.read_text().splitlines()
    start = json.loads(lines[0])
    assert (start["schema_version"], start["reference"], start["port"]) == (SCHEMA_VERSION, "torch", "auto"), start
    result = pytester.runpytest(f"--resume={partial}", "--receipts-dir", "two")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines([f"resumed: 2 tests carried over as passed from {partial} (a partial log records "
                                 "no pins: not checked)"])
    _, second = only_receipt(pytester.path / "two")
    assert second["resume_unchecked"] == "pins: a .partial.jsonl records none", second["resume_unchecked"]
    other = pytester.path / "other.partial.jsonl"
    other.write_text("\n".join([json.dumps({**start, "reference": "mlx"}), *lines[1:]]) + "\n")
    error = _usage_error(pytester.runpytest(f"--resume={other}", "--receipts-dir", "three"))
    assert error == (f"ERROR: --resume {other}: invocation.reference 'mlx' differs from this run's 'torch'; "
                     "resume only from a run of the same setting"), error


# -- 4. an explicit --port that cannot run here ----------------------------------------------------

def test_explicit_unavailable_port_is_refused(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import oracles.engines

    monkeypatch.setattr(oracles.engines.Registry, "unavailable_reason",
                        lambda self, e: "not on this test machine" if e == "mlx" else None)
    pytester.makepyfile("def test_a():\n    pass\n")
    error = _usage_error(pytester.runpytest("--port", "mlx", "--no-receipt"))
    assert error == "ERROR: --port 'mlx': engine cannot run here: not on this test machine; " \
                    "drop it, or use --port auto to run the ports that can", error
    for value in ("auto", "none"):
        assert pytester.runpytest("--port", value, "--no-receipt").ret == pytest.ExitCode.OK, value


@pytest.mark.skipif(platform.system() == "Darwin" and platform.machine() == "arm64", reason="mtplx can run on macOS arm64")
def test_port_mtplx_off_macos_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    error = _usage_error(pytester.runpytest("--port", "mtplx", "--no-receipt"))
    assert error.startswith("ERROR: --port 'mtplx': engine cannot run here: mtplx imports only on macOS arm64"), error


# -- 5-7. values refused at configure -------------------------------------------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (("--deadline", "1e309"), "ERROR: --deadline inf: expected a finite positive number of seconds"),
    (("--deadline", "nan"), "ERROR: --deadline nan: expected a finite positive number of seconds"),
    (("--receipt-tag", "../../etc"), "ERROR: --receipt-tag '../../etc': expected a folder name of letters, digits, "
                                     "'.', '_' and '-' (not '.' or '..'): it names one folder under --receipts-dir"),
    (("--receipt-tag", "a/b"), "ERROR: --receipt-tag 'a/b': expected a folder name*"),
    (("--receipt-tag", ".."), "ERROR: --receipt-tag '..': expected a folder name*"),
    (("--receipt-tag", ""), "ERROR: --receipt-tag '': expected a folder name*"),
], ids=["deadline-inf", "deadline-nan", "tag-parent", "tag-nested", "tag-dotdot", "tag-empty"])
def test_bad_values_refused_at_configure(pytester: pytest.Pytester, args: tuple[str, ...], expected: str) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest(*args, "--receipts-dir", "out")
    _usage_error(result)
    result.stderr.fnmatch_lines([expected])
    assert not (pytester.path / "out").exists() and not (pytester.path.parent.parent / "etc").exists()


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_snapshot_path_that_is_no_folder_is_refused(pytester: pytest.Pytester, kind: str) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    path = pytester.path / "snap"
    if kind == "file":
        path.write_text("not a snapshot")
    error = _usage_error(pytester.runpytest(f"--snapshot={DEFAULT_PIN}={path}", "--no-receipt"))
    what = "does not exist" if kind == "missing" else "is not a folder"
    assert error == f"ERROR: --snapshot '{DEFAULT_PIN}={path}': PATH {path} of pin {DEFAULT_PIN!r} {what}; " \
                    "expected the snapshot folder holding the pinned files", error


def test_receipt_tag_with_dots_and_dashes_is_accepted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--receipts-dir", "out", "--receipt-tag", "run-1.b_2")
    result.assert_outcomes(passed=1)
    assert (pytester.path / "out" / "run-1.b_2").is_dir()
