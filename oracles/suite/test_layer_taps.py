"""Layer taps (``Engine.taps``) and ``oracles bisect`` on a faithful port (marker faults).

On the default pin and the "ping" record, for the reference and every port: the attention and MLP
outputs a layer adds are its stream step bit for bit, and row L of the stream through the engine's
final norm is the final-norm hidden state the head read. Then bisect holds each port against the
reference: a faithful port has no stage over budget, and the per-stage figures (the noise floor the
budgets of oracles/checks/bisect.py were calibrated on) go to the receipt.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pytest

from oracles.checks.bisect import noise_floor
from oracles.checks.exact import assert_bits_equal
from oracles.engines.base import Engine
from oracles.engines.taps import Taps
from oracles.families.execution.judged import Judge
from oracles.families.execution.localise import localise
from oracles.faults.panel import PING
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def taps(runs: Runs, engine: Engine) -> Taps:
    """The engine's taps of "ping", once per session (MLX: ~5 s here)."""
    return runs(("taps", engine.id, engine.pin, PING.id), lambda: engine.taps(list(PING.bind(engine.pin).ids)))


def test_taps_add_up(runs: Runs, engine: Engine, receipt: Receipt) -> None:
    """stream[l + 1] == (stream[l] + attn[l]) + mlp[l] in float32, bit for bit, for every layer: the
    taps are the two residual terms of each layer (not some other tensor of the same shape)."""
    t = taps(runs, engine)
    n, positions = engine.num_layers, len(PING.bind(engine.pin).ids)
    assert t.stream.shape == (n + 1, positions, engine.hidden_size), f"{engine.id}: stream {t.stream.shape}"
    assert t.attn.shape == t.mlp.shape == (n, positions, engine.hidden_size), f"{engine.id}: attn {t.attn.shape}"
    receipt.update(engine=engine.id, mixers=sorted(set(t.mixers)), layers=n)
    assert_bits_equal((t.stream[:-1] + t.attn) + t.mlp, t.stream[1:],
                      f"{engine.id} ping: stream[l] + attn[l] + mlp[l] vs stream[l + 1] [layer, position, dim]")
    assert np.abs(t.attn).max() > 0 and np.abs(t.mlp).max() > 0, f"{engine.id}: a tap recorded only zeros"


def test_stream_row_L_through_final_norm(runs: Runs, engine: Engine, receipt: Receipt) -> None:
    """Row L of the stream (after the last layer), through the engine's own final norm, is the hidden
    state the head read, bit for bit."""
    t = taps(runs, engine)
    again = engine.final_norm(t.stream[-1])
    receipt.update(engine=engine.id, bit_equal=bool(np.array_equal(again.view("<u4"), t.hidden.view("<u4"))))
    assert_bits_equal(again, t.hidden, f"{engine.id} ping: final_norm(stream[L]) vs final-norm hidden [position, dim]")


@pytest.mark.port
def test_bisect_faithful_port(runs: Runs, reference: Engine, port: Engine, judge: Judge, receipt: Receipt) -> None:
    """A faithful port (mlx-lm against transformers; a quantized artifact against its dequantized
    reference) has no stage over its budget on "ping": float32's budgets, or under a band judgment
    those calibrated on the band (oracles.families.execution.judged); every stage's NMSE and its ratio
    to the noise floor are recorded."""
    ids = list(PING.bind(reference.pin).ids)
    tolerance = judge.bisect_tolerance(runs, reference, ids, judge.own)
    report = localise(_Cached(reference, taps(runs, reference)), _Cached(port, taps(runs, port)),
                      ids, PING.id, tolerance=tolerance)
    floors = [_over_floor(s["nmse"], noise_floor(s["depth"], tolerance=tolerance)) for s in report["stages"]]
    receipt.update(kind="bisect", pin=reference.pin, port_pin=port.pin, judgment=judge.judgment.as_json(),
                   translations=list(judge.translations), record=PING.id, reference=reference.id, port=port.id,
                   stages=report["stages"], divergent=report["divergent"], nmse_over_floor_max=max(floors))
    over = [(s["name"], s["nmse"], s["budget"]) for s in report["stages"] if s["over"]]
    assert report["divergent"] is None and not over, judge.label(
        f"{port.id} vs {reference.id} on ping: stages over budget {over[:4]}")


def _over_floor(nmse: float, floor: float) -> float:
    """``nmse`` over the noise floor; a floor of 0 (a band calibrated on a stage both sides compute exactly,
    such as the embedding under q8_1 activations) gives 0 for an exact stage and inf for any other."""
    if floor > 0:
        return nmse / floor
    return 0.0 if nmse == 0 else float("inf")


class _Cached:
    """An engine whose ``taps`` returns an earlier capture (the session's), so bisect reads the very
    arrays the taps tests checked; everything else is the engine's."""

    def __init__(self, engine: Engine, captured: Taps) -> None:
        self._engine, self._captured = engine, captured

    def taps(self, _ids: Sequence[int]) -> Taps:
        return self._captured

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
