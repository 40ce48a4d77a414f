"""``oracles compare REF.json PORT.json``: hold a port's receipt against a reference receipt, unit by unit.

The units are the receipts' declared comparable units (:mod:`oracles.receipts.units`: prefill, decode,
generation, chat turns, d1 and clef read-outs), matched pin by pin by ``(kind, request_sha256, unit)``
(:mod:`oracles.receipts.compare`); ``--ref-pin``/``--port-pin`` compare one pin's reference units against
another pin's port units instead (an fp32 pin against a converted one). No path or nodeid is in the
key, so receipts from different machines compare, and one receipt that holds both engines compares
with itself. Per match: ids equal, argmax agreement, max |Δlogit|, NMSE, KL(ref‖port), first
divergent token; read-outs add max |Δp| and whether the answer agrees. The thresholds are held on
the rows the family's port test holds (:func:`oracles.receipts.compare.held_rows`):
every prompt position of a prefill or a clef row (text and picture tokens, beside its read-out), a d1
read-out's slot, a greedy decode's or generation's steps through the first divergent token, a sampled
generation's first step (its tokens are recorded, not held), so a unit passes here
exactly when its family's port test passes it on the same logits, for a port held to FLOAT32.

Which thresholds: each pin pair's judgment, from its two pins' precision in this project's pin store
(:func:`oracles.pins.pairing.judgment_of`, as the port tests choose it). ``exact``:
:data:`oracles.checks.tolerance.FLOAT32` (a receipt records no port's own tolerance). ``band``: each
unit's bound from the band unit of the reference receipt (engine ``<reference>@<dtype>`` on the
reference pin: :func:`oracles.receipts.compare.band_bound`); a greedy token may then change where the
held rows allow it. A pair the judgment refuses (a quantized artifact against a reference without its
weights) is refused, or with ``--graded`` its figures are printed and recorded as ``graded``: no
verdict, and the exit status does not depend on them. A pin not in the store is judged exact when
both sides are that pin (another machine's receipt), else refused.

Units present in one receipt only are listed (a port may run a sample), not an error, and the
summary line says so; ``--require-all`` makes a reference unit without a port unit a failure. A
generation without a step is "recorded only": nothing in it is held to a threshold.
The npz sidecar is the one the JSON names, else the JSON's namesake ``<stem>.npz`` (said when used).
A comparison JSON is written exclusively, after every input is checked (a bad input is refused first): a
taken ``--out`` is refused before anything is printed; the default name gains ``-2``, ``-3`` ... when taken
(two comparisons in one second), never overwriting one.
Logits stored to an error (:mod:`oracles.receipts.logit_store`) are held by their figures' bounds
(:mod:`oracles.checks.stored_bounds`): a threshold they leave open fails as ``undecided``, never passes.
Exit status: 0 all held units within thresholds (or every matched unit graded); 1 a threshold passed or
undecided, no unit matched or held, or (``--require-all``) a reference unit unmatched; 2 bad input (a
receipt of another schema, one without units, an engine or pin the receipt lacks, the reference compared
with its own records, a missing npz sidecar, a unit without its array or a coded array without a member,
a malformed field: file, record and field named; a pin pair nothing judges, a pin not in the store, a
band pair without band units). No torch import.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Iterator

from oracles.checks.judgment import Judgment
from oracles.checks.tolerance import FLOAT32
from oracles.errors import PinError, ReceiptError
from oracles.receipts.compare import PinPair, band_bound, compare_pair, plan
from oracles.receipts.compare_text import LEGEND, listing, summary_figures, table, worst_line
from oracles.receipts.files import dump_json, load_json, write_exclusive
from oracles.receipts.sidecar import find_sidecar, load_npz
from oracles.receipts.units import Unit
from oracles.receipts.units_reader import no_units, unit_rows, units_of

#: 5: a row whose logits are stored to an error has ``stored_error`` (the bound on its stored logit
#: differences) and ``bounds`` (``max_abs``, ``nmse``, ``kl_max``: [lower, upper] of the attached rows'
#: figures); its figures are the stored rows' (argmax and bit equality exact), and a failure may read
#: ``undecided``. 4: each ``pins`` entry has its ``judgment`` (``kind``, ``dtype``, ``why``) and each row
#: its ``tolerance`` (and ``band``, the band's figures, under a band); 3: units keyed with their pin, rows
#: name both pins and engines, ``pins`` holds one entry a pin pair.
SCHEMA = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ref", type=Path, help="the reference receipt (JSON)")
    parser.add_argument("port", type=Path, help="the port's receipt (JSON); may be the same file")
    parser.add_argument("--ref-engine", default=None, help="engine id of the reference units; default the REF run's --reference")
    parser.add_argument("--port-engine", default=None,
                        help="engine id of the port units on every pin; default, per pin, the one engine other than the "
                             "reference's (or the reference's own id in another receipt)")
    parser.add_argument("--ref-pin", default=None, help="compare only this pin's reference units (with --port-pin: "
                                                        "across pins); default: pin by pin")
    parser.add_argument("--port-pin", default=None, help="compare only this pin's port units; default: --ref-pin")
    parser.add_argument("--graded", action="store_true",
                        help="a pin pair nothing judges (a quantized artifact against a reference without its "
                             "weights): print and record its figures as graded, with no verdict (default: refused)")
    parser.add_argument("--require-all", action="store_true",
                        help="exit 1 when a reference unit has no port unit "
                             "(default: listed, not failed, as a port may run a sample)")
    parser.add_argument("--out", type=Path, default=None,
                        help="comparison JSON to create (refused when it exists); default receipts/compare/<UTC time>-<REF "
                             "stem>-vs-<PORT stem>.json, or -2, -3 ... before .json when that is taken")


def _ref_engine(units: list[Unit], receipt: dict[str, Any], wanted: str | None, path: Path) -> str:
    """``wanted``, else the run's ``--reference`` (else ``torch``), when ``path`` holds units of it.

    Raises:
        ReceiptError: it holds none; the engines it holds are named, and the option to choose one.
    """
    invoked = receipt.get("invocation")
    engine = wanted or str((invoked.get("reference") if isinstance(invoked, dict) else None) or "torch")
    _present(units, engine, path, "--ref-engine")
    return engine


def _present(units: list[Unit], engine: str, path: Path, option: str) -> None:
    present = sorted({u.engine for u in units})
    if engine not in present:
        raise ReceiptError(f"{path}: holds no comparable units of engine {engine!r}; engines present: "
                           f"{', '.join(present) or 'none'} (choose one with {option})")


def _same_records(args: argparse.Namespace, ref_receipt: dict[str, Any], port_receipt: dict[str, Any]) -> bool:
    """Whether REF and PORT are the same run's records (the same file, or two copies of one run id)."""
    run_id = ref_receipt.get("run_id")
    return args.ref.resolve() == args.port.resolve() or (run_id is not None and run_id == port_receipt.get("run_id"))


