"""Graded (marker graded): an artifact that quantizes its activations at run time, which has no exact
float32 reference, graded with llama-perplexity's ``--kl-divergence`` statistics against the float32
reference (:mod:`oracles.families.graded`, :mod:`oracles.checks.kld`) and held to the band of the
reference run with the export's own int8 arithmetic.

ONNX Runtime's dynamic quantization (``quantize_dynamic``: precision ``int8`` weights, ``dynamic_uint8``
compute) quantizes each quantized product's input to uint8 with one scale and zero point per tensor,
computed from that tensor's own range at run time. A position's rounding therefore depends on every
other position in the same call (a prefill rounds otherwise than the same tokens decoded one by one:
on the draft twin's int8 export, 8.9e-3 max |Δlogit| between a 40-token cold forward and 30 + 10 through
the cache), so no float32 snapshot reproduces it and the float32 port checks cannot hold it; the pin
pairing refuses it as a ``--port-pin`` (its weights are not the reference's). What it costs is graded:
each port engine that loads the artifact, over the corpus, against the reference on the pin the artifact
names as its ``reference``, beside

* the band: the reference with the export's int8 weights and its per-tensor uint8 rounding of every
  quantized product's input, the integer products exact (``torch@dynamic_uint8``,
  :mod:`oracles.engines.torch.dynamic_int8`), a rounding of the same kind computed by other code. The port
  is held to it as a bfloat16 port is to its band (test_graded.py): KL mean and p99 at most
  :data:`~oracles.checks.judgment.BAND_RATIO` squared times the band's, RMS delta-p BAND_RATIO times;
  The port's KL mean must also be at least the band's over BAND_RATIO squared: an artifact that does not
  round (a float32 graph under an int8 pin, say) is not graded as one that does;
* under ``--port-records all`` (every chunk) also the float32 export it was quantized from (the control:
  float32 arithmetic, held to FLOAT32's per-row KL bound) and the band with the int16 pair saturation of an
  x86 kernel without AVX-VNNI (``torch@dynamic_uint8+sat``), recorded, not held: whether a kernel saturates
  depends on the CPU (measured on this machine's AVX2: ONNX Runtime within 2.4e-7 of it on the twin, 0.037
  from the band; on SmolLM2 the rounding is chaotic and neither band tracks it row by row:
  :mod:`oracles.engines.torch.dynamic_int8`).

Runs on the built-in int8 export of the draft twin, or on the run-time quantized pins ``--pin`` names
(``--pin smollm2-onnx-int8``: SmolLM2's, after ``oracles materialize smollm2-onnx-int8``).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from oracles.checks.judgment import BAND_RATIO
from oracles.checks.tolerance import FLOAT32
from oracles.engines.base import Engine
from oracles.families.graded.corpus import corpus_for, sample_chunks
from oracles.families.graded.run import graded_many
from oracles.plugin.fixtures import Engines, PinCache, Runs
from oracles.plugin.state import settings_of
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.graded, pytest.mark.slow]

#: The figures the band budget holds, each with its power of BAND_RATIO (as test_graded.py's ``HELD``).
HELD = (("kld", "mean", 2), ("kld", "p99", 2), ("delta_p", "rms", 1))
#: The built-in artifact graded without ``--pin``: the draft twin's float32 export (smollm2-draft-twin-onnx)
#: through ``quantize_dynamic``.
ARTIFACT = "smollm2-draft-twin-onnx-int8"
#: The compute precisions that quantize activations at run time (oracles.pins.precision.ONNX_COMPUTE).
RUNTIME_QUANTIZED = ("dynamic_uint8",)
#: Chunks under ``--port-records sample`` (every chunk under ``all``): 2 of the corpus' 15, its first and last,
#: 510 scored positions (ONNX Runtime runs a 512-token chunk of the twin in 2-5 s here, its 49,152-wide head dominating).
SAMPLE_CHUNKS = 2


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``artifact``: the ``--pin`` pins that quantize activations at run time, else :data:`ARTIFACT` (none of
    them among ``--pin``: an empty parametrization, which pytest reports as a skip)."""
    if "artifact" in metafunc.fixturenames:
        settings = settings_of(metafunc.config)
        named = [p for p in settings.pins if settings.pin_store.load(p).precision.compute in RUNTIME_QUANTIZED]
        metafunc.parametrize("artifact", named if settings.pins else [ARTIFACT], scope="session")


def _ports(pytestconfig: pytest.Config, artifact: str) -> list[str]:
    """The session's port engines that load ``artifact`` (its ``unsupported_pin``)."""
    settings = settings_of(pytestconfig)
    return [e for e in settings.ports if settings.compatible(e, artifact)]


