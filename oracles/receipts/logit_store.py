"""How a receipt's npz sidecar stores unit logits: packed 2-byte codes with their error, read back as rows.

A unit's logits (:func:`oracles.receipts.units.attach_unit`) are staged as ``<key>.npy`` with
``<key>.logits.json`` beside them naming their *group* (kind, request sha256, unit: the arrays a
comparison holds against each other). :func:`pack` writes the sidecar: every other array as it was
(``<key>.npy``, float32 or whatever the test attached), a logit array holding a value that is not
finite too (evidence: the reader names it), and each other logit array as the members

``<key>~meta``
    a JSON string: ``codec`` (:data:`oracles.checks.logit_codec.CODECS`, or ``same``: the array is
    byte for byte another's, ``same_as``), ``shape``, ``error`` (max |decoded - attached|, logit units),
    ``base`` and ``base_rows`` (a ``d16`` residual's array and how many of its leading rows), ``group``
``<key>~codes``, ``<key>~lo``, ``<key>~step``
    the code (:mod:`oracles.checks.logit_codec`)
``<key>~argmax``, ``<key>~gap``, ``<key>~sha``
    the exact per-row argmax, top-2 gap and sha256 of the attached float32 rows

Within a group the arrays are coded in a fixed order (most rows first, then key) and each is a ``d16``
residual on the earlier array (or its leading rows) that gives the smallest codes, when they fit: a
port's rows on the reference's cost a fraction of a byte a logit once deflated. Residual codes are
deflated (measured: 0.09-0.14 bytes a logit), and so are ``u16`` and ``r16`` codes: on make test's,
deflate at level 6 saves 7.1 % of ``u16`` codes (30.4 MB -> 28.2 MB, 45 MB/s) and 37 % of the one ``r16``
array (5.9 MB as ``u16`` deflated -> 3.7 MB). ``bf16`` codes are stored.

Readers take :class:`LogitStore`, which decodes an array once per session (a base read by several
ports is decoded once). Numpy only.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from oracles.checks.logit_codec import Coded, Stats, decode, encode, rows_of, stats_of

#: The staged file beside ``<key>.npy`` that makes it a unit's logits: ``{"group": ...}`` (and, for an
#: array carried by ``--resume``, ``carried_error`` and ``stats``).
STAGED = ".logits.json"
#: What separates an array's key from its member's name in the sidecar.
SEP = "~"
_MEMBERS = ("codes", "lo", "step", "argmax", "gap", "sha")
#: zlib's level per codec whose codes are deflated. Residuals at the fastest: 20 MB/s at 0.71 byte a
#: logit, where level 6 takes 2.9 MB/s for 0.61 (a port 1e-4 from its reference, V = 49,152;
#: bench/receipt_pack.py). An array's own codes at 6 (module docstring).
DEFLATED = {"d16": 1, "u16": 6, "r16": 6}


@dataclass(frozen=True)
class Rows:
    """A stored array read back: ``values`` float32 (its attached shape), ``error`` the bound on
    |values - attached| (0 when stored as attached), ``stats`` the exact per-row statistics of the
    attached rows, ``codec`` (``f4`` for an array stored as attached). ``anchor``: the array its chain of
    ``d16`` bases starts at (``store`` the sidecar's identity, ``id`` of its :class:`LogitStore`),
    and ``anchor_error`` the bound on |(values - anchor's values) - (attached - anchor's attached)|
    over its rows: two arrays of one anchor differ as attached to within the sum of theirs
    (:func:`difference_error`)."""

    values: np.ndarray
    error: float
    stats: Stats
    codec: str
    anchor: str = ""
    anchor_error: float = 0.0
    store: int = 0


def difference_error(a: Rows, b: Rows) -> float:
    """The bound on |(a.values - b.values) - (attached a - attached b)| elementwise: the sum of their
    errors against a shared anchor (one sidecar, one chain of bases), else the sum of their errors."""
    if a.anchor and a.anchor == b.anchor and a.store == b.store:
        return a.anchor_error + b.anchor_error
    return a.error + b.error


def as_rows(x: Rows | np.ndarray | None) -> Rows | None:
    """``x`` as :class:`Rows`: an array is taken as attached (error 0, its statistics computed)."""
    if x is None or isinstance(x, Rows):
        return x
    a = np.asarray(x, dtype=np.float32)
    return Rows(a, 0.0, stats_of(rows_of(a, finite=False)), "f4")


class StoreError(ValueError):
    """A stored array cannot be read: ``problem`` says why (the key named)."""


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(a), allow_pickle=False)
    return buf.getvalue()


def _staged(staging: Path) -> tuple[list[Path], dict[str, dict[str, Any]]]:
    files = sorted(staging.glob("*.npy")) if staging.is_dir() else []
    meta: dict[str, dict[str, Any]] = {}
    for f in files:
        side = f.with_name(f.stem + STAGED)
        if side.is_file():
            meta[f.stem] = json.loads(side.read_text(encoding="utf-8"))
    return files, meta


def _coded_members(key: str, c: Coded, extra: dict[str, Any]) -> Iterator[tuple[str, np.ndarray, int | None]]:
    info = {"codec": c.codec, "shape": list(c.shape), "error": c.error, **extra}
    yield f"{key}{SEP}meta", np.array(json.dumps(info)), None
    for name, arr in (("codes", c.planes), ("lo", c.lo), ("step", c.step), ("argmax", c.stats.argmax),
                      ("gap", c.stats.gap), ("sha", c.stats.sha)):
        yield f"{key}{SEP}{name}", arr, DEFLATED.get(c.codec) if name == "codes" else None


def _best_base(x2: np.ndarray, done: list[tuple[str, np.ndarray, np.ndarray]]) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The earlier array of the group nearest ``x2`` in max |Δ| (its leading rows), among those with at
    least its rows and its vocabulary: ``(key, attached rows, decoded rows)``."""
    best: tuple[float, str, np.ndarray, np.ndarray] | None = None
    n = x2.shape[0]
    for key, attached, decoded in done:
        if attached.shape[0] < n or attached.shape[1] != x2.shape[1]:
            continue
        gap = float(np.abs(attached[:n].astype(np.float64) - x2).max())
        if best is None or gap < best[0]:
            best = (gap, key, attached[:n], decoded[:n])
    return None if best is None else best[1:]


def _carried(meta: dict[str, Any], x2: np.ndarray) -> tuple[float, Stats | None]:
    stats = meta.get("stats")
    if not stats:
        return 0.0, None
    return float(meta.get("carried_error", 0.0)), Stats(np.asarray(stats["argmax"], np.int64),
                                                        np.asarray(stats["gap"], np.float64),
                                                        np.array([bytes.fromhex(h) for h in stats["sha"]]).view(np.uint8)
                                                        .reshape(x2.shape[0], 32))


def _group_members(group: list[tuple[str, np.ndarray, dict[str, Any]]]) -> Iterator[tuple[str, np.ndarray, int | None]]:
    """The sidecar members of one group's logit arrays: duplicates as ``same``, the rest coded on the
    nearest earlier array (:func:`_best_base`), each with its anchor and its error against it."""
    done: list[tuple[str, np.ndarray, np.ndarray]] = []
    seen: dict[str, str] = {}
    anchors: dict[str, str] = {}
    for key, a, meta in sorted(group, key=lambda g: (-rows_of(g[1], finite=False).shape[0], g[0])):
        if not np.isfinite(a).all():  # evidence as attached: a reader names the first non-finite logit
            yield key, a, None
            continue
        x2 = rows_of(a)
        digest = hashlib.sha256(x2.tobytes() + repr(a.shape).encode()).hexdigest()
        carried_error, carried_stats = _carried(meta, x2)
        if carried_stats is None and digest in seen:
            info = {"codec": "same", "same_as": seen[digest], "shape": list(a.shape), "group": meta.get("group")}
            yield f"{key}{SEP}meta", np.array(json.dumps(info)), None
            continue
        # an array carried by --resume is the decoded rows of another sidecar: no base, and none's base
        base = None if carried_stats is not None else _best_base(x2, done)
        c = encode(a, None if base is None else (base[1], base[2]))
        decoded = c.decoded
        extra: dict[str, Any] = {"group": meta.get("group"), "anchor": key, "anchor_error": 0.0}
        if c.codec == "d16" and base is not None:
            anchor = anchors[base[0]]
            root = next((att, dec) for k, att, dec in done if k == anchor)
            moved = (decoded.astype(np.float64) - root[1][: x2.shape[0]]) - (x2 - root[0][: x2.shape[0]].astype(np.float64))
            extra.update(base=base[0], base_rows=x2.shape[0], anchor=anchor, anchor_error=float(np.abs(moved).max()))
        if carried_stats is not None:
            c = replace(c, error=c.error + carried_error, stats=carried_stats)
        anchors[key] = extra["anchor"]
        yield from _coded_members(key, c, extra)
        if carried_stats is None:
            seen.setdefault(digest, key)
            done.append((key, x2, decoded))


def pack(staging: Path) -> tuple[bytes, int]:
    """The sidecar's bytes (a zip of ``.npy`` members, as ``numpy.savez`` writes) from a staging folder,
    and how many arrays it holds; ``b""`` when there is none.

    Raises:
        ValueError: a staged logit array that is not ``[V]`` or ``[R, V]`` rows (:func:`oracles.checks.logit_codec.rows_of`).
    """
    files, meta = _staged(staging)
    if not files:
        return b"", 0
    groups: dict[str, list[tuple[str, np.ndarray, dict[str, Any]]]] = {}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", allowZip64=True) as zf:
        for f in files:
            arr = np.load(f, allow_pickle=False)
            if f.stem in meta:
                groups.setdefault(str(meta[f.stem].get("group")), []).append((f.stem, arr, meta[f.stem]))
            else:
                zf.writestr(f"{f.stem}.npy", _npy(arr), zipfile.ZIP_STORED)
        for name in sorted(groups):
            for member, arr, level in _group_members(groups[name]):
                zf.writestr(f"{member}.npy", _npy(arr), zipfile.ZIP_STORED if level is None else zipfile.ZIP_DEFLATED,
                            compresslevel=level)
    return buf.getvalue(), len(files)


def array_keys(names: Any) -> set[str]:
    """The array keys a sidecar's member names (``numpy.load(...).files``) hold: plain arrays and coded ones."""
    out = set()
    for n in names:
        n = str(n).removesuffix(".npy")
        if SEP not in n:
            out.add(n)
        elif n.endswith(f"{SEP}meta"):
            out.add(n.removesuffix(f"{SEP}meta"))
    return out


class LogitStore:
    """The arrays of one open npz sidecar (``numpy.load`` of it), decoded once each."""

    def __init__(self, npz: Any) -> None:
        self.npz = npz
        self.keys = array_keys(npz.files)
        self._cache: dict[str, Rows] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.keys

    def meta(self, key: str) -> dict[str, Any] | None:
        """A coded array's ``~meta`` (None for an array stored as attached).

        Raises:
            StoreError: the meta is not a JSON object.
        """
        name = f"{key}{SEP}meta"
        if name not in self.npz.files:
            return None
        try:
            info = json.loads(str(self.npz[name][()]))
        except (ValueError, TypeError) as exc:
            raise StoreError(f"npz member {name!r} is not the JSON of a coded array: {exc}") from None
        if not isinstance(info, dict):
            raise StoreError(f"npz member {name!r} is a JSON {type(info).__name__}, not an object")
        return info

    def rows(self, key: str, _depth: int = 0) -> Rows:
        """The array ``key`` read back (:class:`Rows`).

        Raises:
            StoreError: ``key`` is not in the sidecar, a member is missing or malformed, a base chain
                is longer than the sidecar's arrays (a cycle), a code does not decode (each names the key).
            KeyError, OSError, ValueError, zipfile.BadZipFile, zlib.error: an unreadable member.
        """
        if key in self._cache:
            return self._cache[key]
        if _depth > len(self.keys):
            raise StoreError(f"array {key!r}: its chain of bases does not end (a cycle)")
        if key in self.npz.files:
            a = np.asarray(self.npz[key])
            if a.dtype.kind != "f":
                raise StoreError(f"array {key!r} has dtype {a.dtype}, not float logits")
            got = Rows(a, 0.0, stats_of(rows_of(a, finite=False)), "f4", key, 0.0, id(self))
        else:
            got = self._coded(key, _depth)
        self._cache[key] = got
        return got

    def _coded(self, key: str, depth: int) -> Rows:
        info = self.meta(key)
        if info is None:
            raise StoreError(f"array {key!r} is not in the npz sidecar")
        if info.get("codec") == "same":
            return self.rows(str(info.get("same_as")), depth + 1)
        missing = [n for n in _MEMBERS if f"{key}{SEP}{n}" not in self.npz.files]
        if missing:
            raise StoreError(f"array {key!r}: coded member {missing[0]!r} ({key}{SEP}{missing[0]}) is missing")
        m = {n: np.asarray(self.npz[f"{key}{SEP}{n}"]) for n in _MEMBERS}
        shape = tuple(int(s) for s in info.get("shape") or ())
        base = None
        if info.get("base") is not None:
            rows = int(info.get("base_rows") or 0)
            base = rows_of(self.rows(str(info["base"]), depth + 1).values)[:rows]
        try:
            values = decode(str(info.get("codec")), m["codes"], m["lo"], m["step"], shape, base)
        except ValueError as exc:
            raise StoreError(f"array {key!r}: {exc}") from None
        bounds = []
        for name in ("error", "anchor_error"):
            value = info.get(name, 0.0 if name == "anchor_error" else None)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise StoreError(f"array {key!r}: its meta's {name} is {value!r}, not a non-negative number")
            bounds.append(float(value))
        stats = Stats(m["argmax"].astype(np.int64), m["gap"].astype(np.float64), m["sha"].astype(np.uint8))
        return Rows(values, bounds[0], stats, str(info["codec"]), str(info.get("anchor") or key), bounds[1], id(self))


__all__ = ["DEFLATED", "STAGED", "LogitStore", "Rows", "StoreError", "array_keys", "as_rows", "difference_error", "pack"]
