"""``oracles bisect``: run the reference and a port on one record and name the first stage (embedding,
decoder layer, final norm, head) where the port leaves the reference, by the rule and the budgets of
:mod:`oracles.checks.bisect`; inside that layer, attention or MLP where both engines tap them.

    oracles bisect --pin smollm2-135m-instruct --port mlx --record ping
    oracles bisect --port fault:gate_up_swapped --record ping     # a fault port of the panel
    oracles bisect --pin smollm2-mlx-q4-dequant --port mlx --port-pin smollm2-mlx-q4 --record ping

With ``--port-pin`` the port loads that artifact and the reference the ``--pin`` it is held against;
the budgets follow the pair's judgment (:func:`oracles.pins.pairing.judgment_of`): float32's for an
artifact computing in float32 on the reference's weights, the band's (the reference run in the
artifact's dtype on the record, :meth:`oracles.families.execution.judged.Judge.bisect_tolerance`) for a
bfloat16 one, so a faithful 4-bit port held against its dequantized reference names no stage.

Prints every stage's NMSE (max over positions), budget, max |Δ| and smallest cosine, the verdict, and
writes ``<out>/<pin>-<port>-<record>-<UTC>.json`` and ``.png`` (per-stage NMSE, log scale, budget
line, the named stage marked), never over an existing file; without matplotlib, the JSON and one line
saying the PNG was not written. Exit 0: every stage within budget; 1: a stage is named; 2: bad input,
an engine that cannot run here (unknown, not installed: checked before anything loads) or cannot load
the pin (one line, as the pytest plugin says it), or an engine that cannot be localised (it has no
layer taps), named.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracles.engines.base import Engine
from oracles.errors import OracleError
from oracles.families import DEFAULT_PIN
from oracles.families.execution.localise import localise

if TYPE_CHECKING:
    from oracles.checks.judgment import Judgment
    from oracles.checks.tolerance import Tolerance
    from oracles.families.execution.prompts import PromptRecord
    from oracles.pins.pin import Pin

FAULT_PREFIX = "fault:"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pin", default=DEFAULT_PIN, help="pin name; default: %(default)s")
    parser.add_argument("--reference", default="torch", help="reference engine id; default: %(default)s")
    parser.add_argument("--port", required=True,
                        help=f"port engine id, or {FAULT_PREFIX}NAME for a fault port of the panel on the reference")
    parser.add_argument("--port-pin", default=None,
                        help="the artifact pin the port loads, held against --pin (a converted artifact); default: --pin")
    parser.add_argument("--record", default="ping",
                        help="prompt record id (mtplx prompts or generation); default: %(default)s")
    parser.add_argument("--snapshot", type=Path, default=None,
                        help="snapshot folder for the pin (verified); default: the materialised one")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads; default: %(default)s")
    parser.add_argument("--out", type=Path, default=Path("receipts") / "bisect",
                        help="folder for the JSON and PNG; default: %(default)s")


def table(report: dict[str, Any]) -> list[str]:
    """The report as text lines: one line a stage, then the verdict with the translations the port
    needed (its ``translation_notes()``, as every port check's verdict names them), then the blocks
    inside the named layer."""
    from oracles.checks.bisect import BLOCKS

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
    loaded = f" [port loaded with {'; '.join(report['translations'])}]" if report.get("translations") else ""
    if report["divergent"] is None:
        lines.append(f"verdict: every stage within its budget{loaded}")
    else:
        lines.append(f"verdict: the port first diverges at {report['divergent']}{loaded}")
    if report["inside"]:
        blocks = [(name, report["inside"][key]) for name, key, _array in BLOCKS if key in report["inside"]]
        figures = ", ".join(f"{name} NMSE {b['nmse']:.3e}" for name, b in blocks)
        lines.append(f"inside it: {figures} (budget {blocks[0][1]['budget']:.1e}): {report['inside']['verdict']}")
    return lines


def plot(report: dict[str, Any]) -> bytes:
    """PNG: per-stage NMSE (log scale) of the port against the reference, the budget line, the named
    stage marked. Bit-equal stages (NMSE 0) are drawn at 1e-18."""
    from oracles.checks.tolerance import FLOAT32
    from oracles.commands.plots import png_bytes, pyplot

    plt = pyplot()

    found = report["stages"]
    floor = 1e-18
    x = list(range(len(found)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * len(found)), 4.0))
    ax.semilogy(x, [max(s["nmse"], floor) for s in found], "o-", label=f"{report['port']} vs {report['reference']}")
    bounds = report.get("tolerance") or {"name": FLOAT32.name, "margin": FLOAT32.bisect_margin}  # an unnamed report
    ax.semilogy(x, [s["budget"] for s in found], "--", color="grey",
                label=f"budget ({bounds['name']} noise floor x {bounds['margin']:g})")
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


def _refuse_unavailable(option: str, engine_id: str) -> None:
    """Refuse an engine id that cannot run here, before anything loads: the registry's reason (an unknown
    id with the known ones, a framework not installed with its pip line, a plugged engine that fails to
    import), as the plugin's ``--port`` check and engine fixture give it.

    Raises:
        OracleError: ``--port NAME: engine cannot run here: <reason>``.
    """
    from oracles.engines import registry, unavailable_reason

    reason = unavailable_reason(engine_id)
    if reason is not None:
        hint = f" (or {FAULT_PREFIX}NAME, a fault port)" if option == "--port" and engine_id not in registry() else ""
        raise OracleError(f"{option} {engine_id}: engine cannot run here: {reason}{hint}")


def _refuse_unsupported(option: str, engine_id: str, pin: Pin) -> None:
    """Refuse an engine that cannot load ``pin``, judged from the pin file alone (``Engine.unsupported_pin``,
    what leaves a pair out of a pytest session), before the snapshot is verified or weights load.

    Raises:
        OracleError: ``--port NAME: <the engine's reason>``.
    """
    from oracles.engines import engine_class

    reason = engine_class(engine_id).unsupported_pin(pin)
    if reason is not None:
        raise OracleError(f"{option} {engine_id}: {reason}")


def _engine(engine_id: str, root: Path, pin: Pin, threads: int) -> Engine:
    """The engine, built as the plugin's engine fixture builds it (:class:`oracles.plugin.fixtures.EngineLoader`):
    any load error, and a tokenizer that disagrees with the pin's recorded ids, become one line.

    Raises:
        OracleError: ``engine NAME cannot load pin PIN: <error> (raised at file:line)...``.
    """
    from oracles.engines import engine_class
    from oracles.plugin.fixtures import EngineLoader

    loader = EngineLoader(lambda _pin: root, threads, lambda _engine_id: {}, lambda *_a, **_k: None, lambda _name: pin)
    built = loader.build(engine_class(engine_id), root, pin)
    if isinstance(built, str):
        raise OracleError(built)
    return built


def _port(engine_id: str, root: Path, pin: Pin, threads: int, reference: Engine) -> tuple[Engine, Engine]:
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
    from oracles.families.execution.prompts import load_prompts
    from oracles.families.execution.runs import GENERATION

    known = {r.id: r for r in [*load_prompts(), *GENERATION]}
    if record not in known:
        raise OracleError(f"unknown record {record!r}; known: {', '.join(sorted(known))}")
    return known[record]


def _check_engines(args: argparse.Namespace) -> None:
    """Refuse the engine options before anything loads: the names first (a fault port given as the
    reference, an unknown fault, the reference held against itself), then whether each engine can run
    here (:func:`_refuse_unavailable`).

    Raises:
        OracleError: the first problem, naming the option.
    """
    from oracles.faults import CONTROL, FAULTS

    if args.reference.startswith(FAULT_PREFIX):
        raise OracleError(f"--reference {args.reference}: a fault port is a port (--port); the reference is an engine id")
    if args.port.startswith(FAULT_PREFIX):
        name = args.port[len(FAULT_PREFIX):]
        if name != CONTROL and name not in FAULTS:
            raise OracleError(f"unknown fault {name!r}; known: {CONTROL}, {', '.join(FAULTS)}")
    elif args.port == args.reference:
        raise OracleError(f"--port {args.port}: the reference itself, which can name no stage; the faithful "
                          f"control to hold against it is --port {FAULT_PREFIX}{CONTROL}")
    _refuse_unavailable("--reference", args.reference)
    if not args.port.startswith(FAULT_PREFIX):
        _refuse_unavailable("--port", args.port)


def _pair(args: argparse.Namespace, pin: Pin) -> tuple[Pin, Judgment | None]:
    """The pin the port loads (``--port-pin``, else ``--pin``) and the pair's judgment (None: the same pin).

    Raises:
        OracleError: a fault port with ``--port-pin`` (it wraps the reference), an unknown pin, two pins
            whose tokenizer files differ, or a pair nothing can judge (:mod:`oracles.pins.pairing`).
    """
    from oracles.pins.pairing import judgment_of, refuse_other_tokenizer
    from oracles.pins.pin import load_pin

    if args.port_pin is None or args.port_pin == pin.name:
        return pin, None
    if args.port.startswith(FAULT_PREFIX):
        raise OracleError(f"--port-pin {args.port_pin}: a fault port wraps the reference on --pin; it loads no artifact")
    artifact = load_pin(args.port_pin)
    refuse_other_tokenizer(f"{pin.name}={artifact.name}", pin, artifact)
    return artifact, judgment_of(pin, artifact)


def _band_budgets(args: argparse.Namespace, root: Path, pin: Pin, reference: Engine, ids: list[int], dtype: str,
                  tolerance: Tolerance) -> Tolerance:
    """Bisect's budgets calibrated on the band: the reference engine in ``dtype`` on ``ids``."""
    from oracles.checks.judgment import Judgment
    from oracles.engines import engine_class
    from oracles.families.execution.judged import Judge
    from oracles.plugin.fixtures import EngineLoader

    loader = EngineLoader(lambda _pin: root, args.threads, lambda _engine_id: {}, lambda *_a, **_k: None, lambda _name: pin)
    built = loader.build(engine_class(args.reference), root, pin, dtype=dtype)
    if isinstance(built, str):
        raise OracleError(built)
    judge = Judge(Judgment("band", f"the {dtype} band", dtype=dtype), tolerance, band=lambda: built)
    return judge.bisect_tolerance(lambda _key, fn: fn(), reference, ids, tolerance)