def _refuse_taken(out: Path | None) -> None:
    """Refuse an explicit ``--out`` that exists (checked once the inputs hold, before anything is printed).

    Raises:
        ReceiptError: the file exists (a comparison is never overwritten).
    """
    if out is not None and (out.exists() or out.is_symlink()):
        raise ReceiptError(f"{out}: already exists; a comparison is never overwritten (choose another --out)")


def _default_names(args: argparse.Namespace) -> Iterator[Path]:
    """``receipts/compare/<UTC time>-<REF stem>-vs-<PORT stem>.json``, then ``-2``, ``-3`` ... (the time is to
    the second, so two comparisons in one second share it; each name is tried exclusively by :func:`_write`)."""
    stem = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{args.ref.stem}-vs-{args.port.stem}"
    folder = Path("receipts") / "compare"
    yield folder / f"{stem}.json"
    for n in range(2, _MAX_SUFFIX + 1):
        yield folder / f"{stem}-{n}.json"


#: The most default names tried in one second before giving up (a bound, so a folder that refuses every
#: name for another reason cannot loop forever).
_MAX_SUFFIX = 1000


def _pairs(args: argparse.Namespace, ref_receipt: dict[str, Any], port_receipt: dict[str, Any]) -> list[PinPair]:
    """The pin pairs to compare (:func:`oracles.receipts.compare.plan`) from the two receipts' units,
    each judged (:func:`_judge`).

    Raises:
        ReceiptError: a malformed unit (:func:`oracles.receipts.units_reader.units_of`), a receipt without units
            (:func:`oracles.receipts.units_reader.no_units`), an engine or pin not present,
            the reference as its own port; a band pair without band units (:func:`_judge`).
        PinError: a pair nothing judges (without ``--graded``) or a pin not in the store (:func:`_judgment`).
    """
    ref_all, port_all = units_of(ref_receipt, args.ref), units_of(port_receipt, args.port)
    for units, receipt, path in ((ref_all, ref_receipt, args.ref), (port_all, port_receipt, args.port)):
        if not units:  # before naming engines: "engine 'torch' not present" would hide that nothing is
            raise ReceiptError(no_units(receipt, path))
    ref_engine = _ref_engine(ref_all, ref_receipt, args.ref_engine, args.ref)
    if args.port_engine:
        _present(port_all, args.port_engine, args.port, "--port-engine")
    pins = None if args.ref_pin is None and args.port_pin is None else (args.ref_pin or args.port_pin,
                                                                         args.port_pin or args.ref_pin)
    pairs = plan(ref_all, port_all, ref_engine, args.port_engine, pins, _same_records(args, ref_receipt, port_receipt),
                 (args.ref, args.port))
    for pair in pairs:
        _judge(pair, ref_all, args)
    return pairs


