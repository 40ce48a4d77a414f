"""``oracles report RECEIPT``: a receipt as one self-contained HTML page, and a Markdown summary.

    oracles report receipts/default/20260101T000000Z-0a1b2c3d.json
    oracles report R.json --html page.html --markdown summary.md
    oracles report R.json --markdown -          # the summary alone on stdout, for a pull request

The page (:mod:`oracles.report.page`) leads with the verdict and the failed tests with their one-line
messages, then a section per family (its checks, its figures drawn inline as SVG where the receipt
holds their data, its records' figures), the run, the pins and engines with their versions and the
translations the ports needed, and the environment. It loads nothing from outside. The per-position
figures read the npz sidecar (``--no-arrays``: leave them out).

``--html`` defaults to ``<receipt stem>.report.html`` beside the receipt. Both files are created
exclusively (written whole under a temporary name, then linked), never over an existing file: an output
that exists is refused before anything is read. Exit 0: written, and the receipt is all ok; 1: written, and it
is not (as ``oracles receipts``); 2: bad input, nothing written: a receipt of another schema, a truncated
or invalid one, a partial log, an output that exists, each one line naming the file. Without matplotlib
the page is written without figures and one line says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from oracles.errors import ReceiptError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("receipt", type=Path, help="a receipt .json (its npz sidecar beside it)")
    parser.add_argument("--html", type=Path, default=None, metavar="FILE",
                        help="the page to write; default: <receipt stem>.report.html beside the receipt")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the Markdown summary there ('-': print it)")
    parser.add_argument("--no-arrays", action="store_true",
                        help="leave out the per-position figures (they read the npz sidecar)")


def _outputs(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The page's path and the summary's (None: none, or stdout), refused when one exists.

    Raises:
        ReceiptError: an output exists, or both name one file.
    """
    page = args.html or args.receipt.with_name(args.receipt.name.removesuffix(".json") + ".report.html")
    summary = None if args.markdown is None or str(args.markdown) == "-" else args.markdown
    if summary is not None and summary.resolve() == page.resolve():
        raise ReceiptError(f"{page}: --html and --markdown name one file")
    for path in (page, summary):
        if path is not None and path.exists():
            raise ReceiptError(f"{path}: already exists; a report is never written over a file")
    return page, summary


def run(args: argparse.Namespace) -> int:
    """Write the page (and the summary) of ``args.receipt``; print where, and the verdict's line.

    Returns 0 when the receipt is all ok, 1 when it is not (the page is written either way).

    Raises:
        FixtureError: the receipt cannot be read (another schema, truncated, invalid: one line naming it).
        ReceiptError: an output exists or cannot be written.
    """
    from oracles.receipts.files import write_exclusive
    from oracles.report import markdown
    from oracles.report.build import build
    from oracles.report.page import render

    page, summary = _outputs(args)
    report = build(args.receipt, with_arrays=not args.no_arrays)
    text = render(report).encode("utf-8")
    summary_text = markdown.render(report, page.name) if args.markdown is not None else None
    status = sys.stderr if summary_text is not None and summary is None else sys.stdout  # stdout: the summary alone
    write_exclusive(page, text)
    print(f"page: {page} ({len(text)} bytes)", file=status)
    if summary_text is not None and summary is not None:
        write_exclusive(summary, summary_text.encode("utf-8"))
        print(f"summary: {summary}", file=status)
    elif summary_text is not None:
        sys.stdout.write(summary_text)
    print(report.verdict.headline, file=status)
    for note in report.notes:
        print(note, file=sys.stderr)
    return 0 if report.verdict.ok else 1
