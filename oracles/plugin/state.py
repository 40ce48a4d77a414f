"""The session state the plugin keeps on ``config.stash``, and the turning of reports into records.

The controller (the only process in a serial run, the xdist controller with ``-n N``) owns a
:class:`RunState`: it turns test reports into :class:`~oracles.receipts.table.TestRecord` s, appends each
to the partial log, and at the end builds the receipt. Workers own a RunState too, but use it only
to queue session events (pin verified, engine loaded) that ride to the controller on test reports.

The session (:mod:`oracles.plugin.session`) makes the state once and keeps it here; the readers
(:func:`state_of`, :func:`settings_of`, :func:`emit`) only read it and never activate anything.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from oracles.errors import OracleError
from oracles.receipts.files import PartialLog, dump_json, pack_arrays, write_exclusive
from oracles.receipts.schema import RunFacts, RunReceipt
from oracles.receipts.table import TestRecord, plain_nodeid, split_nodeid

if TYPE_CHECKING:
    from oracles.plugin.settings import Settings
    from oracles.receipts.environment import EnvironmentProbe
    from oracles.receipts.resume import ArraySource

#: The user_properties keys this plugin uses on reports.
DATA_KEY = "oracles.data"
EVENTS_KEY = "oracles.events"
FAMILY_KEY = "oracles.family"  # the family of a test, from its marker names (oracles.plugin.collect.markers_of)
ENGINE_KEY = "oracles.engine"  # [engine id, pin] of a test that runs on one engine (its engine_id / port_id)
TIMEOUT_MARK = "Timeout (>"  # pytest-timeout's failure text: "Failed: Timeout (>Ns) from pytest-timeout."


def worker_id(config: Any = None) -> str:
    """xdist's worker id ("gw0", ...) of the process ``config`` belongs to, else "main".

    Read from ``config.workerinput``, not from $PYTEST_XDIST_WORKER: that variable is inherited by any
    pytest a worker's test starts (pytester, subprocesses), which is not itself a worker.
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return str(workerinput.get("workerid", "gw?"))
    return "main" if config is not None else os.environ.get("PYTEST_XDIST_WORKER", "main")


