"""The hooks an active session registers (:meth:`oracles.plugin.session.OracleSession.start`), per test
among them: none of these exists in a run that never uses pytest-oracles.

Each hook object holds the session's settings and run state and reads nothing else: the xdist hand-over
of the run id and ``--resume`` source, the controller's list of collected tests and their families, an
engine's missing capability as a skip naming both, a bad-input failure as one line, and which engine
and pin a test ran on (the receipt's ``ran_nothing``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracles.engines.base import Unsupported
from oracles.errors import OracleError
from oracles.families.port_scope import LeftOut
from oracles.plugin.collect import item_family
from oracles.plugin.settings import Settings
from oracles.plugin.state import ENGINE_KEY, EVENTS_KEY, FAMILY_KEY, RunState
from oracles.receipts.table import plain_nodeid


def _one_line(config: pytest.Config, excinfo: pytest.ExceptionInfo[BaseException] | None) -> str | None:
    """A bad-input error (OracleError: its message names file, record and field) as one line instead
    of a traceback, unless the user asked for a traceback style with --tb."""
    if excinfo is None or not excinfo.errisinstance(OracleError) or config.option.tbstyle != "auto":
        return None
    return f"{excinfo.typename}: {excinfo.value}"


class ActiveHooks:
    """The hooks an active session needs, per test among them."""

    def __init__(self, settings: Settings, state: RunState) -> None:
        self.settings, self.state = settings, state
        self.engines = frozenset(settings.engines)  # asked at every test's set-up

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist: hand the run id, start time, --resume file and whether groups stay whole to each worker
        (deadlines, staging, skips and the run memo agree)."""
        state = self.state
        node.workerinput["oracles"] = {"run_id": state.run_id, "started_wall": state.started_wall,
                                       "loadgroup": getattr(node.config.option, "dist", "no") == "loadgroup",
                                       "resume": str(Path(state.resume_path).resolve()) if state.resume_path else None,
                                       "resume_rerun": [row["nodeid"] for row in state.resume_not_carried]}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The controller notes every collected test (a test never started is listed as not run) and
        its family: a test that never reports (not run, a crashed worker) still counts under it."""
        state = self.state
        if state.controller and not state.collected:
            state.collected = [plain_nodeid(item.nodeid) for item in session.items]
            state.families = _families(session.items)
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller collects no items, so it is told
            workeroutput[FAMILIES_OUTPUT] = _families(session.items)
            workeroutput[SCOPE_OUTPUT] = state.port_scope

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist: the controller takes the families a worker collected (sent when the worker finishes)."""
        state = self.state
        output = getattr(node, "workeroutput", {})
        families, scope = output.get(FAMILIES_OUTPUT), output.get(SCOPE_OUTPUT)
        if state.controller and isinstance(families, dict):
            state.families.update(families)
        if state.controller and isinstance(scope, dict) and scope:
            left_out = LeftOut.from_json(scope)
            left_out.merge(state.port_scope)
            state.port_scope = left_out.to_json()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """xdist: the controller has no items; it notes the workers' collection instead."""
        state = self.state
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
        """Session events ride on the report, and at set-up the test's family and engine; a bad-input
        failure is one line."""
        outcome = yield
        report = outcome.get_result()
        state = self.state
        if report.when == "setup":
            report.user_properties = [*report.user_properties, *self._setup_properties(item)]
        if state.pending_events:
            report.user_properties = [*report.user_properties, (EVENTS_KEY, list(state.pending_events))]
            state.pending_events.clear()
        if report.failed and (line := _one_line(item.config, call.excinfo)):
            report.longrepr = line

    def _setup_properties(self, item: pytest.Item) -> list[tuple[str, Any]]:
        """The test's family, and the (engine, pin) it runs on: its ``port_id``, else its ``engine_id``,
        else the reference when it asks for the ``reference`` fixture, each only when that engine is one
        of the session's (a placeholder of a test with nothing to run on is not)."""
        out: list[tuple[str, Any]] = []
        if (family := item_family(item)) is not None:
            out.append((FAMILY_KEY, family.name))
        params = getattr(getattr(item, "callspec", None), "params", {})
        engine = params.get("port_id", params.get("engine_id"))
        if engine is None and "reference" in getattr(item, "fixturenames", ()):
            engine = self.settings.reference
        pin = params.get("port_pin", params.get("pin")) if "port_id" in params else params.get("pin")
        if isinstance(engine, str) and isinstance(pin, str) and engine in self.engines:
            out.append((ENGINE_KEY, [engine, pin]))
        return out


#: The ``workeroutput`` key under which an xdist worker sends the families of the tests it collected.
FAMILIES_OUTPUT = "oracles_families"
#: ... and the tests the port scope left out of its collection (:meth:`oracles.families.port_scope.LeftOut.to_json`).
SCOPE_OUTPUT = "oracles_port_scope"


def _families(items: list[pytest.Item]) -> dict[str, str]:
    """nodeid -> family name of each item in a family (a test in none is family "unit")."""
    return {plain_nodeid(item.nodeid): family.name for item in items
            if (family := item_family(item)) is not None}


class DeadlineHooks:
    """Registered with ``--deadline`` only."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        """A test not yet started when the time is up is not run at all (no report)."""
        return True if self.state.past_deadline() else None
