"""``oracles materialize NAME``: build a pinned snapshot under ``$ORACLES_HOME`` and verify it (a ``local:``
or ``hf:`` pin is verified where it is, not copied)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="pin name (the project's pins folder, then the built-in pins) or a pin file path")
    parser.add_argument("--dest", type=Path, default=None, help="folder to build into; default $ORACLES_HOME/snapshots/NAME")
    parser.add_argument("--write-pin", action="store_true",
                        help="maintainers: rewrite the pin's file digests from this build instead of checking them")


def run(args: argparse.Namespace) -> int:
    from oracles.pins.materialize import materialize
    from oracles.pins.pin import load_pin

    result = materialize(load_pin(args.name), args.dest, write_pin=args.write_pin)
    print(json.dumps(result, indent=2))
    return 0
