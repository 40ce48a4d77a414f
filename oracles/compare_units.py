"""The comparable units of a receipt and the figures of one matched pair (for ``oracles compare``).

A *unit* is the smallest thing a reference and a port are held against each other on. A test record
is comparable when its ``data`` holds the strings ``kind``, ``engine`` and ``request_sha256``; its
units are keyed by ``(kind, request_sha256, unit)``, where ``unit`` names the part of the request the
unit holds:

* execution kinds (``prefill``, ``decode``, ``generate-*``): one unit per record, ``unit`` the
  record's own ``unit`` field or ``""``; array ``last_logits`` (may be absent: an empty generation);
* ``chat``: one unit per turn, ``unit`` = ``turn<n>``; array ``turn<n>_warm_logits``;
* read-out kinds (:data:`READOUT_KINDS`, d1 and clef): one unit per question, ``unit`` = the question id,
  with ``ids``, ``keys``, ``probs``, ``argmax_key`` and the array ``slot_logits`` ``[1, V]``, all
  required (a missing or malformed one is bad input).

The key holds no path, nodeid or machine name, so receipts of different machines compare. Numpy only.
"""

from __future__ import annotations

import math
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oracles.checks.port import first_divergence, port_figures, readout_failures, readout_figures, threshold_failures
from oracles.errors import ReceiptError

#: Kinds whose tokens are greedy, so a divergent token is a failure (sampled ones are only recorded).
GREEDY_KINDS = ("prefill", "decode", "generate-greedy", "chat")
#: Kinds read out at one answer slot: d1's row path and tree path's branch of each question, and clef's
#: row of a question about pictures (``request_sha256`` names the record in one arm).
READOUT_KINDS = ("d1-row", "d1-tree", "clef-row")

Key = tuple[str, str, str]


@dataclass
class Unit:
    """One comparable unit of one receipt.

    ``ids``: the input token ids; ``tokens``: generated tokens (None when the kind generates none);
    ``argmax``: per-position argmax the record lists (None when absent); ``array``: name of its
    logits in the npz sidecar (``None`` when the record attaches none); ``keys``/``probs``/``argmax_key``:
    the read-out (read-out kinds only). ``test`` is the nodeid, used in messages only, never to match.
    """

    kind: str
    request_sha256: str
    unit: str
    engine: str
    test: str
    label: str
    ids: list[int]
    tokens: list[int] | None
    argmax: list[int] | None
    array: str | None
    array_entry: dict[str, Any] | None
    keys: list[str] | None = None
    probs: list[float] | None = None
    argmax_key: str | None = None

    @property
    def key(self) -> Key:
        return (self.kind, self.request_sha256, self.unit)


def _bad(path: Path, test: str, field: str, problem: str) -> ReceiptError:
    return ReceiptError(f"{path}: record {test}: field {field!r} {problem}")


def _int_list(value: Any, path: Path, test: str, field: str) -> list[int]:
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        raise _bad(path, test, field, "is missing or not a list of ints")
    return value


def _opt_ints(obj: dict[str, Any], field: str, path: Path, test: str, where: str = "") -> list[int] | None:
    """``obj[field]`` when absent or null (None), else a list of ints (the field named when it is not)."""
    value = obj.get(field)
    return None if value is None else _int_list(value, path, test, where + field)


