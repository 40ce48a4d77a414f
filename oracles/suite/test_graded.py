"""Graded figures (marker graded): what quantization costs and what reduced-precision compute
costs, with llama-perplexity's ``--kl-divergence`` statistics over the shipped corpus
(:mod:`oracles.families.graded`, :mod:`oracles.checks.kld`).

* Conversion costs, on a float32 pin: the reference against the reference run in bfloat16 (the band
  a bfloat16 port is judged by, :mod:`oracles.checks.judgment`) and against each float32 snapshot
  dequantized from one of the pin's quantized conversions (in the pin store): the cost of the
  weights alone, no port involved. A figure, not a pass: the test holds only that no cost is zero (a
  comparison of a model with itself; oracles/checks/kld.py's tests hold the statistics).
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
from oracles.families.graded.run import graded, graded_many
from oracles.plugin.fixtures import Engines, PinCache, Runs
from oracles.plugin.state import settings_of
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.graded, pytest.mark.slow]

#: The chunks a port runs under ``--port-records sample``: one 512-token chunk is ~40-75 s of mlx-lm here.
PORT_SAMPLE_CHUNKS = 1
#: The chunks the reference-side costs run under ``--port-records sample`` (every chunk under ``all``):
#: 5 of the 15, spread over the corpus, 2,560 tokens and 1,275 scored positions, so the costs' three
#: comparisons take ~60 s of torch here instead of ~190 s; the KL mean's uncertainty grows by sqrt(3).
REFERENCE_SAMPLE_CHUNKS = 5
#: The figures a band budget holds, each with its power of BAND_RATIO: KL mean and p99 (nats) grow as
#: the square of a small logit error, RMS delta-p (a probability) as the error itself.
HELD = (("kld", "mean", 2), ("kld", "p99", 2), ("delta_p", "rms", 1))


def _corpus(runs: Runs, engine: Engine) -> Any:
    return runs(("corpus", engine.pin_file.tokenizer_sha256), lambda: corpus_for(engine.tokenizer))


def test_conversion_costs(runs: Runs, engines: Engines, pins: PinCache, pytestconfig: pytest.Config, pin: str,
                          receipt: Receipt) -> None:
    """On a float32 pin, over the corpus (:data:`REFERENCE_SAMPLE_CHUNKS` of it under ``--port-records
    sample``, every chunk under ``all``): the reference in bfloat16 (the band) and the reference on each
    dequantized snapshot, in the pin store, of one of the pin's conversions (the quantization cost),
    each against the reference on the pin, its forward of each chunk shared.
    Graded, not a pass: each cost must be above zero (zero is a model compared with itself)."""
    settings = settings_of(pytestconfig)
    if pins(pin).precision.weights != "float32":
        pytest.skip(f"pin {pin} holds {pins(pin).precision.describe()} weights: its costs are graded against the "
                    "float32 pin it was converted from")
    base = engines(settings.reference, pin)
    others = {"bfloat16 band": engines(settings.reference, pin, dtype="bfloat16")}
    for name in settings.pin_store.names():  # every dequantized snapshot of one of this pin's conversions
        source = pins(name).precision.dequantized_from
        if source is not None and pins(source).converted_from == pin:
            others[f"quantization {source}"] = engines(settings.reference, name)
    corpus = _corpus(runs, base)
    chunks = None if settings.port_scope.kind == "all" else sample_chunks(corpus.n_chunk, REFERENCE_SAMPLE_CHUNKS)
    found = graded_many(base, others, corpus, chunks)
    receipt.update(kind="conversion-costs", pin=pin, engines={k: f"{e.id} on {e.pin}" for k, e in others.items()},
                   figures=found)
    zero = [label for label, fig in found.items() if not fig["pooled"]["kld"]["mean"] > 0]
    assert not zero, f"{pin}: KL mean 0 for {zero}: the same model as the reference, so nothing was converted"


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
