"""clef port oracle: each clef port (mlx-vlm) held against the reference, row by row.

Both engines' runs are the session runs of ``test_clef.py`` (the same memo key), so a row runs once per
engine whichever module asks first. A port runs the rows ``--port-records`` selects (``sample``: rows
of at most :data:`oracles.families.clef.run.CLEF_SAMPLE_TOKENS` tokens, every built-in row). The
thresholds are the port's (:mod:`oracles.checks.port`, float32 by default); ``oracles compare R.json R.json``
holds the same rows again from the receipt's ``clef-row`` units (mlx-vlm is the port on the clef pin):
each carries the read-out and every prompt position's logits ``[T, V]``, as test_port_logits and
test_port_readout hold them. Every bound is the port's (``port.tolerance()``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.checks.exact import assert_ids_equal, assert_within, diff
from oracles.checks.mrope import first_mismatches
from oracles.checks.port import assert_within_thresholds, held_figures, readout_failures, readout_figures
from oracles.engines.base import Engine
from oracles.families.clef import records as clef
from oracles.families.clef.run import CLEF_SAMPLE_TOKENS, Row, RowRun, all_rows, memo_row, vision_spec
from oracles.families.port_scope import PortScope
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.clef, pytest.mark.slow]

ROWS = all_rows(clef.load_records())
ROW_IDS = [r.label for r in ROWS]


def _pair(runs: Runs, reference: Engine, port: Engine, row: Row, root: Path, manifest: dict[str, Any],
          config: pytest.Config, receipt: Receipt) -> tuple[RowRun, RowRun]:
    """The reference's and the port's run of ``row``; a row the port scope leaves out is skipped."""
    spec = vision_spec(root)
    ref, _ = memo_row(runs, reference, row, spec, manifest)
    scope = PortScope.parse(config.getoption("port_records"))
    if not scope.selects(len(ref.ids), CLEF_SAMPLE_TOKENS):
        pytest.skip(scope.skip_reason(port.id, row.label, len(ref.ids)))
    got, _ = memo_row(runs, port, row, spec, manifest)
    receipt.update(row=row.label, port=port.id, request_sha256=clef.arm_sha256(row.record, row.arm), kind="clef-port")
    return ref, got


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_port_inputs(runs: Runs, reference: Engine, port: Engine, row: Row, clef_root: Path,
                     manifest: dict[str, Any], pytestconfig: pytest.Config, receipt: Receipt) -> None:
    """The port renders the same ids, and its processor chooses the same grids and pixel rows within
    the port's ``pixel_atol`` (bit equality recorded)."""
    ref, got = _pair(runs, reference, port, row, clef_root, manifest, pytestconfig, receipt)
    assert_ids_equal(got.ids, ref.ids, f"{row.label}: port ids vs reference ids")
    assert [m.grid for m in got.step.media] == [m.grid for m in ref.step.media], \
        f"{row.label}: port grids {[m.grid for m in got.step.media]} vs {[m.grid for m in ref.step.media]}"
    exact = [diff(a.pixels, b.pixels) for a, b in zip(got.step.media, ref.step.media)]
    receipt.update(pixels_bit_equal=[d.equal for d in exact], pixels_max_abs=[d.max_abs for d in exact])
    for i, (a, b) in enumerate(zip(got.step.media, ref.step.media)):
        assert_within(a.pixels, b.pixels, port.tolerance().pixel_atol,
                      f"{row.label}: picture {i}: port vs reference pixel rows")


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_port_positions(runs: Runs, reference: Engine, port: Engine, row: Row,
                        clef_root: Path, manifest: dict[str, Any], pytestconfig: pytest.Config, receipt: Receipt) -> None:
    """The port's text model received the reference's M-RoPE planes, position for position."""
    ref, got = _pair(runs, reference, port, row, clef_root, manifest, pytestconfig, receipt)
    a, b = np.asarray(got.step.positions), np.asarray(ref.step.positions)
    assert a.shape == b.shape, f"{row.label}: port planes {list(a.shape)} vs reference {list(b.shape)}"
    assert not first_mismatches(a, b), f"{row.label}: port vs reference planes: {first_mismatches(a, b)}"


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_port_logits(runs: Runs, reference: Engine, port: Engine, row: Row, clef_root: Path,
                     manifest: dict[str, Any], pytestconfig: pytest.Config, receipt: Receipt) -> None:
    """Every position's logits within the float32 port thresholds; the tower rows, final hidden states and
    residual stream differences are recorded (they feed the logits, which carry the threshold)."""
    ref, got = _pair(runs, reference, port, row, clef_root, manifest, pytestconfig, receipt)
    fig = held_figures(row.label, ref.step.logits, got.step.logits)
    towers = [diff(p.tower, r.tower).max_abs for p, r in zip(got.step.media, ref.step.media)]
    assert got.step.layers is not None and ref.step.layers is not None, "forward(layers=True) returned no residual stream"
    stream = np.abs(got.step.layers.astype(np.float64) - ref.step.layers).max(axis=(1, 2))
    receipt.update(figures=fig, tower_max_abs=towers, hidden_max_abs=diff(got.step.hidden, ref.step.hidden).max_abs,
                   stream_max_abs=[float(v) for v in stream])
    assert_within_thresholds(f"{row.label}: {port.id} vs reference logits", fig, tolerance=port.tolerance())


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_port_readout(runs: Runs, reference: Engine, port: Engine, row: Row,
                      clef_root: Path, manifest: dict[str, Any], pytestconfig: pytest.Config, receipt: Receipt) -> None:
    """The question's read-out probabilities within max |Δp| of the reference's, and the same answer
    unless the reference's is a near tie (the port's ``key_margin``: :mod:`oracles.checks.tolerance`)."""
    ref, got = _pair(runs, reference, port, row, clef_root, manifest, pytestconfig, receipt)
    fig = readout_figures(list(row.question.keys), ref.probs, got.probs)
    receipt.update(readout=fig)
    failures = readout_failures(fig, tolerance=port.tolerance())
    assert not failures, f"{row.label}: {port.id} vs reference read-out: " + "; ".join(failures)
