"""``oracles compare REF.json PORT.json``: hold a port's receipt against a reference receipt, record by record.

A comparable record is a test record whose data has ``kind``, ``engine`` and ``request_sha256`` (the
decode, generation, chat and prefill oracles attach them with the tokens, the per-row argmax and the
last-row logits in the npz sidecar). Records are matched by ``(kind, request_sha256)``, so receipts
from different machines compare as long as the requests are the same. Per match: ids equal, argmax
agreement, max |Δlogit|, KL(ref‖port), first divergent token. The thresholds are those of
:mod:`oracles.checks.port`. A comparison JSON is written exclusively (never overwritten); the exit
status is 1 when a threshold is passed, 2 on bad input. No torch import.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from oracles.checks.port import first_divergence, port_figures, threshold_failures
from oracles.errors import ReceiptError
from oracles.receipts import dump_json, load_json, write_exclusive

#: Kinds whose tokens are greedy, so a divergent token is a failure (sampled ones are only recorded).
GREEDY_KINDS = ("prefill", "decode", "generate-greedy", "chat")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ref", type=Path, help="the reference receipt (JSON)")
    parser.add_argument("port", type=Path, help="the port's receipt (JSON); may be the same file")
    parser.add_argument("--ref-engine", default=None, help="engine id of the reference records; default the REF run's --reference")
    parser.add_argument("--port-engine", default=None,
                        help="engine id of the port records; default the one other engine in PORT (or the reference's id when PORT has only it)")
    parser.add_argument("--out", type=Path, default=None,
                        help="comparison JSON to create; default receipts/compare/<UTC time>-<REF stem>-vs-<PORT stem>.json")


def comparables(receipt: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """The comparable records of a receipt, each with its test's ``data`` and ``nodeid``.

    Raises:
        ReceiptError: the receipt has no ``tests`` list (path named).
    """
    tests = receipt.get("tests")
    if not isinstance(tests, list):
        raise ReceiptError(f"{path}: field 'tests' is missing or not a list; not a receipt")
    out = []
    for t in tests:
        data = t.get("data") if isinstance(t, dict) else None
        if isinstance(data, dict) and all(isinstance(data.get(k), str) for k in ("kind", "engine", "request_sha256")):
            out.append({**data, "nodeid": t.get("nodeid"), "outcome": t.get("outcome")})
    return out


def _arrays(receipt: dict[str, Any], path: Path) -> Any:
    name = receipt.get("arrays")
    if not name:
        return None
    npz = path.parent / name
    if not npz.is_file():
        raise ReceiptError(f"{path}: its npz sidecar {npz} is missing")
    return np.load(npz, allow_pickle=False)


def _array(rec: dict[str, Any], name: str, npz: Any) -> np.ndarray | None:
    entry = (rec.get("arrays") or {}).get(name)
    if entry is None or npz is None or entry["npz_key"] not in npz:
        return None
    return np.asarray(npz[entry["npz_key"]], dtype=np.float32)


def _units(rec: dict[str, Any]) -> list[tuple[str, list[int], list[int] | None, list[int] | None, str | None]]:
    """(unit suffix, ids, tokens, argmax, array name) per comparable unit of a record (chat: per turn)."""
    if rec["kind"] == "chat":
        return [(f"#turn{t['turn']}", t.get("suffix_ids") or [], t.get("tokens"), None, f"turn{t['turn']}_warm_logits")
                for t in rec.get("turns", [])]
    return [("", rec.get("ids") or [], rec.get("tokens"), rec.get("argmax"), "last_logits")]


def compare(ref: list[dict[str, Any]], port: list[dict[str, Any]], ref_npz: Any, port_npz: Any) -> list[dict[str, Any]]:
    """One row per matched unit: figures, failures (list of lines) and ``ok``."""
    by_key = {(r["kind"], r["request_sha256"]): r for r in port}
    rows = []
    for r in ref:
        p = by_key.get((r["kind"], r["request_sha256"]))
        if p is None:
            continue
        for (suffix, ids_r, tok_r, am_r, arr), (_s, ids_p, tok_p, am_p, _a) in zip(_units(r), _units(p)):
            row: dict[str, Any] = {"kind": r["kind"] + suffix, "request_sha256": r["request_sha256"],
                                   "ref_test": r["nodeid"], "port_test": p["nodeid"], "ids_equal": ids_r == ids_p}
            fails = [] if row["ids_equal"] else [f"ids differ at position {first_divergence(ids_r, ids_p)}"]
            if am_r is not None and am_p is not None and len(am_r) and len(am_r) == len(am_p):
                row["argmax_agreement"] = float(np.mean(np.asarray(am_r) == np.asarray(am_p)))
            if tok_r is not None and tok_p is not None:
                row["first_divergent_token"] = first_divergence(tok_r, tok_p)
                if row["first_divergent_token"] is not None and r["kind"] in GREEDY_KINDS:
                    fails.append(f"greedy tokens diverge at {row['first_divergent_token']}")
            a, b = _array(r, arr, ref_npz), _array(p, arr, port_npz)
            if row.get("first_divergent_token") is not None:
                a = b = None  # the last rows follow different tokens: their logits are not comparable
                row["logits"] = "not compared: the token sequences differ before the last row"
            if a is not None and b is not None and a.shape == b.shape:
                try:
                    fig = port_figures(a, b)
                except ValueError as exc:
                    fig, fails = {}, [*fails, str(exc)]
                row.update({k: fig[k] for k in ("max_abs", "kl_mean", "kl_max", "nmse") if k in fig})
                if fig:
                    fails += threshold_failures(fig)
            row["failures"], row["ok"] = fails, not fails
            rows.append(row)
    return rows


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = f"{'kind':<22} {'request':<12} {'ids':<4} {'argmax':>7} {'max|Δlogit|':>12} {'KL mean':>10} {'KL max':>10} {'1st div':>7}  ok"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['kind']:<22} {r['request_sha256'][:12]:<12} {'yes' if r['ids_equal'] else 'NO':<4} "
                     f"{_fmt(r.get('argmax_agreement'), '7.2%')} {_fmt(r.get('max_abs'), '12.3e')} "
                     f"{_fmt(r.get('kl_mean'), '10.2e')} {_fmt(r.get('kl_max'), '10.2e')} "
                     f"{_fmt(r.get('first_divergent_token'), '>7')}  {'ok' if r['ok'] else 'FAIL: ' + '; '.join(r['failures'])}")
    return lines


def _pick_port_engine(port: list[dict[str, Any]], ref_engine: str, path: Path) -> str:
    others = sorted({r["engine"] for r in port} - {ref_engine})
    if len(others) > 1:
        raise ReceiptError(f"{path}: holds records of engines {others}; choose one with --port-engine")
    return others[0] if others else ref_engine


def run(args: argparse.Namespace) -> int:
    ref_receipt, port_receipt = load_json(args.ref), load_json(args.port)
    ref_all, port_all = comparables(ref_receipt, args.ref), comparables(port_receipt, args.port)
    ref_engine = args.ref_engine or (ref_receipt.get("invocation") or {}).get("reference") or "torch"
    port_engine = args.port_engine or _pick_port_engine(port_all, ref_engine, args.port)
    ref = [r for r in ref_all if r["engine"] == ref_engine]
    port = [r for r in port_all if r["engine"] == port_engine]
    if not ref:
        raise ReceiptError(f"{args.ref}: no comparable records of engine {ref_engine!r}")
    rows = compare(ref, port, _arrays(ref_receipt, args.ref), _arrays(port_receipt, args.port))
    unmatched = sorted({(r["kind"], r["request_sha256"]) for r in ref} - {(r["kind"], r["request_sha256"]) for r in port})
    print(f"reference {ref_engine} ({args.ref}) vs port {port_engine} ({args.port}): {len(rows)} matched, "
          f"{len(unmatched)} reference records without a port record")
    for line in table(rows):
        print(line)
    out = args.out or Path("receipts") / "compare" / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{args.ref.stem}-vs-{args.port.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"schema": 1, "ref": str(args.ref), "port": str(args.port), "ref_engine": ref_engine,
              "port_engine": port_engine, "rows": rows, "unmatched": [list(u) for u in unmatched],
              "all_ok": all(r["ok"] for r in rows) and bool(rows)}
    write_exclusive(out, dump_json(result))
    print(f"comparison: {out}")
    return 0 if result["all_ok"] else 1
