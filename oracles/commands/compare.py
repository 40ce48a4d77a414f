"""``oracles compare REF.json PORT.json``: hold a port's receipt against a reference receipt, unit by unit.

The units (:mod:`oracles.compare_units`) are matched by ``(kind, request_sha256, unit)``: the
execution oracles' records (prefill, decode, generation; chat per turn) and the d1 read-outs per
question (``d1-row``, ``d1-tree``, unit = question id). No path or nodeid is in the key, so receipts
from different machines compare as long as the requests are the same, and one receipt that holds both
engines compares with itself. Per match: ids equal, argmax agreement, max |Δlogit|, NMSE,
KL(ref‖port), first divergent token; read-outs add max |Δp| and whether the answer (argmax key)
agrees. The thresholds are those of :mod:`oracles.checks.port`.

Units present in one receipt only are listed (a port may run a sample), not an error, and the
summary line says so; ``--require-all`` makes a reference unit without a port unit a failure. A
sampled generation whose tokens diverged is "recorded only": nothing in it is held to a threshold.
The npz sidecar is the one the JSON names, else the JSON's namesake ``<stem>.npz`` (said when used).
A comparison JSON is written exclusively: a taken ``--out`` is refused before anything is computed.
Exit status: 0 all held units within thresholds; 1 a threshold passed, no unit matched or held, or
(``--require-all``) a reference unit unmatched; 2 bad input (an engine the receipt lacks, the
reference compared with its own records, a missing npz sidecar, a unit without its array, a
malformed field: file, record and field named). No torch import.
"""

from __future__ import annotations

import argparse
import textwrap
import time
from pathlib import Path
from typing import Any

from oracles.compare_units import Key, Unit, compare_pair, find_sidecar, load_npz, unit_array, units_of
from oracles.errors import ReceiptError
from oracles.receipts import dump_json, load_json, write_exclusive

SCHEMA = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ref", type=Path, help="the reference receipt (JSON)")
    parser.add_argument("port", type=Path, help="the port's receipt (JSON); may be the same file")
    parser.add_argument("--ref-engine", default=None, help="engine id of the reference records; default the REF run's --reference")
    parser.add_argument("--port-engine", default=None,
                        help="engine id of the port records; default the one other engine in PORT (or the reference's id when PORT has only it)")
    parser.add_argument("--require-all", action="store_true",
                        help="exit 1 when a reference unit has no port unit (default: listed, not failed, as a port may run a sample)")
    parser.add_argument("--out", type=Path, default=None,
                        help="comparison JSON to create; default receipts/compare/<UTC time>-<REF stem>-vs-<PORT stem>.json")


def by_key(units: list[Unit], path: Path) -> dict[Key, Unit]:
    """Units of one engine by match key.

    Raises:
        ReceiptError: two records of the receipt hold the same key (both tests named): which one to
            compare would be a guess.
    """
    out: dict[Key, Unit] = {}
    for u in units:
        seen = out.get(u.key)
        if seen is not None and seen.test != u.test:
            raise ReceiptError(f"{path}: records {seen.test} and {u.test} both hold unit {u.kind} {u.label} "
                               f"of engine {u.engine}; a unit must be unique per engine")
        out[u.key] = u
    return out


