"""Port vs reference (port): every execution record held against the reference, record by record.

For each record: ids equal; per-position argmax agreement, max |Δlogit|, NMSE, KL(reference‖port)
mean and max (the port's own thresholds, ``port.tolerance()``: :mod:`oracles.checks.tolerance` derives
the float32 ones); over generations, the first
divergent token. Every run is the one the family tests made (same ``runs`` keys), so nothing here
recomputes. Also: a port whose outputs hold NaN fails naming the record and position. The chat
records' port check lives in test_chat.py (marked ``port`` too), so that under ``--dist loadgroup`` it
shares the mtplx_chat worker's chat runs instead of re-running them here.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from oracles.checks.exact import assert_ids_equal
from oracles.checks.port import assert_within_thresholds, compared_rows, first_divergence, held_figures
from oracles.checks.tolerance import Tolerance
from oracles.engines.base import Engine, Step
from oracles.families.execution import runs as ex
from oracles.families.execution.judged import Judge, teacher_forced
from oracles.families.execution.localise import localise
from oracles.families.execution.prompts import PromptRecord, load_prompts
from oracles.plugin.fixtures import Engines, Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.port, pytest.mark.slow]

PROMPTS = load_prompts()


@pytest.fixture
def record(request: pytest.FixtureRequest, pin: str) -> PromptRecord:
    """The record of this test's parameter bound to its pin (parametrized indirectly)."""
    return request.param.bind(pin)


def _held(what: str, ref_logits: Any, port_logits: Any, receipt: Receipt, tolerance: Tolerance,
          localise_on: tuple[Any, Any, PromptRecord] | None = None) -> dict[str, Any]:
    """Hold the logits to ``tolerance``'s thresholds (the port's). When they fail and ``localise_on``
    gives (reference, port, record), the receipt gains a ``bisect`` section: the first stage (layer,
    attention or MLP inside it) where the port leaves the reference on that record
    (:mod:`oracles.families.execution.localise`, the same tolerance's budgets), or which engine cannot
    be localised."""
    __tracebackhide__ = True
    fig = held_figures(what, ref_logits, port_logits)
    receipt.update(fig)
    try:
        assert_within_thresholds(what, fig, tolerance=tolerance)
    except AssertionError:
        if localise_on is not None:
            reference, port, record = localise_on
            receipt["bisect"] = localise(reference, port, list(record.ids), record.id, tolerance=tolerance)
        raise
    return fig


def _judged(what: str, key: Any, ref_logits: Any, port_logits: Any, runs: Runs, judge: Judge, receipt: Receipt,
            band_logits: Callable[[Engine], Any], localise_on: tuple[Any, Any, PromptRecord] | None = None) -> None:
    """:func:`_held` with the judge's bounds for these rows (the port's own, or the record's band:
    ``band_logits`` computes the band engine's on the same rows), the judgment, the band's figures and
    the port's translations in the receipt, and both named in the message."""
    __tracebackhide__ = True
    tolerance, band = judge.bounds(runs, key, ref_logits, band_logits)
    receipt.update(judgment=judge.judgment.as_json(), band=band, tolerance=tolerance.name,
                   translations=list(judge.translations))
    try:
        _held(judge.label(what), ref_logits, port_logits, receipt, tolerance)
    except AssertionError:
        if localise_on is not None:  # bisect's floors: float32's, or the band's measured on this record
            reference, port, record = localise_on
            budgets = judge.bisect_tolerance(runs, reference, list(record.ids), tolerance)
            receipt["bisect"] = localise(reference, port, list(record.ids), record.id, tolerance=budgets)
        raise


def _tokens_held(what: str, ref_tokens: Any, port_tokens: Any, judge: Judge) -> None:
    """Tokens equal under an exact judgment. Under a band, the held step rows (through the first
    divergent token) already decide: a token may change only where the reference's top-2 gap is
    inside the band's near tie, which the argmax check of those rows enforces."""
    __tracebackhide__ = True
    if judge.judgment.exact:
        assert_ids_equal(port_tokens, ref_tokens, judge.label(what))


@pytest.mark.parametrize("record", PROMPTS, ids=[p.id for p in PROMPTS], indirect=True)
def test_prefill_vs_reference(runs: Runs, reference: Engine, port: Engine, judge: Judge, record: PromptRecord,
                              receipt: Receipt, pytestconfig: pytest.Config) -> None:
    """Prompt records (test_forward's prefills): ids, then every row's logits within the port's bounds."""
    ids = port.chat_ids(record.message_list)
    assert_ids_equal(ids, reference.chat_ids(record.message_list), f"{record.id}: port vs reference chat-template ids")
    ref, got = ex.prefill(runs, reference, record), ex.prefill(runs, port, record)
    receipt.update(request_sha256=record.sha256, kind="prefill", port=port.id, reference=reference.id,
                   port_pin=port.pin)
    _judged(f"{record.id}: prefill logits, port {port.id} on {port.pin} vs {reference.id}", ("prefill", record.id),
            ref.logits, got.logits, runs, judge, receipt, lambda band: ex.prefill(runs, band, record).logits,
            localise_on=(reference, port, record))
    _artifact_units("prefill", record, receipt, pytestconfig, runs, judge,
                    {reference: (None, ref.logits), port: (None, got.logits)}, ("prefill", record.id),
                    lambda band: ex.prefill(runs, band, record).logits)


