"""Holding a port's units against a reference's (pure: pairing, the figures of a pair, the table).

The units (:mod:`oracles.units`) of one engine are keyed by ``(kind, request_sha256, unit, pin)``. A
comparison holds the reference engine's units against the port engine's pin by pin: on each pin the
two receipts share, the units with the same ``(kind, request_sha256, unit)``; or, given a pair of
pins (an fp32 pin against a converted one), the reference pin's against the port pin's. The
thresholds are those of :mod:`oracles.checks.port`. Numpy only; ``oracles compare`` is the command.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oracles.checks.port import first_divergence, port_figures, readout_failures, readout_figures, threshold_failures
from oracles.errors import ReceiptError
from oracles.units import Key, Unit


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
    when the port holds no units to compare on that pin (its reference units are then all unmatched)."""

    ref_pin: str
    port_pin: str
    ref_engine: str
    port_engine: str | None
    matched: list[tuple[Unit, Unit]] = field(default_factory=list)
    ref_only: list[Unit] = field(default_factory=list)
    port_only: list[Unit] = field(default_factory=list)

    @property
    def title(self) -> str:
        port = self.port_engine or "no port units"
        if self.ref_pin == self.port_pin:
            return f"pin {self.ref_pin}: {self.ref_engine} vs {port}"
        return f"pin {self.ref_pin} ({self.ref_engine}) vs pin {self.port_pin} ({port})"


def _port_engine(port: list[Unit], pin: str, ref_engine: str, same_run: bool, path: Path) -> str | None:
    """The port engine on ``pin`` by default: the one engine other than the reference's holding units of
    it; else the reference's own in another run; else None (nothing to compare on that pin).

    Raises:
        ReceiptError: several other engines hold units of ``pin`` (named; ``--port-engine`` chooses).
    """
    present = {u.engine for u in port if u.pin == pin}
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


def _at_rows(fig: dict[str, Any], r: Unit, p: Unit) -> tuple[dict[str, Any], str]:
    """``fig`` (:func:`oracles.checks.port.port_figures` of two units' arrays) with its row indices
    renumbered to the rows the arrays hold (:attr:`oracles.units.Unit.array_rows`), and those rows named.

    A decode unit stores its last step's logits only: row 0 of the array is step 63 of a 64-step decode,
    and the family's own test, which holds every step, says 63; so must the comparison. The reference's
    numbering is used; a port unit whose array is another row is named beside it.
    """
    at = r.array_rows
    name = f"{r.spec.row} {', '.join(map(str, at))}"
    if p.array_rows != at:
        name += f" (port: {r.spec.row} {', '.join(map(str, p.array_rows))})"
    if len(at) != fig.get("rows"):
        return fig, name
    fig = {**fig, "max_abs_at": [at[fig["max_abs_at"][0]], *fig["max_abs_at"][1:]],
           "kl_argmax_row": at[fig["kl_argmax_row"]],
           "disagreements": [{**d, "row": at[d["row"]]} for d in fig["disagreements"]]}
    return fig, name


def compare_pair(r: Unit, p: Unit, a: np.ndarray | None, b: np.ndarray | None) -> dict[str, Any]:
    """One comparison row of a matched pair (``r`` reference, ``p`` port, ``a``/``b`` their logits):
    figures, ``failures`` (one line each, reasons for exit 1; the first logits failure names the step,
    position or turn the array holds, numbered as the family's own test numbers its rows: ``logits_at``),
    ``held`` (what was held to a threshold: ``tokens`` of a greedy kind, ``logits``, ``read-out``),
    ``status`` and ``ok``.

    ``status`` is ``"FAIL"`` (``ok`` False) when a failure is listed, ``"ok"`` (``ok`` True) when
    something was held and passed, and ``"recorded only"`` (``ok`` None) when nothing but the prompt
    ids was held: a sampled generation whose tokens diverged, so its logits are not comparable and its
    tokens are not expected to agree; such a row can fail only on its prompt ids."""
    spec = r.spec
    row: dict[str, Any] = {"kind": r.kind, "unit": r.unit, "request_sha256": r.request_sha256, "label": r.label,
                           "ref_pin": r.pin, "port_pin": p.pin, "ref_engine": r.engine, "port_engine": p.engine,
                           "ref_test": r.test, "port_test": p.test, "ids_equal": r.ids == p.ids}
    fails = [] if row["ids_equal"] else [f"ids differ at position {first_divergence(r.ids, p.ids)}"]
    if r.tokens is not None and p.tokens is not None:
        row["first_divergent_token"] = first_divergence(r.tokens, p.tokens)
    row.update(_argmax_agreement(r, p, row.get("first_divergent_token")))
    held: list[str] = []
    if r.tokens is not None and p.tokens is not None:
        if spec.greedy:
            held.append("tokens")
            if row["first_divergent_token"] is not None:
                fails.append(f"greedy tokens diverge at {row['first_divergent_token']}")
    if row.get("first_divergent_token") is not None:
        a = b = None
        row["logits"] = "not compared: the token sequences differ before the last row"
    elif r.keys is not None and not row["ids_equal"]:
        a = b = None
        row["logits"] = "not compared: the rows' ids differ"
    if a is not None and b is not None:
        try:
            fig = port_figures(a, b)
        except ValueError as exc:
            fig, fails = {}, [*fails, str(exc)]
        row.update({k: fig[k] for k in ("max_abs", "nmse", "kl_mean", "kl_max", "bit_equal") if k in fig})
        if fig:
            fig, row["logits_at"] = _at_rows(fig, r, p)
            row["max_abs_at"] = fig["max_abs_at"]
            held.append("logits")
            if r.keys is not None:
                row["argmax_agreement"] = fig["argmax_agreement"]
            logit_fails = threshold_failures(fig)
            if logit_fails and spec.row != "slot":  # a read-out's one row is its slot: nothing to name
                logit_fails[0] = f"{spec.array} of {row['logits_at']}: {logit_fails[0]}"
            fails += logit_fails
    if r.keys is not None and p.keys is not None:
        if r.keys != p.keys:
            fails.append(f"read-out keys differ: reference {list(r.keys)} vs port {list(p.keys)}")
        else:
            rf = readout_figures(r.keys, r.probs or [], p.probs or [])
            row.update(rf)
            held.append("read-out")
            fails += readout_failures(rf)
    row["failures"], row["held"] = fails, held
    row["status"] = "FAIL" if fails else ("ok" if held else "recorded only")
    row["ok"] = {"FAIL": False, "ok": True}.get(row["status"])
    return row


