"""The one reader of comparable units: every unit of a receipt (:func:`units_of`), checked against its
kind's declaration (:mod:`oracles.receipts.units`), and a unit's logits from the npz sidecar (:func:`unit_rows`,
:func:`unit_array`).
Numpy only.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from oracles.errors import ReceiptError
from oracles.receipts.logit_store import Rows
from oracles.receipts.table import SCHEMA_VERSION
from oracles.receipts.units import ATTACHED_BY, DATA_KEY, BadField, Unit, parse_unit


def check_schema(receipt: Any, path: Path) -> None:
    """Refuse, in one line, what is not a receipt of this schema (units are read from this schema only).

    Raises:
        ReceiptError: not a JSON object with a ``tests`` list, or ``schema_version`` is not
            :data:`oracles.receipts.table.SCHEMA_VERSION` (a receipt of schema 1 holds its units as loose
            fields of a test's data, one of schema 2 the last row of a prefill, decode or generation
            alone, one of schema 3 its logits as float32 arrays where this schema reads codes: no reader
            guesses at any).
    """
    if not isinstance(receipt, dict):
        raise ReceiptError(f"{path}: not a receipt (a JSON object with a 'tests' list)")
    if not isinstance(receipt.get("tests"), list):
        raise ReceiptError(f"{path}: field 'tests' is missing or not a list; not a receipt")
    version = receipt.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ReceiptError(f"{path}: field 'schema_version' is {version!r}, not {SCHEMA_VERSION}: its comparable units "
                           f"are not the records this plugin declares (oracles/receipts/units.py); re-run its tests with this "
                           f"plugin to read them")


def units_of(receipt: Any, path: Path) -> list[Unit]:
    """Every unit of a receipt, in receipt order, each with ``test`` set to its record's nodeid.

    Raises:
        ReceiptError: :func:`check_schema`'s refusals; an item of ``tests`` that is not an object; a
            ``data.units`` that is not a list; a unit field missing or malformed (file, record nodeid
            and field named, e.g. ``units[0].request_sha256``).
    """
    check_schema(receipt, path)
    out: list[Unit] = []
    for i, t in enumerate(receipt["tests"]):
        if not isinstance(t, dict):
            raise ReceiptError(f"{path}: field 'tests[{i}]' is a JSON {type(t).__name__}, not a test record (an object)")
        data = t.get("data")
        stored = data.get(DATA_KEY) if isinstance(data, dict) else None
        if stored is None:
            continue
        test = str(t.get("nodeid") or f"tests[{i}]")
        if not isinstance(stored, list):
            raise ReceiptError(f"{path}: record {test}: field {DATA_KEY!r} is a JSON {type(stored).__name__}, not a list")
        for n, obj in enumerate(stored):
            try:
                u = parse_unit(obj)
            except BadField as bad:
                name = f"{DATA_KEY}[{n}]" + (f".{bad.field}" if bad.field else "")
                raise ReceiptError(f"{path}: record {test}: field {name!r} {bad.problem}") from None
            out.append(replace(u, test=test))
    return out


def no_units(receipt: dict[str, Any], path: Path) -> str:
    """Why a receipt of this schema holds no unit, in one line: which families attach units
    (:data:`oracles.receipts.units.ATTACHED_BY`) and which its tests ran (each test record's ``family``).

    A port-family test holds the port against the reference inside the test and attaches none, so a
    ``-m port`` run's receipt is told apart from one whose engine is missing.
    """
    ran: dict[str, int] = {}
    for t in receipt["tests"]:
        family = str(t.get("family") or "none") if isinstance(t, dict) else "none"
        ran[family] = ran.get(family, 0) + 1
    tests = ", ".join(f"{f} {n}" for f, n in ran.items())
    return (f"{path}: holds no comparable units at all: its {len(receipt['tests'])} tests "
            f"{f'(families: {tests}) ' if ran else ''}attached none; units are attached by tests of families "
            f"{', '.join(ATTACHED_BY)} (a port-family test holds the port against the reference in the test "
            f"and attaches none)")


def unit_rows(u: Unit, store: Any, path: Path) -> Rows | None:
    """The unit's logits (its kind's declared array) as stored, or None when it carries none.

    Args:
        store: the receipt's sidecar (:class:`oracles.receipts.logit_store.LogitStore`), or None.

    Returns:
        :class:`oracles.receipts.logit_store.Rows`: ``values`` float32 shaped as
        :data:`oracles.receipts.units.KINDS` declares for ``u.kind`` as stored (``[V]``, ``[1, V]``, or
        ``[T, V]``/``[S, V]`` with one row per entry of ``u.argmax``; a sampled generation its first
        row: :meth:`oracles.receipts.units.Kind.shape_problem`), ``error`` the bound on their distance
        from the attached float32 rows, ``stats`` those rows' exact argmax, top-2 gap and sha256.

    Raises:
        ReceiptError: the unit names an array the sidecar lacks or cannot read (or there is no
            sidecar), or one of another dtype or shape than its kind declares (file, record and field).
    """
    spec = u.spec
    key = u.arrays.get(spec.array)
    if key is None:
        return None

    def bad(problem: str) -> ReceiptError:
        return ReceiptError(f"{path}: record {u.test}: unit {u.kind} {u.label}: field 'arrays.{spec.array}' {problem}")

    if store is None:
        raise bad("names an array, but the receipt has no npz sidecar (field 'arrays')")
    if key not in store:
        raise bad(f"names npz key {key!r}, which the npz sidecar lacks")
    try:
        got = store.rows(key)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise bad(f"names npz key {key!r}, which cannot be read: {exc}") from exc
    a = got.values
    if a.dtype.kind != "f":
        raise bad(f"has dtype {a.dtype}, not a float array")
    problem = spec.shape_problem(a.shape, u.argmax, stored=True)
    if problem:
        raise bad(problem)
    return replace(got, values=a.astype(np.float32))


def unit_array(u: Unit, store: Any, path: Path) -> np.ndarray | None:
    """The values of :func:`unit_rows` (float32), or None when the unit carries no array.

    Raises:
        ReceiptError: as :func:`unit_rows`.
    """
    got = unit_rows(u, store, path)
    return None if got is None else got.values
