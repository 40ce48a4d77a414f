"""The plugin's options and markers, driven through pytester in-process (no weights).

Not ``dry``: twenty inner pytest sessions cost seconds, and ``make smoke`` has a 10 s budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

SLOW_SUITE = """
import pytest

@pytest.mark.slow
def test_heavy():
    pass

def test_light():
    pass
"""


def test_slow_skipped_without_runslow(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SLOW_SUITE)
    result = pytester.runpytest("-rs", "--no-receipt")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] *.py:3: slow: needs --runslow*"])  # line 3: test_heavy


def test_slow_runs_with_runslow(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SLOW_SUITE)
    result = pytester.runpytest("--runslow", "--no-receipt")
    result.assert_outcomes(passed=2)


def test_markers_listed_with_descriptions(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    assert result.ret == 0
    lines = result.stdout.lines
    from oracles.families import FAMILIES, OTHER_MARKERS

    markers = (*(f.name for f in FAMILIES), *OTHER_MARKERS)  # every marker the plugin registers
    assert len(markers) >= 11, markers  # the families and dry, slow, gpu: a list read from somewhere
    for name in markers:
        found = [ln for ln in lines if ln.startswith(f"@pytest.mark.{name}:")]
        assert len(found) == 1, f"marker {name!r} listed {len(found)} times in --markers"
        description = found[0].split(":", 1)[1].strip()
        assert len(description) > 10, f"marker {name!r} has no real description: {found[0]!r}"


def test_unregistered_marker_refused(pytester: pytest.Pytester) -> None:
    """--strict-markers (as pytest.ini sets) refuses a typo'd family marker; ours pass."""
    pytester.makepyfile("""
        import pytest

        @pytest.mark.mtplx_chat
        @pytest.mark.cohort
        def test_ok():
            pass

        @pytest.mark.mtplxchat
        def test_typo():
            pass
    """)
    result = pytester.runpytest("--strict-markers", "--no-receipt")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*'mtplxchat' not found in `markers` configuration option*"])


def test_gpu_skip_names_what_was_probed(pytester: pytest.Pytester) -> None:
    from oracles.engines.accel import probe_accelerator

    if probe_accelerator() is None:
        pytest.skip("an accelerator answers on this machine: gpu tests run here")
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpu
        def test_on_gpu():
            pass
    """)
    result = pytester.runpytest("-rs", "--no-receipt")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*gpu: no accelerator answered (CUDA:*Metal:*)*"])


def test_no_receipt_writes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import numpy as np

        def test_attach(receipt):
            receipt["n"] = 3
            receipt.array("a", np.zeros(4, dtype=np.float32))
    """)
    result = pytester.runpytest("--no-receipt", "--receipts-dir", "out")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists()
    assert not (pytester.path / "receipts").exists()
    assert "oracles receipt" not in result.stdout.str()