def _write(report: dict[str, Any], out: Path, stem: str) -> None:
    """``<out>/<stem>.json`` and ``.png``, both created exclusively; where matplotlib cannot be imported,
    the JSON alone and one line on stderr saying why the PNG is missing (the verdict stands)."""
    from oracles.commands.plots import unavailable
    from oracles.receipts.files import dump_json, write_exclusive

    out.mkdir(parents=True, exist_ok=True)
    write_exclusive(out / f"{stem}.json", dump_json(report))
    note = unavailable()
    if note is None:
        write_exclusive(out / f"{stem}.png", plot(report))
        print(f"wrote {out / stem}.json and .png")
    else:
        print(f"wrote {out / stem}.json")
        print(note, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Localise ``--port`` against ``--reference`` on one record; print the table, write JSON and PNG.

    Returns 0 (every stage within budget), 1 (a stage named) or 2 (an engine that cannot be localised).

    Raises:
        OracleError: bad input (record, fault, engine names), an engine that cannot run here or cannot
            load the pin, a snapshot that does not match its pin; before any weights load where it can be
            known then, and a failed engine build as one line.
    """
    from oracles.engines.base import Unsupported
    from oracles.pins.pin import load_pin, snapshot_dir, verify_snapshot

    record = _record(args.record)  # bad input is refused before minutes of loading
    _check_engines(args)
    pin = load_pin(args.pin)
    _refuse_unsupported("--reference", args.reference, pin)
    artifact, judge = _pair(args, pin)
    if not args.port.startswith(FAULT_PREFIX):
        _refuse_unsupported("--port", args.port, artifact)
    root = args.snapshot or snapshot_dir(pin)
    verify_snapshot(pin, root, origin="--snapshot" if args.snapshot else None)
    port_root = root if artifact is pin else snapshot_dir(artifact)
    if artifact is not pin:
        verify_snapshot(artifact, port_root)
    reference = _engine(args.reference, root, pin, args.threads)
    try:
        port, against = _port(args.port, port_root, artifact, args.threads, reference)
        ids = reference.chat_ids(record.message_list)  # the pin's own tokenizer and chat template
    except Unsupported as exc:  # a fault the pin's model has no place for; a tokenizer without a chat template
        raise OracleError(str(exc)) from None
    tolerance = port.tolerance()
    if judge is not None and not judge.exact:
        tolerance = _band_budgets(args, root, pin, reference, ids, judge.dtype, tolerance)
    report = localise(against, port, ids, args.record, tolerance=tolerance)
    report["judgment"] = None if judge is None else judge.as_json()
    print("\n".join(table(report)))
    if report["cannot_localise"]:
        return 2
    stem = f"{artifact.name}-{args.port.replace(':', '-')}-{args.record}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    _write(report, args.out, stem)
    return 0 if report["divergent"] is None else 1
