"""pytest hooks and options of pytest-oracles. State lives in :class:`oracles.state.RunState`;
the ``receipt`` fixture's object is :class:`oracles.receipts.Receipt`.

Imports here stay light (no torch, transformers or mlx): ``pytest -m dry`` must not load them.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from oracles.engines.base import Unsupported
from oracles.errors import OracleError
from oracles.pins import parse_snapshot_options
from oracles.port_scope import PortScope
from oracles.receipts import Receipt, load_records, plain_nodeid
from oracles.resume import check_resume_source, partial_header
from oracles.state import DATA_KEY, EVENTS_KEY, EnvironmentProbe, RunState

STATE = pytest.StashKey[RunState]()

MARKERS = {
    "dry": "needs no weights and imports no torch, transformers or mlx; runs in seconds (CI smoke)",
    "slow": "loads a model or runs a long oracle; runs only with --runslow",
    "gpu": "needs an accelerator (CUDA, or Metal through MLX); skipped where none answers",
    "mtplx": "execution oracle family: forward rows, cache-continuation decode, generation, speculative round",
    "mtplx_chat": "execution oracle family: a 3-turn chat through a prompt cache with snapshot/restore",
    "d1": "readout oracle family: typed questions read out from log-softmax at an answer slot",
    "clef": "vision oracle family: M-RoPE, image embeds, span decoding",
    "cohort": "decode cohort family: serial vs batched lanes bit-exact, snapshot/restore",
    "port": "a port engine held against the reference, record by record",
    "faults": "fault panel: ports with one injected fault each, the detection matrix and bisect's localisation",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oracles", "numerical reference oracles (pytest-oracles)")
    group.addoption("--runslow", action="store_true", default=False,
                    help="run tests marked slow (model loads, long oracles); default: %(default)r")
    group.addoption("--receipts-dir", default="receipts", metavar="DIR",
                    help="folder receipts are written under, as DIR/TAG/<UTC time>-<run id>.json; write "
                         "--receipts-dir=DIR when DIR exists; default: %(default)r")
    group.addoption("--receipt-tag", default="default", metavar="TAG",
                    help="sub-folder of --receipts-dir for this run (letters, digits, '.', '_', '-'); default: %(default)r")
    group.addoption("--no-receipt", action="store_true", default=False,
                    help="write no receipt, partial log or npz sidecar; default: %(default)r")
    group.addoption("--snapshot", action="append", default=[], metavar="NAME=PATH",
                    help="use the local snapshot folder PATH for pin NAME, verified against the pin; repeatable; default: %(default)r")
    group.addoption("--reference", default="torch", metavar="ENGINE",
                    help="engine id of the reference; default: %(default)r")
    group.addoption("--port", default="auto", metavar="ENGINE",
                    help="engine id(s) of ports, comma-separated (one that cannot run here is refused); 'auto' = mlx where "
                         "importable, 'none' = no port; default: %(default)r")
    group.addoption("--oracle-threads", type=int, default=0, metavar="N",
                    help="intra-op threads for engines (torch.set_num_threads); 0 leaves the library default; default: %(default)r")
    group.addoption("--deadline", type=float, default=None, metavar="SECONDS",
                    help="start no new test after SECONDS from session start; the rest are listed as not run and the "
                         "session exits 2 (interrupted); default: %(default)r")
    group.addoption("--port-records", default="sample", metavar="SCOPE",
                    help="records a port engine runs (the reference runs all): 'sample' (each family's budget "
                         "sample), 'all', or N = records of at most N prompt tokens (see oracles/port_scope.py); "
                         "default: %(default)r")
    group.addoption("--resume", default=None, metavar="RECEIPT",
                    help="a receipt or .partial.jsonl of a run with the same schema, --reference, --port and pins: "
                         "skip the tests that passed there, carrying their records; write --resume=RECEIPT; "
                         "default: %(default)r")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


#: pytest options under which no test body runs: a receipt would list every test as passed or not run.
NO_RUN_OPTIONS = ("collectonly", "showfixtures", "show_fixtures_per_test", "markers", "help", "version",
                  "setuponly", "setupplan")


def _runs_tests(opt: Any) -> bool:
    return not any(getattr(opt, name, False) for name in NO_RUN_OPTIONS)


#: Our options whose value is a path. pytest picks rootdir and ini file before plugins load, from every
#: argument that names an existing path: ``--resume /tmp/r.json`` as two words makes /tmp/r.json a "test
#: path" for that choice (rootdir /tmp, pytest.ini dropped), though the value still reaches the option.
PATH_OPTIONS = ("--resume", "--receipts-dir")
#: A receipt tag is one folder name under --receipts-dir: no separator, no '.' or '..'.
TAG = re.compile(r"[A-Za-z0-9._-]+")


def _check_path_words(args: list[str], invocation_dir: Path) -> None:
    """Refuse a path option given as two words whose value is an existing path (see :data:`PATH_OPTIONS`).

    Raises:
        pytest.UsageError: one line naming the option, the value and the ``--option=VALUE`` form to write.
    """
    for flag, value in zip(args, args[1:]):
        if flag in PATH_OPTIONS and value and not value.startswith("-") and (invocation_dir / value).exists():
            raise pytest.UsageError(
                f"{flag} {value}: write {flag}={value}: as two words, an existing path is read by pytest as a test "
                "path when it picks the rootdir and ini file (before plugins load), which can drop pytest.ini")


def _check_options(opt: Any) -> None:
    """Refuse option values that would otherwise fail late or, worse, skip every test quietly.

    Raises:
        pytest.UsageError: one line naming the option, the value and what is expected.
    """
    if opt.oracle_threads < 0:
        raise pytest.UsageError(f"--oracle-threads {opt.oracle_threads}: expected 0 (library default) or a positive count")
    # inf would pass "> 0" and then break the receipt (strict JSON holds no inf); nan fails any comparison.
    if opt.deadline is not None and not (math.isfinite(opt.deadline) and opt.deadline > 0):
        raise pytest.UsageError(f"--deadline {opt.deadline:g}: expected a finite positive number of seconds")
    if not TAG.fullmatch(opt.receipt_tag) or opt.receipt_tag in (".", ".."):
        raise pytest.UsageError(f"--receipt-tag {opt.receipt_tag!r}: expected a folder name of letters, digits, "
                                "'.', '_' and '-' (not '.' or '..'): it names one folder under --receipts-dir")
    try:
        PortScope.parse(opt.port_records)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    ports = [] if opt.port in ("auto", "none") else [p.strip() for p in opt.port.split(",") if p.strip()]
    # Light: finds engine modules without importing them; registry() scans entry points, so only when needed.
    from oracles.engines import BUILTIN, registry, unavailable_reason

    for flag, engine_id in [("--reference", opt.reference), *(("--port", p) for p in ports)]:
        if engine_id not in BUILTIN and engine_id not in (known := registry()):
            raise pytest.UsageError(f"{flag} {engine_id!r}: unknown engine; known: {', '.join(sorted(known))}")
    # A port named explicitly that cannot run here would skip every test of it: a green run that held
    # nothing. 'auto' means "the ports that can run here" and keeps skipping the others.
    for engine_id in ports:
        if engine_id != opt.reference and (reason := unavailable_reason(engine_id)):
            raise pytest.UsageError(f"--port {engine_id!r}: engine cannot run here: {reason}; drop it, or use "
                                    "--port auto to run the ports that can")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a hub at run time
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    opt = config.option
    if not _is_worker(config):  # a worker gets the controller's args after the controller made --receipts-dir
        _check_path_words(list(config.invocation_params.args), Path(config.invocation_params.dir))
    try:  # a bad --snapshot stops the run here, not only when some test first asks for that pin
        parse_snapshot_options(list(opt.snapshot))
    except OracleError as exc:
        raise pytest.UsageError(str(exc)) from None
    _check_options(opt)
    receipts_dir = None if opt.no_receipt or not _runs_tests(opt) else Path(opt.receipts_dir).resolve()
    if _is_worker(config):
        shared = config.workerinput.get("oracles", {})  # type: ignore[attr-defined]
        state = RunState.new(receipts_dir, opt.receipt_tag, opt.deadline, controller=False,
                             run_id=shared.get("run_id"), started_wall=shared.get("started_wall"))
        if shared.get("resume"):  # the worker skips what passed before; the controller carries the records
            state.resume, state.resume_path = load_records(Path(shared["resume"])), str(opt.resume)
        config.stash[STATE] = state
        return
    state = RunState.new(receipts_dir, opt.receipt_tag, opt.deadline, controller=True)
    if opt.resume:
        try:
            state.resume = load_records(Path(opt.resume))
        except OracleError as exc:
            raise pytest.UsageError(f"--resume: {exc}") from None
        try:
            state.resume_unchecked = check_resume_source(Path(opt.resume), opt.reference, opt.port)
        except OracleError as exc:
            raise pytest.UsageError(f"--resume {opt.resume}: {exc}; resume only from a run of the same setting") from None
        state.resume_path = str(opt.resume)
    if receipts_dir is not None:
        try:
            state.open_partial(partial_header(opt.reference, opt.port))
        except OracleError as exc:
            raise pytest.UsageError(f"--receipts-dir: {exc}") from None
        state.environment_probe = EnvironmentProbe(config.rootpath, opt.oracle_threads)
    config.stash[STATE] = state
    config.pluginmanager.register(SessionHooks(config), "oracles-session")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: hand the run id, start time and --resume file to each worker, so deadlines, array
    staging and resumed skips agree with the controller."""
    state = node.config.stash[STATE]
    node.workerinput["oracles"] = {"run_id": state.run_id, "started_wall": state.started_wall,
                                   "resume": str(Path(state.resume_path).resolve()) if state.resume_path else None}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = config.stash[STATE]
    runslow = config.getoption("runslow")
    skip_slow = pytest.mark.skip(reason="slow: needs --runslow (loads a model or runs a long oracle)")
    gpu_reason = None
    for item in items:
        if "slow" in item.keywords and not runslow:
            item.add_marker(skip_slow)
        if "gpu" in item.keywords:
            if gpu_reason is None:
                from oracles.accel import probe_accelerator

                gpu_reason = probe_accelerator()
            if gpu_reason:
                item.add_marker(pytest.mark.skip(reason=f"gpu: no accelerator answered ({gpu_reason})"))
        previous = state.resume.get(plain_nodeid(item.nodeid))
        if previous is not None and previous.outcome == "passed":
            item.add_marker(pytest.mark.skip(reason=f"resume: passed in {state.resume_path}"))


