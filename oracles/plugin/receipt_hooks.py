"""The receipt hooks: the controller's hooks that turn test reports into the receipt.

Registered by the session only when pytest-oracles is on for the run (the ini's ``oracles = true``, or
a receipt option) or ``--deadline`` is given, as pytest-xdist registers its distribution session only
when distribution is on; otherwise no receipt, partial log or terminal section is made. The receipt is
built once, at session end (:meth:`oracles.plugin.state.RunState.build`), with what a project adds
through the ``pytest_oracles_receipt_fields`` hook (:mod:`oracles.plugin.hookspecs`).
"""

from __future__ import annotations

from typing import Any

import pytest

from oracles.errors import OracleError
from oracles.plugin.settings import Settings
from oracles.plugin.state import RunState


class ReceiptHooks:
    """The controller's receipt: records from reports, the receipt at the end, its terminal section."""

    def __init__(self, config: pytest.Config, settings: Settings, state: RunState) -> None:
        self.config, self.settings, self.state = config, settings, state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each phase report of a test; the record is made after its last phase."""
        self.state.on_report(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A module or record file that failed to collect is kept for the receipt."""
        if report.failed:
            self.state.on_collect_error(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Mark a cut run interrupted, then build and write the receipt (an enabled run with a folder)."""
        state = self.state
        state.not_run_count = len(state.not_run())
        if state.not_run_count and state.past_deadline() and session.exitstatus == pytest.ExitCode.OK:
            # The run was cut, not failed: INTERRUPTED is pytest's own status for a session stopped
            # before it ran every selected test (Ctrl-C, a collection error); TESTS_FAILED would claim
            # a failure that did not happen. Either way not 0: a CI job must not go green on a cut run.
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            exitstatus = session.exitstatus
        if state.folder is None or state.partial is None:
            return
        try:
            self._write(int(exitstatus))
        except (OracleError, TypeError) as exc:
            state.write_error = str(exc)
            # The run's evidence is missing: do not exit 0 (make oracle would then show an older receipt).
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        state.partial.write({"event": "end", "receipt": state.receipt_path.name if state.receipt_path else None,
                             "error": state.write_error})
        # the receipt (fsynced, its folder too) holds every record; without one the log is the evidence
        state.partial.close(sync=state.receipt_path is None)

    def _write(self, exitstatus: int) -> None:
        """The receipt, built in one place and written exclusively.

        Raises:
            TypeError: a project's receipt fields are not JSON-safe (plugin and key named).
            ReceiptError: the sidecar or the receipt cannot be written (path named).
        """
        state, config = self.state, self.config
        from oracles.plugin.extend import project_fields

        plugin_fields = project_fields(config)
        not_run = state.finish()
        env = state.environment_probe.result() if state.environment_probe else {}
        facts = state.facts(self._invocation(), env, self.settings.left_out_json(), plugin_fields)
        arrays = state.pack_arrays()
        state.write(state.build(exitstatus, not_run, facts, arrays))

    def _invocation(self) -> dict[str, Any]:
        """The invocation as given: arguments, selection, and the oracles options' values."""
        config, opt = self.config, self.config.option
        return {"args": list(config.invocation_params.args), "markexpr": opt.markexpr or None,
                "keyword": opt.keyword or None, "rootdir": str(config.rootpath),
                "numprocesses": getattr(opt, "numprocesses", None), "runslow": opt.runslow,
                "reference": opt.reference, "reference_device": opt.reference_device, "port": opt.port,
                "pin": opt.pin, "snapshots": list(opt.snapshot), "deadline": opt.deadline}

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        """The receipt's section: its path, what did not run or was carried, the checks table."""
        state, tr = self.state, terminalreporter
        from oracles.families.port_scope import LeftOut

        for line in LeftOut.from_json(state.port_scope).lines():  # one choice of scope, said once a port
            tr.write_line(line)
        if state.receipt is None and state.not_run_count and state.past_deadline():  # --no-receipt: still say so
            tr.write_line(f"not run: {state.not_run_count} tests (deadline passed)")
        if state.write_error:
            tr.write_sep("=", "oracles receipt NOT written", red=True)
            tr.write_line(state.write_error)
            return
        if state.receipt is None:
            return
        from oracles.receipts.report import format_benchmarks, format_checks

        receipt = state.receipt
        tr.write_sep("=", "oracles receipt")
        tr.write_line(f"receipt: {state.receipt_path}")
        if receipt.collection_errors:
            tr.write_line(f"collection errors: {len(receipt.collection_errors)}; listed in the receipt")
        if receipt.not_run:
            tr.write_line(f"not run: {len(receipt.not_run)} tests ({receipt.not_run[0]['reason']}); listed in the receipt")
        if state.resume_path:
            resumed = sum(1 for t in receipt.tests if t.get("resumed_from"))
            note = " (a partial log records no pins: not checked)" if state.resume_unchecked else ""
            tr.write_line(f"resumed: {resumed} tests carried over as passed from {state.resume_path}{note}")
            if state.resume_not_carried:
                tr.write_line(f"resume: {len(state.resume_not_carried)} passes run again, not carried: their arrays "
                              "are in no sidecar of the source; listed in the receipt (resume_not_carried)")
        for line in format_checks(receipt.checks, receipt.all_ok, receipt.ran_nothing):
            tr.write_line(line)
        for line in format_benchmarks(receipt.tests):
            tr.write_line(line)
