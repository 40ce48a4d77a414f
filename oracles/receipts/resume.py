"""What ``--resume`` may carry over: passes only from a run of the same schema, reference, port and pins.

A pass recorded against another model (pin), another reference or port engine, or another receipt
schema says nothing about this run; carrying it would make a receipt claim checks that were never made.
A receipt records all four (``schema_version``, ``invocation.reference``, ``invocation.port``, ``pins``).
A ``.partial.jsonl`` records the first three in its ``start`` line, and no pins (they are known only at
the end of a run): it is accepted, and that the pins were not checked is recorded in the new receipt.
The ``--pin`` selection is held too: a pass on another pin has another nodeid and would carry nothing,
so a run that resumes "0 tests" from another pin's receipt is refused rather than silently redone.

A carried pass keeps its data, whose npz keys name arrays in the old run's sidecar; they are copied into
the new run's (:class:`ArraySource`), or the new receipt would name arrays it lacks and no reader could
compare it. A pass whose arrays are nowhere to be found (a killed run's staging folder removed, a
sidecar deleted) is not carried but run again, and the receipt lists it under ``resume_not_carried``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from oracles.errors import FixtureError
from oracles.pins.pin import PinStore, pin_names
from oracles.receipts.files import load_json
from oracles.receipts.table import SCHEMA_VERSION, TestRecord

#: The ``resume_unchecked`` note of a receipt resumed from a partial log.
PARTIAL_UNCHECKED = "pins: a .partial.jsonl records none"


def pin_value(pins: Sequence[str]) -> str | None:
    """This run's pins as a receipt records ``--pin``: ``"a,b"``, or None for each family's defaults."""
    return ",".join(pins) or None


def partial_header(reference: str, port: str, pins: Sequence[str]) -> dict[str, Any]:
    """The fields a partial log's ``start`` line carries so that a resume from it can be checked:
    ``reference`` (:func:`reference_setting`), the ``--port`` value, the pins (:func:`pin_value`)."""
    return {"schema_version": SCHEMA_VERSION, "reference": reference, "port": port, "pin": pin_value(pins)}


def pin_selection(value: Any) -> Any:
    """A recorded ``--pin`` value as the set of pins it selects (``"a,b"`` and ``"b, a"`` run the same
    tests); a sequence of names likewise; anything else (None: each family's defaults) as itself."""
    if isinstance(value, str):
        value = pin_names(value)
    if isinstance(value, (list, tuple)):
        return sorted(set(value)) or None
    return value


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


def check_resume_source(path: Path, reference: str, port: str, pins: Sequence[str], where: PinStore) -> str | None:
    """Hold a ``--resume`` source to this run's setting.

    Args:
        path: a receipt (``.json``) or partial log (``.partial.jsonl``) already read by ``load_records``.
        reference, port: this run's ``--reference`` and ``--port`` values, compared as given (a run with
            ``--port auto`` resumes only from a run with ``--port auto``).
        pins: this run's ``--pin`` names, compared as a set (empty: no ``--pin``).
        where: the pin store the source's recorded pins are held to (digest and source).

    Returns:
        None when every field was checked, else a note of what could not be (a partial log: the pins).

    Raises:
        FixtureError: the first field that differs, naming it and both values.
    """
    path = Path(path)
    if path.name.endswith(".jsonl"):
        head = _start_line(path)
        setting = {"schema_version": head.get("schema_version"), "reference": head.get("reference"),
                   "port": head.get("port"), "pin": head.get("pin", pin_value(pins))}
        recorded: list[Any] = []
        # a log written before its start line carried the pin selection: that is not checked either
        unchecked: str | None = PARTIAL_UNCHECKED if "pin" in head else f"{PARTIAL_UNCHECKED}; --pin not recorded"
    else:
        receipt = load_json(path)
        invocation = receipt.get("invocation") if isinstance(receipt.get("invocation"), dict) else {}
        device = invocation.get("reference_device")
        setting = {"schema_version": receipt.get("schema_version"),
                   "reference": reference_setting(invocation.get("reference"), device or "cpu"),
                   "port": invocation.get("port"), "pin": invocation.get("pin")}
        recorded = receipt.get("pins") if isinstance(receipt.get("pins"), list) else []
        unchecked = None
    if setting["schema_version"] != SCHEMA_VERSION:
        raise FixtureError(f"schema_version {setting['schema_version']!r} differs from this plugin's {SCHEMA_VERSION}")
    for field, ours in (("reference", reference), ("port", port)):
        if setting[field] != ours:
            raise FixtureError(f"invocation.{field} {setting[field]!r} differs from this run's {ours!r}")
    if pin_selection(setting["pin"]) != pin_selection(pins):
        raise FixtureError(f"invocation.pin {setting['pin']!r} differs from this run's {pin_value(pins)!r}")
    for row in recorded:
        name = row.get("name") if isinstance(row, dict) else None
        if not isinstance(name, str) or where.path(name) is None:
            raise FixtureError(f"pins[{name}]: no pin file {name}.json in {where.describe()}")
        pinned = where.load(name)
        for field in ("digest", "source"):
            if row.get(field) != getattr(pinned, field):
                raise FixtureError(f"pins[{name}].{field} {row.get(field)!r} differs from {pinned.path}'s "
                                   f"{getattr(pinned, field)!r}")
    return unchecked


def npz_keys(data: Any) -> set[str]:
    """Every npz key a record's data names: ``arrays.<name>.npz_key`` (``receipt.array``) and
    ``units[i].arrays.<role>`` (:func:`oracles.receipts.units.attach_unit`; the same keys, read anyway)."""
    keys: set[str] = set()
    if not isinstance(data, dict):
        return keys
    arrays = data.get("arrays")
    for meta in arrays.values() if isinstance(arrays, dict) else ():
        if isinstance(meta, dict) and isinstance(meta.get("npz_key"), str):
            keys.add(meta["npz_key"])
    units = data.get("units")
    for unit in units if isinstance(units, list) else ():
        roles = unit.get("arrays") if isinstance(unit, dict) else None
        keys.update(k for k in (roles.values() if isinstance(roles, dict) else ()) if isinstance(k, str))
    return keys


class ArraySource:
    """Where the arrays of a ``--resume`` source's records are: a receipt's npz sidecar (its field
    ``arrays``), or for a partial log the staging folder its run left when killed
    (``.<stem>.arrays/<key>.npy``), else the sidecar of its run when that run finished (``<stem>.npz``)."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        self.npz: Path | None = None
        self.folder: Path | None = None
        if path.name.endswith(".partial.jsonl"):
            stem = path.name.removesuffix(".partial.jsonl")
            staging, npz = path.with_name(f".{stem}.arrays"), path.with_name(f"{stem}.npz")
            if staging.is_dir():
                self.folder = staging
            elif npz.is_file():
                self.npz = npz
        else:  # found as every receipt reader finds it (a renamed R.json + R.npz pair too)
            from oracles.errors import ReceiptError
            from oracles.receipts.sidecar import find_sidecar

            receipt = load_json(path)
            try:
                self.npz = find_sidecar(receipt, path)[0] if isinstance(receipt, dict) else None
            except ReceiptError:  # no sidecar at hand: its passes are run again, each listed
                self.npz = None
        self.keys = self._keys()

    def describe(self) -> str:
        """Where the arrays are, for messages: the sidecar, the staging folder, or that there is neither."""
        return str(self.npz or self.folder or "no npz sidecar or staging folder beside it")

    def _keys(self) -> set[str]:
        if self.folder is not None:
            return {p.stem for p in self.folder.glob("*.npy")}
        if self.npz is None or not self.npz.is_file():
            return set()
        import zipfile

        from oracles.receipts.logit_store import array_keys

        try:
            with zipfile.ZipFile(self.npz) as zf:
                return array_keys(zf.namelist())
        except (OSError, zipfile.BadZipFile):
            return set()

    def copy_into(self, keys: set[str], staging: Path) -> None:
        """Write each of ``keys`` to ``staging/<key>.npy`` (where ``receipt.array`` puts this run's),
        unless this run wrote it already. A unit's logits stored coded are carried decoded, with their
        group, their error and the exact statistics of the rows first attached
        (:data:`oracles.receipts.logit_store.STAGED`), so the new sidecar states the error from those
        rows, never from the decoded ones. Raises OSError/ValueError on an unreadable source."""
        import shutil

        import numpy as np

        from oracles.receipts.logit_store import STAGED, LogitStore

        wanted = sorted(k for k in keys & self.keys if not (staging / f"{k}.npy").exists())
        if not wanted:
            return
        staging.mkdir(parents=True, exist_ok=True)
        if self.folder is not None:
            for key in wanted:
                if (self.folder / f"{key}{STAGED}").is_file():
                    shutil.copyfile(self.folder / f"{key}{STAGED}", staging / f"{key}{STAGED}")
                shutil.copyfile(self.folder / f"{key}.npy", staging / f"{key}.npy")
            return
        assert self.npz is not None
        with np.load(self.npz, allow_pickle=False) as packed:
            store = LogitStore(packed)
            for key in wanted:
                info = store.meta(key)
                if info is None:  # stored as attached
                    np.save(staging / f"{key}.npy", packed[key], allow_pickle=False)
                    continue
                got = store.rows(key)
                carried = {"group": info.get("group"), "carried_error": got.error,
                           "stats": {"argmax": got.stats.argmax.tolist(), "gap": got.stats.gap.tolist(),
                                     "sha": [bytes(r).hex() for r in got.stats.sha]}}
                (staging / f"{key}{STAGED}").write_text(json.dumps(carried), encoding="utf-8")
                np.save(staging / f"{key}.npy", got.values, allow_pickle=False)


def plan_carry(path: Path, records: dict[str, TestRecord]) -> tuple[ArraySource, list[dict[str, str]]]:
    """Which passes of a ``--resume`` source can be carried with their arrays.

    Returns:
        The source of the arrays, and one ``{"nodeid", "reason"}`` per pass that cannot be carried
        (an npz key in no sidecar of the source): the caller runs those again instead.
    """
    source = ArraySource(path)
    not_carried = []
    for nodeid, rec in sorted(records.items()):
        if rec.outcome != "passed":
            continue
        missing = sorted(npz_keys(rec.data) - source.keys)
        if missing:
            not_carried.append({"nodeid": nodeid, "reason": f"its array {missing[0]!r}"
                                f"{f' (+{len(missing) - 1} more)' if len(missing) > 1 else ''} is not in "
                                f"{source.describe()}: run again"})
    return source, not_carried
