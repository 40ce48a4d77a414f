"""``oracles bisect``: run the reference and a port on one record and name the first stage (embedding,
decoder layer, final norm, head) where the port leaves the reference, by the rule and the budgets of
:mod:`oracles.checks.bisect`; inside that layer, attention or MLP where both engines tap them.

    oracles bisect --pin smollm2-135m-instruct --port mlx --record ping
    oracles bisect --port fault:gate_up_swapped --record ping     # a fault port of the panel

Prints every stage's NMSE (max over positions), budget, max |Δ| and smallest cosine, the verdict, and
writes ``<out>/<pin>-<port>-<record>-<UTC>.json`` and ``.png`` (per-stage NMSE, log scale, budget
line, the named stage marked), never over an existing file. Exit 0: every stage within budget; 1: a
stage is named; 2: bad input, or an engine that cannot be localised (it has no layer taps), named.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracles.engines.base import Engine
from oracles.errors import OracleError
from oracles.families.localise import localise

if TYPE_CHECKING:
    from oracles.families.mtplx import PromptRecord

FAULT_PREFIX = "fault:"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pin", default="smollm2-135m-instruct", help="pin name; default: %(default)s")
    parser.add_argument("--reference", default="torch", help="reference engine id; default: %(default)s")
    parser.add_argument("--port", required=True,
                        help=f"port engine id, or {FAULT_PREFIX}NAME for a fault port of the panel on the reference")
    parser.add_argument("--record", default="ping",
                        help="prompt record id (mtplx prompts or generation); default: %(default)s")
    parser.add_argument("--snapshot", type=Path, default=None,
                        help="snapshot folder for the pin (verified); default: the materialised one")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads; default: %(default)s")
    parser.add_argument("--out", type=Path, default=Path("receipts") / "bisect",
                        help="folder for the JSON and PNG; default: %(default)s")


def table(report: dict[str, Any]) -> list[str]:
    """The report as text lines: one line a stage, then the verdict."""
    head = (f"{report['port']} vs {report['reference']} on {report['pin']}, record {report['record']} "
            f"({report['tokens']} ids)")
    if report["cannot_localise"]:
        c = report["cannot_localise"]
        return [head, f"cannot localise: engine {c['engine']!r} has no per-layer states ({c['why']})"]
    lines = [head, f"{'stage':<12} {'NMSE (max row)':>14} {'at pos':>6} {'budget':>9} {'max |d|':>10} {'min cos':>12}"]
    for s in report["stages"]:
        flag = "  <-- first over budget with its input within" if s["name"] == report["divergent"] else (
            "  over" if s["over"] else "")
        lines.append(f"{s['name']:<12} {s['nmse']:>14.3e} {s['nmse_position']:>6} {s['budget']:>9.1e} {s['max_abs']:>10.3e} "
                     f"{s['cosine']:>12.9f}{flag}")
    if report["divergent"] is None:
        lines.append("verdict: every stage within its budget")
    else:
        lines.append(f"verdict: the port first diverges at {report['divergent']}")
    if report["inside"]:
        a, m = report["inside"]["attention"], report["inside"]["mlp"]
        lines.append(f"inside it: attention NMSE {a['nmse']:.3e}, MLP NMSE {m['nmse']:.3e} (budget {a['budget']:.1e}): "
                     f"{report['inside']['verdict']}")
    return lines


def plot(report: dict[str, Any]) -> bytes:
    """PNG: per-stage NMSE (log scale) of the port against the reference, the budget line, the named
    stage marked. Bit-equal stages (NMSE 0) are drawn at 1e-18."""
    from oracles.plots import png_bytes, pyplot

    plt = pyplot()

    found = report["stages"]
    floor = 1e-18
    x = list(range(len(found)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * len(found)), 4.0))
    ax.semilogy(x, [max(s["nmse"], floor) for s in found], "o-", label=f"{report['port']} vs {report['reference']}")
    ax.semilogy(x, [s["budget"] for s in found], "--", color="grey", label="budget (fp32 noise floor x 1000)")
    if report["divergent"] is not None:
        i = next(k for k, s in enumerate(found) if s["name"] == report["divergent"])
        ax.axvline(i, color="red", alpha=0.5)
        ax.semilogy([i], [max(found[i]["nmse"], floor)], "o", color="red", label=f"first divergent: {report['divergent']}")
    ax.set_xticks(x, [s["name"].replace("layer ", "") for s in found], rotation=90, fontsize=7)
    ax.set_xlabel("stage (embedding, decoder layer index, final norm, head)")
    ax.set_ylabel("NMSE, max over positions")
    ax.set_title(f"{report['pin']} / {report['record']}: per-stage NMSE", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return png_bytes(fig)


def _engine(engine_id: str, root: Path, pin: str, threads: int) -> Engine:
    from oracles.engines import engine_class

    return engine_class(engine_id)(root, pin, threads)


def _port(engine_id: str, root: Path, pin: str, threads: int, reference: Engine) -> tuple[Engine, Engine]:
    """(the port, the engine it is held against): a fault port against the engine it wraps (the
    reference, or its variant: the windowed one), any other port against the reference."""
    if engine_id.startswith(FAULT_PREFIX):
        from oracles.faults import fault_port

        port = fault_port(engine_id[len(FAULT_PREFIX):], reference)
        return port, port.base
    return _engine(engine_id, root, pin, threads), reference


def _record(record: str) -> PromptRecord:
    """The prompt record ``record`` (mtplx prompts or generation), before any engine loads.

    Raises:
        OracleError: an unknown id (the known ones named).
    """
    from oracles.families.execution import GENERATION
    from oracles.families.mtplx import load_prompts

    known = {r.id: r for r in [*load_prompts(), *GENERATION]}
    if record not in known:
        raise OracleError(f"unknown record {record!r}; known: {', '.join(sorted(known))}")
    return known[record]


def run(args: argparse.Namespace) -> int:
    from oracles.engines.base import Unsupported
    from oracles.pins import load_pin, snapshot_dir, verify_snapshot
    from oracles.receipt_files import dump_json, write_exclusive

    record = _record(args.record)  # bad input is refused before minutes of loading
    if args.reference.startswith(FAULT_PREFIX):
        raise OracleError(f"--reference {args.reference}: a fault port is a port (--port); the reference is an engine id")
    from oracles.faults import CONTROL, FAULTS

    if args.port.startswith(FAULT_PREFIX):
        name = args.port[len(FAULT_PREFIX):]
        if name != CONTROL and name not in FAULTS:
            raise OracleError(f"unknown fault {name!r}; known: {CONTROL}, {', '.join(FAULTS)}")
    elif args.port == args.reference:
        raise OracleError(f"--port {args.port}: the reference itself, which can name no stage; the faithful "
                          f"control to hold against it is --port {FAULT_PREFIX}{CONTROL}")
    pin = load_pin(args.pin)
    root = args.snapshot or snapshot_dir(pin)
    verify_snapshot(pin, root)
    reference = _engine(args.reference, root, pin.name, args.threads)
    try:
        port, against = _port(args.port, root, pin.name, args.threads, reference)
    except Unsupported as exc:
        raise OracleError(str(exc)) from None
    ids = reference.chat_ids(record.message_list)  # the pin's own tokenizer and chat template
    report = localise(against, port, ids, args.record)
    print("\n".join(table(report)))
    if report["cannot_localise"]:
        return 2
    stem = f"{pin.name}-{args.port.replace(':', '-')}-{args.record}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    args.out.mkdir(parents=True, exist_ok=True)
    write_exclusive(args.out / f"{stem}.json", dump_json(report))
    write_exclusive(args.out / f"{stem}.png", plot(report))
    print(f"wrote {args.out / stem}.json and .png")
    return 0 if report["divergent"] is None else 1
