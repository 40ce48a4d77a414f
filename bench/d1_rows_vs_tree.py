"""d1 rows vs trees on one engine, side by side in one run.

    ORACLES_HOME=/tmp/oh .venv/bin/python bench/d1_rows_vs_tree.py [--engine torch] [--repeats 3] [--threads N] [--out FILE]

1. Row path, every request: wall seconds per length bucket (sum over the bucket's rows, and tokens/s).
2. Multi-question requests: the row path (every question as its own full row) and the tree path
   (trunk prefilled once, a branch per question from a restored snapshot) run alternately
   ``--repeats`` times each, interleaved so machine noise hits both alike; the median of each and
   their ratio tree/row per request, and the ratio of the summed medians (the tree should win: < 1).
Prints one JSON document (and writes it to ``--out`` when given, refusing to overwrite).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oracles.engines import engine_class  # noqa: E402
from oracles.engines.base import Engine  # noqa: E402
from oracles.families import DEFAULT_PIN  # noqa: E402
from oracles.families.d1 import records as d1  # noqa: E402
from oracles.families.d1.run import row_pass, tree_pass  # noqa: E402
from oracles.pins.pin import load_pin, snapshot_dir, verify_snapshot  # noqa: E402

Rows = dict[tuple[str, str], dict[str, Any]]


def row_buckets(engine: Engine, requests: list[d1.Request], meta: dict[str, Any], rows: Rows) -> dict[int, dict[str, float]]:
    """Part 1: the row path of every question, summed per length bucket (rows, tokens, seconds, tokens/s)."""
    buckets: dict[int, dict[str, float]] = {}
    for r in requests:
        for q in r.questions:
            if (r.id, q.qid) not in rows:
                continue
            row = rows[(r.id, q.qid)]
            run = row_pass(engine, row["ids"], row["readout_ids"])
            b = buckets.setdefault(meta[r.id]["bucket"], {"rows": 0, "tokens": 0, "seconds": 0.0})
            b["rows"] += 1
            b["tokens"] += len(row["ids"])
            b["seconds"] += run.seconds
    for b in buckets.values():
        b["tokens_per_second"] = round(b["tokens"] / b["seconds"], 1)
        b["seconds"] = round(b["seconds"], 3)
    return buckets


def trees_vs_rows(engine: Engine, requests: list[d1.Request], meta: dict[str, Any], rows: Rows,
                  repeats: int) -> list[dict[str, Any]]:
    """Part 2: per multi-question request, the row path and the tree path run alternately ``repeats``
    times each; their medians and the ratio tree/row."""
    trees = []
    for r in requests:
        m = meta[r.id]
        if m["path"] != "tree":
            continue
        groups = [rows[(r.id, qid)]["readout_ids"] for qid in m["questions"]]
        ids = [rows[(r.id, qid)]["ids"] for qid in m["questions"]]
        row_s, tree_s = [], []
        for _ in range(repeats):
            row_s.append(sum(row_pass(engine, i, g).seconds for i, g in zip(ids, groups)))
            tree_s.append(tree_pass(engine, m["trunk"], m["branches"], groups).seconds)
        trees.append({"id": r.id, "bucket": m["bucket"], "questions": len(ids), "trunk_len": len(m["trunk"]),
                      "row_tokens": sum(map(len, ids)), "tree_tokens": len(m["trunk"]) + sum(map(len, m["branches"])),
                      "rows_median_s": round(statistics.median(row_s), 4), "tree_median_s": round(statistics.median(tree_s), 4),
                      "tree_over_rows": round(statistics.median(tree_s) / statistics.median(row_s), 4)})
    return trees


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="torch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="engine threads (0: the library default); on a shared "
                    "2-core machine 1 thread avoids the oversubscription stalls of 2")
    ap.add_argument("--max-bucket", type=int, default=4096, help="skip requests above this bucket")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.out is not None and a.out.exists():
        print(f"{a.out} exists; refusing to overwrite", file=sys.stderr)
        return 2
    pin = load_pin(DEFAULT_PIN)
    root = snapshot_dir(pin)
    verify_snapshot(pin, root)
    start = time.perf_counter()
    engine = engine_class(a.engine)(root, pin, a.threads)
    load_s = time.perf_counter() - start
    rows_doc = d1.rows_doc(DEFAULT_PIN)
    meta = {r["id"]: r for r in rows_doc["requests"]}
    rows = {(r["id"], r["qid"]): r for r in rows_doc["rows"]}
    requests = [r for r in d1.load_requests() if meta[r.id]["bucket"] <= a.max_bucket]
    engine.forward([1, 2, 3], keep=1)  # warm-up: first-call allocations are not charged to a bucket
    buckets = row_buckets(engine, requests, meta, rows)
    trees = trees_vs_rows(engine, requests, meta, rows, a.repeats)
    total_rows = sum(t["rows_median_s"] for t in trees)
    total_tree = sum(t["tree_median_s"] for t in trees)
    doc = {"engine": a.engine, "pin": pin.name, "threads": a.threads, "load_seconds": round(load_s, 2), "repeats": a.repeats,
           "describe": engine.describe() if hasattr(engine, "describe") else {},
           "row_path_by_bucket": {str(k): v for k, v in sorted(buckets.items())},
           "row_path_seconds": round(sum(b["seconds"] for b in buckets.values()), 2),
           "trees": trees, "tree_over_rows_total": round(total_tree / total_rows, 4) if total_rows else None,
           "wall_seconds": round(time.perf_counter() - start, 1)}
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out is not None:
        with open(a.out, "x") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