def _fmt(v: Any, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if v is None else format(v, f">{width}{spec}")


#: Under the table: what the two token columns compare and what "recorded only" means.
LEGEND = ("prompt ids: the input token ids are equal; gen tokens: the generated tokens (div@N: the first position "
          "they differ); recorded only: a sampled generation that diverged, nothing held to a threshold")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The printed table, one line per matched unit (``-`` where a figure does not apply), then :data:`LEGEND`."""
    head = (f"{'kind':<16} {'unit':<28} {'prompt ids':<10} {'argmax':>7} {'max|Δlogit|':>11} {'KL max':>9} "
            f"{'max|Δp|':>9} {'answer':<20} {'gen tokens':>10}  status")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "ref_key" in r:
            answer = r["ref_key"] if r["key_equal"] else f"{r['ref_key']}->{r['port_key']}"
            answer = ("= " if r["key_equal"] else "≠ ") + answer
        else:
            answer = "-"
        gen = "-" if "first_divergent_token" not in r else (
            "same" if r["first_divergent_token"] is None else f"div@{r['first_divergent_token']}")
        status = "FAIL: " + "; ".join(r["failures"]) if r["status"] == "FAIL" else r["status"]
        lines.append(f"{r['kind']:<16} {r['label'][:28]:<28} {'same' if r['ids_equal'] else 'DIFFER':<10} "
                     f"{_fmt(r.get('argmax_agreement'), '.0%', 7)} {_fmt(r.get('max_abs'), '.3e', 11)} "
                     f"{_fmt(r.get('kl_max'), '.2e', 9)} {_fmt(r.get('max_abs_dp'), '.2e', 9)} {answer[:20]:<20} "
                     f"{gen:>10}  {status}")
    return [*lines, LEGEND]


def summary_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst figures over the matched units (None where no unit has the figure)."""
    def worst(name: str) -> float | None:
        vals = [r[name] for r in rows if r.get(name) is not None]
        return max(vals) if vals else None

    agree = [r["argmax_agreement"] for r in rows if r.get("argmax_agreement") is not None]
    keys = [r["key_equal"] for r in rows if "key_equal" in r]
    return {"matched": len(rows), "failed": sum(r["ok"] is False for r in rows),
            "recorded_only": sum(r["ok"] is None for r in rows), "max_abs_logit": worst("max_abs"),
            "nmse_max": worst("nmse"), "kl_max": worst("kl_max"), "max_abs_dp": worst("max_abs_dp"),
            "argmax_agreement_min": min(agree) if agree else None,
            "answers_equal": f"{sum(keys)}/{len(keys)}" if keys else None}


def _listing(title: str, units: list[Unit]) -> list[str]:
    """One line per kind: ``<title>, <kind> (<n>): label, label, ...`` (wrapped)."""
    lines = []
    for kind in sorted({u.kind for u in units}):
        labels = ", ".join(u.label for u in units if u.kind == kind)
        n = sum(u.kind == kind for u in units)
        lines += textwrap.wrap(f"{title}, {kind} ({n}): {labels}", width=120, subsequent_indent="    ")
    return lines


def _engine(units: list[Unit], wanted: str | None, default: str, path: Path, option: str) -> str:
    """``wanted`` (or ``default``) when ``path`` holds units of it.

    Raises:
        ReceiptError: it holds none; the engines it holds are named, and the option to choose one.
    """
    engine = wanted or default
    present = sorted({u.engine for u in units})
    if engine not in present:
        raise ReceiptError(f"{path}: holds no comparable records of engine {engine!r}; engines present: "
                           f"{', '.join(present) or 'none'} (choose one with {option})")
    return engine


def _pick_port_engine(port: list[Unit], ref_engine: str, path: Path) -> str:
    others = sorted({u.engine for u in port} - {ref_engine})
    if len(others) > 1:
        raise ReceiptError(f"{path}: holds records of engines {others}; choose one with --port-engine")
    return others[0] if others else ref_engine


def _same_records(args: argparse.Namespace, ref_receipt: dict[str, Any], port_receipt: dict[str, Any]) -> bool:
    """Whether REF and PORT are the same run's records (the same file, or two copies of one run id)."""
    run_id = ref_receipt.get("run_id")
    return args.ref.resolve() == args.port.resolve() or (run_id is not None and run_id == port_receipt.get("run_id"))


def _out_path(args: argparse.Namespace) -> Path:
    """The comparison's path, refused at once when taken (before anything is computed).

    Raises:
        ReceiptError: the file exists (a comparison is never overwritten) or its folder cannot be made.
    """
    out: Path = args.out or (Path("receipts") / "compare" /
                             f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{args.ref.stem}-vs-{args.port.stem}.json")
    if out.exists() or out.is_symlink():
        raise ReceiptError(f"{out}: already exists; a comparison is never overwritten (choose another --out)")
    return out


def run(args: argparse.Namespace) -> int:
    out = _out_path(args)
    ref_receipt, port_receipt = load_json(args.ref), load_json(args.port)
    for receipt, path in ((ref_receipt, args.ref), (port_receipt, args.port)):
        if not isinstance(receipt, dict):
            raise ReceiptError(f"{path}: not a receipt (a JSON object with a 'tests' list)")
    ref_all, port_all = units_of(ref_receipt, args.ref), units_of(port_receipt, args.port)
    invoked = ref_receipt.get("invocation")
    default_ref = (invoked.get("reference") if isinstance(invoked, dict) else None) or "torch"
    ref_engine = _engine(ref_all, args.ref_engine, str(default_ref), args.ref, "--ref-engine")
    port_engine = _engine(port_all, args.port_engine, _pick_port_engine(port_all, ref_engine, args.port), args.port,
                          "--port-engine")
    if port_engine == ref_engine and _same_records(args, ref_receipt, port_receipt):
        raise ReceiptError(f"{args.port}: the port records would be the reference's own ({ref_engine!r} of the same "
                           f"run): a comparison with itself cannot fail; choose another --port-engine or receipt")
    ref = by_key([u for u in ref_all if u.engine == ref_engine], args.ref)
    port = by_key([u for u in port_all if u.engine == port_engine], args.port)
    (ref_npz_path, ref_note), (port_npz_path, port_note) = find_sidecar(ref_receipt, args.ref), find_sidecar(port_receipt, args.port)
    ref_npz, port_npz = load_npz(ref_npz_path, args.ref), load_npz(port_npz_path, args.port)
    rows = [compare_pair(r, port[k], unit_array(r, ref_npz, args.ref), unit_array(port[k], port_npz, args.port))
            for k, r in ref.items() if k in port]
    ref_only = [u for k, u in ref.items() if k not in port]
    port_only = [u for k, u in port.items() if k not in ref]
    for note in dict.fromkeys(n for n in (ref_note, port_note) if n):
        print(note)
    missing = (f"; FAIL (--require-all): {len(ref_only)} reference units have no port unit" if args.require_all else
               " (not compared, not failed: a port may run a sample; --require-all fails on them)") if ref_only else ""
    print(f"reference {ref_engine} ({args.ref}) vs port {port_engine} ({args.port}): {len(rows)} units matched, "
          f"{len(ref_only)} only in the reference, {len(port_only)} only in the port{missing}")
    if rows:
        lines = table(rows)
    else:
        lines = [f"no unit matched: the reference has {len(ref)} units of {ref_engine!r}, the port {len(port)} of "
                 f"{port_engine!r}, and no (kind, request sha256, unit) is in both; nothing was compared"]
    figures = summary_figures(rows)
    lines += _listing("only in the reference", ref_only) + _listing("only in the port", port_only)
    if rows:
        lines.append("worst: " + ", ".join(f"{k} {_fmt(v, '.0%' if k.startswith('argmax') else '.3e', 0)}"
                                           if isinstance(v, float) else f"{k} {v}"
                                           for k, v in figures.items() if v is not None))
    for line in lines:
        print(line)
    held = any(r["ok"] is True for r in rows)
    result = {"schema": SCHEMA, "ref": str(args.ref), "port": str(args.port), "ref_engine": ref_engine,
              "port_engine": port_engine, "ref_arrays": None if ref_npz_path is None else str(ref_npz_path),
              "port_arrays": None if port_npz_path is None else str(port_npz_path), "require_all": args.require_all,
              "figures": figures, "rows": rows,
              "unmatched": {"ref_only": [[u.kind, u.request_sha256, u.unit, u.label] for u in ref_only],
                            "port_only": [[u.kind, u.request_sha256, u.unit, u.label] for u in port_only]},
              "all_ok": held and all(r["ok"] is not False for r in rows) and not (args.require_all and ref_only)}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_exclusive(out, dump_json(result))
    except OSError as exc:
        raise ReceiptError(f"{out.parent}: cannot create the comparison's folder: {exc.strerror or exc}") from exc
    except ReceiptError as exc:  # taken since the check at the start (another run): say what it is
        raise ReceiptError(str(exc).replace("receipts are never overwritten", "a comparison is never overwritten")) from exc
    print(f"comparison: {out}")
    return 0 if result["all_ok"] else 1
