"""Reading a receipt for the report: its JSON held to this schema (:func:`oracles.receipts.table.load_receipt`),
typed (:meth:`oracles.receipts.schema.RunReceipt.from_json`), each test record checked
(:meth:`oracles.receipts.table.TestRecord.from_json`) and the checks table's fields the page reads.
Every refusal is one line naming the file (and the record or field)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracles.errors import FixtureError
from oracles.receipts.schema import RunReceipt
from oracles.receipts.table import TestRecord, load_receipt

#: Field -> types of one row of the checks table, as the page reads it (``xfailed`` and ``not_run`` are
#: read as 0 from a table written before them).
CHECK_FIELDS: dict[str, tuple[type, ...]] = {"ok": (bool, type(None)), "passed": (int,), "skipped": (int,),
                                             "failed": (list,), "xfailed": (int,), "not_run": (int,)}


#: Field -> types of the receipt's fields the page reads beyond the checks table and the test records
#: (each item of a list here an object).
FIELDS: dict[str, tuple[type, ...]] = {
    "tests": (list,), "all_ok": (bool,), "pins": (list,), "engines": (list,), "environment": (dict,),
    "invocation": (dict,), "run_id": (str,), "started": (str,), "finished": (str,), "seconds": (int, float),
    "exitstatus": (int,), "not_run": (list,), "collection_errors": (list,), "ran_nothing": (list,), "left_out": (list,)}
_MISSING = object()


@dataclass(frozen=True)
class Loaded:
    """A receipt read back: ``path``, the raw JSON object ``raw`` (what the unit reader takes), the typed
    ``receipt``, and its test records in receipt order."""

    path: Path
    raw: dict[str, Any]
    receipt: RunReceipt
    records: tuple[TestRecord, ...]


def _truncated(path: Path) -> str | None:
    """``"truncated: ..."`` when the file's JSON stops before its end (a copy cut short, a disk that
    filled): it fails to parse and does not end with the ``}`` that closes every receipt, or fails at its
    end; else None (another syntax error, which the reader's own line names)."""
    try:
        text = path.read_text(encoding="utf-8")
        json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.rstrip().endswith("}") or exc.pos >= len(text.rstrip()):  # a receipt's JSON ends with its "}"
            return (f"{path}: truncated: its JSON ends at line {exc.lineno}, column {exc.colno} before the receipt "
                    f"closes ({len(text.encode())} bytes); not a whole receipt")
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _check_rows(checks: Any, path: Path) -> None:
    """Raise FixtureError naming the first ``checks.<name>.<field>`` the page cannot read."""
    if not isinstance(checks, dict):
        raise FixtureError(f"{path}: field 'checks' is not an object")
    for name, row in checks.items():
        if not isinstance(row, dict):
            raise FixtureError(f"{path}: field 'checks.{name}' is not an object")
        for key, kinds in CHECK_FIELDS.items():
            value = row.get(key, 0 if key in ("xfailed", "not_run") else _MISSING)
            bad = not isinstance(value, kinds) or (kinds == (int,) and isinstance(value, bool))
            if bad or (isinstance(value, list) and not all(isinstance(v, str) for v in value)):
                names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
                raise FixtureError(f"{path}: field 'checks.{name}.{key}' is missing or not {names}")


def _check_fields(raw: dict[str, Any], path: Path) -> None:
    """Raise FixtureError naming the first of :data:`FIELDS` of another type (a list but ``tests`` of objects)."""
    for name, kinds in FIELDS.items():
        value = raw.get(name, [] if name in ("ran_nothing", "left_out") else None)  # fields a receipt may lack
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise FixtureError(f"{path}: field {name!r} is a JSON {type(value).__name__}, not "
                               f"{' or '.join(k.__name__ for k in kinds)}; not a receipt the report reads")
        if isinstance(value, list) and name != "tests":
            bad = next((i for i, item in enumerate(value) if not isinstance(item, dict)), None)
            if bad is not None:
                raise FixtureError(f"{path}: field '{name}[{bad}]' is not an object; not a receipt the report reads")


def read(path: Path) -> Loaded:
    """The receipt at ``path``, read and checked.

    Raises:
        FixtureError: a partial log, unreadable, truncated or invalid JSON, not an object, another ``schema_version``, a
            field missing (:meth:`RunReceipt.from_json`), a test record or checks row the page cannot
            read; one line, naming the file and the record or field.
    """
    if path.name.endswith(".partial.jsonl"):
        raise FixtureError(f"{path}: a partial log, not a receipt: `oracles receipts {path}` prints the tests it "
                           f"holds; its run's receipt (the same name, .json) is what the report reads")
    try:
        raw = load_receipt(path)
    except FixtureError:
        cut = _truncated(path)
        if cut is not None:
            raise FixtureError(cut) from None
        raise
    receipt = RunReceipt.from_json(raw, path)
    _check_fields(raw, path)
    _check_rows(receipt.checks, path)
    records = tuple(TestRecord.from_json(t, f"{path}: tests[{i}]") for i, t in enumerate(receipt.tests))
    for i, rec in enumerate(records):
        if not isinstance(rec.data, dict):
            raise FixtureError(f"{path}: tests[{i}] ({rec.nodeid}): field 'data' is not an object")
    return Loaded(path=path, raw=raw, receipt=receipt, records=records)