def _judgment(ref_pin: str, port_pin: str, graded: bool) -> tuple[Judgment | None, str | None]:
    """The judgment of a pin pair (:func:`oracles.pins.pairing.judgment_of` of the two pins in the store of
    this run), or, with ``graded``, None and why the pair has none.

    Raises:
        PinError: a pin not in the store while the two sides are different pins (the pin and the folders
            searched); a pair the judgment refuses, without ``graded`` (its line); a malformed pin file.
    """
    from oracles.pins import pairing
    from oracles.pins.pin import store

    where = store()
    missing = [name for name in dict.fromkeys((ref_pin, port_pin)) if where.path(name) is None]
    if missing and ref_pin == port_pin:
        return Judgment("exact", f"pin {ref_pin} on both sides (not in {where.describe()}): held to float32"), None
    if missing:
        raise PinError(f"pin {missing[0]!r} of the pair {ref_pin}/{port_pin} is not in {where.describe()}: its "
                       "precision decides the thresholds (oracles --pins-dir DIR compare ...: the folder holding its pin file)")
    try:
        return pairing.judgment_of(where.load(ref_pin), where.load(port_pin)), None
    except PinError as exc:
        if not graded:
            raise PinError(f"{exc}; or oracles compare --graded: its figures, with no verdict") from None
        return None, str(exc)


def _judge(pair: PinPair, ref_all: list[Unit], args: argparse.Namespace) -> None:
    """Set ``pair``'s judgment (:func:`_judgment`) and, under a band, its band units: the reference
    receipt's units of engine ``<reference engine>@<dtype>`` on the reference pin.

    Raises:
        ReceiptError: a band pair where a matched unit with an array has no band unit (how many, the
            first named, and how to attach them).
        PinError: as :func:`_judgment`.
    """
    pair.judgment, pair.graded = _judgment(pair.ref_pin, pair.port_pin, args.graded)
    if pair.judgment is None or pair.judgment.exact:
        return
    engine = f"{pair.ref_engine}@{pair.judgment.dtype}"
    pair.band = {u.key[:3]: u for u in ref_all if u.engine == engine and u.pin == pair.ref_pin}
    lacking = [r for r, _ in pair.matched if r.arrays and r.key[:3] not in pair.band]
    if lacking:
        raise ReceiptError(f"{args.ref}: {len(lacking)} of {len(pair.matched)} matched units of pins "
                           f"{pair.ref_pin}/{pair.port_pin} have no band unit (engine {engine} on pin {pair.ref_pin}; "
                           f"first: {lacking[0].kind} {lacking[0].label}), and the {pair.judgment.dtype} band judges "
                           f"them: run the port tests with --port-pin {pair.ref_pin}={pair.port_pin}, which attach "
                           "them, and compare that receipt")


