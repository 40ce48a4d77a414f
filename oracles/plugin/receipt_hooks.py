"""The receipt session: the controller's hooks that turn test reports into the receipt.

Registered by the plugin only when pytest-oracles is on for the run (the ini's ``oracles = true``, or a
receipt option) and a receipt is wanted, as pytest-xdist registers its distribution session only when
distribution is on; otherwise no receipt, partial log or terminal section is made.
"""

from __future__ import annotations

from typing import Any

import pytest

from oracles.errors import OracleError
from oracles.plugin.state import STATE_KEY, settings_of, state_of


class ReceiptSession:
    """The controller's hooks that need the config but get only a report; registered per config."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = state_of(self.config)
        if state.controller:
            state.on_report(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        state = state_of(self.config)
        if state.controller and report.failed:
            state.on_collect_error(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = self.config
        state = state_of(config)
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
                      "reference": opt.reference, "reference_device": opt.reference_device, "port": opt.port,
                      "pin": opt.pin, "snapshots": list(opt.snapshot),
                      "deadline": opt.deadline}
        env = state.environment_probe.result() if state.environment_probe else {}
        receipt = state.build(invocation, env, int(exitstatus))
        receipt["left_out"] = settings_of(config).left_out_json()
        try:
            state.write(receipt)
        except OracleError as exc:
            state.write_error = str(exc)
            # The run's evidence is missing: do not exit 0 (make oracle would then show an older receipt).
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        state.partial.write({"event": "end", "receipt": state.receipt_path.name if state.receipt_path else None,
                             "error": state.write_error})
        # the receipt (fsynced, its folder too) holds every record; without one the log is the evidence
        state.partial.close(sync=state.receipt_path is None)

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        state = config.stash.get(STATE_KEY, None)
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
        from oracles.receipts.report import format_benchmarks, format_checks

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
            if state.resume_not_carried:
                tr.write_line(f"resume: {len(state.resume_not_carried)} passes run again, not carried: their arrays "
                              "are in no sidecar of the source; listed in the receipt (resume_not_carried)")
        for line in format_checks(state.receipt["checks"], state.receipt["all_ok"]):
            tr.write_line(line)
        for line in format_benchmarks(state.receipt["tests"]):
            tr.write_line(line)