def test_receipts_dir_that_is_a_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """An unwritable receipts folder (here: the path is an existing file) stops the run at once, in one line."""
    pytester.makepyfile("def test_a():\n    pass\n")
    blocker = pytester.path / "blocked"
    blocker.write_text("not a folder")
    result = pytester.runpytest(f"--receipts-dir={blocker}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [ln for ln in result.stderr.lines if ln.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert "--receipts-dir" in errors[0] and str(blocker) in errors[0] and "Not a directory" in errors[0], errors[0]
    assert blocker.read_text() == "not a folder"
    assert result.stdout.str().count("passed") == 0


def test_tag_folder_that_is_a_file_is_a_usage_error(pytester: pytest.Pytester, receipt_files: Callable[..., Any]) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    (pytester.path / "out").mkdir()
    (pytester.path / "out" / "mine").write_text("x")
    result = pytester.runpytest("--receipts-dir=out", "--receipt-tag", "mine")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --receipts-dir: *out/mine*cannot be created*"])
    assert receipt_files(pytester.path / "out")["json"] == []


@pytest.mark.parametrize(("value", "expected"), [
    ("no-such-pin=/tmp/x", "*unknown pin 'no-such-pin'; known pins: *smollm2-135m-instruct*"),
    ("smollm2-135m-instruct", "*'smollm2-135m-instruct': expected NAME=PATH*"),
])
def test_bad_snapshot_option_is_a_usage_error(pytester: pytest.Pytester, value: str, expected: str,
                                               receipt_files: Callable[..., Any]) -> None:
    """A bad --snapshot is refused before any test runs, even when no test asks for a snapshot."""
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--snapshot", value, "--receipts-dir", "out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [ln for ln in result.stderr.lines if ln.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    result.stderr.fnmatch_lines([f"ERROR: --snapshot{expected}"])
    assert receipt_files(pytester.path / "out")["json"] == []


def test_receipt_header_names_the_target(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--receipts-dir", "out", "--receipt-tag", "t1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"oracles: receipt {Path(pytester.path, 'out', 't1')}/*.json; python *"])


#: The built-in engine ids as an unknown one lists them (the tail matched by pattern: torch, torch-cuda).
KNOWN = "executorch, litert, llamacpp, mlx, mlx-vlm, mlx-vlm-d1, mlx-vlm-dsv4, mlx-vlm-mtp, mtplx, onnxruntime, torch*"


@pytest.mark.parametrize(("args", "expected"), [
    (("--oracle-threads", "-2"), "ERROR: --oracle-threads -2: expected 0 (library default) or a positive count"),
    (("--deadline", "0"), "ERROR: --deadline 0: expected a finite positive number of seconds"),
    (("--reference", "nope"), f"ERROR: --reference 'nope': unknown engine; known: {KNOWN}"),
    (("--port", "mlx,nope"), f"ERROR: --port 'nope': unknown engine; known: {KNOWN}"),
])
def test_bad_option_values_are_usage_errors(pytester: pytest.Pytester, args: tuple[str, ...], expected: str) -> None:
    """A value that would fail late (or skip every engine test quietly) stops the run at once."""
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest(*args, "--no-receipt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])


@pytest.mark.parametrize("mode", ["--collect-only", "--fixtures", "--fixtures-per-test", "--markers", "--setup-plan",
                                  "--setup-only"])
def test_invocations_that_run_no_test_write_no_receipt(pytester: pytest.Pytester, mode: str) -> None:
    """No receipt (it would claim outcomes) and no start-only partial log from a run that runs no test."""
    pytester.makepyfile("import pytest\n\n@pytest.fixture\ndef f():\n    return 1\n\ndef test_a(f):\n    assert f == 2\n")
    result = pytester.runpytest(mode, "--receipts-dir", "out")
    assert result.ret == pytest.ExitCode.OK
    assert not (pytester.path / "out").exists(), sorted(p.name for p in (pytester.path / "out").rglob("*"))


BAD_INPUT_SUITE = """
from pathlib import Path
import pytest
from oracles.errors import FixtureError
from oracles.families.records import load_record_list

@pytest.fixture
def rows():
    return load_record_list(Path(__file__).with_name("rows.json"))[1]

def test_rows(rows):
    pass

def test_plain_failure():
    assert 1 == 2
"""


def test_bad_input_errors_are_one_line(pytester: pytest.Pytester) -> None:
    """An OracleError (bad file, record, field) is reported as its one-line message, not a traceback."""
    pytester.makepyfile(test_suite=BAD_INPUT_SUITE)
    (pytester.path / "rows.json").write_text('{"records": [\n  {"id": 3}\n]}\n')
    result = pytester.runpytest("--no-receipt")
    result.assert_outcomes(failed=1, errors=1)
    block = result.stdout.str().split("ERROR at setup of test_rows", 1)[1].split("\n", 2)[1]
    assert block == f"FixtureError: {pytester.path}/rows.json: records[0]: field 'id' is missing or not a plain " \
                    "non-empty string", block
    assert "assert 1 == 2" in result.stdout.str(), "an ordinary failure keeps its traceback"
    long = pytester.runpytest("--no-receipt", "--tb=long")
    assert "load_record_list" in long.stdout.str(), "--tb=long asks for the traceback"


def test_bad_record_file_at_collection_is_one_line(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> None:
    pytester.makepyfile(test_suite="""
        from pathlib import Path
        from oracles.families.records import load_record_list

        RECORDS = load_record_list(Path(__file__).with_name("rows.json"))[1]

        def test_a():
            pass
    """)
    (pytester.path / "rows.json").write_text('{"records": [\n  {"id": "a",}\n]}\n')
    result = pytester.runpytest("--receipts-dir", "out")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    _, receipt = only_receipt(pytester.path / "out")
    (error,) = receipt["collection_errors"]
    assert error["nodeid"] == "test_suite.py" and error["summary"].startswith(f"FixtureError: {pytester.path}/rows.json:2:")
    assert receipt["all_ok"] is False
    result.stdout.fnmatch_lines(["*ERROR collecting test_suite.py*",
                                 f"FixtureError: {pytester.path}/rows.json:2:14: not valid JSON: *",
                                 "*short test summary info*"])


def test_one_option_table_gives_the_options_their_defaults_and_help(pytester: pytest.Pytester) -> None:
    """pytest_addoption declares every row of oracles.plugin.options.OPTIONS: what pytest parses when
    nothing is given is the table's default, and each help line says it."""
    from oracles.plugin.options import OPTIONS

    config = pytester.parseconfig()
    for option in OPTIONS:
        assert getattr(config.option, option.dest) == option.stored_default, option.flag
    help_text = pytester.runpytest("--help").stdout.str()
    for flag, shown in (("--port", "'auto'"), ("--receipts-dir", "'receipts'"), ("--pin", "each family's own default")):
        text = help_text.split(flag, 1)[1].split("\n  --", 1)[0]
        assert f"default: {shown}" in " ".join(text.split()), (flag, text)


@pytest.mark.parametrize(("args", "expected"), [
    (("--resume=r.json", "--no-receipt"), "ERROR: --resume=r.json with --no-receipt: the passes --resume carries over "
                                          "are recorded only in this run's receipt; drop one of the two"),
    (("--snapshot=smollm2-135m-instruct=a", "--snapshot=smollm2-135m-instruct=b"),
     "ERROR: --snapshot 'smollm2-135m-instruct=b': pin 'smollm2-135m-instruct' has folder */a already; one folder a pin"),
], ids=["resume-no-receipt", "snapshot-twice"])
def test_options_that_conflict_are_refused_at_configure(pytester: pytest.Pytester, args: tuple[str, ...],
                                                        expected: str) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    (pytester.path / "a").mkdir()
    (pytester.path / "b").mkdir()
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    assert not (pytester.path / "receipts").exists()


def test_an_inner_session_leaves_the_outer_stores_as_they_were(pytester: pytest.Pytester) -> None:
    """An in-process session opens its project's stores and leaves them at its end: nothing to reset."""
    import oracles.engines
    from oracles.families.records import records_store
    from oracles.pins.pin import BUILTIN_PINS, store

    before = (store(), records_store(), oracles.engines.current())
    (pytester.path / "fixtures" / "pins").mkdir(parents=True)
    text = (BUILTIN_PINS / "smollm2-135m-instruct.json").read_text()
    (pytester.path / "fixtures" / "pins" / "mine.json").write_text(text.replace('"smollm2-135m-instruct"', '"mine"', 1))
    pytester.makepyfile("from oracles.pins.pin import load_pin\n\n"
                        "def test_sees_its_project(pin_file):\n    assert load_pin('mine').name == 'mine'\n")
    pytester.runpytest("--pin", "mine", "--no-receipt").assert_outcomes(passed=1)
    assert (store(), records_store(), oracles.engines.current()) == before
    assert "mine" not in store().names()