def fmt(v: Any, spec: str, width: int) -> str:
    """``v`` formatted right-aligned to ``width``, ``-`` when None."""
    return f"{'-':>{width}}" if v is None else format(v, f">{width}{spec}")


#: Under the table: what the two token columns compare and what "recorded only" means.
LEGEND = ("prompt ids: the input token ids are equal; gen tokens: the generated tokens (div@N: the first position "
          "they differ); recorded only: a sampled generation that diverged, nothing held to a threshold")
HEAD = (f"{'kind':<16} {'unit':<28} {'prompt ids':<10} {'argmax':>7} {'max|Δlogit|':>11} {'KL max':>9} "
        f"{'max|Δp|':>9} {'answer':<20} {'gen tokens':>10}  status")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per matched unit (``-`` where a figure does not apply), under :data:`HEAD`."""
    lines = [HEAD, "-" * len(HEAD)]
    for r in rows:
        if "ref_key" in r:
            answer = ("= " if r["key_equal"] else "≠ ") + (r["ref_key"] if r["key_equal"] else f"{r['ref_key']}->{r['port_key']}")
        else:
            answer = "-"
        gen = "-" if "first_divergent_token" not in r else (
            "same" if r["first_divergent_token"] is None else f"div@{r['first_divergent_token']}")
        status = "FAIL: " + "; ".join(r["failures"]) if r["status"] == "FAIL" else r["status"]
        lines.append(f"{r['kind']:<16} {r['label'][:28]:<28} {'same' if r['ids_equal'] else 'DIFFER':<10} "
                     f"{fmt(r.get('argmax_agreement'), '.0%', 7)} {fmt(r.get('max_abs'), '.3e', 11)} "
                     f"{fmt(r.get('kl_max'), '.2e', 9)} {fmt(r.get('max_abs_dp'), '.2e', 9)} {answer[:20]:<20} "
                     f"{gen:>10}  {status}")
    return lines


def summary_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst figures over matched rows (None where no row has the figure), and the count per kind."""
    def worst(name: str) -> float | None:
        vals = [r[name] for r in rows if r.get(name) is not None]
        return max(vals) if vals else None

    agree = [r["argmax_agreement"] for r in rows if r.get("argmax_agreement") is not None]
    keys = [r["key_equal"] for r in rows if "key_equal" in r]
    kinds = sorted({r["kind"] for r in rows})
    return {"matched": len(rows), "by_kind": {k: sum(r["kind"] == k for r in rows) for k in kinds},
            "failed": sum(r["ok"] is False for r in rows), "recorded_only": sum(r["ok"] is None for r in rows),
            "max_abs_logit": worst("max_abs"), "nmse_max": worst("nmse"), "kl_max": worst("kl_max"),
            "max_abs_dp": worst("max_abs_dp"), "argmax_agreement_min": min(agree) if agree else None,
            "answers_equal": f"{sum(keys)}/{len(keys)}" if keys else None}


def worst_line(figures: dict[str, Any]) -> str:
    """``worst: max_abs_logit 1.234e-04, ...`` from :func:`summary_figures` (counts per kind left out)."""
    parts = [f"{k} {fmt(v, '.0%' if k.startswith('argmax') else '.3e', 0)}" if isinstance(v, float) else f"{k} {v}"
             for k, v in figures.items() if v is not None and k != "by_kind"]
    return "worst: " + ", ".join(parts)


def listing(title: str, units: list[Unit]) -> list[str]:
    """One line per kind: ``<title>, <kind> (<n>): label, label, ...`` (wrapped)."""
    lines = []
    for kind in sorted({u.kind for u in units}):
        labels = ", ".join(u.label for u in units if u.kind == kind)
        n = sum(u.kind == kind for u in units)
        lines += textwrap.wrap(f"{title}, {kind} ({n}): {labels}", width=120, subsequent_indent="    ")
    return lines
