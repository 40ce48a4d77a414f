"""Receipt records: the test record, the checks table, JSON safety of attached data, the ``receipt``
fixture's object, and reading records back.

A receipt is one JSON file per test session, ``receipts/<tag>/<UTC time>-<run id>.json``, never
overwritten; beside it a ``.partial.jsonl`` gains one line per finished test while the session runs,
so a killed run leaves its evidence (the files: :mod:`oracles.receipts.files`); :func:`load_records`
reads either file back (for ``--resume``); :func:`load_receipt` reads a receipt for the commands that
print it, refusing one of another schema.
"""

from __future__ import annotations

import functools
import json
import math
import operator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from oracles.errors import FixtureError
from oracles.receipts.files import load_json

#: 2: comparable units are declared records under a test's ``data.units`` (:mod:`oracles.receipts.units`), no
#: longer loose fields of its data. 3: a prefill, decode or generation unit carries every row its
#: family's port test holds (``logits`` ``[T, V]``, ``step_logits`` ``[S, V]``), no longer the last row
#: alone (``last_logits`` ``[V]``). 4: the npz sidecar stores unit logits as 2-byte codes with their
#: error and exact per-row statistics (``<key>~meta`` and its members: :mod:`oracles.receipts.logit_store`),
#: no longer as float32 arrays under ``<key>``, and a sampled generation its first step alone. A reader
#: refuses a receipt of another schema.
SCHEMA_VERSION = 4

#: Every outcome a test record can have. ``crashed``: the worker died mid-test; ``timeout``:
#: pytest-timeout stopped it; ``not_run``: it never started (``--deadline``, or the run was cut short).
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "crashed", "timeout", "not_run")
FAILING = frozenset({"failed", "error", "xpassed", "crashed", "timeout"})