def _artifact_units(kind: str, record: PromptRecord, receipt: Receipt, pytestconfig: pytest.Config, runs: Runs,
                    judge: Judge, sides: dict[Engine, tuple[Any, Any]], band_key: Any, band_rows: Callable[[Engine], Any],
                    band_tokens: Any = None) -> None:
    """The comparable units of a ``--port-pin`` pair (``oracles compare --ref-pin REF --port-pin ARTIFACT``):
    the port's on the artifact pin; the reference's when no engine family runs on its pin in the same run
    (a dequantized reference: otherwise that family's test attaches it, and one key is one unit); the band
    engine's (``torch@bfloat16`` on the reference pin) under a band judgment, its rows those the band was
    measured on. ``sides``: engine -> (tokens or None, ``[T, V]`` logits)."""
    from oracles.families import family_of
    from oracles.plugin.state import settings_of
    from oracles.receipts.units import attach_unit

    (reference, _), (port, _) = sides.items()
    if port.pin == reference.pin:
        return
    family = family_of({"mtplx"})
    ours = settings_of(pytestconfig).pins_for(family)
    role = "logits" if kind == "prefill" else "step_logits"
    units = [(e, t, lg) for e, (t, lg) in sides.items() if e is port or reference.pin not in ours]
    if judge.band is not None:
        band = judge.band()
        units.append((band, band_tokens, runs(("band", band_key, band.id, band.pin), lambda: band_rows(band))))
    for engine, tokens, logits in units:
        attach_unit(receipt, kind, request_sha256=record.sha256, pin=engine.pin, engine=engine.id, record=record.id,
                    ids=record.ids, tokens=tokens, argmax=logits.argmax(-1), arrays={role: logits})


def _steps_band(record: PromptRecord, tokens: Any, rows: int) -> Callable[[Engine], Any]:
    """The band engine's logits on the reference's greedy steps (teacher-forced: one cold forward)."""
    return lambda band: teacher_forced(band, list(record.ids), list(tokens), rows)


@pytest.mark.parametrize("record", ex.GENERATION, ids=[r.id for r in ex.GENERATION], indirect=True)
def test_decode_vs_reference(runs: Runs, reference: Engine, port: Engine, judge: Judge, record: PromptRecord,
                             receipt: Receipt, pytestconfig: pytest.Config) -> None:
    """Greedy cache-continuation decode: the cached step logits within the bounds; the same tokens
    (under a band: a token changes only at a near tie)."""
    ref = ex.decode(runs, reference, record)
    got = ex.decode_steps(runs, port, record, shared=port.pin == reference.pin)
    first = first_divergence(ref.tokens, got.tokens)
    receipt.update(request_sha256=record.sha256, kind="decode", first_divergent_token=first,
                   ref_tokens=ref.tokens, port_tokens=got.tokens)
    n = compared_rows(ref.tokens, got.tokens)
    _judged(f"{record.id}: decode step logits (first {n} steps)", ("steps", record.id, n), ref.step_logits[:n],
            got.step_logits[:n], runs, judge, receipt, _steps_band(record, ref.tokens, n))
    _artifact_units("decode", record, receipt, pytestconfig, runs, judge,
                    {reference: (ref.tokens, ref.step_logits), port: (got.tokens, got.step_logits)},
                    ("steps", record.id, n), _steps_band(record, ref.tokens, n), band_tokens=ref.tokens[:n])
    _tokens_held(f"{record.id}: port {port.id} greedy decode vs reference", ref.tokens, got.tokens, judge)


@pytest.mark.parametrize("record", ex.GENERATION, ids=[r.id for r in ex.GENERATION], indirect=True)
def test_greedy_generation_vs_reference(runs: Runs, reference: Engine, port: Engine, judge: Judge,
                                        record: PromptRecord, receipt: Receipt) -> None:
    """Each library's greedy generation: the step logits within the bounds; the same tokens (first
    divergent token recorded; under a band, a token changes only at a near tie), the same finish."""
    ref, got = ex.generate(runs, reference, record, "greedy"), ex.generate(runs, port, record, "greedy")
    first = first_divergence(ref.tokens, got.tokens)
    receipt.update(request_sha256=record.sha256, kind="generate-greedy", first_divergent_token=first,
                   finish=[ref.finish_reason, got.finish_reason])
    n = compared_rows(ref.tokens, got.tokens)
    _judged(f"{record.id}: greedy generation step logits (first {n} steps)", ("steps", record.id, n),
            ref.step_logits[:n], got.step_logits[:n], runs, judge, receipt, _steps_band(record, ref.tokens, n))
    if judge.judgment.exact:
        assert first is None, (f"{record.id}: first divergent token at {first}: {ref.tokens[first:first + 3]} vs "
                               f"{got.tokens[first:first + 3]}")


