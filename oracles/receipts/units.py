"""Comparable units: the one typed record that ``oracles compare`` and ``oracles summarize`` read from a receipt.

A *unit* is the smallest thing a reference and a port are held against each other on: one prefill, one
decode, one generation, one chat turn, one read-out question. A test attaches its units with
:func:`attach_unit` (the one writer), which stores them as a list under ``data["units"]`` of the test's
record (a chat test attaches one per turn) and their logits in the npz sidecar; readers load them with
:func:`oracles.receipts.units_reader.units_of` (the one reader). A record holds units because it holds
``units``: no other field of a test's data makes it one, so ``kind`` and the rest stay free for a
test's own figures.

A unit is keyed by ``(kind, request_sha256, unit, pin)``: no path, nodeid or machine name, so receipts
of different machines compare, and one receipt holding two pins per engine (SmolLM2 and its hybrid twin)
keeps them apart. :data:`KINDS` declares what each kind holds and which array it must carry. Numpy only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from oracles.receipts.table import Receipt

#: The field of a test record's data that holds its units.
DATA_KEY = "units"

Key = tuple[str, str, str, str]
#: Which rows of a unit's array ``oracles compare`` holds to the thresholds (:attr:`Kind.held`).
Held = Literal["all", "prefix", "first"]


@dataclass(frozen=True)
class Kind:
    """What one unit of a kind holds.

    ``fields``: which of ``tokens``, ``argmax``, ``readout`` (``keys``, ``probs``, ``argmax_key``) it
    must carry; the others it must not. ``array``: the role of its logits in the npz sidecar, a float
    array shaped as ``rows`` says (:attr:`shape`): None, one row stored as ``[V]``; an int n, ``[n, V]``;
    a letter (``T`` prompt positions, ``S`` steps), ``[T, V]``: one row per entry of the unit's
    ``argmax``, every row its family's port test holds. ``array_required`` False where a unit may have
    none (a generation that produced no step). ``greedy``: its tokens are chosen by argmax, so a
    divergent token is a failure. ``held``: which rows ``oracles compare`` holds to the thresholds,
    the rows the family's port test holds: ``all``; ``prefix``, the rows computed from the same
    prefix (:func:`oracles.checks.port.compared_rows`: through the first divergent generated token);
    ``first``, row 0 only (a sampled generation's first step comes from the prompt alone; later ones
    follow a draw). ``unit``: what the ``unit`` field names ("" allowed when it names nothing: the
    record is the unit). ``family``: the family whose tests attach it (tests/unit/test_compare_no_units.py
    holds this to the suite). ``row``: what the array's rows are, in the numbering the family's own
    tests report rows in (:attr:`Unit.array_rows`): ``position`` (prompt position, from 0), ``step``
    (decode step; step 0 comes from the prefill), ``turn`` (the unit's turn, from 0), ``slot`` (the
    read-out's answer slot, its one row). A read-out kind may hold more rows than its slot: a clef row
    carries every prompt position ``[T, V]`` (its port test holds them all), its slot the last.
    """

    name: str
    holds: str
    fields: frozenset[str]
    array: str
    family: str
    row: str
    rows: int | str | None = None
    array_required: bool = True
    greedy: bool = False
    held: Held = "all"
    unit: str = ""

    @property
    def shape(self) -> str:
        """The declared shape of the array, as messages write it: ``[V]``, ``[1, V]``, ``[S, V]``."""
        return "[V]" if self.rows is None else f"[{self.rows}, V]"

    def shape_problem(self, shape: tuple[int, ...], argmax: Sequence[int] | None, stored: bool = False) -> str | None:
        """Why an array of ``shape`` is not this kind's (:attr:`shape`), or None when it is.

        ``argmax``: the unit's per-row argmax; a kind with a letter for ``rows`` holds one row per entry.
        ``stored``: the array as the sidecar holds it (:meth:`stored_rows`: a kind holding its first row
        stores that row alone). Every row needs at least one logit.
        """
        if isinstance(self.rows, str):
            n: int | None = len(argmax or ())
            want = f"{self.shape} with {self.rows} = {n}, one row per entry of the unit's argmax"
            if stored and self.held == "first":
                n = min(n or 0, 1)
                want = f"[{n}, V], the first of the unit's {len(argmax or ())} rows (the row compare holds)"
        else:
            n, want = self.rows, self.shape
        if len(shape) != (1 if n is None else 2) or (n is not None and shape[0] != n) or shape[-1] == 0:
            return f"has shape {list(shape)}, not {want}"
        return None

    def stored_rows(self, arr: np.ndarray) -> np.ndarray:
        """The rows of an attached array the sidecar stores: those ``oracles compare`` holds when they
        are fixed at attach time (``held`` ``first``: row 0, a sampled generation's later steps follow a
        draw and are recorded by their tokens), else every row."""
        return arr[:1] if self.held == "first" and arr.ndim == 2 else arr


def _kind(name: str, holds: str, carries: str, array: str, family: str, row: str, **kw: Any) -> Kind:
    return Kind(name, holds, frozenset(carries.split()), array, family, row, **kw)


_READOUT = "the question id"
#: Every kind a unit may be, the one table writer and readers share.
KINDS: dict[str, Kind] = {k.name: k for k in (
    _kind("prefill", "a prompt record's cold prefill: per-position argmax, every position's logits [T, V]", "argmax",
          "logits", "mtplx", "position", rows="T", greedy=True),
    _kind("decode", "greedy decode through the cache to a stop token: tokens, per-step argmax, every step's logits "
                    "[S, V]", "tokens argmax", "step_logits", "mtplx", "step", rows="S", greedy=True, held="prefix"),
    _kind("generate-greedy", "the engine's own greedy generation: tokens, per-step argmax, every step's logits [S, V] "
                             "(none when no step ran)", "tokens argmax", "step_logits", "mtplx", "step", rows="S",
          array_required=False, greedy=True, held="prefix"),
    _kind("generate-sampled", "the engine's own seeded sampled generation: as generate-greedy, its tokens only "
                              "recorded, its first step held (the one row stored)", "tokens argmax", "step_logits",
          "mtplx", "step",
          rows="S", array_required=False, held="first"),
    _kind("chat", "one chat turn through the live cache: the suffix ids, the greedy tokens, the warm next-token "
                  "logits [V]", "tokens", "warm_logits", "mtplx_chat", "turn", greedy=True, unit="turn<n>"),
    _kind("d1-row", "a d1 question read out on its own row: keys, probabilities, slot logits [1, V]", "readout",
          "slot_logits", "d1", "slot", rows=1, unit=_READOUT),
    _kind("d1-tree", "a d1 question read out on its tree branch: as d1-row", "readout", "slot_logits", "d1",
          "slot", rows=1, unit=_READOUT),
    _kind("clef-row", "a question about pictures in one arm (request_sha256 names record and arm): keys, "
                      "probabilities, per-position argmax, every prompt position's logits [T, V] (text and picture "
                      "tokens; the answer slot is the last)", "readout argmax", "logits", "clef", "position",
          rows="T", unit=_READOUT),
)}
#: The families whose tests attach units (a receipt without units is told to run one of them).
ATTACHED_BY: tuple[str, ...] = tuple(dict.fromkeys(k.family for k in KINDS.values()))


@dataclass(frozen=True)
class Unit:
    """One comparable unit (module docstring); ``test`` is the nodeid holding it, for messages, never matched.

    ``ids``: the input token ids (a chat turn: its suffix); ``tokens``/``argmax``: generated tokens and
    per-row argmax where the kind holds them; ``keys``/``probs``/``argmax_key``: the read-out;
    ``arrays``: role -> npz key in the receipt's sidecar; ``record``: the record's id, for people.
    """

    kind: str
    request_sha256: str
    unit: str
    pin: str
    engine: str
    record: str
    ids: tuple[int, ...]
    tokens: tuple[int, ...] | None = None
    argmax: tuple[int, ...] | None = None
    keys: tuple[str, ...] | None = None
    probs: tuple[float, ...] | None = None
    argmax_key: str | None = None
    arrays: Mapping[str, str] = field(default_factory=dict)
    test: str = ""

    @property
    def key(self) -> Key:
        return (self.kind, self.request_sha256, self.unit, self.pin)

    @property
    def label(self) -> str:
        return f"{self.record}/{self.unit}" if self.unit else self.record

    @property
    def spec(self) -> Kind:
        return KINDS[self.kind]

    @property
    def array_rows(self) -> tuple[int, ...]:
        """Per row of the unit's array, its index in the numbering :attr:`Kind.row` names.

        A prefill's array holds every position and a decode's or generation's every step, one row per
        argmax entry: ``0 .. len(argmax) - 1``. A chat turn's one row is the turn (``turn<n>``: n - 1);
        a read-out's one row is the slot (0). Empty when there is no array (a generation without a step).
        Derived from what a unit already holds: nothing about rows is stored.
        """
        row = self.spec.row
        if row in ("position", "step"):  # no argmax: no step ran, and there is no array
            return tuple(range(len(self.argmax or ())))
        if row == "turn" and self.unit.removeprefix("turn").isdigit():
            return (int(self.unit.removeprefix("turn")) - 1,)
        return tuple(range(self.spec.rows if isinstance(self.spec.rows, int) else 1))

    def to_json(self) -> dict[str, Any]:
        """The stored form: the fields, lists for tuples, absent fields left out (``test`` never stored)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "test"}
        return {k: list(v) if isinstance(v, tuple) else dict(v) if k == "arrays" else v
                for k, v in out.items() if v is not None}