@dataclass
class TestRecord:
    """One finished test as the receipt keeps it.

    ``check`` is the test function's name, ``record_id`` its parametrize id (``""`` when not
    parametrized); ``duration`` is seconds summed over setup, call and teardown; ``data`` is what
    the test attached through the ``receipt`` fixture.
    """

    __test__ = False  # not a pytest test class

    nodeid: str
    family: str
    check: str
    record_id: str
    outcome: str
    duration: float
    summary: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    worker: str = "main"
    resumed_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as a dict, fields in declaration order (shallow: ``data`` is shared, not copied; it
        is JSON-safe already)."""
        return dict(zip(_RECORD_FIELDS, _record_values(self)))

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "TestRecord":
        """Build from a dict read back from a receipt or partial line.

        Raises:
            FixtureError: naming ``where`` (file and line or index) and the missing or wrong field.
        """
        if not isinstance(obj, dict):
            raise FixtureError(f"{where}: a test record must be a JSON object, got {type(obj).__name__}")
        for key, kind in (("nodeid", str), ("outcome", str)):
            if not isinstance(obj.get(key), kind):
                raise FixtureError(f"{where}: field {key!r} is missing or not a {kind.__name__}")
        if obj["outcome"] not in OUTCOMES:
            raise FixtureError(f"{where}: field 'outcome' is {obj['outcome']!r}, not one of {', '.join(OUTCOMES)}")
        known = {f for f in cls.__dataclass_fields__}
        check, record_id = split_nodeid(obj["nodeid"])
        values: dict[str, Any] = {"family": "unit", "check": check, "record_id": record_id, "duration": 0.0}
        values.update({k: v for k, v in obj.items() if k in known})
        return cls(**values)


_RECORD_FIELDS = tuple(f.name for f in fields(TestRecord))
_record_values = operator.attrgetter(*_RECORD_FIELDS)  # one C call for every field: a record per test


def plain_nodeid(nodeid: str) -> str:
    """The test's nodeid without the ``@group`` suffix ``--dist loadgroup`` adds to it.

    pytest-xdist 3.8 (``xdist/remote.py``) appends ``@<xdist_group name>`` to the nodeid of a grouped
    test on the workers; receipts name a test the same way whether it ran serially or on a worker, so
    a receipt of one run resumes or compares with a receipt of the other. A ``@`` inside the
    parametrize brackets is part of the id and stays.
    """
    at = nodeid.rfind("@")
    if at > nodeid.rfind("]") and at > nodeid.rfind("::"):
        return nodeid[:at]
    return nodeid


def split_nodeid(nodeid: str) -> tuple[str, str]:
    """``"tests/x.py::test_a[ping-torch]"`` -> ``("test_a", "ping-torch")``; no brackets -> id ``""``.

    The parametrize id is everything inside the first ``[`` after the function name and the final
    ``]``, so ids holding ``::`` or brackets (``test_a[x::y]``, ``test_a[a[1]]``) stay whole.
    """
    base, bracket, rest = nodeid.partition("[")
    check = base.rsplit("::", 1)[-1]
    if bracket and rest.endswith("]"):
        return check, rest[:-1]
    return check, ""


@functools.lru_cache(maxsize=4096)
def _owner_of(head: str) -> str:
    """``"tests/x.py::TestA"`` -> ``"x::TestA"``, once per module or class: a receipt asks it for every test."""
    parts = head.split("::") if head else []
    return "::".join([Path(parts[0]).stem, *parts[1:]]) if parts else ""


def _owner(nodeid: str) -> str:
    """What holds the test function: ``"tests/x.py::TestA::test_b[p]"`` -> ``"x::TestA"``."""
    return _owner_of(nodeid.partition("[")[0].rpartition("::")[0])


def check_name(nodeid: str, check: str, table: Mapping[str, Any]) -> str:
    """The row of ``table`` (a :func:`checks_table`) that counts the test ``nodeid`` of function ``check``:
    ``check``, or ``module::check`` / ``module::Class::check`` where two owners share the name."""
    return check if check in table else f"{_owner(nodeid)}::{check}"


def checks_table(records: Iterable[TestRecord]) -> dict[str, dict[str, Any]]:
    """The ``{check: {family, ok, passed, failed: [record ids], skipped, xfailed, not_run}}`` table of a run.

    ``passed``, ``skipped``, ``xfailed`` and ``not_run`` count records by outcome (``xfailed``: a declared
    expected failure that failed as declared, apart from ``passed`` so a strict xfail is not read as a
    pass). ``ok`` is False when any record failed in any way (see :data:`FAILING`) or was not run (the
    check is not done), else True when at least one record passed or xfailed, else None (all skipped).
    A check name used by two modules or classes is qualified by its owner, as
    ``module::name`` or ``module::Class::name``. The table does not depend on test order, so an
    ``-n 2`` run gives the same table as a serial one.
    """
    owned = sorted(((r.nodeid, r, _owner(r.nodeid)) for r in records), key=operator.itemgetter(0))
    owners: dict[str, set[str]] = {}
    for _, r, owner in owned:
        owners.setdefault(r.check, set()).add(owner)
    table: dict[str, dict[str, Any]] = {}
    for _, r, owner in owned:
        key = r.check if len(owners[r.check]) == 1 else f"{owner}::{r.check}"
        row = table.get(key)
        if row is None:
            row = table[key] = {"family": r.family, "ok": None, "passed": 0, "failed": [], "skipped": 0,
                                "xfailed": 0, "not_run": 0}
        label = r.record_id or r.nodeid
        if r.outcome in FAILING:
            row["failed"].append(label)
        elif r.outcome in ("passed", "xfailed", "not_run"):
            row[r.outcome] += 1
        else:
            row["skipped"] += 1
    for row in table.values():
        row["ok"] = False if row["failed"] or row["not_run"] else (True if row["passed"] or row["xfailed"] else None)
    return dict(sorted(table.items()))


def all_ok(table: Mapping[str, Mapping[str, Any]]) -> bool:
    """True when no check failed and at least one check passed."""
    oks = [row["ok"] for row in table.values()]
    return False not in oks and True in oks


# ---------------------------------------------------------------------------------------------
# JSON safety of attached data


def check_json_safe(value: Any, key: str) -> None:
    """Refuse anything that would not round-trip through strict JSON, naming the key path.

    Allowed: None, bool, int, finite float, str, list/tuple of allowed, dict with str keys.
    Refused: sets, numpy scalars and arrays (use ``int()``/``float()`` or ``receipt.array``),
    NaN/inf, bytes, any other object.

    Raises:
        TypeError: ``"receipt data 'key.sub[3]': ..."`` naming where the bad value sits.
    """
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return
    if kind is float:
        if not math.isfinite(value):
            raise TypeError(f"receipt data {key!r}: float {value!r} is not finite and has no JSON form")
        return
    if kind in (list, tuple):
        for i, item in enumerate(value):
            check_json_safe(item, f"{key}[{i}]")
        return
    if kind is dict:
        for k, item in value.items():
            if type(k) is not str:
                raise TypeError(f"receipt data {key!r}: dict key {k!r} is a {type(k).__name__}, not a str")
            check_json_safe(item, f"{key}.{k}")
        return
    module = kind.__module__.split(".")[0]
    if module == "numpy" and getattr(value, "ndim", 0) == 0:
        hint = "a numpy scalar; convert with int() or float()"
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        hint = "an array; attach it with receipt.array(name, a), which writes the npz sidecar"
    elif kind in (set, frozenset):
        hint = "a set; JSON has no sets, attach sorted(list(...))"
    else:
        hint = f"a {module}.{kind.__qualname__}, which JSON cannot hold"
    raise TypeError(f"receipt data {key!r}: refused {hint}")


class Receipt:
    """What the ``receipt`` fixture (:mod:`oracles.plugin`) gives a test: attach JSON-safe data, or arrays to the npz sidecar.

    ``receipt["key"] = value`` and ``receipt.update(...)`` validate at once (see
    :func:`oracles.receipts.table.check_json_safe`): a set, a numpy scalar or an array raises TypeError
    naming the key. ``receipt.array(name, a)`` stores ``a`` in the run's npz sidecar under
    ``<test>::<name>`` and attaches its key, shape and dtype. The key ``units`` is written only by
    :func:`oracles.receipts.units.attach_unit` (through :meth:`put_units`), which checks each unit.
    """

    def __init__(self, data: dict[str, Any], staging: Path | None, nodeid: str) -> None:
        self._data, self._staging, self._nodeid = data, staging, nodeid

    def __setitem__(self, key: str, value: Any) -> None:
        if type(key) is not str:
            raise TypeError(f"receipt data key {key!r} is a {type(key).__name__}, not a str")
        if key == "units":
            raise TypeError("receipt data 'units': comparable units are attached with oracles.units.attach_unit, "
                            "which checks them against their kind")
        check_json_safe(value, key)
        self._data[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def put_units(self, units: list[dict[str, Any]]) -> None:
        """Store the checked units of this test (the writer :func:`oracles.receipts.units.attach_unit` calls this)."""
        check_json_safe(units, "units")
        self._data["units"] = units

    def update(self, values: dict[str, Any] | None = None, **kw: Any) -> None:
        for key, value in {**(values or {}), **kw}.items():
            self[key] = value

    def array(self, name: str, a: Any, *, logits_group: str | None = None) -> None:
        """Stage ``a`` for the npz sidecar under ``<test>::<name>`` and attach its key, shape and dtype.

        ``logits_group``: ``a`` is a unit's logits (:func:`oracles.receipts.units.attach_unit` passes the
        unit's request and unit, so every kind of one request codes on the others: a decode and a
        generation of one record), stored coded with the other arrays of its group
        (:mod:`oracles.receipts.logit_store`); other arrays are stored as attached.

        Raises:
            TypeError: an object array.
        """
        import hashlib

        import numpy as np

        arr = np.asarray(a)
        if arr.dtype.hasobject:
            raise TypeError(f"receipt array {name!r}: refused an object array (dtype {arr.dtype}); npz holds numbers")
        key = f"{self._nodeid}::{name}"
        safe = hashlib.sha256(key.encode()).hexdigest()[:16] + "_" + "".join(c if c.isalnum() else "_" for c in name)
        if self._staging is not None:
            self._staging.mkdir(parents=True, exist_ok=True)
            if logits_group is not None:  # before the array: the packer codes an array whose group it sees
                from oracles.receipts.logit_store import STAGED

                (self._staging / f"{safe}{STAGED}").write_text(json.dumps({"group": logits_group}), encoding="utf-8")
            np.save(self._staging / f"{safe}.npy", arr, allow_pickle=False)
        self._data.setdefault("arrays", {})[name] = {"npz_key": safe, "shape": list(arr.shape), "dtype": arr.dtype.str}


def check_schema_version(receipt: Mapping[str, Any], path: Path) -> None:
    """Refuse a receipt whose ``schema_version`` is not :data:`SCHEMA_VERSION`, in one line.

    Its fields may mean something else (schema 1 held units as loose data fields), so no reader guesses.

    Raises:
        FixtureError: ``"<path>: field 'schema_version' is 4, not 3: ..."`` (file, field, both versions).
    """
    version = receipt.get("schema_version")
    if type(version) is int and version == SCHEMA_VERSION:  # True == 1 and 2.0 == 2: neither is a schema
        return
    shown = "missing" if "schema_version" not in receipt else repr(version)
    raise FixtureError(f"{path}: field 'schema_version' is {shown}, not {SCHEMA_VERSION}: a receipt of another "
                       f"schema, which this plugin does not read")


def load_receipt(path: Path) -> dict[str, Any]:
    """A receipt ``.json`` as a dict, held to this schema: the loader of every command that reads one.

    Raises:
        FixtureError: unreadable or invalid JSON (:func:`oracles.receipts.files.load_json`), not a JSON
            object, or :func:`check_schema_version`'s refusal; each one line naming the file.
    """
    receipt = load_json(path)
    if not isinstance(receipt, dict):
        raise FixtureError(f"{path}: not a receipt: a JSON {type(receipt).__name__}, not an object")
    check_schema_version(receipt, path)
    return receipt


def load_records(path: Path) -> dict[str, TestRecord]:
    """Test records by nodeid from a receipt (``.json``) or a partial log (``.partial.jsonl``).

    A partial log's torn last line (a run killed mid-write) is ignored; any other bad line is an error.

    Raises:
        FixtureError: naming the file and line (partial) or test index (receipt) and the field.
    """
    path = Path(path)
    out: dict[str, TestRecord] = {}
    if path.name.endswith(".jsonl"):
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except OSError as exc:
            raise FixtureError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                if number == len(lines):  # torn final line of a killed run: no newline after it
                    break
                raise FixtureError(f"{path}:{number}:{exc.colno}: not valid JSON: {exc.msg}") from exc  # a line holds no newline
            if isinstance(obj, dict) and obj.get("event", "test") != "test":
                continue
            rec = TestRecord.from_json(obj, f"{path}:{number}")
            out[rec.nodeid] = rec
        return out
    receipt = load_json(path)
    if not isinstance(receipt, dict) or not isinstance(receipt.get("tests"), list):
        raise FixtureError(f"{path}: not a receipt: field 'tests' is missing or not a list")
    for i, obj in enumerate(receipt["tests"]):
        rec = TestRecord.from_json(obj, f"{path}: tests[{i}]")
        out[rec.nodeid] = rec
    return out