def _readout_unit(data: dict[str, Any], path: Path, test: str) -> Unit:
    unit = data.get("unit")
    if not isinstance(unit, str) or not unit:
        raise _bad(path, test, "unit", "is missing or not a non-empty string (the question id)")
    ids = _int_list(data.get("ids"), path, test, "ids")
    keys = data.get("keys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise _bad(path, test, "keys", "is missing or not a non-empty list of distinct strings")
    probs = data.get("probs")
    if (not isinstance(probs, list) or len(probs) != len(keys)
            or not all(type(p) in (int, float) and math.isfinite(p) for p in probs)):
        raise _bad(path, test, "probs", f"is missing or not {len(keys)} finite numbers (one per key)")
    top = keys[int(np.argmax(np.asarray(probs, dtype=np.float64)))]
    if data.get("argmax_key") != top:
        raise _bad(path, test, "argmax_key", f"is {data.get('argmax_key')!r}, not {top!r}, the key of the largest probability")
    entry = (data.get("arrays") or {}).get("slot_logits") if isinstance(data.get("arrays"), dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("npz_key"), str):
        raise _bad(path, test, "arrays.slot_logits", "is missing: a read-out unit needs its slot logits [1, V]")
    label = f"{data.get('record', data['request_sha256'][:12])}/{unit}"
    return Unit(data["kind"], data["request_sha256"], unit, data["engine"], test, label, ids, None, None,
                "slot_logits", entry, list(keys), [float(p) for p in probs], top)


def _entry(data: dict[str, Any], name: str, path: Path, test: str) -> dict[str, Any] | None:
    arrays = data.get("arrays")
    entry = arrays.get(name) if isinstance(arrays, dict) else None
    if entry is not None and not (isinstance(entry, dict) and isinstance(entry.get("npz_key"), str)):
        raise _bad(path, test, f"arrays.{name}", "has no 'npz_key' string")
    return entry


#: Every kind :func:`units_of` reads a unit from.
UNIT_KINDS = (*GREEDY_KINDS, "generate-sampled", *READOUT_KINDS)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _is_unit_record(data: dict[str, Any], path: Path, test: str) -> bool:
    """Whether a record's ``data`` is a comparable unit; a record that starts to be one and is
    malformed is bad input, never skipped (it would shrink the comparison without a word).

    A record with all of ``kind``, ``engine`` and ``request_sha256`` is meant to be a unit, and so is
    one with ``engine`` and a unit kind (:data:`UNIT_KINDS`) or a non-string ``kind``. Others are not
    units and are skipped: per-engine records of another kind (a d1 red arm: ``kind`` ``word_flip``
    with ``engine``), a port test's own figures (``kind`` and ``request_sha256``, no ``engine``),
    records with ``engine`` alone.

    Raises:
        ReceiptError: a meant unit whose ``kind`` or ``engine`` is not a non-empty string or whose
            ``request_sha256`` is not 64 lowercase hex digits (file, record and field named).
    """
    kind = data.get("kind")
    meant = all(k in data for k in ("kind", "engine", "request_sha256")) or (
        "engine" in data and "kind" in data and (kind in UNIT_KINDS or not isinstance(kind, str)))
    if not meant:
        return False
    for field in ("kind", "engine"):
        if not isinstance(data.get(field), str) or not data[field]:
            raise _bad(path, test, field, f"is {data.get(field)!r}, not a non-empty string (a comparable record "
                                          f"needs kind, engine and request_sha256)")
    sha = data.get("request_sha256")
    if not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
        raise _bad(path, test, "request_sha256", f"is {'missing' if sha is None else repr(sha)[:20]}, not 64 lowercase hex "
                                                 f"digits (a {kind} record is matched by it)")
    return True


def units_of(receipt: dict[str, Any], path: Path) -> list[Unit]:
    """Every comparable unit of a receipt (module docstring), in receipt order.

    Raises:
        ReceiptError: the receipt has no ``tests`` list, an item of it is not an object, or a unit
            record's field is missing or malformed (file, record nodeid and field named).
    """
    tests = receipt.get("tests")
    if not isinstance(tests, list):
        raise ReceiptError(f"{path}: field 'tests' is missing or not a list; not a receipt")
    out: list[Unit] = []
    for i, t in enumerate(tests):
        if not isinstance(t, dict):
            raise ReceiptError(f"{path}: field 'tests[{i}]' is a JSON {type(t).__name__}, not a test record (an object)")
        data = t.get("data")
        test = str(t.get("nodeid") or f"tests[{i}]")
        if not (isinstance(data, dict) and _is_unit_record(data, path, test)):
            continue
        kind, sha = data["kind"], data["request_sha256"]
        name_of = str(data.get("record") or sha[:12])  # the record id where the test gives it, for people
        if kind in READOUT_KINDS:
            out.append(_readout_unit(data, path, test))
        elif kind == "chat":
            for n, turn in enumerate(data.get("turns") or [], 1):
                if not isinstance(turn, dict):
                    raise _bad(path, test, f"turns[{n - 1}]", "is not an object")
                name = f"turn{turn.get('turn', n)}"
                where = f"turns[{n - 1}]."
                out.append(Unit(kind, sha, name, data["engine"], test, f"{name_of}/{name}",
                                _opt_ints(turn, "suffix_ids", path, test, where) or [],
                                _opt_ints(turn, "tokens", path, test, where), None, f"{name}_warm_logits",
                                _entry(data, f"{name}_warm_logits", path, test)))
        else:
            unit = data.get("unit", "")
            if not isinstance(unit, str):
                raise _bad(path, test, "unit", "is not a string")
            out.append(Unit(kind, sha, unit, data["engine"], test, name_of + (f"/{unit}" if unit else ""),
                            _opt_ints(data, "ids", path, test) or [], _opt_ints(data, "tokens", path, test),
                            _opt_ints(data, "argmax", path, test), "last_logits",
                            _entry(data, "last_logits", path, test)))
    return out


def find_sidecar(receipt: dict[str, Any], path: Path) -> tuple[Path | None, str | None]:
    """The receipt's npz sidecar and, when it is not the recorded one, a note saying which was used.

    The sidecar is ``receipt["arrays"]`` beside the JSON; when that file is missing (the pair was
    renamed or copied as ``R.json`` + ``R.npz``), the file with the JSON's stem and ``.npz`` is used.
    ``(None, None)`` when the receipt names no sidecar.

    Raises:
        ReceiptError: field ``arrays`` is not a string, or neither file exists (both named).
    """
    name = receipt.get("arrays")
    if not name:
        return None, None
    if not isinstance(name, str):
        raise ReceiptError(f"{path}: field 'arrays' is {name!r}, not the npz sidecar's file name")
    recorded = path.parent / name
    if recorded.is_file():
        return recorded, None
    namesake = path.with_suffix(".npz")
    if namesake.is_file():
        return namesake, f"{path}: npz sidecar {namesake} (the recorded {name} is missing; using the JSON's namesake)"
    raise ReceiptError(f"{path}: field 'arrays': its npz sidecar {recorded} is missing, and so is {namesake}")


def load_npz(npz: Path | None, path: Path) -> Any:
    """The npz sidecar ``npz`` of receipt ``path`` opened (lazily, no pickles), or None when ``npz`` is None.

    Raises:
        ReceiptError: the file is not a readable npz archive (both files named).
    """
    if npz is None:
        return None
    try:
        return np.load(npz, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ReceiptError(f"{path}: field 'arrays': npz sidecar {npz} cannot be read: {exc}") from exc


def unit_array(u: Unit, npz: Any, path: Path) -> np.ndarray | None:
    """The unit's logits as float32, or None when the record attaches none (execution kinds only).

    Raises:
        ReceiptError: the record names an array the sidecar lacks (or there is no sidecar), or a
            read-out unit's array is not ``[1, V]`` (file, record and field named).
    """
    if u.array_entry is None:
        return None
    field = f"arrays.{u.array}"
    if npz is None:
        raise _bad(path, u.test, field, "names an array, but the receipt has no npz sidecar (field 'arrays')")
    if u.array_entry["npz_key"] not in npz:
        raise _bad(path, u.test, field, f"names npz key {u.array_entry['npz_key']!r}, which the npz sidecar lacks")
    try:
        a = np.asarray(npz[u.array_entry["npz_key"]])
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise _bad(path, u.test, field, f"names npz key {u.array_entry['npz_key']!r}, which cannot be read: {exc}") from exc
    if a.dtype.kind != "f":
        raise _bad(path, u.test, field, f"has dtype {a.dtype}, not a float array")
    if u.kind in READOUT_KINDS and (a.ndim != 2 or a.shape[0] != 1):
        raise _bad(path, u.test, field, f"has shape {list(a.shape)}, not [1, V]")
    return a.astype(np.float32)


def compare_pair(r: Unit, p: Unit, a: np.ndarray | None, b: np.ndarray | None) -> dict[str, Any]:
    """One comparison row of a matched pair (``r`` reference, ``p`` port, ``a``/``b`` their logits):
    figures, ``failures`` (one line each, reasons for exit 1), ``held`` (what was held to a threshold:
    ``tokens`` of a greedy kind, ``logits``, ``read-out``), ``status`` and ``ok``.

    ``status`` is ``"FAIL"`` (``ok`` False) when a failure is listed, ``"ok"`` (``ok`` True) when
    something was held and passed, and ``"recorded only"`` (``ok`` None) when nothing but the prompt
    ids was held: a sampled generation whose tokens diverged, so its logits are not comparable and its
    tokens are not expected to agree; such a row can fail only on its prompt ids."""
    row: dict[str, Any] = {"kind": r.kind, "unit": r.unit, "request_sha256": r.request_sha256, "label": r.label,
                           "ref_test": r.test, "port_test": p.test, "ids_equal": r.ids == p.ids}
    fails = [] if row["ids_equal"] else [f"ids differ at position {first_divergence(r.ids, p.ids)}"]
    if r.argmax is not None and p.argmax is not None and len(r.argmax) and len(r.argmax) == len(p.argmax):
        row["argmax_agreement"] = float(np.mean(np.asarray(r.argmax) == np.asarray(p.argmax)))
    held: list[str] = []
    if r.tokens is not None and p.tokens is not None:
        row["first_divergent_token"] = first_divergence(r.tokens, p.tokens)
        if r.kind in GREEDY_KINDS:
            held.append("tokens")
            if row["first_divergent_token"] is not None:
                fails.append(f"greedy tokens diverge at {row['first_divergent_token']}")
    if row.get("first_divergent_token") is not None:
        a = b = None
        row["logits"] = "not compared: the token sequences differ before the last row"
    elif r.kind in READOUT_KINDS and not row["ids_equal"]:
        a = b = None
        row["logits"] = "not compared: the rows' ids differ"
    if a is not None and b is not None:
        try:
            fig = port_figures(a, b)
        except ValueError as exc:
            fig, fails = {}, [*fails, str(exc)]
        row.update({k: fig[k] for k in ("max_abs", "nmse", "kl_mean", "kl_max", "bit_equal") if k in fig})
        if fig:
            held.append("logits")
            if r.kind in READOUT_KINDS:
                row["argmax_agreement"] = fig["argmax_agreement"]
            fails += threshold_failures(fig)
    if r.kind in READOUT_KINDS and r.keys is not None and p.keys is not None:
        if r.keys != p.keys:
            fails.append(f"read-out keys differ: reference {r.keys} vs port {p.keys}")
        else:
            rf = readout_figures(r.keys, r.probs or [], p.probs or [])
            row.update(rf)
            held.append("read-out")
            fails += readout_failures(rf)
    row["failures"], row["held"] = fails, held
    row["status"] = "FAIL" if fails else ("ok" if held else "recorded only")
    row["ok"] = {"FAIL": False, "ok": True}.get(row["status"])
    return row
