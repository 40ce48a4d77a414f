"""The session receipt as one typed object: :class:`RunReceipt`, schema :data:`SCHEMA_VERSION`.

Built once per run, on the controller, after every test reported (:meth:`RunReceipt.build`), and
written as JSON (:meth:`RunReceipt.to_json`) with the layout receipts of this schema always had; the
fields added since (``ran_nothing``, ``plugin_fields``, ``port_scope``) are read as empty from a receipt without them
(:meth:`RunReceipt.from_json`), so older receipts of the schema still load.
"""

from __future__ import annotations

import time
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Iterable, Mapping

from oracles.errors import FixtureError
from oracles.receipts.table import SCHEMA_VERSION, TestRecord, all_ok, check_json_safe, check_schema_version, checks_table

#: Outcomes that are not a check made: a test with only these made no claim about its engine.
NOT_RAN = frozenset({"skipped", "not_run"})


def utc_now() -> str:
    """The current time as the receipt writes times: ``2024-05-01T12:00:00.000000Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class RunFacts:
    """What the receipt says about the run as a whole, gathered by the session: ``invocation`` (args,
    options as given), ``environment`` (:mod:`oracles.receipts.environment`), ``events`` (pins verified,
    engines loaded), ``resume`` (``resumed_from``, ``resume_unchecked``, ``resume_not_carried``),
    ``left_out`` (pairs the parametrization left out), ``port_scope`` (the tests ``--port-records`` left out
    of the collection, per port: :meth:`oracles.families.port_scope.LeftOut.to_json`), ``engine_of``
    (nodeid -> (engine id, pin) of the tests that run on one engine), ``plugin_fields`` (a project's fields, by plugin)."""

    invocation: dict[str, Any]
    environment: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    resume: dict[str, Any] = field(default_factory=dict)
    collection_errors: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[dict[str, Any]] = field(default_factory=list)
    port_scope: dict[str, Any] = field(default_factory=dict)
    engine_of: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    plugin_fields: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunReceipt:
    """One session's receipt. ``tests``: each :class:`~oracles.receipts.table.TestRecord` as JSON;
    ``checks``: their table (:func:`~oracles.receipts.table.checks_table`); ``all_ok``: no check failed,
    one passed, every collected test ran and no engine ran nothing; ``ran_nothing``: each engine whose
    every test was skipped or not run (:func:`ran_nothing`); ``arrays``: the npz sidecar's file name,
    None when no test attached an array; ``port_scope``: the port tests ``--port-records`` left out of the
    collection (setting, and per port the count, the records and why); ``plugin_fields``: a project's fields by plugin name
    (hook ``pytest_oracles_receipt_fields``)."""

    schema_version: int
    run_id: str
    started: str
    finished: str
    seconds: float
    exitstatus: int
    invocation: dict[str, Any]
    environment: dict[str, Any]
    pins: list[dict[str, Any]]
    engines: list[dict[str, Any]]
    resumed_from: str | None
    resume_unchecked: str | None
    resume_not_carried: list[dict[str, Any]]
    collection_errors: list[dict[str, Any]]
    not_run: list[dict[str, Any]]
    tests: list[dict[str, Any]]
    checks: dict[str, dict[str, Any]]
    all_ok: bool
    ran_nothing: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[dict[str, Any]] = field(default_factory=list)
    port_scope: dict[str, Any] = field(default_factory=dict)
    arrays: str | None = None
    plugin_fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def build(cls, run_id: str, started: str, started_wall: float, exitstatus: int, records: Iterable[TestRecord],
              not_run: list[dict[str, str]], facts: RunFacts, arrays: str | None) -> "RunReceipt":
        """The receipt of a finished run: ``started`` the start as a UTC string, ``started_wall`` as
        epoch seconds; ``records`` every test's record (the tests never started among them, outcome
        ``not_run``, also listed in ``not_run`` with the reason); ``arrays`` the sidecar's name or None."""
        ordered = sorted(records, key=lambda r: r.nodeid)
        table = checks_table(ordered)
        idle = ran_nothing(ordered, facts.engine_of)
        return cls(
            schema_version=SCHEMA_VERSION, run_id=run_id, started=started, finished=utc_now(),
            seconds=round(time.time() - started_wall, 3), exitstatus=int(exitstatus), invocation=facts.invocation,
            environment=facts.environment, pins=_pins(facts.events), engines=_engines(facts.events),
            resumed_from=facts.resume.get("resumed_from"), resume_unchecked=facts.resume.get("resume_unchecked"),
            resume_not_carried=list(facts.resume.get("resume_not_carried", [])),
            collection_errors=facts.collection_errors, not_run=not_run, tests=[r.to_json() for r in ordered],
            checks=table,
            # A cut run (deadline, Ctrl-C) is not "all ok" even when every test it ran passed, nor is a run
            # where an engine it selected made no check at all (each of its tests skipped).
            all_ok=all_ok(table) and not not_run and not idle,
            ran_nothing=idle, left_out=facts.left_out, port_scope=facts.port_scope, arrays=arrays,
            plugin_fields=facts.plugin_fields)

    def to_json(self) -> dict[str, Any]:
        """The receipt as strict-JSON-ready dict, fields in declaration order; ``arrays`` only when a
        sidecar was written, ``plugin_fields`` only when a plugin gave some and ``port_scope`` only when
        the scope left a test out (as receipts of this schema always had them)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if out["arrays"] is None:
            del out["arrays"]
        for optional in ("plugin_fields", "port_scope"):
            if not out[optional]:
                del out[optional]
        return out

    @classmethod
    def from_json(cls, obj: Any, path: Path) -> "RunReceipt":
        """A receipt read back (``json.load``) from ``path``; fields a receipt of this schema may lack
        (those with a default) take it.

        Raises:
            FixtureError: not an object, another schema (:func:`check_schema_version`), or a field
                missing, naming the file and the field.
        """
        if not isinstance(obj, dict):
            raise FixtureError(f"{path}: not a receipt: a JSON {type(obj).__name__}, not an object")
        check_schema_version(obj, path)
        known = {f.name: f for f in fields(cls)}
        for name, f in known.items():
            if name not in obj and f.default is MISSING and f.default_factory is MISSING:
                raise FixtureError(f"{path}: field {name!r} is missing from the receipt")
        return cls(**{k: v for k, v in obj.items() if k in known})


def check_plugin_fields(name: str, value: Any) -> dict[str, Any] | None:
    """The fields a plugin returned from ``pytest_oracles_receipt_fields``, held to the receipt's JSON
    rules (:func:`~oracles.receipts.table.check_json_safe`); None: it adds none.

    Raises:
        TypeError: not a dict, or a value strict JSON cannot hold, naming the plugin and the key.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"pytest_oracles_receipt_fields of {name}: returned a {type(value).__name__}, not a dict "
                        "(or None)")
    check_json_safe(value, f"plugin_fields.{name}")
    return value


