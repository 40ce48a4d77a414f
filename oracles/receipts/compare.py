"""Holding a port's units against a reference's (pure: pairing, the figures of a pair, the table).

The units (:mod:`oracles.receipts.units`) of one engine are keyed by ``(kind, request_sha256, unit, pin)``. A
comparison holds the reference engine's units against the port engine's pin by pin: on each pin the
two receipts share, the units with the same ``(kind, request_sha256, unit)``; or, given a pair of
pins (an fp32 pin against a converted one), the reference pin's against the port pin's. Each pair
is held as its pins' :class:`~oracles.checks.judgment.Judgment` says (``oracles compare`` chooses it):
``exact``, to :data:`oracles.checks.tolerance.FLOAT32`; ``band``, each unit to
:func:`~oracles.checks.judgment.band_tolerance` of the reference unit against the band unit (the
reference engine run in the port's dtype, engine ``<reference>@<dtype>``, on the reference pin: the
port tests attach it); or graded (figures, no verdict). Numpy only; ``oracles compare`` is the command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oracles.checks.judgment import Judgment, band_tolerance
from oracles.checks.port import (
    compared_rows,
    first_divergence,
    port_figures,
    readout_failures,
    readout_figures,
    threshold_failures,
)
from oracles.checks.stored_bounds import bounded_failures, exact_from_stats, figure_bounds
from oracles.checks.tolerance import FLOAT32, Tolerance
from oracles.errors import ReceiptError
from oracles.receipts.logit_store import Rows, as_rows, difference_error
from oracles.receipts.units import Key, Unit

#: A unit's logits as a reader holds them: stored rows with their error and exact statistics, or a
#: float32 array taken as attached (error 0).
Logits = Rows | np.ndarray


def by_key(units: list[Unit], path: Path) -> dict[Key, Unit]:
    """Units by key (``(kind, request_sha256, unit, pin)``), all of one engine.

    Raises:
        ReceiptError: two units hold the same key (both records named): which to compare is a guess.
    """
    out: dict[Key, Unit] = {}
    for u in units:
        seen = out.get(u.key)
        if seen is not None:
            raise ReceiptError(f"{path}: records {seen.test} and {u.test} both hold unit {u.kind} {u.label} of engine "
                               f"{u.engine} on pin {u.pin}; a unit must be unique per engine and pin")
        out[u.key] = u
    return out


@dataclass
class PinPair:
    """One comparison of a pin's reference units against a pin's port units; ``port_engine`` is None
    when the port holds no units to compare on that pin (its reference units are then all unmatched).
    ``judgment``: how the pair is held (None: graded, ``graded`` says why nothing judges it); ``band``:
    the band engine's units on the reference pin by ``(kind, request_sha256, unit)`` (a band judgment)."""

    ref_pin: str
    port_pin: str
    ref_engine: str
    port_engine: str | None
    matched: list[tuple[Unit, Unit]] = field(default_factory=list)
    ref_only: list[Unit] = field(default_factory=list)
    port_only: list[Unit] = field(default_factory=list)
    judgment: Judgment | None = None
    graded: str | None = None
    band: dict[tuple[str, str, str], Unit] = field(default_factory=dict)

    @property
    def title(self) -> str:
        port = self.port_engine or "no port units"
        if self.ref_pin == self.port_pin:
            return f"pin {self.ref_pin}: {self.ref_engine} vs {port}"
        return f"pin {self.ref_pin} ({self.ref_engine}) vs pin {self.port_pin} ({port})"


def _port_engine(port: list[Unit], pin: str, ref_engine: str, same_run: bool, path: Path) -> str | None:
    """The port engine on ``pin`` by default: the one engine other than the reference's holding units of
    it; else the reference's own in another run; else None (nothing to compare on that pin). A band
    engine (``torch@bfloat16``: an id with ``@``) is the reference's calibration, never a port.

    Raises:
        ReceiptError: several other engines hold units of ``pin`` (named; ``--port-engine`` chooses).
    """
    present = {u.engine for u in port if u.pin == pin and "@" not in u.engine}
    others = sorted(present - {ref_engine})
    if len(others) > 1:
        raise ReceiptError(f"{path}: pin {pin} holds units of engines {others}; choose one with --port-engine")
    if others:
        return others[0]
    return ref_engine if ref_engine in present and not same_run else None