@pytest.mark.parametrize("record", ex.GENERATION, ids=[r.id for r in ex.GENERATION], indirect=True)
def test_sampled_generation_recorded(runs: Runs, reference: Engine, port: Engine, judge: Judge, record: PromptRecord,
                                     receipt: Receipt) -> None:
    """Sampled (0.6 / 0.95 / 20 / seed 0): the two libraries draw from different RNGs, so the tokens
    may differ after the first draw; recorded. The first step's raw logits come from the same prompt
    and must be within the bounds."""
    got = ex.generate(runs, port, record, "sampled")  # first: a port without a sampler skips before the reference runs
    ref = ex.generate(runs, reference, record, "sampled")
    receipt.update(request_sha256=record.sha256, kind="generate-sampled",
                   first_divergent_token=first_divergence(ref.tokens, got.tokens),
                   ref_tokens=ref.tokens, port_tokens=got.tokens)
    _judged(f"{record.id}: sampled generation, first step logits", ("prefill-last", record.id), ref.step_logits[:1],
            got.step_logits[:1], runs, judge, receipt, lambda band: band.forward(list(record.ids), keep=1).logits)


@pytest.mark.parametrize("record", ex.GENERATION, ids=[r.id for r in ex.GENERATION], indirect=True)
def test_speculative_vs_reference(runs: Runs, engines: Engines, reference: Engine, port: Engine, judge: Judge,
                                  record: PromptRecord, receipt: Receipt) -> None:
    """Draft/verify/commit with the twin draft: the port commits the reference's tokens; under a band,
    its own greedy tokens (drafting never changes what greedy decoding commits)."""
    ref, got = (ex.speculative(runs, engines, e, record, "twin") for e in (reference, port))
    receipt.update(request_sha256=record.sha256, kind="speculative-twin",
                   first_divergent_token=first_divergence(ref.tokens, got.tokens),
                   accepted=[ref.accepted, got.accepted], drafted=[ref.drafted, got.drafted])
    if judge.judgment.exact:
        assert_ids_equal(got.tokens, ref.tokens, judge.label(f"{record.id}: port {port.id} speculative (twin) vs reference"))
    else:
        own = ex.decode_steps(runs, port, record, shared=port.pin == reference.pin)
        receipt.update(vs_own_greedy=first_divergence(own.tokens, got.tokens))
        assert_ids_equal(got.tokens, own.tokens, judge.label(f"{record.id}: port {port.id} speculative (twin) vs its own "
                                                             "greedy decode"))


class NanPort:
    """A fake port whose forward puts NaN at one position of the logits (bad-input check)."""

    id = "nan-port"

    def __init__(self, vocab: int, position: int) -> None:
        self.vocab, self.position = vocab, position

    def forward(self, ids: Any, cache: Any = None, keep: int = 0) -> Step:
        logits = np.zeros((len(ids), self.vocab), "<f4")
        logits[self.position, 7] = np.nan
        return Step(logits=logits, hidden=np.zeros((len(ids), 4), "<f4"))


def test_nan_port_names_record_and_position(runs: Runs, reference: Engine, receipt: Receipt) -> None:
    """A port whose logits hold NaN fails with the record and the position (row) named."""
    record = PROMPTS[0].bind(reference.pin)
    ref = ex.prefill(runs, reference, record)
    bad = NanPort(reference.vocab_size, position=5).forward(list(record.ids))
    with pytest.raises(AssertionError) as err:
        _held(f"{record.id}: prefill logits, port nan-port vs {reference.id}", ref.logits, bad.logits, receipt,
              reference.tolerance())
    message = str(err.value)
    receipt.update(message=message)
    assert f"{record.id}:" in message and "position 5" in message and "non-finite" in message, message


def test_failed_record_is_localised(runs: Runs, reference: Engine, receipt: Receipt) -> None:
    """Positive control of the port family's bisect section: a port with the MLP's gate and up
    projections swapped (oracles.faults) fails the prefill thresholds, and the receipt names the
    stage the fault was injected in, where the engine can be localised."""
    from oracles.faults import fault_port

    record = PROMPTS[0].bind(reference.pin)
    port = fault_port("gate_up_swapped", reference)
    ref, got = ex.prefill(runs, reference, record), port.forward(list(record.ids))
    with pytest.raises(AssertionError):
        _held(f"{record.id}: prefill logits, port {port.id} vs {reference.id}", ref.logits, got.logits, receipt,
              port.tolerance(), localise_on=(reference, port, record))
    report = receipt["bisect"]
    want = port.stage()
    receipt.update(injected_at=want)
    assert report["cannot_localise"] is None, report["cannot_localise"]
    assert report["divergent"] == want, f"bisect named {report['divergent']!r}, the fault sits in {want!r}"
