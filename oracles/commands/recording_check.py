"""``oracles recording-check DIR``: a recording's conformance to its layout (``docs/recordings.md``; the checks:
:mod:`oracles.engines.recorded.check`), and what it holds.

::

    oracles recording-check recordings/smollm2            # a store a session wrote with --record torch=DIR
    oracles recording-check /data/from-my-harness --verbose

Prints one line per failure naming the file, then each context (engine, pin, entries, when and where it was
recorded) and a summary; exits 1 when a check failed, 2 when ``DIR`` is not a store of this layout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", type=Path, help="the recording's folder (DIR of --record ENGINE=DIR)")
    parser.add_argument("--verbose", action="store_true", help="also print the checks that passed")


def run(args: argparse.Namespace) -> int:
    """Check the store (module docstring)."""
    from oracles.engines.recorded.check import check_store

    report, contexts, counts = check_store(args.store)
    if not contexts and report.failures and not (args.store / "store.json").is_file():
        print(f"recording-check: {report.failures[0]}", file=sys.stderr)
        return 2
    for line in report.failures:
        print(f"recording-check: {line}")
    if args.verbose:
        for line in report.passed:
            print(f"ok: {line}")
    for c in contexts:
        name, digest = c.pin
        where = c.provenance.get("node"), c.identity.get("device"), c.provenance.get("recorded_at")
        print(f"context {c.digest[:12]}: {c.engine} on pin {name} ({digest[:12]}), {counts.get(c.digest, 0)} entries; "
              f"recorded on {where[0]} ({where[1]}) at {where[2]}")
    print(f"recording-check: {len(report.failures)} failed, {sum(counts.values())} entries in {len(contexts)} contexts")
    return 1 if report.failures else 0
