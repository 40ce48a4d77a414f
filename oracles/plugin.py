"""pytest hooks and options of pytest-oracles; each hook delegates to a session object.

Installed, the plugin changes nothing in a project that did not ask for it: it registers its options,
markers and fixtures (inert until a test asks), and nothing else happens (no receipt, partial log,
environment variable or terminal section) unless the project's ini file says ``oracles = true`` or the
run passes a receipt option (``--receipts-dir``, ``--receipt-tag``, ``--resume``). The tests of the
shipped suite (``oracles.suite``) keep their slow and gpu gates either way.

Imports here stay light (no torch, transformers or mlx): ``pytest -m dry`` must not load them.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from oracles import collect
from oracles.engines.base import Unsupported
from oracles.errors import OracleError
from oracles.families import FAMILIES, OTHER_MARKERS, family_of
from oracles.pins import parse_snapshot_options
from oracles.project import DEFAULTS, PINS_KEY, RECORDS_KEY, ProjectDirs, use_project
from oracles.receipts import load_records, plain_nodeid
from oracles.resume import check_resume_source, partial_header
from oracles.settings import Settings, project_path
from oracles.state import EVENTS_KEY, FAMILY_KEY, EnvironmentProbe, RunState, keep, settings_of, state_of

pytest_plugins = ["oracles.fixtures"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oracles", "numerical reference oracles (pytest-oracles)")
    group.addoption("--runslow", action="store_true", default=False,
                    help="run tests marked slow (model loads, long oracles); default: %(default)r")
    group.addoption("--pin", default=None, metavar="NAME[,NAME]",
                    help="the pins the families run on (each where it serves the model's kind); default: each "
                         "family's own default pins")
    group.addoption("--receipts-dir", default=None, metavar="DIR",
                    help="folder receipts are written under, as DIR/TAG/<UTC time>-<run id>.json (turns receipts "
                         "on); write --receipts-dir=DIR when DIR exists; default: 'receipts'")
    group.addoption("--receipt-tag", default=None, metavar="TAG",
                    help="sub-folder of --receipts-dir for this run (letters, digits, '.', '_', '-'; turns receipts "
                         "on); default: 'default'")
    group.addoption("--no-receipt", action="store_true", default=False,
                    help="write no receipt, partial log or npz sidecar; default: %(default)r")
    group.addoption("--snapshot", action="append", default=[], metavar="NAME=PATH",
                    help="use the local snapshot folder PATH for pin NAME, verified against the pin; repeatable; default: %(default)r")
    group.addoption("--reference", default="torch", metavar="ENGINE",
                    help="engine id of the reference; default: %(default)r")
    group.addoption("--port", default="auto", metavar="ENGINE",
                    help="engine id(s) of ports, comma-separated (one that cannot run here is refused); 'auto' = every "
                         "registered engine but the reference that can run here, 'none' = no port; default: %(default)r")
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
                         "skip the tests that passed there, carrying their records (turns receipts on); write "
                         "--resume=RECEIPT; default: %(default)r")
    parser.addini("oracles", type="bool", default=False,
                  help="turn pytest-oracles on for this project: receipts, partial logs and the slow gate")
    parser.addini(PINS_KEY, type="paths", default=[],
                  help=f"the project's pins folder, before the built-in pins (default {DEFAULTS[PINS_KEY]})")
    parser.addini(RECORDS_KEY, type="paths", default=[],
                  help=f"the project's records folder for per-tokenizer token ids (default {DEFAULTS[RECORDS_KEY]})")


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
    from oracles.engines import registry

    if opt.reference not in registry():
        raise pytest.UsageError(f"--reference {opt.reference!r}: unknown engine; known: {', '.join(sorted(registry()))}")




def _enabled(config: pytest.Config) -> bool:
    opt = config.option
    return bool(config.getini("oracles")) or any(v is not None for v in (opt.receipts_dir, opt.receipt_tag, opt.resume))


def pytest_configure(config: pytest.Config) -> None:
    for family in FAMILIES:
        config.addinivalue_line("markers", f"{family.name}: {family.help}")
    for name, text in OTHER_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.addinivalue_line("markers", f"{collect.MISSING}(message): internal: the pin lacks the family's token ids")
    opt = config.option
    use_project(ProjectDirs(project_path(config, PINS_KEY, DEFAULTS[PINS_KEY]),
                            project_path(config, RECORDS_KEY, DEFAULTS[RECORDS_KEY]), config.inipath))
    enabled = _enabled(config)
    opt.receipts_dir = "receipts" if opt.receipts_dir is None else opt.receipts_dir
    opt.receipt_tag = "default" if opt.receipt_tag is None else opt.receipt_tag
    if not _is_worker(config):  # a worker gets the controller's args after the controller made --receipts-dir
        _check_path_words(list(config.invocation_params.args), Path(config.invocation_params.dir))
    try:  # a bad --snapshot, --pin or --port stops the run here, not when some test first asks
        parse_snapshot_options(list(opt.snapshot))
        _check_options(opt)
        settings = Settings.resolve(opt, enabled)
    except OracleError as exc:
        raise pytest.UsageError(str(exc)) from None
    receipts_dir = Path(opt.receipts_dir).resolve() if enabled and not opt.no_receipt and _runs_tests(opt) else None
    if _is_worker(config):
        shared = config.workerinput.get("oracles", {})  # type: ignore[attr-defined]
        state = RunState.new(receipts_dir, opt.receipt_tag, opt.deadline, controller=False,
                             run_id=shared.get("run_id"), started_wall=shared.get("started_wall"))
        if shared.get("resume"):  # the worker skips what passed before; the controller carries the records
            state.resume, state.resume_path = load_records(Path(shared["resume"])), str(opt.resume)
        keep(config, state, settings)
        return
    state = RunState.new(receipts_dir, opt.receipt_tag, opt.deadline, controller=True)
    keep(config, state, settings)
    if enabled and opt.resume:
        _open_resume(state, opt)
    if receipts_dir is not None:
        try:
            state.open_partial(partial_header(opt.reference, opt.port))
        except OracleError as exc:
            raise pytest.UsageError(f"--receipts-dir: {exc}") from None
        state.environment_probe = EnvironmentProbe(config.rootpath, opt.oracle_threads)
    if enabled or opt.deadline is not None:  # a cut run exits non-zero even without a receipt
        from oracles.receipt_session import ReceiptSession

        config.pluginmanager.register(ReceiptSession(config), "oracles-receipts")


def _open_resume(state: RunState, opt: Any) -> None:
    """Load the ``--resume`` source and hold it to this run's setting.

    Raises:
        pytest.UsageError: the source cannot be read, or it is of another setting (the field named).
    """
    try:
        state.resume = load_records(Path(opt.resume))
    except OracleError as exc:
        raise pytest.UsageError(f"--resume: {exc}") from None
    try:
        state.resume_unchecked = check_resume_source(Path(opt.resume), opt.reference, opt.port)
    except OracleError as exc:
        raise pytest.UsageError(f"--resume {opt.resume}: {exc}; resume only from a run of the same setting") from None
    state.resume_path = str(opt.resume)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: hand the run id, start time and --resume file to each worker (deadlines, staging, skips agree)."""
    state = state_of(node.config)
    node.workerinput["oracles"] = {"run_id": state.run_id, "started_wall": state.started_wall,
                                   "resume": str(Path(state.resume_path).resolve()) if state.resume_path else None}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``pin``, ``engine_id`` and ``port_id`` over the compatible (pin, engine) pairs."""
    collect.parametrize(metafunc, settings_of(metafunc.config))


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook turns the marks into nodeid suffixes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """xdist groups, the port scope, the slow and gpu gates, and resumed passes."""
    state = state_of(config)
    collect.modify_items(config, items, settings_of(config), state.resume, state.resume_path)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after -m / -k deselection
def pytest_collection_modifyitems_selected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A selected test whose pin has no token ids for its family stops the run, naming the command."""
    collect.refuse_missing_tokens(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The controller notes every collected test (a test never started is listed as not run)."""
    state = state_of(session.config)
    if state.controller and not state.collected:
        state.collected = [plain_nodeid(item.nodeid) for item in session.items]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist: the controller has no items; it notes the workers' collection instead."""
    state = state_of(node.config)
    if not state.collected:
        state.collected = [plain_nodeid(i) for i in ids]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """With --deadline, a test not yet started when the time is up is not run at all (no report)."""
    return True if state_of(item.config).past_deadline() else None


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """A test whose engine lacks a capability (:class:`~oracles.engines.base.Unsupported`) is skipped, naming both."""
    try:
        return (yield)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Any:
    """A fixture that raises :class:`~oracles.engines.base.Unsupported` skips its tests, naming both."""
    try:
        return (yield)
    except Unsupported as exc:
        pytest.skip(f"unsupported: {exc}")


def _one_line(config: pytest.Config, excinfo: pytest.ExceptionInfo[BaseException] | None) -> str | None:
    """A bad-input error (OracleError: its message names file, record and field) as one line instead
    of a traceback, unless the user asked for a traceback style with --tb."""
    if excinfo is None or not excinfo.errisinstance(OracleError) or config.option.tbstyle != "auto":
        return None
    return f"{excinfo.typename}: {excinfo.value}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    """Session events ride on the report; a bad-input failure is one line."""
    outcome = yield
    report = outcome.get_result()
    state = state_of(item.config)
    if report.when == "setup" and (family := family_of(collect.markers_of(item))) is not None:
        report.user_properties = [*report.user_properties, (FAMILY_KEY, family.name)]
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


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The receipt's path, the engines and pins (only where pytest-oracles is on)."""
    settings, state = settings_of(config), state_of(config)
    if not settings.enabled or not state.controller:
        return []
    off = "off (--no-receipt)" if config.option.no_receipt else "off (this invocation runs no test)"
    where = off if state.folder is None else f"{state.folder}/{state.stem}.json"
    return [f"oracles: receipt {where}; python {sys.version.split()[0]}", settings.header_line()]


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path, items: list[pytest.Item]) -> list[str]:
    """The (engine, pin) pairs left out of the parametrization, with reasons (never silently)."""
    settings = settings_of(config)
    return settings.left_out_lines() if settings.enabled else []
