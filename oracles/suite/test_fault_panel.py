"""The fault panel (markers faults, port): ports that wrap the faithful transformers engine and inject
one fault each (oracles/faults/), run through every family on their path with the families' own run
functions, held to the suite's checks (oracles/faults/matrix.py). Every fault must be caught by some
check, the faithful control (eager attention: float32 reordering only) by none, on every pin of the
family (``--pin``, else the faults family's default pins); ``oracles bisect`` on a cold prefill must
name the stage each fault was injected in (no stage for a fault a cold prefill cannot see: its
catching check names record and position instead). A fault that cannot be injected into a pin's
model (no such part) is skipped naming why.

Each row attaches its cells to the receipt; ``oracles faults RECEIPT`` prints the matrix.
"""

from __future__ import annotations

import pytest

from oracles.faults import CONTROL, FAULTS
from oracles.faults.detect import bisect_row, detect
from oracles.faults.matrix import caught_by
from oracles.plugin.fixtures import Engines, Runs
from oracles.plugin.state import settings_of
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.faults, pytest.mark.port, pytest.mark.slow]

#: The control first, then the faults in :data:`oracles.faults.FAULTS`' order (the matrix's row order).
NAMES = (CONTROL, *FAULTS)


@pytest.mark.parametrize("fault", NAMES)
def test_detection(runs: Runs, engines: Engines, pytestconfig: pytest.Config, pin: str,
                   fault: str, receipt: Receipt) -> None:
    """The port through every family on its path, every check: a fault is caught by at least one
    check (the first message names record and position), the faithful control by none."""
    row = detect(runs, engines, settings_of(pytestconfig).reference, pin, fault)
    caught = caught_by(row.checks)
    receipt.update(kind="fault-detection", pin=pin, fault=fault, order=[NAMES.index(fault)],
                   title=row.port.fault.describe(row.port.base),
                   reference=row.reference.id, port=row.port.id, checks=row.checks, caught_by=caught)
    if fault == CONTROL:
        assert not caught, (f"{pin}: false alarm on the faithful port by {', '.join(caught)}: "
                            + row.checks[caught[0]]["message"])
    else:
        missed = {c: v["status"] for c, v in row.checks.items()}
        assert caught, f"{pin} {fault}: missed by every check ({missed})"


@pytest.mark.parametrize("fault", NAMES)
def test_bisect_names_injected_stage(runs: Runs, engines: Engines,
                                     pytestconfig: pytest.Config, pin: str, fault: str, receipt: Receipt) -> None:
    """``oracles bisect`` on "ping" names the stage the fault was injected in (first over budget with
    its input within), attention vs MLP inside a layer; none for the faithful control and for a
    fault a cold prefill does not run through (positions after a prefill, a trim, a cohort's mask)."""
    report, port = bisect_row(runs, engines, settings_of(pytestconfig).reference, pin, fault)
    if (cannot := report["cannot_localise"]) is not None:  # no stages: "none named" would pass vacuously
        pytest.skip(f"engine {cannot['engine']!r} cannot be localised: {cannot['why']}")
    expected = port.stage()
    inside = report["inside"]["verdict"] if report["inside"] else None
    receipt.update(kind="fault-bisect", pin=pin, fault=fault, expected=expected, named=report["divergent"],
                   inside=inside, stages=report["stages"])
    over = [s["name"] for s in report["stages"] if s["over"]]
    assert report["divergent"] == expected, (f"{pin} {fault}: bisect named {report['divergent']}, the fault was "
                                             f"injected at {expected}; stages over budget: {over[:6]}")
