"""Graded figures (marker graded): what quantization costs and what reduced-precision compute
costs, with llama-perplexity's ``--kl-divergence`` statistics over the shipped corpus
(:mod:`oracles.families.graded`, :mod:`oracles.checks.kld`).

* Quantization cost, on a dequantized reference pin: the float32 original against the float32
  snapshot dequantized from its quantized artifact, both on the reference engine: the cost of the
  weights alone, no port involved. A figure, not a pass: the test holds only that the cost is not
  zero (a comparison of a model with itself would be; oracles/checks/kld.py's tests hold the statistics).
* The band, on a float32 pin: the reference against the reference run in bfloat16 (the band a
  bfloat16 port is judged by, :mod:`oracles.checks.judgment`).
* A bfloat16 port (a ``--port-pin`` pair judged by a band) against the float32 reference over the
  chunks its scope runs: its KL mean and p99 held to :data:`BAND_RATIO` squared times the band's, its
  RMS delta-p to BAND_RATIO times, on the same chunks: a budget, so a pass or a failure.

The reference runs every chunk; a port runs one under ``--port-records sample`` (mlx-lm prefills a
512-token chunk in ~40-75 s on this machine's CPU), all under ``all``.
"""

from __future__ import annotations

from typing import Any

import pytest

from oracles.checks.judgment import BAND_RATIO
from oracles.engines.base import Engine
from oracles.families.execution.judged import Judge
from oracles.families.graded.corpus import corpus_for, sample_chunks
from oracles.families.graded.run import graded
from oracles.plugin.fixtures import Engines, PinCache, Runs
from oracles.plugin.state import settings_of
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.graded, pytest.mark.slow]

#: The chunks a port runs under ``--port-records sample``.
PORT_SAMPLE_CHUNKS = 1
#: The figures a band budget holds, each with its power of BAND_RATIO: KL mean and p99 (nats) grow as
#: the square of a small logit error, RMS delta-p (a probability) as the error itself.
HELD = (("kld", "mean", 2), ("kld", "p99", 2), ("delta_p", "rms", 1))


def _corpus(runs: Runs, engine: Engine) -> Any:
    return runs(("corpus", engine.pin_file.tokenizer_sha256), lambda: corpus_for(engine.tokenizer))


def test_quantization_cost(runs: Runs, engines: Engines, pins: PinCache, pytestconfig: pytest.Config, pin: str,
                           receipt: Receipt) -> None:
    """The float32 original against this dequantized reference, every chunk (graded, not a pass)."""
    precision = pins(pin).precision
    if precision.dequantized_from is None:
        pytest.skip(f"pin {pin} is not a dequantized reference (its precision names no dequantized_from)")
    artifact = pins(precision.dequantized_from)
    original = artifact.converted_from
    if original is None:
        pytest.skip(f"pin {artifact.name} names no float32 original (converted_from)")
    reference = settings_of(pytestconfig).reference
    base, dequantized = engines(reference, original), engines(reference, pin)
    fig = graded(base, dequantized, _corpus(runs, base))
    receipt.update(kind="quantization-cost", original=original, artifact=artifact.name, dequantized=pin,
                   precision=precision.describe(), artifact_precision=artifact.precision.describe(), **fig)
    assert fig["pooled"]["kld"]["mean"] > 0, (f"{original} vs {pin}: KL mean 0: the dequantized weights equal the "
                                                "original's, so nothing was quantized")


def test_bfloat16_band(runs: Runs, engines: Engines, pins: PinCache, pytestconfig: pytest.Config, pin: str,
                       receipt: Receipt) -> None:
    """The reference against itself run in bfloat16, every chunk: the band a bfloat16 port is judged by."""
    if pins(pin).precision.dequantized_from is not None:
        pytest.skip(f"pin {pin} is a dequantized reference: its artifact computes in float32 (exact judgment)")
    reference = settings_of(pytestconfig).reference
    fp32, bf16 = engines(reference, pin), engines(reference, pin, dtype="bfloat16")
    fig = runs(("graded-band", pin, None), lambda: graded(fp32, bf16, _corpus(runs, fp32)))
    receipt.update(kind="bfloat16-band", band_engine=bf16.id, **fig)
    assert fig["pooled"]["kld"]["mean"] > 0, f"{pin}: the bfloat16 run equals the float32 one: no band"


@pytest.mark.port
def test_port_within_band(runs: Runs, engines: Engines, reference: Engine, port: Engine, judge: Judge,
                          pytestconfig: pytest.Config, receipt: Receipt) -> None:
    """A port judged by a band, over the chunks its scope runs: KL mean and p99 at most BAND_RATIO
    squared times the band's, RMS delta-p BAND_RATIO times, on the same chunks."""
    if judge.judgment.exact or judge.band is None:
        pytest.skip(f"port {port.id} on {port.pin}: exact judgment; the port family holds it to float32 record by record")
    corpus = _corpus(runs, reference)
    scope = settings_of(pytestconfig).port_scope
    chunks = None if scope.kind == "all" else sample_chunks(corpus.n_chunk, PORT_SAMPLE_CHUNKS)
    band_engine = judge.band()
    band = runs(("graded-band", reference.pin, tuple(chunks or ())), lambda: graded(reference, band_engine, corpus, chunks))
    fig = graded(reference, port, corpus, chunks)
    receipt.update(kind="port-graded", port=port.id, port_pin=port.pin, band_engine=band_engine.id,
                   judgment=judge.judgment.as_json(), translations=list(judge.translations), band=band, **fig)
    over = [f"{a} {b} {fig['pooled'][a][b]:.3g} > {BAND_RATIO ** k:g} x band {band['pooled'][a][b]:.3g}"
            for a, b, k in HELD if fig["pooled"][a][b] > BAND_RATIO ** k * band["pooled"][a][b]]
    assert not over, judge.label(f"{port.id} on {port.pin} vs {reference.id} on {reference.pin}, chunks "
                                 f"{fig['corpus']['chunks_run']}: " + "; ".join(over))
