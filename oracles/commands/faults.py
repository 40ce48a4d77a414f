"""``oracles faults RECEIPT``: the fault panel's detection matrix from a receipt of ``pytest -m faults``.

Rows are (pin, port): the faithful control and one fault each; columns are the suite's checks
(:data:`oracles.faults.matrix.CHECKS`); a cell is ``X`` caught, ``.`` passed, ``-`` not applicable
(the engine lacks the family: its reason in ``--details``), ``~`` untouched (the fault is not on that
family's path). Beside each row: how many checks caught it, and what ``oracles bisect`` named on a
cold prefill against where the fault was injected. ``--details`` prints each row's first catching
message; ``--markdown`` prints the table the README carries.

Exit 0: every fault caught by some check, the faithful port by none, every bisect on its injected
stage; 1: otherwise (each failure listed); 2: a malformed receipt, one of another schema, or one without
panel records.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from oracles.errors import FixtureError
from oracles.receipts.table import load_receipt

#: Column heads, in the order of oracles.faults.matrix.CHECKS (kept here so this command imports no numpy).
ABBREV = {"forward:port": "fwd", "decode:port": "dec", "decode:recompute": "rec", "generation:port": "gen",
          "generation:vs-decode": "g=d", "speculative:port": "spc", "speculative:vs-greedy": "s=g",
          "chat:port": "cht", "chat:warm-cold": "w=c", "chat:replay": "rpl", "d1:port": "d1",
          "d1:tree-row": "t=r", "cohort:port": "coh", "cohort:serial": "c=s"}
CELL = {"caught": "X", "passed": ".", "n/a": "-", "untouched": "~"}
CONTROL = "faithful"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("receipt", type=Path, help="a receipt .json of a run that included the faults tests")
    parser.add_argument("--details", action="store_true", help="print each row's first catching check and message")
    parser.add_argument("--markdown", action="store_true", help="print the matrix as a Markdown table")


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise FixtureError(f"{where}: field {key!r} is missing or not {getattr(kind, '__name__', kind)}")
    return value


def collect(receipt: Any, path: Path) -> tuple[list[dict[str, Any]], dict[tuple[str, str], dict[str, Any]]]:
    """(detection rows in receipt order, bisect results by (pin, fault)) from a receipt's tests.

    Raises:
        FixtureError: not a receipt, a panel record with a missing or mistyped field (file, test and
            field named), or no panel record at all.
    """
    tests = receipt.get("tests") if isinstance(receipt, dict) else None
    if not isinstance(tests, list):
        raise FixtureError(f"{path}: not a receipt (no 'tests' list)")
    rows, bisects = [], {}
    for i, t in enumerate(tests):
        data = t.get("data") if isinstance(t, dict) else None
        if not isinstance(data, dict) or data.get("kind") not in ("fault-detection", "fault-bisect"):
            continue
        where = f"{path}: tests[{i}] ({t.get('nodeid')})"
        pin, fault = _field(data, "pin", str, where), _field(data, "fault", str, where)
        if data["kind"] == "fault-bisect":
            if not isinstance(data.get("named", 0), (str, type(None))):
                raise FixtureError(f"{where}: field 'named' is missing or not a str or null")
            bisects[(pin, fault)] = {"expected": data.get("expected"), "named": data.get("named"),
                                     "inside": data.get("inside"), "outcome": t.get("outcome")}
            continue
        checks = _field(data, "checks", dict, where)
        for name, cell in checks.items():
            if not (isinstance(cell, dict) and cell.get("status") in CELL):
                raise FixtureError(f"{where}: field 'checks.{name}' is not {{'status': one of "
                                   f"{', '.join(CELL)}, 'message'}}")
        order = data.get("order", [])
        rows.append({"pin": pin, "fault": fault, "title": data.get("title", ""), "checks": checks,
                     "outcome": t.get("outcome"), "order": order if isinstance(order, list) else []})
    if not rows:
        raise FixtureError(f"{path}: no fault panel records "
                           f"(run: pytest --pyargs oracles.suite -m faults --runslow [--pin NAME])")
    # the panel's order (pins as they first appear, then the control and the faults in the order of
    # oracles.faults.FAULTS); xdist finishes tests in any order
    pins = list(dict.fromkeys(r["pin"] for r in rows))
    rows.sort(key=lambda r: [pins.index(r["pin"]), *r["order"], r["fault"]])
    return rows, bisects


def _caught(row: dict[str, Any]) -> list[str]:
    return [c for c in ABBREV if row["checks"].get(c, {}).get("status") == "caught"]


def _bisect_cell(b: dict[str, Any] | None) -> str:
    if b is None:
        return "not run"
    named = b["named"] or "none"
    mark = "ok" if b["named"] == b["expected"] else f"MISSED (injected: {b['expected'] or 'none'})"
    inside = f", {b['inside']}" if b.get("inside") and b["inside"] != "neither" else ""
    return f"{named}{inside} {mark}"


def text(rows: list[dict[str, Any]], bisects: dict[tuple[str, str], dict[str, Any]], details: bool) -> list[str]:
    """The matrix as fixed-width lines (a legend of the column heads first)."""
    width = max(len(f"{r['pin']} {r['fault']}") for r in rows)
    legend = "  ".join(f"{a}={c}" for c, a in ABBREV.items())
    lines = [f"columns: {legend}", "cells: X caught, . passed, - not applicable, ~ fault not on that path", "",
             f"{'pin fault':<{width}}  " + " ".join(f"{a:>3}" for a in ABBREV.values()) + "  caught  bisect (cold prefill)"]
    for r in rows:
        cells = " ".join(f"{CELL[r['checks'].get(c, {}).get('status', 'untouched')]:>3}" for c in ABBREV)
        lines.append(f"{r['pin'] + ' ' + r['fault']:<{width}}  {cells}  {len(_caught(r)):>6}  "
                     f"{_bisect_cell(bisects.get((r['pin'], r['fault'])))}")
        if details:
            first = _caught(r)[:1]
            lines.append(f"    {r['title']}")
            lines.append(f"    first: {first[0]}: {r['checks'][first[0]]['message']}" if first else "    first: none")
    return lines


def markdown(rows: list[dict[str, Any]], bisects: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """The matrix as a Markdown table with each row's first catching message."""
    out = ["| pin | port | " + " | ".join(ABBREV.values()) + " | caught | bisect | first failure |",
           "|---|---|" + "---|" * len(ABBREV) + "---:|---|---|"]
    for r in rows:
        first = _caught(r)[:1]
        message = (r["checks"][first[0]]["message"] or "").replace("|", "\\|") if first else ""
        cells = " | ".join(CELL[r["checks"].get(c, {}).get("status", "untouched")] for c in ABBREV)
        out.append(f"| {r['pin']} | {r['fault']} | {cells} | {len(_caught(r))} | "
                   f"{_bisect_cell(bisects.get((r['pin'], r['fault'])))} | {message} |")
    return out


def verdicts(rows: list[dict[str, Any]], bisects: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """What the panel must show and does not: a missed fault, a false alarm, a bisect off its stage."""
    bad = []
    for r in rows:
        caught = _caught(r)
        if r["fault"] == CONTROL and caught:
            bad.append(f"{r['pin']} {r['fault']}: false alarm by {', '.join(caught)}")
        elif r["fault"] != CONTROL and not caught:
            bad.append(f"{r['pin']} {r['fault']}: missed by every check")
    for (pin, fault), b in bisects.items():
        if b["named"] != b["expected"]:
            bad.append(f"{pin} {fault}: bisect named {b['named']}, injected at {b['expected']}")
    return bad


def run(args: argparse.Namespace) -> int:
    rows, bisects = collect(load_receipt(args.receipt), args.receipt)
    print("\n".join(markdown(rows, bisects) if args.markdown else text(rows, bisects, args.details)))
    bad = verdicts(rows, bisects)
    for line in bad:
        print(f"FAIL {line}")
    if not bad:
        faults = sum(r["fault"] != CONTROL for r in rows)
        print(f"ok: {faults} fault rows each caught, {len(rows) - faults} faithful rows caught by none, "
              f"{len(bisects)} bisects on their stage")
    return 1 if bad else 0