def _rows(pair: PinPair, args: argparse.Namespace, ref_npz: Any, port_npz: Any) -> list[dict[str, Any]]:
    """The comparison rows of one judged pair (:func:`oracles.receipts.compare.compare_pair`): to FLOAT32
    (exact), to each unit's band bound (band), or graded (its figures; no failure, status ``graded``).

    Raises:
        ReceiptError: a unit without its array (:func:`oracles.receipts.units_reader.unit_rows`), a band
            unit whose rows do not fit (:func:`oracles.receipts.compare.band_bound`).
    """
    rows = []
    for r, p in pair.matched:
        a, b = unit_rows(r, ref_npz, args.ref), unit_rows(p, port_npz, args.port)
        if pair.judgment is None:
            row = compare_pair(r, p, a, b)
            row.update(tolerance=None, failures=[], held=[], status="graded", ok=None)
        elif pair.judgment.exact:
            row = compare_pair(r, p, a, b)
        else:
            q = pair.band.get(r.key[:3])  # None only for a unit without an array: nothing for a bound to hold
            bound, bound_hi, band = ((FLOAT32, None, None) if q is None else
                                     band_bound(r, p, q, a, b, unit_rows(q, ref_npz, args.ref)))
            row = compare_pair(r, p, a, b, bound, tokens_held=False, tolerance_hi=bound_hi)
            row["band"] = band
        rows.append(row)
    return rows


def _print_pairs(pairs: list[PinPair], rows: dict[int, list[dict[str, Any]]]) -> None:
    """Per pin pair: a title with the counts per kind, the table, the worst figures; then the unmatched."""
    for n, pair in enumerate(pairs):
        mine = rows[n]
        counts = summary_figures(mine)["by_kind"]
        kinds = ", ".join(f"{k} {c}" for k, c in counts.items())
        print(f"== {pair.title}: {len(mine)} units matched{f' ({kinds})' if kinds else ''}, "
              f"{len(pair.ref_only)} only in the reference, {len(pair.port_only)} only in the port; judged "
              f"{_verdict(pair)}")
        if mine:
            print("\n".join([*table(mine), worst_line(summary_figures(mine))]))
    for pair in pairs:
        where = f"pin {pair.ref_pin}" if pair.ref_pin == pair.port_pin else f"pins {pair.ref_pin}/{pair.port_pin}"
        for line in listing(f"only in the reference ({where})", pair.ref_only) + listing(f"only in the port ({where})",
                                                                                          pair.port_only):
            print(line)


