"""Divergence per position (or step) of a port from the reference, read from a receipt's units and their
logits in the npz sidecar (:func:`oracles.receipts.units_reader.units_of`, :func:`~oracles.receipts.units_reader.unit_rows`).

A port's unit is paired with the reference engine's unit of the same kind, request and unit
(:func:`_reference_of`): the one its own test attached beside it, or on the pin of the band unit beside
it, or on the pin its pin file names as its reference (a converted artifact held against the pin it was
converted from), or on the same pin, or the only one on another pin. A band unit (the reference run in the port's
dtype, engine ``torch@bfloat16``) is drawn against the reference too, dashed: the figures a quantized
port is judged within. Of each pair the rows its family's port test holds are drawn
(:func:`oracles.receipts.compare.held_rows`): per row, the largest |Δlogit| and KL(reference‖port)
(:func:`oracles.checks.close.kl_divergence`), with the bound the sidecar's coding puts on a difference
(:func:`oracles.receipts.logit_store.difference_error`) as a dashed limit: a difference below it is
not told apart from zero. Numpy; the sidecar's arrays are decoded one group of pairs at a time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from oracles.errors import ReceiptError
from oracles.receipts.table import TestRecord
from oracles.receipts.units import Unit
from oracles.report.curves import MAX_LINES, Curve, Line, slug
from oracles.report.load import Loaded

#: The kinds whose array holds a row per prompt position or decode step: the ones with a curve. (A chat
#: turn, a read-out's slot and a sampled generation's first step are one row each: their figures are
#: in the records' tables.)
ROW_KINDS = ("prefill", "decode", "generate-greedy", "clef-row")
#: Rows widened to float64 at once: 78 MB a temporary at a 152k vocabulary (Qwen's), 25 MB at SmolLM2's 49k.
CHUNK_ROWS = 64


@dataclass(frozen=True)
class Pair:
    """A reference unit ``ref`` and a unit ``other`` to hold against it (a port's, or a band's: ``band``)."""

    ref: Unit
    other: Unit
    band: bool


def _reference_of(u: Unit, found: dict[str, Unit], beside: list[Unit], reference: str,
                  pin_reference: Callable[[str], str | None]) -> Unit | None:
    """The reference unit ``u`` is held against, of ``found`` (the reference engine's units of its kind,
    request and unit, by pin): the one its own test attached beside it (a port test attaches the
    reference's unit of a converted artifact's pair), else the one on the pin of a band unit beside it
    (the band runs on the reference pin), else the one on the pin ``u``'s pin names as its reference
    (``pin_reference``: a converted artifact's pin file), else the one on ``u``'s pin, else the only one;
    None when that leaves several."""
    for other in beside:
        if other.key[:3] == u.key[:3] and other.engine == reference:
            return other
    for other in beside:
        if other.key[:3] == u.key[:3] and other is not u and "@" in other.engine and other.pin in found:
            return found[other.pin]
    named = pin_reference(u.pin)
    if named in found:
        return found[named]
    return found.get(u.pin) or (next(iter(found.values())) if len(found) == 1 else None)


def pin_reference(name: str) -> str | None:
    """The pin a pin file names as its reference (a converted artifact's float32 source), None when it
    names none or is not in this project's or the built-in store (a receipt from elsewhere)."""
    from oracles.errors import OracleError
    from oracles.pins.pin import load_pin

    try:
        return load_pin(name).reference
    except OracleError:
        return None


def pairs(units: list[Unit], reference: str, pin_reference: Callable[[str], str | None] = lambda _pin: None,
          ) -> tuple[dict[tuple[str, str, str, str], list[Pair]], int]:
    """The pairs to draw, grouped by (kind, reference pin, port pin, port engine): each group's port pairs,
    then the band pairs the same port tests attached (the band a converted artifact is judged within);
    a band with no port beside it is a group of its own. Also how many units of another engine had no
    reference unit to pair with, or more than one (on several other pins)."""
    ref: dict[tuple[str, str, str], dict[str, Unit]] = {}
    for u in units:
        if u.engine == reference and u.kind in ROW_KINDS:
            ref.setdefault(u.key[:3], {})[u.pin] = u
    by_test: dict[str, list[Unit]] = {}
    for u in units:
        by_test.setdefault(u.test, []).append(u)
    groups: dict[tuple[str, str, str, str], list[Pair]] = {}
    bands: list[Pair] = []
    unpaired = 0
    for u in units:
        if u.engine == reference or u.kind not in ROW_KINDS or not u.arrays:
            continue
        r = _reference_of(u, ref.get(u.key[:3], {}), by_test.get(u.test, []), reference, pin_reference)
        if r is None or not r.arrays:
            unpaired += 1
        elif "@" in u.engine:
            bands.append(Pair(r, u, band=True))
        else:
            groups.setdefault((u.kind, r.pin, u.pin, u.engine), []).append(Pair(r, u, band=False))
    for b in bands:
        homes = [group for group in groups.values()
                 if any(p.ref.key == b.ref.key and p.other.test == b.other.test and not p.band for p in group)]
        for home in homes:
            home.append(b)
        if not homes:
            groups.setdefault((b.ref.kind, b.ref.pin, b.other.pin, b.other.engine), []).append(b)
    return groups, unpaired


def chosen(found: list[Pair]) -> tuple[list[Pair], int]:
    """The pairs of a group to draw: its first :data:`MAX_LINES` ports' (or bands', in a group of bands)
    and the band pairs of the same units; and how many pairs are left out."""
    ports = [p for p in found if not p.band] or found
    kept = ports[:MAX_LINES]
    keys = {p.ref.key for p in kept}
    out = kept + [p for p in found if p.band and p not in kept and p.ref.key in keys]
    return out, len(found) - len(out)


def per_row(pair: Pair, store: Any, path: Any) -> tuple[tuple[int, ...], np.ndarray, np.ndarray, float] | None:
    """The held rows' numbers (as the family numbers them), per row max |Δlogit| and KL(reference‖other)
    (float64 ``[n]``), and the bound the stored coding puts on a difference; None when no row is held
    (a generation that diverged at once) or either unit has no array.

    Raises:
        ReceiptError: a unit's array is missing, unreadable or of another shape (:func:`unit_rows`).
        ValueError: the two arrays' vocabularies differ.
    """
    from oracles.checks.close import kl_divergence
    from oracles.receipts.compare import held_rows
    from oracles.receipts.logit_store import difference_error
    from oracles.receipts.units_reader import unit_rows

    a, b = unit_rows(pair.ref, store, path), unit_rows(pair.other, store, path)
    if a is None or b is None:
        return None
    held = held_rows(pair.ref, pair.other, a.values, b.values)
    if isinstance(held, str):
        return None
    ra, pb = (h.reshape(-1, h.shape[-1]) for h in held)
    if ra.shape != pb.shape:
        raise ValueError(f"unit {pair.ref.label}: rows {list(ra.shape)} of {pair.ref.engine} vs {list(pb.shape)} of "
                         f"{pair.other.engine}")
    at = pair.ref.array_rows[: ra.shape[0]]
    rows = at if len(at) == ra.shape[0] else tuple(range(ra.shape[0]))
    diff, kl = np.empty(ra.shape[0]), np.empty(ra.shape[0])
    for s in range(0, ra.shape[0], CHUNK_ROWS):  # float64 temporaries of CHUNK_ROWS rows at a time
        part = slice(s, s + CHUNK_ROWS)
        diff[part] = np.abs(ra[part].astype(np.float64) - pb[part]).max(axis=-1)
        kl[part] = kl_divergence(ra[part], pb[part])
    return rows, diff, kl, difference_error(a, b)


def _curves(family: str, key: tuple[str, str, str, str], drawn: list[tuple[Pair, Any]], error: float, left: int) -> list[Curve]:
    """The two figures of one group: max |Δlogit| and KL per row, a line per unit."""
    kind, ref_pin, pin, engine = key
    word = "position" if kind in ("prefill", "clef-row") else "step"
    against = f"{engine} on {pin}" + (f" vs the reference on {ref_pin}" if pin != ref_pin else " vs the reference")
    more = f" {left} more units of this group are not drawn." if left else ""
    note = (f"From the {kind} units' logits in the npz sidecar, the rows the port test holds.{more}")
    if not any(got[1].any() for _, got in drawn):  # every row bit-equal: a flat line at the floor says less than this
        return [Curve(key=slug(family, "positions", kind, ref_pin, pin, engine), family=family,
                      title=f"{kind}: per {word}, {against}", xlabel=word, ylabel="", lines=(),
                      note=f"Every held row of the {len(drawn)} units reads back equal to the reference's"
                           f"{f' (to the stored error bound {error:.2g})' if error else ''}. {note}")]
    out = []
    for name, i, ylabel in (("max |Δlogit|", 1, "max |Δlogit| over the vocabulary"), ("KL(reference‖port)", 2, "KL, nats")):
        lines = tuple(Line(f"{p.other.label} ({p.other.engine})" if p.band else p.other.label,
                           tuple(float(v) for v in got[i]), x=tuple(float(r) for r in got[0]), dashed=p.band)
                      for p, got in drawn)
        limits = ((error, f"stored error bound {error:.2g}"),) if i == 1 and error > 0 else ()
        out.append(Curve(key=slug(family, "positions", kind, ref_pin, pin, engine, i), family=family,
                         title=f"{kind}: {name} per {word}, {against}", xlabel=f"{word}", ylabel=ylabel, lines=lines,
                         log=True, limits=limits, note=note))
    return out


def position_curves(loaded: Loaded, family_of: Mapping[str, TestRecord]) -> tuple[list[Curve], list[str]]:
    """The per-position figures of a receipt's unit pairs (module docstring), each in the section of the
    family of the test that attached the port's unit (``family_of``: nodeid -> record), and notes for the
    page: what could not be drawn, one line each (a malformed unit, a sidecar missing or unreadable, an
    array of another shape: file, record and field named, as the readers raise them). The verdict is the
    receipt's; a figure that cannot be drawn takes nothing else from the page."""
    from oracles.receipts.sidecar import find_sidecar, load_npz
    from oracles.receipts.units_reader import units_of

    try:
        units = units_of(loaded.raw, loaded.path)
    except ReceiptError as exc:
        return [], [f"no per-position figures: {exc}"]
    reference = str(loaded.receipt.invocation.get("reference") or "torch")
    groups, unpaired = pairs(units, reference, functools.lru_cache(maxsize=None)(pin_reference))
    notes = [f"{unpaired} units of other engines have no reference unit to pair with on one pin; not drawn"] if unpaired else []
    if not groups:
        return [], notes
    try:
        npz, moved = find_sidecar(loaded.raw, loaded.path)
        notes += [moved] if moved else []
        opened = load_npz(npz, loaded.path)
    except ReceiptError as exc:
        return [], [*notes, f"no per-position figures: {exc}"]
    if opened is None:
        return [], [*notes, f"no per-position figures: {loaded.path} names no npz sidecar (field 'arrays')"]
    opened.npz.close()
    out: list[Curve] = []
    for key, found in groups.items():
        picked, left = chosen(found)
        drawn = _drawn(picked, npz, loaded.path, notes)
        if drawn:
            error = max(got[3] for _, got in drawn)
            rec = family_of.get(found[0].other.test)
            out += _curves(rec.family if rec else "unknown", key, drawn, error, left)
    return out, notes


def _drawn(picked: list[Pair], npz: Any, path: Any, notes: list[str]) -> list[tuple[Pair, Any]]:
    """:func:`per_row` of each pair, in order, those that hold rows. The sidecar is opened once per
    reference unit and closed after its pairs, so at most one reference's arrays (and the ports coded
    on it) are held decoded at a time. A pair that cannot be read is left out with a note (``notes``)."""
    from oracles.receipts.sidecar import load_npz

    by_ref: dict[Any, list[Pair]] = {}
    for pair in picked:
        by_ref.setdefault(pair.ref.key, []).append(pair)
    out = []
    for same in by_ref.values():
        store = load_npz(npz, path)
        try:
            for pair in same:
                try:
                    got = per_row(pair, store, path)
                except (ReceiptError, ValueError) as exc:  # one pair not drawn, named; the page goes on
                    notes.append(f"not drawn: {exc}")
                    continue
                if got is not None:
                    out.append((pair, got))
        finally:
            store.npz.close()
    return sorted(out, key=lambda item: picked.index(item[0]))