def pytest_collection_finish(session: pytest.Session) -> None:
    state = session.config.stash[STATE]
    if state.controller and not state.collected:
        state.collected = [plain_nodeid(item.nodeid) for item in session.items]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    state = node.config.stash[STATE]
    if not state.collected:
        state.collected = [plain_nodeid(i) for i in ids]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """With --deadline, a test not yet started when the time is up is not run at all (no report)."""
    if item.config.stash[STATE].past_deadline():
        return True
    return None


def _one_line(config: pytest.Config, excinfo: pytest.ExceptionInfo[BaseException] | None) -> str | None:
    """A bad-input error (OracleError: its message names file, record and field) as one line instead
    of a traceback, unless the user asked for a traceback style with --tb."""
    if excinfo is None or not excinfo.errisinstance(OracleError) or config.option.tbstyle != "auto":
        return None
    return f"{excinfo.typename}: {excinfo.value}"


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """A test whose engine lacks a capability (:class:`~oracles.engines.base.Unsupported`) is skipped, naming both."""
    try:
        return (yield)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Any:
    """An engine fixture that raises :class:`~oracles.engines.base.Unsupported` skips its tests, naming both."""
    try:
        return (yield)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    report = outcome.get_result()
    state = item.config.stash[STATE]
    if state.pending_events:
        report.user_properties = [*report.user_properties, (EVENTS_KEY, list(state.pending_events))]
        state.pending_events.clear()
    if report.failed and (line := _one_line(item.config, call.excinfo)):
        report.longrepr = line


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A record or pin file that breaks collection is reported in one line (see :func:`_one_line`)."""
    outcome = yield
    report = outcome.get_result()
    crash = getattr(report.longrepr, "reprcrash", None)
    if (report.failed and crash is not None and crash.message.startswith("oracles.errors.")
            and collector.config.option.tbstyle == "auto"):
        report.longrepr = crash.message.removeprefix("oracles.errors.")


class SessionHooks:
    """The controller's hooks that need the config but get only a report; registered per config."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self.config.stash[STATE]
        if state.controller:
            state.on_report(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        state = self.config.stash[STATE]
        if state.controller and report.failed:
            state.on_collect_error(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = self.config
        state = config.stash[STATE]
        if not state.controller:
            return
        state.not_run_count = len(state.not_run())
        if state.not_run_count and state.past_deadline() and session.exitstatus == pytest.ExitCode.OK:
            # The run was cut, not failed: INTERRUPTED is pytest's own status for a session stopped
            # before it ran every selected test (Ctrl-C, a collection error); TESTS_FAILED would claim
            # a failure that did not happen. Either way not 0: a CI job must not go green on a cut run.
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            exitstatus = session.exitstatus
        if state.folder is None or state.partial is None:
            return
        opt = config.option
        invocation = {"args": list(config.invocation_params.args), "markexpr": opt.markexpr or None,
                      "keyword": opt.keyword or None, "rootdir": str(config.rootpath),
                      "numprocesses": getattr(opt, "numprocesses", None), "runslow": opt.runslow,
                      "reference": opt.reference, "port": opt.port, "snapshots": list(opt.snapshot),
                      "deadline": opt.deadline}
        env = state.environment_probe.result() if state.environment_probe else {}
        receipt = state.build(invocation, env, int(exitstatus))
        try:
            state.write(receipt)
        except OracleError as exc:
            state.write_error = str(exc)
            # The run's evidence is missing: do not exit 0 (make oracle would then show an older receipt).
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        state.partial.write({"event": "end", "receipt": state.receipt_path.name if state.receipt_path else None,
                             "error": state.write_error})
        state.partial.close()

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        state = config.stash.get(STATE, None)
        if state is None or not state.controller:
            return
        tr = terminalreporter
        if state.receipt is None and state.not_run_count and state.past_deadline():  # --no-receipt: still say so
            tr.write_line(f"not run: {state.not_run_count} tests (deadline passed)")
        if state.write_error:
            tr.write_sep("=", "oracles receipt NOT written", red=True)
            tr.write_line(state.write_error)
            return
        if state.receipt is None:
            return
        from oracles.report import format_checks

        tr.write_sep("=", "oracles receipt")
        tr.write_line(f"receipt: {state.receipt_path}")
        if state.receipt["collection_errors"]:
            tr.write_line(f"collection errors: {len(state.receipt['collection_errors'])}; listed in the receipt")
        not_run = state.receipt["not_run"]
        if not_run:
            tr.write_line(f"not run: {len(not_run)} tests ({not_run[0]['reason']}); listed in the receipt")
        if state.resume_path:
            resumed = sum(1 for t in state.receipt["tests"] if t.get("resumed_from"))
            note = " (a partial log records no pins: not checked)" if state.resume_unchecked else ""
            tr.write_line(f"resumed: {resumed} tests carried over as passed from {state.resume_path}{note}")
        for line in format_checks(state.receipt["checks"], state.receipt["all_ok"]):
            tr.write_line(line)


def emit(config: pytest.Config, event: str, **fields: Any) -> None:
    """Queue a session event (``pin_verified``, ``engine_loaded``) for the receipt.

    The event rides to the controller on the report of the test whose set-up caused it, so it
    reaches the receipt from xdist workers too. Fields are held to the receipt's JSON rules at
    once (a str subclass such as ``torch.__version__`` would pass serially and then break xdist's
    serialiser on a worker).

    Raises:
        TypeError: a field that strict JSON cannot hold, naming it.
    """
    from oracles.receipts import check_json_safe
    from oracles.state import worker_id

    check_json_safe(fields, f"event {event}")
    config.stash[STATE].pending_events.append({"event": event, "worker": worker_id(config), "at": time.time(),
                                               **fields})


@pytest.fixture
def receipt(request: pytest.FixtureRequest) -> Receipt:
    """Attach JSON-safe data to this test's record in the session receipt (see :class:`Receipt`)."""
    data: dict[str, Any] = {}
    request.node.user_properties.append((DATA_KEY, data))
    state = request.config.stash[STATE]
    return Receipt(data, state.staging, plain_nodeid(request.node.nodeid))


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(STATE, None)
    if state is None or not state.controller:
        return []
    off = "off (--no-receipt)" if config.option.no_receipt else "off (this invocation runs no test)"
    where = off if state.folder is None else f"{state.folder}/{state.stem}.json"
    return [f"oracles: receipt {where}; python {sys.version.split()[0]}"]
