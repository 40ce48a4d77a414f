"""One panel row: a fault port (or the faithful control) and its reference run through the families,
held to every check; and its bisect on a cold prefill. The glue the panel tests and a user's own
tests share; no pytest import.

``runs(key, fn)`` is the session memo (the ``runs`` fixture): every family run is made once per
session per (pin, engine, family) and shared by the detection and bisect tests of that row; the
reference's runs are shared by every row of its pin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from oracles.engines.base import Engine
from oracles.faults import CONTROL, FAULTS, VARIANTS, FaultPort, fault_port, reference_for
from oracles.faults.matrix import run_checks
from oracles.faults.panel import DRAFT_PIN, PANEL_RUNS, PING, d1_inputs, family_runner

if TYPE_CHECKING:
    from oracles.families.callables import Engines, Runs


@dataclass
class Row:
    """A panel row: the faithful engine it is held against, the port, and the matrix cells."""

    pin: str
    fault: str
    reference: Engine
    port: FaultPort
    checks: dict[str, dict[str, Any]]


def engines_of(runs: Runs, base: Engine, pin: str, fault: str) -> tuple[Engine, FaultPort]:
    """(the faithful engine ``fault`` is held against, the port), built once per session.

    Raises:
        oracles.engines.base.Unsupported: the fault cannot be injected into ``base`` (named).
    """
    variant = VARIANTS.get(fault)
    reference = base if variant is None else runs(("faults-engine", pin, variant.name), lambda: reference_for(fault, base))
    return reference, runs(("faults-engine", pin, fault), lambda: fault_port(fault, base, reference))


def family_runs(runs: Runs, engine: Engine, pin: str, families: tuple[str, ...], draft: Callable[[], Engine]) -> dict[str, Any]:
    """family -> the run of ``engine`` (memoised), or the exception it raised (kept, not raised: the
    matrix decides what an exception means)."""
    out: dict[str, Any] = {}
    for family in families:
        try:
            out[family] = runs(("faults", pin, engine.id, family), family_runner(family, engine, draft))
        except Exception as exc:  # noqa: BLE001 - an engine's failure is a cell of the matrix
            out[family] = exc
    return out


def detect(runs: Runs, engines: Engines, reference_id: str, pin: str, fault: str) -> Row:
    """The row of ``fault`` (or :data:`oracles.faults.CONTROL`) on ``pin``: the faithful engine
    ``engines(reference_id, pin)`` (or its variant), the port, both through the families (the port
    through those on the fault's path) and every check, held to the port's tolerance."""
    base = engines(reference_id, pin)
    reference, port = engines_of(runs, base, pin, fault)
    def draft() -> Engine:
        return engines(reference_id, DRAFT_PIN)

    touches = None if fault == CONTROL else FAULTS[fault].touches
    touched = PANEL_RUNS if touches is None else touches
    ref_runs = family_runs(runs, reference, pin, PANEL_RUNS, draft)
    port_runs = family_runs(runs, port, pin, tuple(touched), draft)
    checks = runs(("faults-checks", pin, fault),
                  lambda: run_checks(ref_runs, port_runs, {q: r["keys"] for q, r in d1_inputs(pin)[1].items()},
                                     tolerance=port.tolerance()))
    return Row(pin, fault, reference, port, checks)


def bisect_row(runs: Runs, engines: Engines, reference_id: str, pin: str,
               fault: str) -> tuple[dict[str, Any], FaultPort]:
    """``oracles bisect``'s report of the port against its faithful engine on "ping" (a cold
    prefill), and the port."""
    from oracles.families.execution.localise import localise

    reference, port = engines_of(runs, engines(reference_id, pin), pin, fault)
    report = runs(("faults-bisect", pin, fault),
                  lambda: localise(reference, port, list(PING.bind(pin).ids), PING.id, tolerance=port.tolerance()))
    return report, port


__all__ = ["Row", "bisect_row", "detect", "engines_of", "family_runs"]