def ran_nothing(records: Iterable[TestRecord], engine_of: Mapping[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """Each engine whose every test (of those that run on one engine: ``engine_of``) was skipped or
    not run: ``{"engine", "pins", "tests", "reasons": {reason: count}}``, by engine id. An engine with
    no test at all (deselected) is not listed: it was not asked for anything."""
    rows: dict[str, dict[str, Any]] = {}
    ran: set[str] = set()
    for rec in records:
        if rec.nodeid not in engine_of:
            continue
        engine, pin = engine_of[rec.nodeid]
        if rec.outcome not in NOT_RAN:
            ran.add(engine)
            continue
        row = rows.setdefault(engine, {"engine": engine, "pins": [], "tests": 0, "reasons": {}})
        if pin not in row["pins"]:
            row["pins"].append(pin)
        row["tests"] += 1
        reason = rec.summary or rec.outcome
        row["reasons"][reason] = row["reasons"].get(reason, 0) + 1
    return [{**row, "pins": sorted(row["pins"])} for engine, row in sorted(rows.items()) if engine not in ran]


def _pins(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (pin, worker) verified: the first ``pin_verified`` event's figures."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "pin_verified":
            seen.setdefault((e["name"], e["worker"]), {k: v for k, v in e.items() if k != "event"})
    return list(seen.values())


def _engines(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (engine, pin, worker): how often it was loaded and the seconds each load took."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "engine_loaded":
            row = rows.setdefault((e["name"], e["pin"], e["worker"]), {
                "name": e["name"], "pin": e["pin"], "worker": e["worker"], "load_count": 0, "seconds": [],
                **{k: v for k, v in e.items() if k not in ("event", "name", "pin", "worker", "seconds")}})
            row["load_count"] += 1
            row["seconds"].append(e["seconds"])
    return list(rows.values())