def plan(ref: list[Unit], port: list[Unit], ref_engine: str, port_engine: str | None, pins: tuple[str, str] | None,
         same_run: bool, paths: tuple[Path, Path]) -> list[PinPair]:
    """The pin pairs to compare, their units matched by ``(kind, request_sha256, unit)``.

    Args:
        ref, port: every unit of the two receipts; ``ref_engine``: the reference's engine id.
        port_engine: the port's engine id on every pin, or None for each pin's default (:func:`_port_engine`).
        pins: ``(reference pin, port pin)`` to compare only those, or None for pin by pin over the
            pins either side holds.
        same_run: REF and PORT are one run's records (then the reference is never its own port).
        paths: the two receipts' files, for messages.

    Raises:
        ReceiptError: a given pin without units on its side (the pins present named); a pin pair whose
            port would be the reference's own records (the same engine, pin and run: a comparison that
            cannot fail); two units with one key (:func:`by_key`); several
            port engines on one pin.
    """
    ref_path, port_path = paths
    if pins is None:
        names = sorted({u.pin for u in ref if u.engine == ref_engine} | {u.pin for u in port})
        pairs = [PinPair(p, p, ref_engine, None) for p in names]
    else:
        for pin, units, path, option in ((pins[0], ref, ref_path, "--ref-pin"), (pins[1], port, port_path, "--port-pin")):
            present = sorted({u.pin for u in units})
            if pin not in present:
                raise ReceiptError(f"{path}: holds no units of pin {pin!r} ({option}); pins present: "
                                   f"{', '.join(present) or 'none'}")
        pairs = [PinPair(pins[0], pins[1], ref_engine, None)]
    for pair in pairs:
        pair.port_engine = port_engine or _port_engine(port, pair.port_pin, ref_engine, same_run, port_path)
        own = same_run and pair.port_engine == ref_engine and pair.ref_pin == pair.port_pin
        if own and (port_engine or pins is not None):
            raise ReceiptError(f"{port_path}: the port records would be the reference's own ({ref_engine!r} on pin "
                               f"{pair.ref_pin} of the same run): a comparison with itself cannot fail; choose another "
                               f"--port-engine, pin or receipt")
    if not any(p.port_engine for p in pairs) and same_run:
        raise ReceiptError(f"{port_path}: holds no engine but the reference's {ref_engine!r} on any pin, so the port "
                           f"records would be the reference's own: a comparison with itself cannot fail; choose "
                           f"another --port-engine or receipt")
    for pair in pairs:
        r = by_key([u for u in ref if u.engine == ref_engine and u.pin == pair.ref_pin], ref_path)
        p = by_key([u for u in port if u.engine == pair.port_engine and u.pin == pair.port_pin], port_path)
        mine = {k[:3]: u for k, u in p.items()}
        pair.matched = [(u, mine[k[:3]]) for k, u in r.items() if k[:3] in mine]
        pair.ref_only = [u for k, u in r.items() if k[:3] not in mine]
        theirs = {k[:3] for k in r}
        pair.port_only = [u for k, u in p.items() if k[:3] not in theirs]
    return pairs


def _argmax_agreement(r: Unit, p: Unit, divergent: int | None) -> dict[str, float]:
    """``{"argmax_agreement": share}`` over the rows both units computed from the same prefix: every row
    while the generated tokens agree, through the row of the first divergent token (its prefix is still
    shared; later rows condition on different tokens). Empty when there is no such row or no argmax.
    A unit without tokens (a prefill) compares its rows when both have as many."""
    if r.argmax is None or p.argmax is None:
        return {}
    if divergent is None and len(r.argmax) != len(p.argmax):
        return {}
    n = min(len(r.argmax), len(p.argmax), len(r.argmax) if divergent is None else divergent + 1)
    if n == 0:
        return {}
    return {"argmax_agreement": float(np.mean(np.asarray(r.argmax[:n]) == np.asarray(p.argmax[:n])))}


def _renumbered(fig: dict[str, Any], at: tuple[int, ...]) -> dict[str, Any]:
    """``fig`` (:func:`oracles.checks.port.port_figures` of ``len(at)`` rows) with its row indices replaced
    by ``at``, the rows' numbers in their family's own numbering (:attr:`oracles.receipts.units.Unit.array_rows`)."""
    return {**fig, "max_abs_at": [at[fig["max_abs_at"][0]], *fig["max_abs_at"][1:]],
            "kl_argmax_row": at[fig["kl_argmax_row"]],
            "disagreements": [{**d, "row": at[d["row"]]} for d in fig["disagreements"]]}


