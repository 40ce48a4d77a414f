"""``oracles receipts [PATH]``: list receipts under a folder, or print one receipt's checks table.

``--latest FOLDER`` prints the newest receipt in FOLDER (by its UTC-time file name). A
``.partial.jsonl`` prints the checks table of the tests its run finished (a killed run's evidence). A listing marks
an unreadable receipt (truncated JSON, not an object, another ``schema_version``) on its own line and
goes on; the exit status is then 2. Printing one receipt of another schema is a one-line error (exit
2). No receipt under the folder is an error (exit 2) for both forms.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from oracles.errors import FixtureError
from oracles.receipts.report import format_checks
from oracles.receipts.table import checks_table, load_receipt, load_records


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


#: Fields a table written before them lacks (then shown as ``?``), held to ``int`` when present.
LATER_CHECK_FIELDS = ("xfailed", "not_run")


def _check_rows(checks: dict[str, Any], path: Path) -> None:
    """Raise FixtureError naming the first malformed ``checks.<name>.<field>`` (file and field named)."""
    for name, row in checks.items():
        if not isinstance(row, dict):
            raise FixtureError(f"{path}: field 'checks.{name}' is not an object")
        later = {f: (int,) for f in LATER_CHECK_FIELDS if f in row}
        for field, kinds in {**CHECK_FIELDS, **later}.items():
            value = row.get(field)
            if not isinstance(value, kinds) or (isinstance(value, list) and not all(isinstance(v, str) for v in value)):
                raise FixtureError(f"{path}: field 'checks.{name}.{field}' is missing or not "
                                   f"{' or '.join(k.__name__ for k in kinds)}{' (of record ids)' if field == 'failed' else ''}")


def _event(line: str, event: str) -> dict[str, Any] | None:
    """The line as a dict when it is a ``event`` line (a torn last line is none: load_records allows it)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and obj.get("event") == event else None


def _partial(path: Path) -> int:
    """Print a ``.partial.jsonl``: the records its run finished, as a checks table.

    A partial log gains one line per finished test while its run goes on, so it is the evidence of a
    run killed before its receipt was written. It lists no test that never started, so it never claims
    all ok (exit 1); when its ``end`` line names the run's receipt, that is named.

    Raises:
        FixtureError: a bad line (file and line named; a torn last line of a killed run is ignored).
    """
    records = load_records(path)
    lines = [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]
    start, end = _event(lines[0] if lines else "", "start") or {}, _event(lines[-1] if lines else "", "end")
    print(f"partial log: {path.resolve()}")
    if end is None:
        state = "no end line: the run was killed (or still runs); tests it never started are not listed"
    elif end.get("receipt"):
        state = f"the run ended; its receipt: {path.with_name(str(end['receipt']))}"
    else:
        state = f"the run ended without a receipt: {end.get('error')}"
    print(f"run {start.get('run_id', '?')} started {start.get('started', '?')}; {len(records)} tests finished; {state}")
    print(f"resume from it: pytest ... --resume={path} (runs what did not pass)")
    for line in format_checks(checks_table(records.values()), False)[:-1]:
        print(line)
    # the log lists no test that never started (a cut run's not-run tests are only in its receipt)
    print("all_ok: not known from a partial log" + (": see its receipt" if end and end.get("receipt") else ""))
    return 1


def run(args: argparse.Namespace) -> int:
    if args.latest is not None:
        found = _receipts(args.latest) if args.latest.is_dir() else []
        if not found:
            raise FixtureError(f"no receipt found under {args.latest}")
        args.path = found[-1]
    if args.path.is_dir():
        return _list(args.path)
    if args.path.name.endswith(".partial.jsonl"):
        return _partial(args.path)
    r = load_receipt(args.path)
    for key, kind in (("checks", dict), ("all_ok", bool)):
        if not isinstance(r.get(key), kind):
            raise FixtureError(f"{args.path}: not a receipt: field {key!r} is missing or not a {kind.__name__}")
    _check_rows(r["checks"], args.path)
    print(f"receipt: {args.path.resolve()}")
    not_run = r.get("not_run")
    print(f"engines: {_engines(r) or 'none'}; not run: {len(not_run) if isinstance(not_run, list) else 0}")
    ran_nothing = r.get("ran_nothing")
    for line in format_checks(r["checks"], r["all_ok"], ran_nothing if isinstance(ran_nothing, list) else ()):
        print(line)
    return 0 if r["all_ok"] else 1