class BadField(Exception):
    """A field of a unit is wrong: ``field``, ``problem``, and the exception type a writer raises for it.

    Raised by :func:`parse_unit`; the writer (:func:`attach_unit`) and the reader
    (:func:`oracles.receipts.units_reader.units_of`) word it for their callers."""

    def __init__(self, field: str, problem: str, kind: type[Exception] = ValueError) -> None:
        super().__init__(field, problem)
        self.field, self.problem, self.kind = field, problem, kind


_SHA256 = re.compile(r"[0-9a-f]{64}")
_STRINGS = ("pin", "engine", "record")
_FIELDS = frozenset({"kind", "request_sha256", "unit", *_STRINGS, "ids", "tokens", "argmax", "keys", "probs",
                     "argmax_key", "arrays"})


def _ints(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        raise BadField(name, "is missing or not a list of ints", TypeError)
    return tuple(value)


def _top(keys: Sequence[str], probs: Sequence[float]) -> str:
    """The key of the largest probability, the lowest index on a tie (as :func:`oracles.checks.readout.argmax`)."""
    return keys[int(np.argmax(np.asarray(probs, dtype=np.float64)))]


def _readout(obj: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[float, ...], str]:
    keys, probs = obj.get("keys"), obj.get("probs")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise BadField("keys", "is missing or not a non-empty list of distinct strings", TypeError)
    if (not isinstance(probs, list) or len(probs) != len(keys)
            or not all(type(p) in (int, float) and math.isfinite(p) for p in probs)):
        raise BadField("probs", f"is missing or not {len(keys)} finite numbers (one per key)", TypeError)
    top = _top(keys, probs)
    if obj.get("argmax_key") != top:
        raise BadField("argmax_key", f"is {obj.get('argmax_key')!r}, not {top!r}, the key of the largest probability")
    return tuple(keys), tuple(float(p) for p in probs), top


def _head(obj: Mapping[str, Any]) -> Kind:
    """The declared kind of ``obj`` after checking its unknown fields, kind, sha256 and strings."""
    extra = sorted(set(obj) - _FIELDS)
    if extra:
        raise BadField(extra[0], f"is not a field of a unit (fields: {', '.join(sorted(_FIELDS))})", TypeError)
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise BadField("kind", f"is {kind!r}, not one of the declared kinds ({', '.join(KINDS)})",
                   ValueError if isinstance(kind, str) else TypeError)
    sha = obj.get("request_sha256")
    if not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
        raise BadField("request_sha256", f"is {'missing' if sha is None else repr(sha)[:20]}, not 64 lowercase hex "
                                     f"digits (a {kind} unit is matched by it)")
    for name in _STRINGS:
        if not isinstance(obj.get(name), str) or not obj[name]:
            raise BadField(name, f"is {obj.get(name)!r}, not a non-empty string", TypeError)
    spec = KINDS[kind]
    unit = obj.get("unit")
    if not isinstance(unit, str) or (spec.unit and not unit):
        raise BadField("unit", f"is {unit!r}, not {'a non-empty string (' + spec.unit + ')' if spec.unit else 'a string'}",
                   TypeError)
    return spec


def parse_unit(obj: Any) -> Unit:
    """A stored unit (a JSON object) checked against its kind's declaration (:data:`KINDS`).

    Raises:
        BadField: the first wrong field (:func:`attach_unit` and :func:`oracles.receipts.units_reader.units_of` word it).
    """
    if not isinstance(obj, dict):
        raise BadField("", f"is a JSON {type(obj).__name__}, not a unit (an object)", TypeError)
    spec = _head(obj)
    ids = _ints(obj.get("ids"), "ids")
    if not ids:
        raise BadField("ids", "is empty: a unit's request has input ids")
    got: dict[str, Any] = {}
    for name in ("tokens", "argmax"):
        if name in spec.fields:
            got[name] = _ints(obj.get(name), name)
        elif obj.get(name) is not None:
            raise BadField(name, f"is given, but a {spec.name} unit holds no {name}", TypeError)
    if "readout" in spec.fields:
        got["keys"], got["probs"], got["argmax_key"] = _readout(obj)
    else:
        for name in ("keys", "probs", "argmax_key"):
            if obj.get(name) is not None:
                raise BadField(name, f"is given, but a {spec.name} unit holds no read-out", TypeError)
    arrays = obj.get("arrays", {})
    if not isinstance(arrays, dict) or not all(isinstance(v, str) for v in arrays.values()):
        raise BadField("arrays", "is not an object of role -> npz key strings", TypeError)
    if set(arrays) - {spec.array}:
        raise BadField(f"arrays.{min(set(arrays) - {spec.array})}", f"is not an array of a {spec.name} unit "
                                                                      f"(it carries {spec.array})")
    if spec.array_required and spec.array not in arrays:
        raise BadField(f"arrays.{spec.array}", f"is missing: a {spec.name} unit carries its {spec.array} "
                                           f"{spec.shape}")
    return Unit(spec.name, obj["request_sha256"], obj["unit"], obj["pin"], obj["engine"], obj["record"], ids,
                arrays=dict(arrays), **got)


# ---------------------------------------------------------------------------------------------
# the writer


def _as_list(value: Any, name: str, numeric: str) -> list[Any] | None:
    """A sequence or 1-D array of ints (``numeric`` ``"iu"``) or real numbers (``"iuf"``) as a Python list.

    Raises:
        TypeError: a string, bools, or numbers of another kind, naming ``name`` (None stays None).
    """
    if value is None:
        return None
    arr = None if isinstance(value, (str, bytes)) else np.asarray(value)
    if arr is None or arr.ndim != 1 or not (arr.dtype.kind in numeric or arr.size == 0):
        what = "ints" if numeric == "iu" else "numbers"
        raise TypeError(f"field {name!r} is {type(value).__name__}, not a sequence of {what}")
    return [int(x) for x in arr] if numeric == "iu" else [float(x) for x in arr]


def _as_array(spec: Kind, role: str, a: Any, argmax: Sequence[int] | None) -> np.ndarray:
    """``a`` as an array of the shape and dtype ``spec`` declares for ``role`` (:meth:`Kind.shape_problem`:
    a ``[S, V]`` kind holds one row per entry of ``argmax``).

    Raises:
        ValueError: an undeclared role or a wrong shape; TypeError: not a float array (names the role).
    """
    if role != spec.array:
        raise ValueError(f"field 'arrays.{role}' is not an array of a {spec.name} unit (it carries {spec.array})")
    arr = np.asarray(a)
    if arr.dtype.kind != "f":
        raise TypeError(f"field 'arrays.{role}' has dtype {arr.dtype}, not a float array")
    problem = spec.shape_problem(arr.shape, argmax)
    if problem:
        raise ValueError(f"field 'arrays.{role}' {problem}")
    return arr


def _stored_form(kind: str, given: dict[str, Any],
                 arrays: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON object of a unit about to be attached (npz keys still empty) and its arrays, converted.

    Raises:
        TypeError, ValueError: as :func:`_as_list` and :func:`_as_array`.
    """
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    argmax = _as_list(given["argmax"], "argmax", "iu")
    arrs = {role: _as_array(spec, role, a, argmax) for role, a in arrays.items()} if spec else {}
    keys = given["keys"]
    if isinstance(keys, str):
        raise TypeError("field 'keys' is a string, not a sequence of strings")
    obj = {"kind": kind, **given, "keys": None if keys is None else list(keys),
           "ids": _as_list(given["ids"], "ids", "iu"),
           "tokens": _as_list(given["tokens"], "tokens", "iu"), "argmax": argmax,
           "probs": _as_list(given["probs"], "probs", "iuf"), "arrays": {role: "" for role in arrs}}
    if spec is not None and "readout" in spec.fields and obj["keys"] and obj["probs"]:
        obj["argmax_key"] = _top(obj["keys"], obj["probs"])
    return {k: v for k, v in obj.items() if v is not None}, arrs


def attach_unit(receipt: Receipt, kind: str, *, request_sha256: str, pin: str, engine: str, record: str,
                ids: Sequence[int | np.integer[Any]] | np.ndarray, unit: str = "",
                tokens: Sequence[int | np.integer[Any]] | np.ndarray | None = None,
                argmax: Sequence[int | np.integer[Any]] | np.ndarray | None = None, keys: Sequence[str] | None = None,
                probs: Sequence[float] | np.ndarray | None = None, arrays: Mapping[str, Any] | None = None) -> Unit:
    """Attach one comparable unit to this test's record: ``data["units"]`` gains it, its arrays go to the npz.

    Args:
        kind: one of :data:`KINDS`; the other arguments are the :class:`Unit`'s fields; ``argmax_key``
            is derived from ``keys`` and ``probs``. Integer sequences may be numpy arrays.
        arrays: role -> float array, the roles and shapes the kind declares (``[V]``, ``[1, V]``, or
            ``[T, V]``/``[S, V]``: one row per entry of ``argmax``).

    Returns:
        The unit as stored (its ``arrays`` hold npz keys).

    Raises:
        TypeError: a field of the wrong type; ValueError: an unknown kind, a wrong value or shape, a
            missing array, or a unit this test already attached (same key). Each names the unit and the
            field, raised in the test that attached it, before anything is attached.
    """
    where = f"attach_unit({kind!r}, record {record!r}, unit {unit!r})"
    given = {"request_sha256": request_sha256, "unit": unit, "pin": pin, "engine": engine, "record": record,
             "ids": ids, "tokens": tokens, "argmax": argmax, "keys": keys, "probs": probs}
    try:
        obj, arrs = _stored_form(kind, given, arrays or {})
        new = parse_unit(obj)  # npz keys still empty: nothing is attached before every field holds
    except BadField as bad:
        raise bad.kind(f"{where}: field {bad.field!r} {bad.problem}") from None
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None
    stored = list(receipt.get(DATA_KEY) or [])
    if any(parse_unit(u).key == new.key and parse_unit(u).engine == engine for u in stored):
        raise ValueError(f"{where}: this test already attached a {kind} unit of request {request_sha256[:12]} on "
                         f"pin {pin!r} for engine {engine!r}; a unit is attached once per engine")
    for role, arr in arrs.items():
        name = f"units[{len(stored)}].{role}"
        receipt.array(name, new.spec.stored_rows(arr), logits_group=f"{request_sha256} {unit}")
        obj["arrays"][role] = receipt["arrays"][name]["npz_key"]
    done = replace(new, arrays=dict(obj["arrays"]))
    receipt.put_units([*stored, done.to_json()])
    return done