def _named(word: str, at: tuple[int, ...]) -> str:
    """``step 63`` for one row, ``steps 0-63`` for consecutive rows, else ``steps 0, 2, 5``."""
    if len(at) == 1:
        return f"{word} {at[0]}"
    if at == tuple(range(at[0], at[0] + len(at))):
        return f"{word}s {at[0]}-{at[-1]}"
    return f"{word}s {', '.join(map(str, at))}"


def _at_rows(fig: dict[str, Any], r: Unit, p: Unit) -> tuple[dict[str, Any], str]:
    """``fig`` (:func:`oracles.checks.port.port_figures` of the held rows of two units' arrays, the
    leading ``fig["rows"]``) with its row indices renumbered as the family's own test numbers them
    (:attr:`oracles.receipts.units.Unit.array_rows`: decode row 63 is step 63; a chat turn's one row is its
    turn), and those rows named (``steps 0-63``). The reference's numbering is used; a port unit whose
    rows are numbered otherwise is named beside it. Returned as given when the numbering does not fit.
    """
    at = r.array_rows[:fig.get("rows", 0)]
    word = r.spec.row
    name = _named(word, at) if at else f"{word}s -"
    theirs = p.array_rows[:len(at)]
    if theirs != at:
        name += f" (port: {_named(word, theirs) if theirs else '-'})"
    if len(at) != fig.get("rows"):
        return fig, name
    return _renumbered(fig, at), name


def _first_row_over(a: np.ndarray, b: np.ndarray, r: Unit, tolerance: Tolerance) -> str:
    """The first held row that passes a threshold on its own (there is one whenever the rows together
    pass one: NMSE over rows is a weighted mean of the rows' NMSEs, the other figures are per row),
    named as its family numbers it, with its failures and the token of its largest |Δlogit|, both values.

    ``a``, ``b``: the held rows, ``[n, V]`` float32 (``[V]`` is one row). "" when no row does."""
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    at = r.array_rows[:a2.shape[0]] if len(r.array_rows) >= a2.shape[0] else tuple(range(a2.shape[0]))
    for i in range(a2.shape[0]):
        fails = threshold_failures(_renumbered(port_figures(a2[i], b2[i]), (at[i],)), tolerance=tolerance)
        if fails:
            t = int(np.abs(a2[i].astype(np.float64) - b2[i]).argmax())
            return (f"first {r.spec.row} over a threshold on its own: {r.spec.row} {at[i]} ({'; '.join(fails)}); "
                    f"its largest |Δlogit| at token {t}: reference {float(a2[i, t]):.9g} vs port {float(b2[i, t]):.9g}")
    return ""


def held_rows(r: Unit, p: Unit, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | str:
    """The rows of ``a`` (reference) and ``b`` (port) that the kind holds to the thresholds
    (:attr:`oracles.receipts.units.Kind.held`), the same rows its family's port test holds: ``all``; ``prefix``,
    the leading :func:`oracles.checks.port.compared_rows` of the two units' tokens; ``first``, row 0.

    Args:
        a, b: the units' arrays as :func:`oracles.receipts.units_reader.unit_array` returns them (``[V]``,
            ``[1, V]``, ``[T, V]``, ``[S, V]`` float32); ``[V]`` is held whole.

    Returns:
        The two held slices, or why nothing is held (one line, e.g. no row computed from a shared prefix).
    """
    held = r.spec.held
    if held == "all" or a.ndim == 1:
        return a, b
    n = 1 if held == "first" else compared_rows(r.tokens or (), p.tokens or ())
    n = min(n, a.shape[0], b.shape[0])
    if n == 0:
        return "not compared: no step row computed from a shared prefix"
    return a[:n], b[:n]


def _held(r: Unit, p: Unit, a: Rows, b: Rows) -> tuple[np.ndarray, np.ndarray, int] | str:
    """:func:`held_rows` of the two units' values, and how many rows that is (their statistics' rows)."""
    rows = held_rows(r, p, a.values, b.values)
    if isinstance(rows, str):
        return rows
    return rows[0], rows[1], rows[0].reshape(-1, rows[0].shape[-1]).shape[0]


def _bounded(r: Unit, p: Unit, a: Rows, b: Rows) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any],
                                                          tuple[np.ndarray, np.ndarray]] | str:
    """The figures of the held rows (exact where the statistics decide them: :func:`exact_from_stats`)
    and their lower and upper bounds (:func:`figure_bounds`), with the held rows; or why none are held.

    Raises:
        ValueError: :func:`oracles.checks.port.port_figures`'s (shapes, a non-finite value).
    """
    held = _held(r, p, a, b)
    if isinstance(held, str):
        return held
    ra, pb, n = held
    fig = exact_from_stats(port_figures(ra, pb), a.stats.rows(n), b.stats.rows(n))
    lo, hi = figure_bounds(ra, pb, a.error, b.error, difference_error(a, b), fig)
    return fig, lo, hi, (ra, pb)


