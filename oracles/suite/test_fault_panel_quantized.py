"""The fault panel on a quantized port (faults, port): faults injected into the MLX port on the 4-bit
conversion (:mod:`oracles.faults.mlx`), held on "ping" against the float32 reference built from the
*dequantized* 4-bit weights, and against the float32 original.

Against the dequantized reference (the same weights the port holds, in float32) the faithful 4-bit
port sits at float32 noise and passes the unchanged float32 port thresholds
(:data:`oracles.checks.tolerance.FLOAT32`), and each fault fails them; bisect on the same prefill
names the stage each fault was injected in, and no stage for the faithful port (not "embedding").
Against the float32 original, the faithful 4-bit port already fails every float32 threshold by its
quantization error, so a fault there gets the same verdict: the original cannot tell a bug from the
quantization, and only the dequantized reference sees it. Each test records its figures and margins
(figure / threshold) in the receipt.

Pins (named by the conversion pins' interface): the port on :data:`Q4`, the references
``torch`` on :data:`DEQUANT` and on :data:`ORIGINAL`, through the ``engines`` fixture; a pin missing
from the store skips naming it.
"""

from __future__ import annotations

from typing import Any

import pytest

from oracles.checks.port import assert_within_thresholds, held_figures, threshold_failures
from oracles.checks.tolerance import FLOAT32
from oracles.engines.base import Engine
from oracles.families.execution import runs as ex
from oracles.families.execution.localise import localise
from oracles.families.execution.prompts import PromptRecord, load_prompts
from oracles.faults.mlx import MLX_FAULTS, MlxFaultPort, mlx_fault_port
from oracles.plugin.fixtures import Engines, Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.faults, pytest.mark.port, pytest.mark.slow]

#: The 4-bit conversion the port runs, its dequantized float32 reference, and the float32 original.
Q4, DEQUANT, ORIGINAL = "smollm2-mlx-q4", "smollm2-mlx-q4-dequant", "smollm2-135m-instruct"
#: The record held (the shortest prompt record: MLX's CPU prefill of 4-bit weights is ~7 tokens/s here).
PING: PromptRecord = next(p for p in load_prompts() if p.id == "ping")


def _engines(engines: Engines, pins: Any) -> tuple[Engine, Engine, Engine]:
    """(MLX port on Q4, torch on DEQUANT, torch on ORIGINAL); skips naming a pin the store lacks."""
    from oracles.errors import OracleError

    for name in (Q4, DEQUANT):
        try:
            pins(name)
        except (OracleError, KeyError, FileNotFoundError) as exc:
            pytest.skip(f"pin {name} is not in the pin store ({exc}); the conversion pins make it")
    return engines("mlx", Q4), engines("torch", DEQUANT), engines("torch", ORIGINAL)


def _figures(runs: Runs, reference: Engine, port: Engine) -> dict[str, Any]:
    """Port figures of ``port``'s "ping" prefill against ``reference``'s (both runs memoised)."""
    record = PING.bind(reference.pin)
    what = f"{record.id}: port {port.id} on {port.pin} vs {reference.id} on {reference.pin}"
    return held_figures(what, ex.prefill(runs, reference, record).logits, ex.prefill(runs, port, record).logits)


def margins(fig: dict[str, Any]) -> dict[str, float]:
    """Each float32 port threshold's figure / threshold (over 1: that threshold fails)."""
    t = FLOAT32
    return {"max_abs": fig["max_abs"] / t.max_abs_logit, "nmse": fig["nmse"] / t.max_nmse, "kl_max": fig["kl_max"] / t.max_kl}


def _brief(fig: dict[str, Any]) -> dict[str, Any]:
    return {k: fig[k] for k in ("rows", "max_abs", "nmse", "kl_mean", "kl_max", "argmax_agreement")} | {"margins": margins(fig)}


def _fault(runs: Runs, port: Engine, name: str) -> MlxFaultPort:
    return runs(("mlx-fault-engine", port.pin, name), lambda: mlx_fault_port(name, port))


def test_faithful_q4_within_float32(runs: Runs, engines: Engines, pins: Any, receipt: Receipt) -> None:
    """The faithful 4-bit port against its dequantized reference: within every float32 threshold, and
    bisect names no stage; against the float32 original: outside them (recorded, the quantization cost)."""
    port, dequant, original = _engines(engines, pins)
    fig, cost = _figures(runs, dequant, port), _figures(runs, original, port)
    report = localise(dequant, port, list(PING.bind(Q4).ids), PING.id, tolerance=FLOAT32)
    receipt.update(kind="fault-quantized", fault="faithful", port=port.id, against_dequantized=_brief(fig),
                   against_original=_brief(cost), bisect_named=report["divergent"], precision=port.describe().get("precision"))
    assert_within_thresholds(f"{PING.id}: faithful 4-bit port vs {DEQUANT}", fig, tolerance=FLOAT32)
    assert report["divergent"] is None, f"bisect named {report['divergent']!r} on the faithful 4-bit port"
    assert threshold_failures(cost, tolerance=FLOAT32), f"{PING.id}: the 4-bit port meets float32 against {ORIGINAL}"


@pytest.mark.parametrize("fault", tuple(MLX_FAULTS))
def test_fault_caught_only_by_dequantized(runs: Runs, engines: Engines, pins: Any, fault: str, receipt: Receipt) -> None:
    """The fault fails the float32 thresholds against the dequantized reference (margins recorded);
    against the float32 original it gets the faithful 4-bit port's verdict (both fail; both figures
    recorded): there the fault is not separable from the quantization."""
    port, dequant, original = _engines(engines, pins)
    bad = _fault(runs, port, fault)
    fig, faithful_cost, cost = _figures(runs, dequant, bad), _figures(runs, original, port), _figures(runs, original, bad)
    caught = threshold_failures(fig, tolerance=FLOAT32)
    receipt.update(kind="fault-quantized", fault=fault, title=bad.fault.describe(bad.base), port=bad.id,
                   against_dequantized=_brief(fig), caught_by=caught,
                   against_original={"faithful": _brief(faithful_cost), "fault": _brief(cost),
                                     "max_abs_ratio": cost["max_abs"] / faithful_cost["max_abs"]})
    assert caught, f"{PING.id}: {fault} on the 4-bit port meets every float32 threshold against {DEQUANT}"
    assert threshold_failures(faithful_cost, tolerance=FLOAT32) and threshold_failures(cost, tolerance=FLOAT32), (
        f"{PING.id}: against {ORIGINAL} the faithful 4-bit port and {fault} got different verdicts")


@pytest.mark.parametrize("fault", tuple(MLX_FAULTS))
def test_fault_bisect_against_dequantized(runs: Runs, engines: Engines, pins: Any, fault: str, receipt: Receipt) -> None:
    """Bisect of the fault port against the dequantized reference on "ping", float32 budgets, names
    the stage the fault was injected in."""
    port, dequant, _original = _engines(engines, pins)
    bad = _fault(runs, port, fault)
    report = localise(dequant, bad, list(PING.bind(Q4).ids), PING.id, tolerance=FLOAT32)
    want = bad.stage()
    over = [s["name"] for s in report["stages"] if s["over"]]
    receipt.update(kind="fault-quantized-bisect", fault=fault, expected=want, named=report["divergent"],
                   inside=report["inside"]["verdict"] if report["inside"] else None, over=over[:6])
    assert report["cannot_localise"] is None, report["cannot_localise"]
    assert report["divergent"] == want, f"{fault}: bisect named {report['divergent']!r}, injected at {want!r}; over: {over[:6]}"
