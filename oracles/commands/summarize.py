"""``oracles summarize RECEIPT``: the d1 table of a receipt.

Reads a receipt's d1 row units (:mod:`oracles.receipts.units`: one per question, pin and engine, with the
figures ``test_readout`` records beside each) and its d1 records (``test_tree_vs_row``: the tree path's
answer; ``test_red_arm``; ``test_tree_split``: timings; ``test_dry_request``: rejected questions), one
block per pin and engine, and writes, beside the receipt unless ``--out`` says
otherwise, ``<receipt stem>.d1-summary.json`` and ``.d1-summary.png`` (both created exclusively,
never overwritten), and prints the table: near ties (top-2 gap <= 0.02), top-2 gap percentiles, gold
agreement overall and by type, source, length bucket and path, seconds per bucket, tree/row time
ratio, and the red arms (RED: the arm moved some option's probability by more than its threshold;
the answer need not flip). Percentiles are nearest-rank on the sorted gaps. A malformed record is
exit 2 naming the file, the record and the field; ``--out`` must be a folder. Without matplotlib the
PNG is not written and one line says so; the rest stands (exit 0).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Iterable

from oracles.checks.tolerance import FLOAT32
from oracles.commands.plots import unavailable
from oracles.errors import FixtureError, ReceiptError
from oracles.receipts.files import dump_json, load_json, write_exclusive
from oracles.receipts.units_reader import units_of

NEAR_TIE = FLOAT32.readout_near_tie  # the label the d1 tests wrote (oracles.checks.tolerance: pure, light)
PERCENTILES = (0.0, 0.05, 0.10, 0.25, 0.50)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("receipt", type=Path, help="a receipt .json holding d1 tests")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="folder for the summary files; default: beside the receipt")


_NUM, _STR, _KEY = (int, float), (str,), (str, int)
_OPT_BOOL = (bool, type(None))
_WHO = {"engine": (_STR, True), "pin": (_STR, True)}
#: check -> (record fields, data fields -> (types, required)) that :func:`summarize` reads; ``d1-row``:
#: the figures beside a d1 row unit (the unit itself holds record, question id, pin, engine and answer).
FIELDS: dict[str, tuple[dict[str, tuple[type, ...]], dict[str, tuple[tuple[type, ...], bool]]]] = {
    "d1-row": ({"outcome": _STR}, {
        "type": (_KEY, True), "source": (_KEY, True), "bucket": (_KEY, True), "row_len": ((int,), True),
        "top2_gap": (_NUM, True), "near_tie": ((bool,), True), "gold_match": (_OPT_BOOL, False), "seconds": (_NUM, False)}),
    "test_tree_vs_row": ({"record_id": _STR}, {"max_abs_dp": (_NUM, True), "gold_match_tree": (_OPT_BOOL, False), **_WHO}),
    "test_tree_split": ({}, {"tree_seconds": (_NUM, True), "rows_seconds": (_NUM, True), **_WHO}),
    "test_red_arm": ({"record_id": _STR, "outcome": _STR}, {
        "kind": (_STR, True), "base": (_STR, True), "max_abs_dp": (_NUM, True), "threshold": (_NUM, True),
        "argmax_base": (_KEY, True), "argmax_arm": (_KEY, True), **_WHO}),
    "test_dry_request": ({"record_id": _STR}, {"rejected": ((list,), False)}),
}


def _bad(where: str, field: str, types: tuple[type, ...]) -> FixtureError:
    names = " or ".join("null" if k is type(None) else k.__name__ for k in types)
    return FixtureError(f"record {where}: field {field!r} is missing or not {names}")


def _check(t: dict[str, Any], where: str, fields: str) -> None:
    """Check the fields of ``t`` that :data:`FIELDS` ``[fields]`` lists.

    Raises:
        FixtureError: one is missing or of the wrong type (the record and the field named).
    """
    if not isinstance(t.get("data"), dict):
        raise _bad(where, "data", (dict,))
    top, data = FIELDS[fields]
    for field, types in top.items():
        if not isinstance(t.get(field), types):
            raise _bad(where, field, types)
    for field, (types, required) in data.items():
        if (field in t["data"] or required) and not isinstance(t["data"].get(field), types):
            raise _bad(where, f"data.{field}", types)
    for n, r in enumerate(t["data"].get("rejected") or []):
        for field in ("qid", "field"):
            if not isinstance(r, dict) or not isinstance(r.get(field), str):
                raise _bad(where, f"data.rejected[{n}].{field}", _STR)


def _tests(receipt: dict[str, Any], check: str) -> list[dict[str, Any]]:
    """The records of ``check`` that hold data, each checked (:func:`_check`).

    Raises:
        FixtureError: an item of ``tests`` is not an object, or a field :data:`FIELDS` lists is wrong.
    """
    out = []
    for i, t in enumerate(receipt["tests"]):
        if not isinstance(t, dict):
            raise FixtureError(f"field 'tests[{i}]' is a JSON {type(t).__name__}, not a test record (an object)")
        if t.get("check") == check and t.get("data"):
            _check(t, str(t.get("nodeid") or f"tests[{i}]"), check)
            out.append(t)
    return out


def _questions(receipt: dict[str, Any], path: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per (pin, engine), one row per d1 row unit: the unit's record, question id and answer, and the
    figures its test recorded beside it (:data:`FIELDS` ``["d1-row"]``).

    Raises:
        ReceiptError: a malformed unit (:func:`oracles.receipts.units_reader.units_of`); FixtureError: a missing figure.
    """
    records = {str(t.get("nodeid")): t for t in receipt["tests"] if isinstance(t, dict)}
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for u in units_of(receipt, path):
        if u.kind != "d1-row":
            continue
        t = records[u.test]
        _check(t, u.test, "d1-row")
        out.setdefault((u.pin, u.engine), []).append(
            t["data"] | {"record": u.record, "qid": u.unit, "argmax_key": u.argmax_key, "outcome": t["outcome"]})
    return out