def _logits(row: dict[str, Any], r: Unit, p: Unit, a: Rows, b: Rows, tolerance: Tolerance,
            tolerance_hi: Tolerance | None) -> tuple[list[str], bool]:
    """Hold the units' held rows (:func:`held_rows`) to ``tolerance``, adding the figures to ``row``.
    Rows stored to an error are held by their figures' bounds (:func:`bounded_failures`): a threshold
    the bounds leave open is a failure saying so (``undecided``), never a pass.

    Returns:
        The failures (the first names the rows held and the first row over a threshold, with both
        values) and whether the logits were held (False when nothing could be compared).
    """
    try:
        got = _bounded(r, p, a, b)
    except ValueError as exc:
        return [str(exc)], False
    if isinstance(got, str):
        row["logits"] = got
        return [], False
    fig, lo, hi, rows = got
    error = difference_error(a, b) if a.error or b.error else None
    row.update({k: fig[k] for k in ("max_abs", "nmse", "kl_mean", "kl_max", "bit_equal")})
    if error is not None or tolerance_hi is not None:
        row["stored_error"] = error
        row["bounds"] = {k: [lo[k], hi[k]] for k in ("max_abs", "nmse", "kl_max")}
    fig, row["logits_at"] = _at_rows(fig, r, p)
    lo, _ = _at_rows(lo, r, p)
    hi, _ = _at_rows(hi, r, p)
    row["logits_rows"], row["max_abs_at"] = fig["rows"], fig["max_abs_at"]
    if r.keys is not None:
        row["argmax_agreement"] = fig["argmax_agreement"]
    failed, undecided = bounded_failures(lo, hi, tolerance, tolerance_hi, error)
    fails = failed + undecided
    if fails and r.spec.row != "slot":  # a d1 read-out's one row is its slot: nothing to name
        fails[0] = f"{r.spec.array} of {row['logits_at']}: {fails[0]}"
        first = _first_row_over(*rows, r, tolerance) if fig["rows"] > 1 and failed else ""
        fails[0] += f"; {first}" if first else ""
    return fails, True


def compare_pair(r: Unit, p: Unit, a: Logits | None, b: Logits | None, tolerance: Tolerance = FLOAT32,
                 tokens_held: bool = True, tolerance_hi: Tolerance | None = None) -> dict[str, Any]:
    """One comparison row of a matched pair (``r`` reference, ``p`` port, ``a``/``b`` their logits as
    :func:`oracles.receipts.units_reader.unit_array` returns them), held to ``tolerance`` (its name in
    ``row["tolerance"]``): figures, ``failures`` (one line each,
    reasons for exit 1; a logits failure names the rows held, numbered as the family's own test numbers
    them, ``logits_at``, and the first row over a threshold with both values), ``held`` (what was held
    to a threshold: ``tokens`` of a greedy kind, ``logits``, ``read-out``), ``status`` and ``ok``.

    The logits held are the rows the kind's family holds (:func:`held_rows`): every prompt position of
    a prefill or a clef row (text and picture tokens, as test_port_logits); a d1 read-out's slot; a
    decode's or greedy generation's steps through the first divergent token; a sampled generation's
    first step (its later tokens follow a draw, recorded, not held). ``tokens_held`` False (a band
    judgment, as the port tests hold one): a greedy token may change, but only where the held step rows'
    argmax check allows it (at the band's near tie), so divergent tokens fail nothing by themselves.
    ``status`` is ``"FAIL"`` (``ok`` False) when a failure is listed, ``"ok"`` (``ok`` True) when
    something was held and passed, and ``"recorded only"`` (``ok`` None) when nothing but the prompt
    ids was held (a generation without a step); such a row can fail only on its prompt ids.

    Stored rows (:class:`~oracles.receipts.logit_store.Rows`) are held by their figures' bounds: exact
    where the rows' statistics decide (argmax, bit equality), within the stored error elsewhere
    (``stored_error``, ``bounds``), a threshold the bounds leave open failing as ``undecided``
    (:func:`oracles.checks.stored_bounds.bounded_failures`). ``tolerance_hi``: the upper ends of
    ``tolerance`` where it is itself bounded (a band computed from stored rows: :func:`band_bound`)."""
    row: dict[str, Any] = {"kind": r.kind, "unit": r.unit, "request_sha256": r.request_sha256, "label": r.label,
                           "ref_pin": r.pin, "port_pin": p.pin, "ref_engine": r.engine, "port_engine": p.engine,
                           "ref_test": r.test, "port_test": p.test, "ids_equal": r.ids == p.ids,
                           "tolerance": tolerance.name}
    fails = [] if row["ids_equal"] else [f"ids differ at position {first_divergence(r.ids, p.ids)}"]
    if r.tokens is not None and p.tokens is not None:
        row["first_divergent_token"] = first_divergence(r.tokens, p.tokens)
    row.update(_argmax_agreement(r, p, row.get("first_divergent_token")))
    held: list[str] = []
    if tokens_held and r.spec.greedy and r.tokens is not None and p.tokens is not None:
        held.append("tokens")
        if row["first_divergent_token"] is not None:
            fails.append(f"greedy tokens diverge at {row['first_divergent_token']}")
    if r.keys is not None and not row["ids_equal"]:
        row["logits"] = "not compared: the rows' ids differ"
    elif (ra := as_rows(a)) is not None and (pb := as_rows(b)) is not None:
        logit_fails, compared = _logits(row, r, p, ra, pb, tolerance, tolerance_hi)
        fails += logit_fails
        held += ["logits"] if compared else []
    if r.keys is not None and p.keys is not None:
        if r.keys != p.keys:
            fails.append(f"read-out keys differ: reference {list(r.keys)} vs port {list(p.keys)}")
        else:
            rf = readout_figures(r.keys, r.probs or [], p.probs or [])
            row.update(rf)
            held.append("read-out")
            fails += readout_failures(rf, tolerance=tolerance)
    row["failures"], row["held"] = fails, held
    row["status"] = "FAIL" if fails else ("ok" if held else "recorded only")
    row["ok"] = {"FAIL": False, "ok": True}.get(row["status"])
    return row


