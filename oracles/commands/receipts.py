"""``oracles receipts [PATH]``: list receipts under a folder, or print one receipt's checks table.

``--latest FOLDER`` prints the newest receipt in FOLDER (by its UTC-time file name).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oracles.errors import FixtureError
from oracles.receipts import load_json
from oracles.report import format_checks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", type=Path, default=Path("receipts"),
                        help="a receipt .json to print, or a folder to list; default: %(default)s")
    parser.add_argument("--latest", type=Path, default=None, metavar="FOLDER", help="print the newest receipt in FOLDER")


def _receipts(folder: Path) -> list[Path]:
    return sorted((p for p in folder.rglob("*.json") if not p.name.startswith(".")), key=lambda p: p.name)


def run(args: argparse.Namespace) -> int:
    if args.latest is not None:
        found = _receipts(args.latest) if args.latest.is_dir() else []
        if not found:
            raise FixtureError(f"{args.latest}: no receipt found")
        args.path = found[-1]
    if args.path.is_dir():
        for p in _receipts(args.path):
            r = load_json(p)
            print(f"{p}  all_ok={r.get('all_ok')}  tests={len(r.get('tests', []))}  seconds={r.get('seconds')}")
        return 0
    r = load_json(args.path)
    if not isinstance(r, dict) or "checks" not in r:
        raise FixtureError(f"{args.path}: not a receipt: field 'checks' is missing")
    print(f"receipt: {args.path.resolve()}")
    engines = ", ".join(f"{e['name']}@{e['worker']} loads={e['load_count']}" for e in r.get("engines", []))
    print(f"engines: {engines or 'none'}; not run: {len(r.get('not_run', []))}")
    for line in format_checks(r["checks"], r["all_ok"]):
        print(line)
    return 0 if r["all_ok"] else 1
