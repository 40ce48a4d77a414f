"""What the plugin does once it is in use: options resolved, session state, receipts, per-test hooks.

The plugin (:mod:`oracles.plugin`) activates a session at configure when pytest-oracles is on (the
ini's ``oracles = true`` or a receipt option), when an oracles option is given explicitly, or with
``--deadline``; otherwise at the first moment a test needs it: a test taking ``pin`` / ``engine_id``
/ ``port_id`` is parametrized, a collected test uses one of the plugin's fixtures or belongs to the
shipped suite. A run that never needs it pays for none of this: no option resolution (which imports
the engine adapters and scans entry points), no session state, and no per-test hook.

Only an enabled run writes a receipt or a partial log; a session activated because a test needs the
fixtures resolves the options and registers the per-test hooks (an engine's missing capability is a
skip, a bad input one line) and nothing else.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from oracles.engines.base import Unsupported
from oracles.errors import OracleError
from oracles.pins.pin import parse_snapshot_options
from oracles.pins.project import DEFAULTS, PINS_KEY, RECORDS_KEY, ProjectDirs, use_project
from oracles.plugin.collect import item_family
from oracles.plugin.settings import Settings, project_path
from oracles.plugin.state import EVENTS_KEY, FAMILY_KEY, RunState, keep, state_of
from oracles.receipts.environment import EnvironmentProbe
from oracles.receipts.resume import check_resume_source, partial_header, plan_carry, reference_setting
from oracles.receipts.table import load_records, plain_nodeid

#: pytest options under which no test body runs: a receipt would list every test as passed or not run.
NO_RUN_OPTIONS = ("collectonly", "showfixtures", "show_fixtures_per_test", "markers", "help", "version",
                  "setuponly", "setupplan")
#: A receipt tag is one folder name under --receipts-dir: no separator, no '.' or '..'.
TAG = re.compile(r"[A-Za-z0-9._-]+")


def _runs_tests(opt: Any) -> bool:
    return not any(getattr(opt, name, False) for name in NO_RUN_OPTIONS)


def check_options(opt: Any) -> None:
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


def activate(config: pytest.Config, enabled: bool = False) -> None:
    """Resolve the options and make the session state; with ``enabled``, open the receipt too.

    Raises:
        pytest.UsageError: a bad option value (one line naming it).
    """
    from oracles.plugin import ACTIVE_KEY

    if config.stash.get(ACTIVE_KEY, False):
        return
    config.stash[ACTIVE_KEY] = True
    opt = config.option
    use_project(ProjectDirs(project_path(config, PINS_KEY, DEFAULTS[PINS_KEY]),
                            project_path(config, RECORDS_KEY, DEFAULTS[RECORDS_KEY]), config.inipath))
    try:  # a bad --snapshot, --pin or --port stops the run here, not when some test first asks
        parse_snapshot_options(list(opt.snapshot))
        check_options(opt)
        settings = Settings.resolve(opt, enabled)
    except OracleError as exc:
        raise pytest.UsageError(str(exc)) from None
    receipts_dir = Path(opt.receipts_dir).resolve() if enabled and not opt.no_receipt and _runs_tests(opt) else None
    config.pluginmanager.register(ActiveHooks(), "oracles-active")
    if opt.deadline is not None:
        config.pluginmanager.register(DeadlineHooks(), "oracles-deadline")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        shared = workerinput.get("oracles", {})
        state = RunState.new(receipts_dir, opt.receipt_tag, opt.deadline, controller=False,
                             run_id=shared.get("run_id"), started_wall=shared.get("started_wall"))
        if shared.get("resume"):  # the worker skips what passed before; the controller carries the records
            state.resume, state.resume_path = load_records(Path(shared["resume"])), str(opt.resume)
            for nodeid in shared.get("resume_rerun", ()):  # the controller found no arrays for these: run them
                state.resume.pop(nodeid, None)
        keep(config, state, settings)
        return
    state = RunState.new(receipts_dir, opt.receipt_tag, opt.deadline, controller=True)
    keep(config, state, settings)
    if enabled and opt.resume:
        _open_resume(state, opt)
    if receipts_dir is not None:
        try:
            state.open_partial(partial_header(reference_setting(opt.reference, opt.reference_device), opt.port,
                                              opt.pin))
        except OracleError as exc:
            raise pytest.UsageError(f"--receipts-dir: {exc}") from None
        state.environment_probe = EnvironmentProbe(config.rootpath, opt.oracle_threads)
    if enabled or opt.deadline is not None:  # a cut run exits non-zero even without a receipt
        from oracles.plugin.receipt_hooks import ReceiptSession

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
        reference = reference_setting(opt.reference, opt.reference_device)
        state.resume_unchecked = check_resume_source(Path(opt.resume), reference, opt.port, opt.pin)
        source, not_carried = plan_carry(Path(opt.resume), state.resume)
    except OracleError as exc:
        raise pytest.UsageError(f"--resume {opt.resume}: {exc}; resume only from a run of the same setting") from None
    for row in not_carried:  # run again rather than carry a record naming arrays the new receipt would lack
        del state.resume[row["nodeid"]]
    state.resume_arrays, state.resume_not_carried = source, not_carried
    state.resume_path = str(opt.resume)


def _one_line(config: pytest.Config, excinfo: pytest.ExceptionInfo[BaseException] | None) -> str | None:
    """A bad-input error (OracleError: its message names file, record and field) as one line instead
    of a traceback, unless the user asked for a traceback style with --tb."""
    if excinfo is None or not excinfo.errisinstance(OracleError) or config.option.tbstyle != "auto":
        return None
    return f"{excinfo.typename}: {excinfo.value}"


class ActiveHooks:
    """The hooks an active session needs, per test among them; registered by :func:`activate` only."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist: hand the run id, start time and --resume file to each worker (deadlines, staging, skips agree)."""
        state = state_of(node.config)
        node.workerinput["oracles"] = {"run_id": state.run_id, "started_wall": state.started_wall,
                                       "resume": str(Path(state.resume_path).resolve()) if state.resume_path else None,
                                       "resume_rerun": [row["nodeid"] for row in state.resume_not_carried]}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The controller notes every collected test (a test never started is listed as not run) and
        its family: a test that never reports (not run, a crashed worker) still counts under it."""
        state = state_of(session.config)
        if state.controller and not state.collected:
            state.collected = [plain_nodeid(item.nodeid) for item in session.items]
            state.families = _families(session.items)
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller collects no items, so it is told
            workeroutput[FAMILIES_OUTPUT] = _families(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist: the controller takes the families a worker collected (sent when the worker finishes)."""
        state = state_of(node.config)
        families = getattr(node, "workeroutput", {}).get(FAMILIES_OUTPUT)
        if state.controller and isinstance(families, dict):
            state.families.update(families)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """xdist: the controller has no items; it notes the workers' collection instead."""
        state = state_of(node.config)
        if not state.collected:
            state.collected = [plain_nodeid(i) for i in ids]

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Any:
        """A test whose engine lacks a capability (:class:`~oracles.engines.base.Unsupported`) is skipped, naming both."""
        try:
            return (yield)
        except Unsupported as exc:
            pytest.skip(f"unsupported: {exc}")

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: pytest.FixtureRequest) -> Any:
        """A fixture that raises :class:`~oracles.engines.base.Unsupported` skips its tests, naming both."""
        try:
            return (yield)
        except Unsupported as exc:
            pytest.skip(f"unsupported: {exc}")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
        """Session events ride on the report; a bad-input failure is one line."""
        outcome = yield
        report = outcome.get_result()
        state = state_of(item.config)
        if report.when == "setup" and (family := item_family(item)) is not None:
            report.user_properties = [*report.user_properties, (FAMILY_KEY, family.name)]
        if state.pending_events:
            report.user_properties = [*report.user_properties, (EVENTS_KEY, list(state.pending_events))]
            state.pending_events.clear()
        if report.failed and (line := _one_line(item.config, call.excinfo)):
            report.longrepr = line


#: The ``workeroutput`` key under which an xdist worker sends the families of the tests it collected.
FAMILIES_OUTPUT = "oracles_families"


def _families(items: list[pytest.Item]) -> dict[str, str]:
    """nodeid -> family name of each item in a family (a test in none is family "unit")."""
    return {plain_nodeid(item.nodeid): family.name for item in items
            if (family := item_family(item)) is not None}


class DeadlineHooks:
    """Registered with ``--deadline`` only."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        """A test not yet started when the time is up is not run at all (no report)."""
        return True if state_of(item.config).past_deadline() else None
