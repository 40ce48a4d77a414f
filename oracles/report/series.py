"""The figures a receipt's JSON holds, each read from the field its test attaches (no array is read):

- per stage (embedding, each decoder layer, final norm, head), a port's NMSE against the reference and
  its budget: ``stages`` of ``test_bisect_faithful_port`` and the fault panel's ``test_bisect_names_injected_stage``,
  and the ``bisect`` section a failing port test adds (:func:`oracles.families.execution.localise.localise`);
- per layer of the residual stream, a clef port's max |Δ| (``stream_max_abs`` of ``test_port_logits``);
- per decode step, the cache's logits against a cold recompute (``steps`` of ``test_decode_matches_recompute``);
- per MTP round, the drafts accepted (``rounds`` of ``test_mtp_rounds_equal_greedy``);
- per corpus chunk, a graded port's KL mean and p99 against the reference, with its band's
  (``chunks`` of ``test_port_within_band``; each conversion of ``test_conversion_costs``);
- per lane, the cohort's largest |Δlogit| from the serial lanes over every step (``test_cohort_close_to_serial``:
  the receipt keeps each lane's maximum and worst step, not the steps);
- per layer, the residual stream's largest |x| against float16's limit (``data.kind == "absmax"``).

Each reader takes one family's records (failed first) and returns its :class:`~oracles.report.curves.Curve`
list, empty when none of them holds the field. Pure.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from oracles.receipts.table import TestRecord
from oracles.report.curves import Curve, Line, capped, number, numbers, slug


def _who(rec: TestRecord) -> str:
    """A record's line label: its parametrize id (which names pin, engine and record), else its check."""
    return rec.record_id or rec.check


def _stages(rec: TestRecord) -> dict[str, Any] | None:
    """The bisect report a record holds: its own ``stages`` (the bisect checks) or its ``bisect`` section
    (a failing port test), when it has stages; None otherwise."""
    data = rec.data
    found = data.get("bisect") if isinstance(data.get("bisect"), dict) else data
    stages = found.get("stages") if isinstance(found, dict) else None
    if not isinstance(stages, list) or not stages or not all(isinstance(s, dict) for s in stages):
        return None
    return found


def bisect(family: str, records: Sequence[TestRecord]) -> list[Curve]:
    """Per check and pin, each record's NMSE per stage (log), its budget dashed, the named stage red."""
    groups: dict[tuple[str, str], list[tuple[TestRecord, dict[str, Any]]]] = {}
    for rec in records:
        found = _stages(rec)
        if found is not None:
            groups.setdefault((rec.check, str(rec.data.get("pin") or "")), []).append((rec, found))
    out = []
    for (check, pin), items in groups.items():
        names = tuple(str(s.get("name", "?")) for s in items[0][1]["stages"])
        lines = []
        for rec, found in items:
            stages = found["stages"]
            named = found.get("divergent", rec.data.get("named"))
            mark = next((i for i, s in enumerate(stages) if s.get("name") == named), None)
            lines.append(Line(_who(rec), tuple(number(s.get("nmse")) for s in stages), mark=mark))
        kept, left = capped(lines, "records")
        budget = Line("budget (first record's)", tuple(number(s.get("budget")) for s in items[0][1]["stages"]),
                      dashed=True)
        out.append(Curve(
            key=slug(family, "bisect", check, pin), family=family, title=f"{check}{' on ' + pin if pin else ''}: "
            "NMSE per stage", xlabel="stage (embedding, decoder layer, final norm, head)", ylabel="NMSE, max over positions",
            lines=(*kept, budget), log=True, ticks=tuple(n.replace("layer ", "") for n in names),
            note=f"From each record's stages ({check}); red: the first stage over budget with its input within.{left}"))
    return out


def stream(family: str, records: Sequence[TestRecord]) -> list[Curve]:
    """Per check, each record's residual-stream max |Δ| per layer (``stream_max_abs``), log."""
    return _per_field(family, records, "stream_max_abs", "residual stream max |Δ| per layer, port vs reference",
                      "layer (0: the embedding's output)", "max |Δ| over positions and channels")


def decode_steps(family: str, records: Sequence[TestRecord]) -> list[Curve]:
    """Per check, each record's max |Δlogit| per compared decode step against a cold recompute, log."""
    def steps(rec: TestRecord) -> Line | None:
        rows = rec.data.get("steps")
        if not isinstance(rows, list) or not rows or not all(isinstance(s, dict) and "max_abs" in s for s in rows):
            return None
        return Line(_who(rec), tuple(number(s.get("max_abs")) for s in rows),
                    x=tuple(float(number(s.get("step")) or 0) for s in rows))

    return _grouped(family, records, steps, "decode-steps", "cached decode vs cold recompute: max |Δlogit| per step",
                    "decode step", "max |Δlogit|", log=True)


def mtp_rounds(family: str, records: Sequence[TestRecord]) -> list[Curve]:
    """Per check, each record's drafts accepted per MTP round."""
    def rounds(rec: TestRecord) -> Line | None:
        rows = rec.data.get("rounds")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and "accepted" in r for r in rows):
            return None
        rate = number(rec.data.get("acceptance"))
        label = f"{_who(rec)} ({rate:.0%} accepted)" if rate is not None else _who(rec)
        return Line(label, tuple(number(r.get("accepted")) for r in rows))

    return _grouped(family, records, rounds, "mtp-rounds", "MTP: drafts accepted per round", "round",
                    "drafts accepted", log=False)


