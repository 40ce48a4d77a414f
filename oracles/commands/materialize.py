"""``oracles materialize NAME [NAME ...]``: build pinned snapshots under ``$ORACLES_HOME`` and verify them (a
``local:`` or ``hf:`` pin is verified where it is, not copied). Several names are built in order in one
process, so the frameworks a build imports (torch and transformers take ~5 s of CPU here) load once."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="+",
                        help="pin names (the project's pins folder, then the built-in pins) or pin file paths, built in order")
    parser.add_argument("--dest", type=Path, default=None, help="folder to build into; default $ORACLES_HOME/snapshots/NAME")
    parser.add_argument("--write-pin", action="store_true",
                        help="maintainers: rewrite the pin's file digests from this build instead of checking them")


def run(args: argparse.Namespace) -> int:
    from oracles.errors import OracleError
    from oracles.pins.materialize import materialize
    from oracles.pins.pin import load_pin

    if args.dest is not None and len(args.name) > 1:
        raise OracleError(f"--dest takes one pin; got {len(args.name)}: {' '.join(args.name)}")
    pins = [load_pin(name) for name in args.name]  # every name checked before the first build
    for pin in pins:
        print(json.dumps(materialize(pin, args.dest, write_pin=args.write_pin), indent=2), flush=True)
    return 0
