"""``oracles receipts [PATH]``: list receipts under a folder, or print one receipt's checks table.

``--latest FOLDER`` prints the newest receipt in FOLDER (by its UTC-time file name). A listing marks
an unreadable receipt (truncated JSON, not an object, another ``schema_version``) on its own line and
goes on; the exit status is then 2. Printing one receipt of another schema is a one-line error (exit
2). No receipt under the folder is an error (exit 2) for both forms.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from oracles.errors import FixtureError
from oracles.receipts import load_receipt
from oracles.report import format_checks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", type=Path, default=Path("receipts"),
                        help="a receipt .json to print, or a folder to list; default: %(default)s")
    parser.add_argument("--latest", type=Path, default=None, metavar="FOLDER", help="print the newest receipt in FOLDER")


#: A receipt's file name, ``<UTC time>-<run id>.json``; summaries and comparisons beside it are not receipts.
RECEIPT_NAME = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}\.json")


def _receipts(folder: Path) -> list[Path]:
    return sorted((p for p in folder.rglob("*.json") if RECEIPT_NAME.fullmatch(p.name)), key=lambda p: p.name)


def _engines(r: dict[str, Any]) -> str:
    """``name/pin@worker loads=N`` per engine load (the pin tells a draft twin from a second load)."""
    engines = r.get("engines")
    if not isinstance(engines, list):
        engines = []
    return ", ".join(f"{e.get('name')}{'/' + str(e['pin']) if e.get('pin') else ''}@{e.get('worker')} "
                     f"loads={e.get('load_count')}" for e in engines if isinstance(e, dict))


def _list(folder: Path) -> int:
    """One line per receipt under ``folder``; an unreadable one is a line saying why, and exit 2 at the end.

    Raises:
        FixtureError: no receipt under ``folder``, or some were unreadable (after listing all).
    """
    found = _receipts(folder)
    if not found:
        raise FixtureError(f"no receipt found under {folder}")
    bad = 0
    for p in found:
        try:
            r = load_receipt(p)
        except FixtureError as exc:
            bad += 1
            print(f"{p}  unreadable: {str(exc).removeprefix(str(p)).lstrip(':').strip()}")
            continue
        tests = r.get("tests")
        print(f"{p}  all_ok={r.get('all_ok')}  tests={len(tests) if isinstance(tests, list) else '?'}  "
              f"seconds={r.get('seconds')}")
    if bad:
        raise FixtureError(f"{folder}: {bad} of {len(found)} receipts unreadable (marked above)")
    return 0


#: Field -> types of one row of a receipt's ``checks`` table (what :func:`format_checks` reads).
CHECK_FIELDS: dict[str, tuple[type, ...]] = {"ok": (bool, type(None)), "passed": (int,), "skipped": (int,), "failed": (list,)}


def _check_rows(checks: dict[str, Any], path: Path) -> None:
    """Raise FixtureError naming the first malformed ``checks.<name>.<field>`` (file and field named)."""
    for name, row in checks.items():
        if not isinstance(row, dict):
            raise FixtureError(f"{path}: field 'checks.{name}' is not an object")
        for field, kinds in CHECK_FIELDS.items():
            value = row.get(field)
            if not isinstance(value, kinds) or (isinstance(value, list) and not all(isinstance(v, str) for v in value)):
                raise FixtureError(f"{path}: field 'checks.{name}.{field}' is missing or not "
                                   f"{' or '.join(k.__name__ for k in kinds)}{' (of record ids)' if field == 'failed' else ''}")


def run(args: argparse.Namespace) -> int:
    if args.latest is not None:
        found = _receipts(args.latest) if args.latest.is_dir() else []
        if not found:
            raise FixtureError(f"no receipt found under {args.latest}")
        args.path = found[-1]
    if args.path.is_dir():
        return _list(args.path)
    r = load_receipt(args.path)
    for key, kind in (("checks", dict), ("all_ok", bool)):
        if not isinstance(r.get(key), kind):
            raise FixtureError(f"{args.path}: not a receipt: field {key!r} is missing or not a {kind.__name__}")
    _check_rows(r["checks"], args.path)
    print(f"receipt: {args.path.resolve()}")
    not_run = r.get("not_run")
    print(f"engines: {_engines(r) or 'none'}; not run: {len(not_run) if isinstance(not_run, list) else 0}")
    for line in format_checks(r["checks"], r["all_ok"]):
        print(line)
    return 0 if r["all_ok"] else 1