def band_bound(r: Unit, p: Unit, q: Unit, a: Logits | None, b: Logits | None,
               c: Logits | None) -> tuple[Tolerance, Tolerance | None, dict[str, Any] | None]:
    """The bound of the pair ``r``/``p`` under a band, :func:`~oracles.checks.judgment.band_tolerance` of
    :data:`FLOAT32` and the figures (returned too: ``rows``, ``max_abs``, ``nmse``, ``kl_max``) of the
    reference's held rows (:func:`held_rows`) against the band unit ``q``'s leading rows, at most as many
    (``c`` ``[n, V]`` or ``[V]``: the band engine on the reference's ids and tokens, the rows the
    port test measured it on). :data:`FLOAT32` and None where no logits are held.

    Returns:
        ``(bound, bound_hi, figures)``: where the reference or band rows are stored to an error, the
        band's figures are bounds and so is the bound: ``bound`` from their lower ends, ``bound_hi``
        from their upper (:func:`oracles.checks.stored_bounds.bounded_failures` holds a port to both);
        ``bound_hi`` None when the figures are exact. ``figures`` adds ``stored_error`` then.

    Raises:
        ReceiptError: the band unit has no array, no row, or rows of another vocabulary (both shapes).
    """
    ra, pb, rc = as_rows(a), as_rows(b), as_rows(c)
    held = None if ra is None or pb is None else _held(r, p, ra, pb)
    if held is None or isinstance(held, str):
        return FLOAT32, None, None
    ref_rows = held[0].reshape(-1, held[0].shape[-1])
    band = None if rc is None else rc.values.reshape(-1, rc.values.shape[-1])[: ref_rows.shape[0]]
    if rc is None or band is None or band.shape[0] == 0 or band.shape[-1] != ref_rows.shape[-1]:
        raise ReceiptError(f"{q.test}: band unit {q.kind} {q.label} of engine {q.engine} on pin {q.pin} has logits "
                           f"{None if rc is None else list(rc.values.shape)}, not rows of the reference's {list(held[0].shape)}")
    n = band.shape[0]
    assert ra is not None
    fig = exact_from_stats(port_figures(ref_rows[:n], band), ra.stats.rows(n), rc.stats.rows(n))
    g = difference_error(ra, rc)
    lo, hi = figure_bounds(ref_rows[:n], band, ra.error, rc.error, g, fig)
    keep = ("rows", "max_abs", "nmse", "kl_max")
    out = {k: fig[k] for k in keep}
    if ra.error == 0 and rc.error == 0:
        return band_tolerance(FLOAT32, fig), None, out
    out["stored_error"] = g
    return band_tolerance(FLOAT32, lo), band_tolerance(FLOAT32, hi), out
