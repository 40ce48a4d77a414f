"""``oracles serve ENGINE --pin PIN``: any registered engine on a pin, served over the wire (``docs/wire.md``).

::

    oracles serve torch --pin smollm2-135m-instruct --stdio              # a project's ini: NAME = oracles serve ...
    oracles serve torch --pin my-model --device cuda --listen 0.0.0.0:7070   # on a GPU box; NAME = tcp://box:7070

The engine is built as the pytest plugin builds it (the snapshot verified against its pin, the engine
contract checked, its tokenizer held to the pin's canary) before the first connection is answered, so a
client's handshake gets the model facts at once. ``--stdio`` answers one conversation on stdin/stdout
(what the libraries print goes to stderr) and exits at EOF; ``--listen`` answers connections one at a
time, the engine kept between them, until killed (``--once``: after the first).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oracles.engines.base import Engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engine", help="engine id (oracles' registry: built-in or plugged)")
    parser.add_argument("--pin", required=True, help="the pin it loads (its snapshot verified first)")
    parser.add_argument("--snapshot", type=Path, default=None,
                        help="snapshot folder for the pin (verified); default: the materialised one")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: the library's own)")
    parser.add_argument("--device", default="cpu", help="the device an engine with devices runs on; default: cpu")
    parser.add_argument("--stdio", action="store_true", help="answer one conversation on stdin/stdout, then exit")
    parser.add_argument("--listen", metavar="HOST:PORT", help="answer TCP connections at HOST:PORT (PORT 0: any free)")
    parser.add_argument("--once", action="store_true", help="with --listen: exit after the first connection")


def run(args: argparse.Namespace) -> int:
    """Build the engine, then serve (module docstring). Returns 0 at the end of the conversation(s).

    Raises:
        OracleError: an unknown engine or pin, one that cannot run here, a snapshot that does not verify,
            an engine that cannot load the pin, a bad --listen or --device, neither or both of --stdio and
            --listen (one line each).
    """
    from oracles.engines.wire.server import serve_stdio, serve_tcp
    from oracles.errors import OracleError

    if bool(args.stdio) == bool(args.listen):
        raise OracleError("oracles serve: give one of --stdio and --listen HOST:PORT")
    listen = _listen(args.listen) if args.listen else None
    engine = build(args.engine, args.pin, args.snapshot, args.threads, args.device)
    print(f"oracles serve: {engine.id} on pin {engine.pin} ready", file=sys.stderr, flush=True)
    if listen is None:
        serve_stdio(engine)
        return 0

    def ready(host: str, port: int) -> None:
        print(f"oracles serve: listening on {host}:{port}", file=sys.stderr, flush=True)

    serve_tcp(engine, *listen, once=args.once, ready=ready)
    return 0


def _listen(value: str) -> tuple[str, int]:
    from oracles.errors import OracleError

    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise OracleError(f"--listen {value!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def build(engine_id: str, pin_name: str, snapshot: Path | None, threads: int, device: str = "cpu") -> "Engine":
    """The engine ``engine_id`` on pin ``pin_name``, built and checked as the plugin's engine fixture does.

    Raises:
        OracleError: as :func:`run`.
    """
    from oracles.engines import engine_class, unavailable_reason
    from oracles.errors import OracleError
    from oracles.pins.pin import load_pin, snapshot_dir, verify_snapshot
    from oracles.plugin.fixtures import EngineLoader

    if (why := unavailable_reason(engine_id)) is not None:
        raise OracleError(f"engine {engine_id} cannot run here: {why}")
    cls = engine_class(engine_id)
    pin = load_pin(pin_name)
    if (why := cls.unsupported_pin(pin)) is not None:
        raise OracleError(f"engine {engine_id}: {why}")
    if device != "cpu" and device not in cls.devices:
        raise OracleError(f"--device {device}: engine {engine_id} runs on {', '.join(cls.devices)} only")
    root = (snapshot or snapshot_dir(pin)).resolve()
    verify_snapshot(pin, root, origin="--snapshot" if snapshot else None)
    options = {"device": device} if device != "cpu" else {}
    loader = EngineLoader(lambda _pin: root, threads, lambda _id: options, lambda *_a, **_k: None, lambda _name: pin)
    built = loader.build(cls, root, pin)
    if isinstance(built, str):
        raise OracleError(built)
    return built
