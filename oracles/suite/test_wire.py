"""Port (wire): a far side the project holds to an in-process engine bit for bit (``oracles_wire NAME.same-as``),
on every run the port family made of both.

A harness that reimplements an engine's calls in another language (``harness/``: C over libllama, as the
llamacpp engine drives it through CFFI) must give that engine's bits on the same artifact and settings: the
prefill rows (logits and the final norm's output), the greedy cached decode's tokens and step logits, and the
library's greedy and sampled generations. The runs are the ones the port family's tests made for both engines
(the same ``runs`` keys, the same xdist group), so nothing here recomputes. A port that names no such engine
is skipped, naming why.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oracles.checks.exact import assert_bits_equal
from oracles.engines.base import Engine
from oracles.families.execution import runs as ex
from oracles.families.execution.prompts import PromptRecord, load_prompts
from oracles.plugin.fixtures import Engines, Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.port, pytest.mark.slow]

PROMPTS = load_prompts()


@pytest.fixture
def record(request: pytest.FixtureRequest, pin: str) -> PromptRecord:
    """The record of this test's parameter bound to its pin (parametrized indirectly)."""
    return request.param.bind(pin)


@pytest.fixture
def twin(engines: Engines, port: Engine, receipt: Receipt) -> Engine:
    """The in-process engine the port must equal on its own pin (skipped when it names none)."""
    target = getattr(type(port), "target", None)
    same = getattr(target, "same_as", None)
    if not same:
        pytest.skip(f"port {port.id} names no in-process engine to equal bit for bit (oracles_wire NAME.same-as)")
    receipt.update(same_as=same)
    return engines(same, port.pin)


def _equal(what: str, got: Any, want: Any) -> None:
    __tracebackhide__ = True
    assert_bits_equal(np.asarray(got), np.asarray(want), what)


@pytest.mark.parametrize("record", PROMPTS, ids=[p.id for p in PROMPTS], indirect=True)
def test_prefill_bits_equal_in_process(runs: Runs, port: Engine, twin: Engine, record: PromptRecord,
                                       receipt: Receipt) -> None:
    """The prompt records' prefill: every row's logits and final-norm output, bit for bit."""
    got, want = ex.prefill(runs, port, record), ex.prefill(runs, twin, record)
    receipt.update(request_sha256=record.sha256, rows=int(got.logits.shape[0]))
    _equal(f"{record.id}: prefill logits, {port.id} vs {twin.id} on {port.pin}", got.logits, want.logits)
    _equal(f"{record.id}: prefill hidden, {port.id} vs {twin.id} on {port.pin}", got.hidden, want.hidden)


@pytest.mark.parametrize("record", ex.GENERATION, ids=[r.id for r in ex.GENERATION], indirect=True)
def test_decode_and_generation_bits_equal_in_process(runs: Runs, pin: str, port: Engine, twin: Engine,
                                                     record: PromptRecord, receipt: Receipt) -> None:
    """The greedy cached decode (tokens, step logits) and the library's greedy and sampled generations
    (tokens, step logits, finish), bit for bit."""
    shared = port.pin == pin  # the test's pin is the reference's
    got, want = ex.decode_steps(runs, port, record, shared), ex.decode_steps(runs, twin, record, shared)
    receipt.update(request_sha256=record.sha256, decode_tokens=len(got.tokens))
    assert got.tokens == want.tokens, f"{record.id}: greedy decode tokens, {port.id} {got.tokens} vs {twin.id} {want.tokens}"
    _equal(f"{record.id}: decode step logits, {port.id} vs {twin.id}", got.step_logits, want.step_logits)
    for mode in ("greedy", "sampled"):
        g, w = ex.generate(runs, port, record, mode), ex.generate(runs, twin, record, mode)
        assert (g.tokens, g.finish_reason) == (w.tokens, w.finish_reason), (
            f"{record.id}: {mode} generation, {port.id} {g.tokens} ({g.finish_reason}) vs {twin.id} {w.tokens} "
            f"({w.finish_reason})")
        _equal(f"{record.id}: {mode} generation step logits, {port.id} vs {twin.id}", g.step_logits, w.step_logits)
