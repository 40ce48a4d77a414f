"""``oracles receipts [PATH]``: list receipts under a folder, or print one receipt's checks table.

``--latest FOLDER`` prints the newest receipt in FOLDER (by its UTC-time file name).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from oracles.errors import FixtureError
from oracles.receipts import load_json
from oracles.report import format_checks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", type=Path, default=Path("receipts"),
                        help="a receipt .json to print, or a folder to list; default: %(default)s")
    parser.add_argument("--latest", type=Path, default=None, metavar="FOLDER", help="print the newest receipt in FOLDER")


#: A receipt's file name, ``<UTC time>-<run id>.json``; summaries and comparisons beside it are not receipts.
RECEIPT_NAME = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}\.json")


def _receipts(folder: Path) -> list[Path]:
    return sorted((p for p in folder.rglob("*.json") if RECEIPT_NAME.fullmatch(p.name)), key=lambda p: p.name)


def run(args: argparse.Namespace) -> int:
    if args.latest is not None:
        found = _receipts(args.latest) if args.latest.is_dir() else []
        if not found:
            raise FixtureError(f"{args.latest}: no receipt found")
        args.path = found[-1]
    if args.path.is_dir():
        for p in _receipts(args.path):
            r = load_json(p)
            if not isinstance(r, dict):
                raise FixtureError(f"{p}: not a receipt: a JSON {type(r).__name__}, not an object")
            print(f"{p}  all_ok={r.get('all_ok')}  tests={len(r.get('tests', []))}  seconds={r.get('seconds')}")
        return 0
    r = load_json(args.path)
    for key, kind in (("checks", dict), ("all_ok", bool)):
        if not isinstance(r, dict) or not isinstance(r.get(key), kind):
            raise FixtureError(f"{args.path}: not a receipt: field {key!r} is missing or not a {kind.__name__}")
    print(f"receipt: {args.path.resolve()}")
    engines = ", ".join(f"{e.get('name')}@{e.get('worker')} loads={e.get('load_count')}" for e in r.get("engines", []))
    print(f"engines: {engines or 'none'}; not run: {len(r.get('not_run', []))}")
    for line in format_checks(r["checks"], r["all_ok"]):
        print(line)
    return 0 if r["all_ok"] else 1
