"""``oracles bisect``'s PNG (matplotlib, Agg) from a synthetic report: written, the named stage marked."""

from __future__ import annotations

import numpy as np
from test_bisect_dry import FakeEngine, forward_arrays, perturbed

from oracles.commands.bisect import plot
from oracles.families.execution.localise import localise


def test_plot_is_a_png_with_the_named_stage() -> None:
    ref = forward_arrays()
    report = localise(FakeEngine("ref", ref, "yes"), FakeEngine("port", perturbed(ref, 2, 0.5, "mlp"), "yes"), [1], "rec")
    png = plot(report)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert report["divergent"] == "layer 2"
    faithful = localise(FakeEngine("ref", ref, "yes"), FakeEngine("port", ref, "yes"), [1], "rec")
    assert plot(faithful)[:8] == b"\x89PNG\r\n\x1a\n" and np.isfinite([s["nmse"] for s in faithful["stages"]]).all()
