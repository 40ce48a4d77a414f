"""Forward oracle on the chat prompt records: ids, prefill logits fingerprints and argmax,
finiteness, and the head re-run (lm_head on the captured final-norm hidden states).

Runs on the reference and on every port (``engine_id``); each prefill runs once per session.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oracles.checks.exact import assert_ids_equal, assert_within, diff
from oracles.checks.fingerprint import as_f4, fingerprint, row_fingerprints
from oracles.engines.base import Engine
from oracles.families.execution import runs as ex
from oracles.families.execution.prompts import PromptRecord, load_prompts
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.mtplx, pytest.mark.slow]

PROMPTS = load_prompts()


@pytest.fixture(params=PROMPTS, ids=[p.id for p in PROMPTS])
def record(request: pytest.FixtureRequest, pin: str) -> PromptRecord:
    """The prompt record bound to this test's pin (its tokenizer's ids)."""
    return request.param.bind(pin)


def prefill(runs: Runs, engine: Engine, record: PromptRecord) -> Any:
    return ex.prefill(runs, engine, record)


def test_chat_template_ids(engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """The engine's chat template gives the committed ids (apply_chat_template with the generation prompt)."""
    ids = engine.chat_ids(record.message_list)
    receipt.update(request_sha256=record.sha256, token_count=len(ids), ids=ids)
    assert_ids_equal(ids, list(record.ids), f"{record.id}: chat-template ids vs the committed mtplx ids of pin {record.pin}")


def test_prefill_finite(runs: Runs, engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """Every prefill logit and final-norm hidden value is finite (first bad position named)."""
    step = prefill(runs, engine, record)
    as_f4(step.logits, f"{record.id}: prefill logits [T, V]")
    as_f4(step.hidden, f"{record.id}: final-norm hidden states [T, D]")
    assert step.logits.shape == (len(record.ids), engine.vocab_size), f"{record.id}: logits shape {step.logits.shape}"
    assert step.hidden.shape == (len(record.ids), engine.hidden_size), f"{record.id}: hidden shape {step.hidden.shape}"
    receipt.update(logits_shape=list(step.logits.shape), hidden_shape=list(step.hidden.shape))


def test_prefill_fingerprints(runs: Runs, engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """Per-row sha256 of the prefill logits, their argmax, and whole-array fingerprints, recorded."""
    step = prefill(runs, engine, record)
    rows = row_fingerprints(step.logits, f"{record.id}: prefill logits")
    argmax = [int(i) for i in step.logits.argmax(axis=-1)]
    assert len(rows) == len(record.ids) == len(argmax)
    assert len(set(rows)) > 1 or len(rows) == 1, f"{record.id}: every logits row is identical, the forward ignored its input"
    receipt.update(request_sha256=record.sha256, row_sha256=rows, argmax=argmax,
                   logits=dict(fingerprint(step.logits)), hidden=dict(fingerprint(step.hidden)),
                   next_token=argmax[-1], next_token_text=engine.decode([argmax[-1]]))


def test_head_rerun(runs: Runs, engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """lm_head on the captured final-norm hidden states reproduces the prefill logits, within the
    engine's ``head_rerun_atol`` (:mod:`oracles.checks.tolerance`)."""
    step = prefill(runs, engine, record)
    atol = engine.tolerance().head_rerun_atol
    again = engine.lm_head(step.hidden)
    exact = diff(again, step.logits)
    receipt.update(bit_equal=exact.equal, mismatches=exact.mismatches, max_abs=exact.max_abs, max_ulp=exact.max_ulp,
                   atol=atol)
    assert_within(again, step.logits, atol, f"{record.id}: lm_head(final-norm hidden) vs prefill logits")
    assert np.array_equal(again.argmax(-1), step.logits.argmax(-1)), f"{record.id}: head re-run changed an argmax"