def run(args: argparse.Namespace) -> int:
    ref_receipt, port_receipt = load_json(args.ref), load_json(args.port)
    pairs = _pairs(args, ref_receipt, port_receipt)
    ref_npz_path, ref_note = find_sidecar(ref_receipt, args.ref)
    port_npz_path, port_note = find_sidecar(port_receipt, args.port)
    ref_npz = load_npz(ref_npz_path, args.ref)
    same = ref_npz_path is not None and port_npz_path is not None and ref_npz_path.resolve() == port_npz_path.resolve()
    port_npz = ref_npz if same else load_npz(port_npz_path, args.port)  # one sidecar: its anchors are shared
    rows = {n: _rows(pair, args, ref_npz, port_npz) for n, pair in enumerate(pairs)}
    _refuse_taken(args.out)  # every input refusal above comes first: a bad input is the thing to fix
    every = [row for n in rows for row in rows[n]]
    ref_only = [u for pair in pairs for u in pair.ref_only]
    port_only = [u for pair in pairs for u in pair.port_only]
    for note in dict.fromkeys(n for n in (ref_note, port_note) if n):
        print(note)
    missing = (f"; FAIL (--require-all): {len(ref_only)} reference units have no port unit" if args.require_all else
               " (not compared, not failed: a port may run a sample; --require-all fails on them)") if ref_only else ""
    engines = ", ".join(sorted({p.port_engine for p in pairs if p.port_engine})) or "none"
    judged = [row for row in every if row["status"] != "graded"]
    graded = f", {len(every) - len(judged)} of them graded (no verdict)" if len(judged) < len(every) else ""
    print(f"reference {pairs[0].ref_engine if pairs else '-'} ({args.ref}) vs port {engines} ({args.port}): "
          f"{len(every)} units matched on {sum(bool(rows[n]) for n in rows)} pins{graded}, {len(ref_only)} only in the "
          f"reference, {len(port_only)} only in the port{missing}")
    _print_pairs(pairs, rows)
    figures = summary_figures(every)
    if every:
        print(LEGEND)
        print(worst_line(figures) + (" (all pins)" if len(pairs) > 1 else ""))
    else:
        print("no unit matched: no (kind, request sha256, unit) of the reference's units is among the port's on a "
              "compared pin; nothing was compared")
    held = any(r["ok"] is True for r in judged) or (bool(every) and not judged)  # graded alone: no verdict
    result = {"schema": SCHEMA, "ref": str(args.ref), "port": str(args.port),
              "ref_arrays": None if ref_npz_path is None else str(ref_npz_path),
              "port_arrays": None if port_npz_path is None else str(port_npz_path), "require_all": args.require_all,
              "pins": [{"ref_pin": p.ref_pin, "port_pin": p.port_pin, "ref_engine": p.ref_engine,
                        "port_engine": p.port_engine, "judgment": _judgment_json(p), "figures": summary_figures(rows[n])}
                       for n, p in enumerate(pairs)],
              "figures": figures, "rows": every,
              "unmatched": {"ref_only": [[*u.key, u.label] for u in ref_only],
                            "port_only": [[*u.key, u.label] for u in port_only]},
              "all_ok": held and all(r["ok"] is not False for r in judged) and not (args.require_all and ref_only)}
    out = _write(args, result)
    print(f"comparison: {out}")
    return 0 if result["all_ok"] else 1


def _verdict(pair: PinPair) -> str:
    """``exact (float32): why``, ``band (bfloat16): why`` or ``graded (no verdict): why``, for the table."""
    if pair.judgment is None:
        return f"graded (no verdict): {pair.graded}"
    return f"{pair.judgment.kind} ({pair.judgment.dtype}): {pair.judgment.why}"


def _judgment_json(pair: PinPair) -> dict[str, Any]:
    """The pair's judgment for the comparison JSON: ``{"kind", "dtype", "why"}``; ``kind`` ``graded``
    (``dtype`` None) where nothing judges the pair."""
    if pair.judgment is None:
        return {"kind": "graded", "dtype": None, "why": pair.graded}
    return pair.judgment.as_json()


def _write(args: argparse.Namespace, result: dict[str, Any]) -> Path:
    """Create the comparison JSON exclusively: at ``--out``, else at the first free default name.

    Returns:
        The path written.

    Raises:
        ReceiptError: its folder cannot be made or written; ``--out`` was taken meanwhile (called a
            comparison); every default name of this second is taken.
    """
    data = dump_json(result)
    for out in [args.out] if args.out is not None else _default_names(args):
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReceiptError(f"{out.parent}: cannot create the comparison's folder: {exc.strerror or exc}") from exc
        try:
            write_exclusive(out, data)
            return out
        except ReceiptError as exc:
            if not isinstance(exc.__cause__, FileExistsError):
                raise
            if args.out is not None:  # taken since the check (another run): say what it is
                raise ReceiptError(f"{out}: already exists; a comparison is never overwritten (choose another "
                                   f"--out)") from exc
    raise ReceiptError(f"{out}: already exists, as does every default name before it this second; choose --out")