def rate(rows: Iterable[dict[str, Any]], key: str = "gold_match") -> dict[str, Any]:
    """Questions, near ties and gold agreement of ``rows`` (``key`` holds True/False/None per row)."""
    rows = list(rows)
    gold = [r[key] for r in rows if r.get(key) is not None]
    return {"questions": len(rows), "near_tie": sum(bool(r.get("near_tie")) for r in rows), "gold_n": len(gold),
            "gold_match": sum(gold), "gold_rate": round(sum(gold) / len(gold), 4) if gold else None}


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def _block(per_q: list[dict[str, Any]], trees: list[dict[str, Any]], splits: list[dict[str, Any]],
           arms: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one pin and engine: its questions, tree records, tree splits and red arms."""
    gaps = sorted(q["top2_gap"] for q in per_q)
    by = lambda f: {str(k): rate(q for q in per_q if q[f] == k)  # noqa: E731
                    for k in sorted({q[f] for q in per_q}, key=lambda v: (isinstance(v, str), v))}
    buckets: dict[str, dict[str, float]] = {}
    for q in sorted(per_q, key=lambda q: q["bucket"]):
        b = buckets.setdefault(str(q["bucket"]), {"rows": 0, "seconds": 0.0, "tokens": 0})
        b["rows"] += 1
        b["seconds"] = round(b["seconds"] + q.get("seconds", 0.0), 4)
        b["tokens"] += q["row_len"]
    tree_s, rows_s = sum(s["tree_seconds"] for s in splits), sum(s["rows_seconds"] for s in splits)
    return {
        "questions": len(per_q),
        "near_ties": {"count": sum(q["near_tie"] for q in per_q),
                      "ids": [f"{q['record']}/{q['qid']}" for q in per_q if q["near_tie"]]},
        "top2_gap": {f"p{int(p * 100):02d}": percentile(gaps, p) for p in PERCENTILES},
        "gold_overall": rate(per_q), "by_type": by("type"), "by_source": by("source"), "by_bucket": by("bucket"),
        "by_path": {"row": rate(per_q), "tree": rate({"gold_match": t.get("gold_match_tree")} for t in trees)},
        "seconds_by_bucket": buckets,
        "tree_vs_row": {"requests": len(splits), "tree_seconds": round(tree_s, 4), "rows_seconds": round(rows_s, 4),
                        "tree_over_rows": round(tree_s / rows_s, 4) if rows_s else None,
                        "max_abs_dp": max((t["max_abs_dp"] for t in trees), default=None)},
        "red_arms": [{k: a.get(k) for k in ("id", "kind", "base", "max_abs_dp", "argmax_base", "argmax_arm",
                                            "threshold", "outcome")} | {"red": a["max_abs_dp"] > a["threshold"]}
                     for a in arms],
        "per_question": [{k: q.get(k) for k in ("record", "qid", "type", "source", "bucket", "path", "row_len",
                                                "argmax_key", "gold_key", "gold_match", "top2_gap", "near_tie")}
                         for q in per_q],
    }


def summarize(receipt: Any, path: Path) -> dict[str, Any]:
    """The summary document of a receipt, one block per pin and engine (see the module docstring).

    Raises:
        ReceiptError: not a receipt of this schema, or a malformed unit (:func:`oracles.receipts.units_reader.units_of`).
        FixtureError: the receipt holds no d1 row unit, or a record summarize reads is malformed
            (:data:`FIELDS`; record and field named).
    """
    per = _questions(receipt, path)
    if not per:
        raise FixtureError("no d1 row units in this receipt (run `pytest -m d1 --runslow`)")

    def of(check: str, pin: str, engine: str) -> list[dict[str, Any]]:
        return [t["data"] | {"id": t.get("record_id"), "outcome": t.get("outcome")} for t in _tests(receipt, check)
                if (t["data"]["pin"], t["data"]["engine"]) == (pin, engine)]

    out: dict[str, Any] = {"kind": "d1-summary", "receipt_run_id": receipt.get("run_id"), "near_tie_threshold": NEAR_TIE,
                           "pins": {}}
    for (pin, engine), per_q in sorted(per.items()):
        out["pins"].setdefault(pin, {})[engine] = _block(per_q, of("test_tree_vs_row", pin, engine),
                                                         of("test_tree_split", pin, engine), of("test_red_arm", pin, engine))
    out["rejected"] = [{"record": t["record_id"], **r} for t in _tests(receipt, "test_dry_request")
                       for r in t["data"].get("rejected", [])]
    return out


#: What a red arm line means, printed under them: red is about probabilities moving, not the answer.
RED_LEGEND = ("           RED: the arm moved some option's probability by more than the threshold (max|dp| > "
              "threshold); the answer need not flip (answer base -> arm shows whether it did)")


def blocks(summary: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(pin, engine, block)`` of each pin and engine the summary holds."""
    return [(pin, engine, s) for pin, engines in summary["pins"].items() for engine, s in engines.items()]


def table(summary: dict[str, Any]) -> list[str]:
    """The printed table, one block per pin and engine."""
    lines = []
    for pin, engine, s in blocks(summary):
        g = s["gold_overall"]
        lines += [f"== d1 summary: pin {pin}, engine {engine}: {s['questions']} questions",
                  f"gold agreement {g['gold_match']}/{g['gold_n']} = {g['gold_rate']}; near ties (gap <= "
                  f"{summary['near_tie_threshold']}): {s['near_ties']['count']} {s['near_ties']['ids']}",
                  "top-2 gap " + "  ".join(f"{k}={v:.4f}" for k, v in s["top2_gap"].items() if v is not None)]
        for name in ("by_type", "by_source", "by_bucket", "by_path"):
            lines.append(f"{name:<10} " + "  ".join(f"{k}: {v['gold_match']}/{v['gold_n']}" for k, v in s[name].items()))
        lines.append("seconds    " + "  ".join(f"{k}: {v['seconds']:.2f}s/{v['rows']} rows/{v['tokens']} tok"
                                               for k, v in s["seconds_by_bucket"].items()))
        t = s["tree_vs_row"]
        lines.append(f"tree/row   {t['requests']} requests: tree {t['tree_seconds']:.2f}s vs rows {t['rows_seconds']:.2f}s "
                     f"= {t['tree_over_rows']}; max |dp| tree vs row {t['max_abs_dp']}")
        for a in s["red_arms"]:
            lines.append(f"red arm    {a['id']:<40} {a['kind']:<10} base {a['base']:<26} max|dp| {a['max_abs_dp']:.4f} "
                         f"{'>' if a['red'] else '<='} {a['threshold']:g} answer {a['argmax_base']} -> {a['argmax_arm']} "
                         f"{'RED' if a['red'] else 'not red'} ({a['outcome']})")
        if s["red_arms"]:
            lines.append(RED_LEGEND)
    if summary["rejected"]:
        lines.append("rejected   " + "; ".join(f"{r['record']}/{r['qid']} ({r['field']})" for r in summary["rejected"]))
    return lines


def plot(summary: dict[str, Any]) -> bytes:
    """PNG bytes: gold agreement by length bucket (left) and the top-2 gap histogram (right)."""
    from oracles.commands.plots import png_bytes, pyplot

    plt = pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for pin, engine, s in blocks(summary):
        items = [(k, v) for k, v in s["by_bucket"].items() if v["gold_rate"] is not None]
        ax1.plot([k for k, _ in items], [v["gold_rate"] for _, v in items], marker="o", label=f"{engine} ({pin})")
        for k, v in items:
            ax1.annotate(f"{v['gold_match']}/{v['gold_n']}", (k, v["gold_rate"]), textcoords="offset points",
                         xytext=(0, 6), ha="center", fontsize=8)
        ax2.hist([q["top2_gap"] for q in s["per_question"]], bins=20, range=(0, 1), alpha=0.6, label=f"{engine} ({pin})")
    ax1.set(title="gold agreement by length bucket", xlabel="state length bucket (tokens)", ylabel="gold agreement",
            ylim=(0, 1.1))
    ax2.axvline(summary["near_tie_threshold"], color="red", linestyle="--", linewidth=1, label="near tie")
    ax2.set(title="top-2 probability gap", xlabel="p(top 1) - p(top 2)", ylabel="questions")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    return png_bytes(fig)


def run(args: argparse.Namespace) -> int:
    """Summarise ``args.receipt``: write the JSON (and the PNG where matplotlib imports), print the table.

    Raises:
        FixtureError: the receipt is unreadable, not JSON, or holds a malformed record (file, record, field).
        ReceiptError: ``--out`` names a file or cannot be created, or an output already exists.
    """
    receipt = load_json(args.receipt)
    try:
        summary = summarize(receipt, args.receipt)
    except FixtureError as exc:
        raise FixtureError(f"{args.receipt}: {exc}") from None
    folder = args.out or args.receipt.parent
    if folder.exists() and not folder.is_dir():
        raise ReceiptError(f"{folder}: --out names a file; it must be a folder (the summary's .json and .png go in it)")
    stem = args.receipt.name.removesuffix(".json")
    json_path, png_path = folder / f"{stem}.d1-summary.json", folder / f"{stem}.d1-summary.png"
    summary["receipt"] = str(args.receipt)
    taken = [p for p in (json_path, png_path) if p.exists()]
    if taken:  # refuse before plotting or writing either file, so a summary is never left half-written
        raise ReceiptError(f"{taken[0]}: already exists; a summary is never overwritten")
    note = unavailable()  # no matplotlib: the JSON and table without the PNG, and one line saying so
    png = plot(summary) if note is None else None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReceiptError(f"{folder}: cannot create the --out folder: {exc.strerror or exc}") from exc
    write_exclusive(json_path, dump_json(summary))
    if png is not None:
        write_exclusive(png_path, png)
    for line in table(summary):
        print(line)
    print(f"summary: {json_path}" + (f"\nplot: {png_path}" if png is not None else ""))
    if note is not None:
        print(note, file=sys.stderr)
    return 0
