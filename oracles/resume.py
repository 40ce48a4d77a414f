"""What ``--resume`` may carry over: passes only from a run of the same schema, reference, port and pins.

A pass recorded against another model (pin), another reference or port engine, or another receipt
schema says nothing about this run; carrying it would make a receipt claim checks that were never made.
A receipt records all four (``schema_version``, ``invocation.reference``, ``invocation.port``, ``pins``).
A ``.partial.jsonl`` records the first three in its ``start`` line, and no pins (they are known only at
the end of a run): it is accepted, and that the pins were not checked is recorded in the new receipt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oracles.errors import FixtureError
from oracles.pins import load_pin, store
from oracles.receipt_files import load_json
from oracles.receipts import SCHEMA_VERSION

#: The ``resume_unchecked`` note of a receipt resumed from a partial log.
PARTIAL_UNCHECKED = "pins: a .partial.jsonl records none"


def partial_header(reference: str, port: str) -> dict[str, Any]:
    """The fields a partial log's ``start`` line carries so that a resume from it can be checked."""
    return {"schema_version": SCHEMA_VERSION, "reference": reference, "port": port}


def reference_setting(reference: Any, device: str) -> Any:
    """The reference as a resume setting: its engine id, with ``@DEVICE`` when it runs off the CPU
    (a pass on one device says nothing about another)."""
    return reference if device == "cpu" or not isinstance(reference, str) else f"{reference}@{device}"


def _start_line(path: Path) -> dict[str, Any]:
    try:
        with path.open(encoding="utf-8") as fh:
            first = fh.readline()
    except OSError as exc:
        raise FixtureError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        obj = None
    return obj if isinstance(obj, dict) and obj.get("event") == "start" else {}


def check_resume_source(path: Path, reference: str, port: str) -> str | None:
    """Hold a ``--resume`` source to this run's setting.

    Args:
        path: a receipt (``.json``) or partial log (``.partial.jsonl``) already read by ``load_records``.
        reference, port: this run's ``--reference`` and ``--port`` values, compared as given (a run with
            ``--port auto`` resumes only from a run with ``--port auto``).

    Returns:
        None when every field was checked, else a note of what could not be (a partial log: the pins).

    Raises:
        FixtureError: the first field that differs, naming it and both values.
    """
    path = Path(path)
    if path.name.endswith(".jsonl"):
        head = _start_line(path)
        setting = {"schema_version": head.get("schema_version"), "reference": head.get("reference"),
                   "port": head.get("port")}
        pins: list[Any] = []
        unchecked: str | None = PARTIAL_UNCHECKED
    else:
        receipt = load_json(path)
        invocation = receipt.get("invocation") if isinstance(receipt.get("invocation"), dict) else {}
        device = invocation.get("reference_device")
        setting = {"schema_version": receipt.get("schema_version"),
                   "reference": reference_setting(invocation.get("reference"), device or "cpu"),
                   "port": invocation.get("port")}
        pins = receipt.get("pins") if isinstance(receipt.get("pins"), list) else []
        unchecked = None
    if setting["schema_version"] != SCHEMA_VERSION:
        raise FixtureError(f"schema_version {setting['schema_version']!r} differs from this plugin's {SCHEMA_VERSION}")
    for field, ours in (("reference", reference), ("port", port)):
        if setting[field] != ours:
            raise FixtureError(f"invocation.{field} {setting[field]!r} differs from this run's {ours!r}")
    for row in pins:
        name = row.get("name") if isinstance(row, dict) else None
        if not isinstance(name, str) or store().path(name) is None:
            raise FixtureError(f"pins[{name}]: no pin file {name}.json in {store().describe()}")
        pin = load_pin(name)
        for field in ("digest", "source"):
            if row.get(field) != getattr(pin, field):
                raise FixtureError(f"pins[{name}].{field} {row.get(field)!r} differs from {pin.path}'s "
                                   f"{getattr(pin, field)!r}")
    return unchecked