def _bands(runs: Runs, verified_snapshot: Any, pytestconfig: pytest.Config, artifact: str, reference_pin: str,
           source: str, saturated: bool) -> dict[str, Any]:
    """The band engine (the reference with the export's int8 arithmetic) and, with ``saturated``, the same with
    the int16 saturation; each built once per session."""
    from oracles.engines.torch.dynamic_int8 import band_engine

    settings = settings_of(pytestconfig)
    int8, float_export = verified_snapshot(artifact) / "model.onnx", verified_snapshot(source) / "model.onnx"
    threads = int(pytestconfig.getoption("oracle_threads"))

    def build(sat: bool) -> Any:
        return band_engine(verified_snapshot(reference_pin), settings.pin_store.load(reference_pin), threads, int8,
                           float_export, saturate=sat)

    wanted = (("band", False), ("band, int16 saturation", True)) if saturated else (("band", False),)
    return {label: runs(("dynamic-int8-band", artifact, sat, settings.reference), functools.partial(build, sat))
            for label, sat in wanted}


def _problems(port_id: str, artifact: str, source: str, fig: dict[str, Any]) -> list[str]:
    """What a port's figures break: the band budget (:data:`HELD`) both ways, and the float32 control where run."""
    got, band = fig["quantized"]["pooled"], fig["band"]["pooled"]
    out = [f"{port_id} on {artifact}: {a} {b} {got[a][b]:.3g} > {BAND_RATIO ** k:g} x band {band[a][b]:.3g}"
           for a, b, k in HELD if got[a][b] > BAND_RATIO ** k * band[a][b]]
    if not got["kld"]["mean"] * BAND_RATIO ** 2 >= band["kld"]["mean"]:
        out.append(f"{port_id} on {artifact}: KL mean {got['kld']['mean']:.3g} < band {band['kld']['mean']:.3g} / "
                   f"{BAND_RATIO ** 2:g}: it does not round as the export's int8 arithmetic does (nothing quantized?)")
    control = fig.get("float32 source", {}).get("pooled", {}).get("kld")
    if control is not None and not control["max"] <= FLOAT32.max_kl:
        out.append(f"{port_id} on {source}: KL max {control['max']:.3g} > FLOAT32's {FLOAT32.max_kl:g} per row (the "
                   "float32 export is not the reference's arithmetic)")
    return out


def test_runtime_quantized_cost(runs: Runs, engines: Engines, pins: PinCache, pytestconfig: pytest.Config,
                                verified_snapshot: Any, artifact: str, receipt: Receipt) -> None:
    """Each port that loads ``artifact`` and the band, against the reference on the artifact's ``reference``
    pin over the corpus (:data:`SAMPLE_CHUNKS` under ``--port-records sample``; every chunk under ``all``, with the
    float32 source and the saturating band too): every statistic in the receipt; the port within :data:`HELD`'s
    budget of the band, and its KL mean at least the band's over BAND_RATIO squared (it rounds as much); the
    float32 source's KL max within FLOAT32's per-row bound where run."""
    pin = pins(artifact)
    source, reference_pin = pin.converted_from, pin.reference
    if source is None or reference_pin is None:
        pytest.fail(f"pin {artifact}: fields 'converted_from' and 'reference' name the float32 export and the "
                    f"reference it is graded against; got {source!r}, {reference_pin!r}")
    ports = _ports(pytestconfig, artifact)
    if not ports:
        pytest.skip(f"no port engine of this run loads pin {artifact} ({pin.precision.describe()})")
    settings = settings_of(pytestconfig)
    every = settings.port_scope.kind == "all"
    reference: Engine = engines(settings.reference, reference_pin)
    corpus = runs(("corpus", reference.pin_file.tokenizer_sha256), lambda: corpus_for(reference.tokenizer))
    chunks = None if every else sample_chunks(corpus.n_chunk, SAMPLE_CHUNKS)
    bands = _bands(runs, verified_snapshot, pytestconfig, artifact, reference_pin, source, saturated=every)
    found = {port_id: graded_many(reference, {"quantized": engines(port_id, artifact), **bands,
                                              **({"float32 source": engines(port_id, source)} if every else {})},
                                  corpus, chunks) for port_id in ports}
    receipt.update(kind="runtime-quantized-cost", artifact=artifact, precision=pin.precision.to_json(),
                   source=source, reference=f"{reference.id} on {reference_pin}", chunks=chunks, figures=found,
                   band_engines={k: e.id for k, e in bands.items()}, band_ratio=BAND_RATIO)
    problems = [line for port_id, fig in found.items() for line in _problems(port_id, artifact, source, fig)]
    assert not problems, "; ".join(problems)
