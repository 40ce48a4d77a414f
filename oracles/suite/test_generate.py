"""Generation to a stop token (mtplx) with the engine's own generation code: greedy, and sampled at
temperature 0.6, top-p 0.95, top-k 20, seed 0. Tokens, text, finish_reason, per-step logits
fingerprints, prefill seconds and decode tokens/s go to the receipt; the same call twice gives the
same tokens and the same final-logits fingerprint.
"""

from __future__ import annotations

import pytest

from oracles.checks.exact import assert_ids_equal
from oracles.checks.fingerprint import fingerprint, row_fingerprints
from oracles.engines.base import Engine
from oracles.families.execution import runs as ex
from oracles.families.execution.prompts import PromptRecord
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt
from oracles.receipts.units import attach_unit

pytestmark = [pytest.mark.mtplx, pytest.mark.slow]

MODES = ["greedy", "sampled"]


@pytest.fixture(params=ex.GENERATION, ids=[r.id for r in ex.GENERATION])
def record(request: pytest.FixtureRequest, pin: str) -> PromptRecord:
    """The generation record bound to this test's pin (its tokenizer's ids)."""
    return request.param.bind(pin)


@pytest.mark.parametrize("mode", MODES)
def test_generation_to_stop(runs: Runs, engine: Engine, record: PromptRecord, mode: str, receipt: Receipt) -> None:
    """The engine's own generation reaches a stop token within the cap; every figure recorded. On an
    untrained pin the figures are recorded and the stop check skips, naming the pin's declaration."""
    gen = ex.generate(runs, engine, record, mode)
    stepped = len(gen.step_logits) > 0
    attach_unit(receipt, f"generate-{mode}", request_sha256=record.sha256, pin=engine.pin, engine=engine.id,
                record=record.id, ids=record.ids, tokens=gen.tokens,
                argmax=gen.step_logits.argmax(-1) if stepped else [],
                arrays={"step_logits": gen.step_logits} if stepped else {})  # [S, V]: every step
    receipt.update(sampler=ex.SAMPLERS[mode].to_json(), max_new_tokens=ex.MAX_NEW_TOKENS,
                   text=gen.text, finish_reason=gen.finish_reason, stop_token_ids=sorted(engine.eos_token_ids),
                   step_logits_rows=int(gen.step_logits.shape[0]),
                   step_row_sha256=row_fingerprints(gen.step_logits, f"{record.id} {mode}: step logits") if stepped else [],
                   prefill_seconds=round(gen.prefill_seconds, 4),
                   decode_tokens_per_second=round(gen.decode_tokens_per_second, 3))
    assert gen.tokens, f"{record.id} {mode}: no token generated"
    assert not (set(gen.tokens[:-1]) & engine.eos_token_ids), f"{record.id} {mode}: generation ran past a stop token"
    if why := engine.pin_file.untrained_reason("ending a generation with a stop token"):
        pytest.skip(why)
    assert gen.finish_reason == "stop" and gen.tokens[-1] in engine.eos_token_ids, (
        f"{record.id} {mode}: no stop token {sorted(engine.eos_token_ids)} within max_new_tokens={ex.MAX_NEW_TOKENS} "
        f"(finish_reason {gen.finish_reason!r}); last tokens {gen.tokens[-8:]}")


@pytest.mark.parametrize("mode", MODES)
def test_generation_step_logits(runs: Runs, engine: Engine, record: PromptRecord, mode: str) -> None:
    """One finite raw-logits row per generated token; under greedy each token is its row's argmax."""
    gen = ex.generate(runs, engine, record, mode)
    assert gen.step_logits.shape == (len(gen.tokens), engine.vocab_size), (
        f"{record.id} {mode}: step logits {list(gen.step_logits.shape)} for {len(gen.tokens)} tokens")
    fingerprint(gen.step_logits, f"{record.id} {mode}: step logits [N, V]")  # raises naming the first non-finite index
    if mode == "greedy":
        assert_ids_equal([int(i) for i in gen.step_logits.argmax(-1)], gen.tokens,
                         f"{record.id}: greedy tokens vs argmax of their step logits")


@pytest.mark.parametrize("mode", MODES)
def test_generation_deterministic(runs: Runs, engine: Engine, record: PromptRecord, mode: str, receipt: Receipt) -> None:
    """The same call twice: identical tokens and an identical final-logits fingerprint."""
    first, second = ex.generate(runs, engine, record, mode, 1), ex.generate(runs, engine, record, mode, 2)
    assert_ids_equal(second.tokens, first.tokens, f"{record.id} {mode}: second call vs first")
    a, b = fingerprint(first.step_logits[-1:]), fingerprint(second.step_logits[-1:])
    receipt.update(final_logits=dict(a), final_logits_again=dict(b))
    assert a == b, f"{record.id} {mode}: final logits fingerprint {a['sha256']} then {b['sha256']}"


def test_greedy_generation_equals_decode(runs: Runs, engine: Engine, record: PromptRecord) -> None:
    """The library's greedy generation and the cache-continuation decode loop give the same tokens."""
    gen, dec = ex.generate(runs, engine, record, "greedy"), ex.decode(runs, engine, record)
    assert_ids_equal(gen.tokens, dec.tokens, f"{record.id}: library greedy generation vs decode loop")