@dataclass
class RunState:
    """Everything one session knows about its receipt; kept on ``config.stash``."""

    run_id: str
    started_wall: float
    started: str
    receipts_dir: Path | None  # None: --no-receipt
    tag: str
    deadline: float | None
    controller: bool
    resume: dict[str, TestRecord] = field(default_factory=dict)
    resume_path: str | None = None
    resume_unchecked: str | None = None  # what the --resume source could not be checked for (oracles.receipts.resume)
    resume_arrays: ArraySource | None = None  # where the carried records' arrays are (copied at write)
    resume_not_carried: list[dict[str, str]] = field(default_factory=list)  # passes run again: no arrays found
    families: dict[str, str] = field(default_factory=dict)  # nodeid -> family, at collection; absent: "unit"
    engine_of: dict[str, tuple[str, str]] = field(default_factory=dict)  # nodeid -> (engine, pin), from reports
    pending_events: list[dict[str, Any]] = field(default_factory=list)  # worker side, drained per report
    events: list[dict[str, Any]] = field(default_factory=list)  # controller side, every event seen
    records: dict[str, TestRecord] = field(default_factory=dict)
    open_reports: dict[str, list[Any]] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    collection_errors: list[dict[str, Any]] = field(default_factory=list)  # {"nodeid", "summary"}
    port_scope: dict[str, Any] = field(default_factory=dict)  # LeftOut.to_json() of the collection (a worker's, merged)
    partial: PartialLog | None = None
    encoded: dict[str, str] = field(default_factory=dict)  # nodeid -> its record's text in the partial log
    environment_probe: EnvironmentProbe | None = None
    receipt_path: Path | None = None
    receipt: RunReceipt | None = None
    write_error: str | None = None
    not_run_count: int = 0  # set at session end, before the receipt turns them into not_run records

    @classmethod
    def new(cls, receipts_dir: Path | None, tag: str, deadline: float | None, controller: bool,
            run_id: str | None = None, started_wall: float | None = None) -> "RunState":
        """A state starting now (or at ``started_wall``, epoch seconds: a worker takes the controller's),
        under a new run id unless ``run_id`` is given; ``receipts_dir`` None: no receipt is written."""
        started_wall = time.time() if started_wall is None else started_wall
        return cls(run_id=run_id or secrets.token_hex(4), started_wall=started_wall,
                   started=datetime.fromtimestamp(started_wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                   receipts_dir=receipts_dir, tag=tag, deadline=deadline, controller=controller)

    # -- paths -------------------------------------------------------------------------------
    # Computed once: the receipt fixture asks for the staging folder in every test.
    @cached_property
    def stem(self) -> str:
        """The receipt's file stem, ``<UTC start>-<run id>`` (``20240501T120000Z-0123abcd``)."""
        stamp = datetime.fromtimestamp(self.started_wall, UTC).strftime("%Y%m%dT%H%M%SZ")
        return f"{stamp}-{self.run_id}"

    @cached_property
    def folder(self) -> Path | None:
        """``<receipts dir>/<tag>``, where this run's files go; None without a receipt."""
        return None if self.receipts_dir is None else self.receipts_dir / self.tag

    @cached_property
    def staging(self) -> Path | None:
        """The hidden folder attached arrays are saved in until the sidecar is packed; None without a receipt."""
        return None if self.folder is None else self.folder / f".{self.stem}.arrays"

    def open_partial(self, header: dict[str, Any] | None = None) -> None:
        """Create the receipt folder and the partial log (exclusively), its ``start`` line carrying
        ``header`` (the setting a later ``--resume`` from it is checked against). Raises ReceiptError."""
        assert self.folder is not None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from oracles.errors import ReceiptError

            raise ReceiptError(f"{self.folder}: receipts folder cannot be created: {exc.strerror or exc}") from exc
        self.partial = PartialLog(self.folder / f"{self.stem}.partial.jsonl")
        self.partial.write({"event": "start", "run_id": self.run_id, "started": self.started, **(header or {})})

    # -- deadline ----------------------------------------------------------------------------
    def past_deadline(self) -> bool:
        """Whether ``--deadline`` seconds have passed since the run started."""
        return self.deadline is not None and time.time() - self.started_wall > self.deadline

    def not_run(self) -> list[str]:
        """Collected tests with no record yet (at session end: never started)."""
        return [n for n in self.collected if n not in self.records]

    def not_run_reason(self) -> str:
        """Why a collected test did not run: the deadline passed, or the session ended first."""
        return "deadline passed" if self.past_deadline() else "session ended before it ran"

    # -- reports -> records ------------------------------------------------------------------
    def on_report(self, report: Any) -> TestRecord | None:
        """Take one phase report; return the finished record after its last phase, else None."""
        for name, value in getattr(report, "user_properties", ()):
            if name == EVENTS_KEY:
                self.events.extend(value)
            elif name == ENGINE_KEY:
                self.engine_of[plain_nodeid(report.nodeid)] = (value[0], value[1])
        self.open_reports.setdefault(report.nodeid, []).append(report)
        if report.when not in ("teardown", "???"):
            return None
        record = self._record(plain_nodeid(report.nodeid), self.open_reports.pop(report.nodeid))
        self.records[record.nodeid] = record
        if self.partial is not None:
            # in the OS before the next test starts (one write(2)); no fsync per line. The record's text is
            # kept for the receipt, which would otherwise encode every record a second time.
            self.encoded[record.nodeid] = self.partial.write_test(record.to_json())
        return record

    def on_collect_error(self, report: Any) -> None:
        """Keep a failed collection (a module or record file that would not load) for the receipt."""
        self.collection_errors.append({"nodeid": plain_nodeid(report.nodeid), "summary": _summary(report)})

    def _record(self, nodeid: str, reports: list[Any]) -> TestRecord:
        check, record_id = split_nodeid(nodeid)
        family = self.families.get(nodeid, "unit")
        data: dict[str, Any] = {}
        for rep in reports:
            for name, value in getattr(rep, "user_properties", ()):
                if name == DATA_KEY:
                    data = value
                elif name == FAMILY_KEY:
                    family = value
        outcome, summary = "passed", None
        for rep in reports:
            if rep.when == "???":
                outcome, summary = "crashed", _summary(rep) or "worker crashed while running this test"
                break
            wasxfail = hasattr(rep, "wasxfail")
            if rep.failed:
                text = _summary(rep)
                if rep.when == "call":
                    outcome = "timeout" if text and TIMEOUT_MARK in text else "failed"
                elif outcome == "passed" or rep.when == "setup":
                    outcome = "error"
                summary = summary or text
            elif rep.skipped and rep.when in ("setup", "call"):
                outcome = "xfailed" if wasxfail else "skipped"
                summary = rep.wasxfail if wasxfail else _summary(rep)
            elif rep.when == "call" and wasxfail:
                outcome = "xpassed"
        record = TestRecord(nodeid=nodeid, family=family, check=check, record_id=record_id, outcome=outcome,
                            duration=round(sum(getattr(r, "duration", 0.0) or 0.0 for r in reports), 6),
                            summary=summary, data=data, worker=_worker_of(reports[-1]))
        previous = self.resume.get(nodeid)
        if outcome == "skipped" and previous is not None and previous.outcome == "passed":
            record = TestRecord(**{**previous.to_json(), "resumed_from": self.resume_path})
        return record

    # -- the receipt -------------------------------------------------------------------------
    def finish(self) -> list[dict[str, str]]:
        """At session end: a record (outcome ``not_run``, with the reason) for each collected test that
        never started; returns them as the receipt lists them."""
        reason = self.not_run_reason()
        rows = []
        for nodeid in self.not_run():
            check, record_id = split_nodeid(nodeid)
            self.records[nodeid] = TestRecord(nodeid=nodeid, family=self.families.get(nodeid, "unit"), check=check,
                                              record_id=record_id, outcome="not_run", duration=0.0, summary=reason)
            rows.append({"nodeid": nodeid, "reason": reason})
        return rows

    def facts(self, invocation: dict[str, Any], environment: dict[str, Any], left_out: list[dict[str, Any]],
              plugin_fields: dict[str, dict[str, Any]]) -> RunFacts:
        """The run as a whole: what the session gives (invocation, environment, left-out pairs, a project's
        fields) and what this state gathered (events, the resume setting, collection errors, engine per test)."""
        resume = {"resumed_from": self.resume_path, "resume_unchecked": self.resume_unchecked,
                  "resume_not_carried": self.resume_not_carried}
        return RunFacts(invocation=invocation, environment=environment, events=self.events, resume=resume,
                        collection_errors=self.collection_errors, left_out=left_out, engine_of=self.engine_of,
                        plugin_fields=plugin_fields, port_scope=self.port_scope)

    def build(self, exitstatus: int, not_run: list[dict[str, str]], facts: RunFacts,
              arrays: str | None) -> RunReceipt:
        """The run's receipt (:meth:`oracles.receipts.schema.RunReceipt.build`) from this state's records
        and ``facts`` (:meth:`facts`, with what the session adds)."""
        return RunReceipt.build(self.run_id, self.started, self.started_wall, exitstatus, self.records.values(),
                                not_run, facts, arrays)

    def pack_arrays(self) -> str | None:
        """Copy the carried records' arrays in, then pack the staging folder into the npz sidecar;
        returns the sidecar's file name, None when no array was attached. Raises ReceiptError."""
        assert self.folder is not None and self.staging is not None
        self._carry_arrays()
        npz = self.folder / f"{self.stem}.npz"
        return npz.name if pack_arrays(self.staging, npz) else None

    def write(self, receipt: RunReceipt) -> Path:
        """Write the receipt exclusively (never over an existing file); on failure its sidecar goes too.

        Raises:
            ReceiptError: the file exists or cannot be written (path named).
        """
        assert self.folder is not None
        path = self.folder / f"{self.stem}.json"
        try:
            # a record made at the end (not_run) has no partial-log text; on_report sets both at once
            encoded = {"tests": [self.encoded.get(t["nodeid"]) for t in receipt.tests]}
            write_exclusive(path, dump_json(receipt.to_json(), encoded))
        except OracleError:
            self.drop_arrays(receipt.arrays)
            raise
        self.receipt_path, self.receipt = path, receipt
        return path

    def drop_arrays(self, name: str | None) -> None:
        """Remove this run's sidecar ``name`` (pack_arrays creates it exclusively: it is ours), so no
        sidecar is left without its receipt."""
        if name is not None and self.folder is not None:
            (self.folder / name).unlink(missing_ok=True)

    def _carry_arrays(self) -> None:
        """Copy the arrays the carried records name from the --resume source into this run's staging,
        so the new sidecar holds every key its receipt names. Raises ReceiptError."""
        if self.resume_arrays is None:
            return
        from oracles.receipts.resume import npz_keys

        keys: set[str] = set()
        for rec in self.records.values():
            if rec.resumed_from is not None:
                keys |= npz_keys(rec.data)
        if not keys:
            return
        import zipfile

        assert self.staging is not None
        try:
            self.resume_arrays.copy_into(keys, self.staging)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            from oracles.errors import ReceiptError

            raise ReceiptError(f"{self.resume_arrays.describe()}: the carried records' arrays cannot be copied "
                               f"into this run's sidecar: {exc}") from exc


def _summary(rep: Any) -> str | None:
    longrepr = getattr(rep, "longrepr", None)
    if longrepr is None:
        return None
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    return text[:4000]


def _worker_of(rep: Any) -> str:
    node = getattr(rep, "node", None)
    gateway = getattr(node, "gateway", None)
    return getattr(gateway, "id", None) or "main"  # no xdist node: the controller ran it itself


STATE_KEY = pytest.StashKey[RunState]()
SETTINGS_KEY = pytest.StashKey["Settings"]()


def _stash(config: pytest.Config) -> pytest.Stash:
    """``config.stash`` once the session is active.

    Raises:
        LookupError: pytest-oracles is not active in the pytest session (one line saying what activates it).
    """
    if STATE_KEY not in config.stash:
        raise LookupError("pytest-oracles is not active in this pytest session: no oracles option was given, the "
                          "ini file has no `oracles = true`, and no test uses its fixtures or parameters (pin, "
                          "engine_id, port_id)")
    return config.stash


def state_of(config: pytest.Config) -> RunState:
    """The session's :class:`RunState` (made when the session is activated: :mod:`oracles.plugin.session`).

    Raises:
        LookupError: the session is not active (nothing to read).
    """
    return _stash(config)[STATE_KEY]


def settings_of(config: pytest.Config) -> "Settings":
    """The session's :class:`~oracles.plugin.settings.Settings` (resolved when the session is activated).

    Raises:
        LookupError: the session is not active (nothing to read).
    """
    return _stash(config)[SETTINGS_KEY]


def emit(config: pytest.Config, event: str, **fields: Any) -> None:
    """Queue a session event (``pin_verified``, ``engine_loaded``) for the receipt.

    The event rides to the controller on the report of the test whose set-up caused it, so it
    reaches the receipt from xdist workers too. Fields are held to the receipt's JSON rules at
    once (a str subclass such as ``torch.__version__`` would pass serially and then break xdist's
    serialiser on a worker).

    Raises:
        TypeError: a field that strict JSON cannot hold, naming it.
        LookupError: the session is not active.
    """
    from oracles.receipts.table import check_json_safe

    check_json_safe(fields, f"event {event}")
    state_of(config).pending_events.append({"event": event, "worker": worker_id(config), "at": time.time(), **fields})


def keep(config: pytest.Config, state: RunState, settings: "Settings") -> None:
    """Put the session's state and settings on ``config.stash`` (the session, when it starts)."""
    config.stash[STATE_KEY] = state
    config.stash[SETTINGS_KEY] = settings