def graded(family: str, records: Sequence[TestRecord]) -> list[Curve]:
    """Per graded record, KL(reference‖port) mean and p99 per corpus chunk, its band's dashed; per
    conversion-costs record, each conversion's KL mean per chunk. Log."""
    out = []
    for rec in records:
        data = rec.data
        if data.get("kind") == "port-graded":
            sides = {str(data.get("port") or "port"): data, "band": data.get("band")}
        elif data.get("kind") == "conversion-costs" and isinstance(data.get("figures"), dict):
            sides = dict(data["figures"])
        else:
            continue
        lines = []
        for label, fig in sides.items():
            chunks = fig.get("chunks") if isinstance(fig, dict) else None
            if not isinstance(chunks, list) or not chunks:
                continue
            x = tuple(float(number(c.get("chunk")) or 0) for c in chunks)
            for stat, dashed in (("mean", False), ("p99", True)):
                y = tuple(number((c.get("kld") or {}).get(stat)) for c in chunks)
                lines.append(Line(f"{label} KL {stat}", y, x=x, dashed=dashed or label == "band"))
        if lines:
            kept, left = capped(lines, "lines")
            out.append(Curve(key=slug(family, "graded", rec.nodeid), family=family,
                             title=f"{rec.check} [{_who(rec)}]: KL(reference‖port) per corpus chunk", xlabel="corpus chunk",
                             ylabel="KL, nats", lines=kept, log=True,
                             note=f"From {rec.check}'s per-chunk statistics; the receipt keeps no per-position KL.{left}"))
    return out


def cohort(family: str, records: Sequence[TestRecord]) -> list[Curve]:
    """Per pin and engine, each lane's largest |Δlogit| of the cohort from the serial lane, with the atol."""
    groups: dict[tuple[str, str], dict[float, float | None]] = {}
    atol: dict[tuple[str, str], float | None] = {}
    for rec in records:
        lane, worst = number(rec.data.get("lane")), number(rec.data.get("max_abs"))
        if rec.check != "test_cohort_close_to_serial" or lane is None:
            continue
        key = (str(rec.data.get("pin")), str(rec.data.get("engine")))
        groups.setdefault(key, {})[lane] = worst
        atol[key] = number(rec.data.get("atol"))
    lines = [Line(f"{engine} on {pin}", tuple(v for _, v in sorted(lanes.items())), x=tuple(sorted(lanes)))
             for (pin, engine), lanes in groups.items()]
    if not lines:
        return []
    kept, left = capped(lines, "pins and engines")
    limits = tuple(sorted({(a, f"atol {a:g}") for a in atol.values() if a is not None}))
    return [Curve(key=slug(family, "cohort-lanes"), family=family, title="cohort vs serial: max |Δlogit| per lane",
                  xlabel="lane", ylabel="max |Δlogit| over every step", lines=kept, log=True, limits=limits,
                  note="From test_cohort_close_to_serial; the receipt keeps each lane's maximum and its worst step "
                       f"(the records' tables), not the per-step differences.{left}")]


def absmax(family: str, records: Sequence[TestRecord]) -> list[Curve]:
    """Per pin and engine, the residual stream's largest |x| per layer over its runs, with float16's limit."""
    from oracles.checks.absmax import FP16_MAX

    groups: dict[tuple[str, str], list[tuple[float | None, ...]]] = {}
    for rec in records:
        layers = rec.data.get("layers")
        if rec.data.get("kind") != "absmax" or not isinstance(layers, list):
            continue
        values = tuple(number(s.get("overall")) if isinstance(s, dict) else None for s in layers)
        groups.setdefault((str(rec.data.get("pin")), str(rec.data.get("engine"))), []).append(values)
    lines = []
    for (pin, engine), runs in groups.items():
        width = max(len(r) for r in runs)
        worst = tuple(max((v for r in runs if i < len(r) and (v := r[i]) is not None), default=None) for i in range(width))
        lines.append(Line(f"{engine} on {pin} ({len(runs)} runs)", worst))
    if not lines:
        return []
    kept, left = capped(lines, "pins and engines")
    return [Curve(key=slug(family, "absmax"), family=family, title="residual stream: largest |x| per layer",
                  xlabel="decoder layer (its output)", ylabel="max |x| over runs", lines=kept, log=True,
                  limits=((FP16_MAX, "float16 max 65504"),),
                  note=f"From the absmax records (oracles survey RECEIPT writes every layer's table).{left}")]


def _per_field(family: str, records: Sequence[TestRecord], field: str, title: str, xlabel: str,
               ylabel: str) -> list[Curve]:
    """Per check, each record's list ``field`` as a line (log)."""
    def line(rec: TestRecord) -> Line | None:
        y = numbers(rec.data.get(field))
        return None if y is None else Line(_who(rec), y)

    return _grouped(family, records, line, field, title, xlabel, ylabel, log=True)


def _grouped(family: str, records: Sequence[TestRecord], line: Callable[[TestRecord], Line | None], what: str,
             title: str, xlabel: str, ylabel: str, *, log: bool) -> list[Curve]:
    """One figure per check: ``line`` of each of its records that has one (capped)."""
    groups: dict[str, list[Line]] = {}
    for rec in records:
        got = line(rec)
        if got is not None:
            groups.setdefault(rec.check, []).append(got)
    out = []
    for check, lines in groups.items():
        kept, left = capped(lines, "records")
        out.append(Curve(key=slug(family, what, check), family=family, title=f"{check}: {title}", xlabel=xlabel,
                         ylabel=ylabel, lines=kept, log=log, note=f"From each record's {what} ({check}).{left}"))
    return out


#: Every reader of this module, in the order a family's figures are shown.
READERS = (bisect, stream, decode_steps, mtp_rounds, graded, cohort, absmax)


def curves(family: str, records: Sequence[TestRecord]) -> list[Curve]:
    """Every figure the JSON of one family's ``records`` holds (:data:`READERS`)."""
    return [c for reader in READERS for c in reader(family, records)]
