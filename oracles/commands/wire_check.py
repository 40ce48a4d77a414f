"""``oracles wire-check CMD|HOST:PORT``: the conformance of a far side to the wire, for a harness author
(``docs/wire.md``, "Conformance"; the checks: :mod:`oracles.engines.wire.conformance`).

::

    oracles wire-check harness/build/oracles-wire-llama --pin smollm2-gguf-f32
    oracles wire-check 'oracles serve torch --pin smollm2-draft-twin --stdio' --pin smollm2-draft-twin
    oracles wire-check 127.0.0.1:7070 --pin my-model          # a phone through adb forward tcp:7070 tcp:7070

A command (one argument, split as a shell would, run without one) is started and closed; ``HOST:PORT``
(or ``tcp://HOST:PORT``) is connected to. ``--pin`` names the pin the far side loads (its snapshot verified,
its folder and files sent in the handshake); without it the handshake carries no pin (a far side that holds
its model already). Prints one line per failure, then a summary; exits 1 when a check failed, 2 when the far
side cannot be reached or refuses the handshake.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

#: HOST:PORT (a name, IPv4, or [IPv6]) or tcp://HOST:PORT.
ADDRESS = re.compile(r"(tcp://)?(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9.-]+):\d{1,5}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="the harness command (one argument) or HOST:PORT")
    parser.add_argument("--pin", default=None, help="the pin the far side loads (verified first); default: none")
    parser.add_argument("--snapshot", type=Path, default=None, help="snapshot folder for the pin; default: the materialised one")
    parser.add_argument("--threads", type=int, default=1, help="the thread count sent in the handshake; default: 1")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a call may take; default: 120")
    parser.add_argument("--verbose", action="store_true", help="also print the checks that passed")


def run(args: argparse.Namespace) -> int:
    """Connect, handshake, run the checks (module docstring).

    Raises:
        OracleError: an unknown pin, a snapshot that does not verify.
    """
    from oracles.engines.wire.conformance import run_checks
    from oracles.errors import OracleError

    pin, root = _pin(args.pin, args.snapshot)
    cls = probe_class(args.target, args.timeout, send_pin=args.pin is not None)
    try:
        engine = cls(root, pin, args.threads)
    except OracleError as exc:
        print(f"wire-check: hello: {exc}", file=sys.stderr)
        return 2
    try:
        report = run_checks(engine)
    finally:
        engine.close()
    for line in report.failures:
        print(f"wire-check: {line}")
    if args.verbose:
        for line in report.passed:
            print(f"ok: {line}")
    served = ", ".join(sorted(engine.served))
    print(f"wire-check: {len(report.passed)} passed, {len(report.failures)} failed, {len(report.skipped)} not asked "
          f"({'; '.join(report.skipped) or 'none'}); served: {served}")
    return 1 if report.failures else 0


def _pin(name: str | None, snapshot: Path | None) -> tuple[Any, Path]:
    from oracles.pins.pin import Pin, load_pin, snapshot_dir, verify_snapshot

    if name is None:
        return Pin(name="(none)", source="local:.", source_sha256=None, model_class="(far side's own)", files={},
                   safetensors_headers={}, built_with={}, path=Path("(none).json")), Path(".")
    pin = load_pin(name)
    root = (snapshot or snapshot_dir(pin)).resolve()
    verify_snapshot(pin, root, origin="--snapshot" if snapshot else None)
    return pin, root


def probe_class(target: str, timeout: float, send_pin: bool = True) -> Any:
    """The engine class of ``target`` (a command, or HOST:PORT) under the id ``wire:check``; with
    ``send_pin`` False its handshake carries no pin."""
    from oracles.engines.wire.client import wire_class
    from oracles.engines.wire.config import Target

    address = target if target.startswith("tcp://") else f"tcp://{target}" if ADDRESS.fullmatch(target) else target
    cls = wire_class(Target("check", address, Path.cwd(), timeout=timeout, hello_timeout=max(timeout, 600.0),
                            origin="oracles wire-check"))
    if not send_pin:
        cls.pin_payload = lambda self: None  # type: ignore[method-assign]
    return cls
