"""3-turn chat through a prompt cache (mtplx_chat): a summary, a lighthouse story, an is_prime function
with five asserts, each turn appended to one live KV cache as the chat template renders it.

Runs on the reference and on every port (the README chat's first turn is ~1,300 tokens: a port runs
it only under ``--port-records all``). Each chat runs once per session (``runs``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oracles.checks.cache import cache_failure, cache_figures
from oracles.checks.exact import assert_ids_equal
from oracles.checks.fingerprint import fingerprint
from oracles.checks.port import assert_within_thresholds, first_divergence, held_figures
from oracles.checks.tolerance import Tolerance
from oracles.engines.base import Engine
from oracles.families import DEFAULT_PIN
from oracles.families.execution import runs as ex
from oracles.families.execution.chat import ChatRecord
from oracles.families.execution.judged import Judge
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt
from oracles.receipts.units import attach_unit

pytestmark = [pytest.mark.mtplx_chat, pytest.mark.slow]

CHATS = ex.CHATS

#: Records whose greedy turn 1 is known not to stop: SmolLM2-135M-Instruct, greedy, summarising the
#: README falls into one repeating sentence (measured on the reference: no stop token in 320 tokens,
#: "... and it is used to create a list of the outputs of a single test, and it is used ..."). Sampling
#: as the MTPLX execution reference's chat does (temperature 0.6, top-p 0.95, top-k 20, seed 0) loops
#: too: measured on the reference, no stop token in 400 tokens ("The plugin is used to generate a list of tests that can be
#: passed to the `pytest` command." repeated). The turn runs to its cap of 160 (finish_reason
#: "length"); the cache checks of the chat still hold. Keyed by (pin, record): measured on that pin.
NO_STOP = {(DEFAULT_PIN, "readme-story-prime"): "greedy SmolLM2-135M repeats one sentence summarising the README: "
                                 "turn 1 measured without a stop token in 320 tokens (finish_reason 'length'); sampled "
                                 "(0.6 / 0.95 / 20, seed 0) no stop in 400 tokens either"}


@pytest.fixture(params=CHATS, ids=[c.id for c in CHATS])
def record(request: pytest.FixtureRequest) -> ChatRecord:
    return request.param


def _run(runs: Runs, engine: Engine, record: ChatRecord) -> Any:
    return ex.chat(runs, engine, record)


def test_turns_finish_with_stop(runs: Runs, engine: Engine, record: ChatRecord, receipt: Receipt,
                                request: pytest.FixtureRequest) -> None:
    """Every turn ends with a stop token within the cap; tokens, text and counts recorded. On an
    untrained pin the figures are recorded and the stop check skips, naming the pin's declaration;
    NO_STOP's gaps hold on the pin they were measured on."""
    untrained = engine.pin_file.untrained_reason("ending each chat turn with a stop token")
    if (engine.pin, record.id) in NO_STOP and untrained is None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=NO_STOP[(engine.pin, record.id)]))
    run = _run(runs, engine, record)
    for t in run.turns:  # one comparable unit a turn: its suffix ids, its tokens, its warm logits
        attach_unit(receipt, "chat", request_sha256=record.sha256, pin=engine.pin, engine=engine.id, record=record.id,
                    unit=f"turn{t.index + 1}", ids=t.suffix, tokens=t.tokens, arrays={"warm_logits": t.warm})
    receipt.update(max_new_tokens=record.max_new_tokens,
                   turns=[{"turn": t.index + 1, "text": engine.decode(t.tokens),
                           "finish_reason": t.finish_reason, "completion_tokens": t.completion_tokens,
                           "cached_tokens": len(t.frontier), "prefill_seconds": round(t.prefill_seconds, 4),
                           "decode_seconds": round(t.decode_seconds, 4), "warm_logits": dict(fingerprint(t.warm))}
                          for t in run.turns], final_tokens=len(run.final_ids), stopped=run.stopped)
    if untrained:
        pytest.skip(untrained)
    bad = [(t.index + 1, t.finish_reason, len(t.tokens)) for t in run.turns if t.finish_reason != "stop"]
    assert not bad, f"{record.id}: turns without a stop token within {record.max_new_tokens} tokens (turn, reason, tokens): {bad}"


def test_cache_holds_frontier(runs: Runs, engine: Engine, record: ChatRecord, receipt: Receipt) -> None:
    """Before each turn the live cache holds exactly the template's rendering of the conversation so far.

    The cached ids are the ids the chat appended (the prompts and the model's own tokens); the rendering
    re-encodes the decoded answers, so this holds where the model's tokens are the tokenizer's own
    encoding of their text: a trained model's behaviour, skipped on an untrained pin (the first
    mismatch per turn is recorded)."""
    run = _run(runs, engine, record)
    receipt.update(frontiers=[len(t.frontier) for t in run.turns],
                   first_mismatch=[first_divergence(t.frontier, t.rendered_prefix) for t in run.turns],
                   stopped=run.stopped)
    if why := engine.pin_file.untrained_reason("emitting tokens the tokenizer re-encodes to themselves"):
        pytest.skip(why)
    for t in run.turns:
        assert_ids_equal(t.frontier, t.rendered_prefix,
                         f"{record.id} turn {t.index + 1}: cached ids vs the template's rendering of the conversation")
    assert run.stopped is None, run.stopped


def test_warm_equals_cold(runs: Runs, engine: Engine, record: ChatRecord, receipt: Receipt) -> None:
    """Next-token logits after a turn's suffix through the live cache agree with a cold prefill of the
    same ids, within :mod:`oracles.checks.cache`'s bounds (max |Δ|, NMSE, argmax) of the engine's tolerance."""
    run = _run(runs, engine, record)
    tolerance = engine.tolerance()
    figures, failures = [], []
    for t in run.turns:
        figures.append({"turn": t.index + 1, "ids": len(t.frontier) + len(t.suffix), **cache_figures(t.warm, t.cold)})
        where = f"turn {t.index + 1} ({len(t.frontier) + len(t.suffix)} ids), warm"
        if msg := cache_failure(where, t.warm, t.cold, tolerance=tolerance):
            failures.append(msg)
    receipt.update(atol=tolerance.cache_atol, nmse_max=tolerance.cache_nmse, turns=figures)
    assert not failures, f"{record.id}: " + "; ".join(failures)


def test_snapshot_unchanged_by_turn(runs: Runs, engine: Engine, record: ChatRecord, receipt: Receipt) -> None:
    """A snapshot taken before a turn has the same digest after the turn ran on the live cache."""
    run = _run(runs, engine, record)
    receipt.update(digests=[{"turn": t.index + 1, "before": t.digest_before, "after": t.digest_after} for t in run.turns])
    changed = [t.index + 1 for t in run.turns if t.digest_before != t.digest_after]
    assert not changed, f"{record.id}: the turn changed its pre-turn snapshot (turns {changed})"


def test_restore_reproduces_turn(runs: Runs, engine: Engine, record: ChatRecord) -> None:
    """The pre-turn snapshot restored into a fresh cache, with the suffix and the turn's tokens run through
    it, gives the turn's tokens back as its argmax (teacher forcing)."""
    run = _run(runs, engine, record)
    for t in run.turns:
        assert_ids_equal(t.replay, t.tokens, f"{record.id} turn {t.index + 1}: restored-snapshot argmax vs the turn's tokens")


def test_completion_counts(runs: Runs, engine: Engine, record: ChatRecord, receipt: Receipt) -> None:
    """Completion token counts (stop token not counted) are recorded and each turn produced text."""
    run = _run(runs, engine, record)
    counts = [t.completion_tokens for t in run.turns]
    receipt.update(completion_tokens=counts, prompt_tokens=[len(t.frontier) + len(t.suffix) for t in run.turns])
    feeds = "emitting tokens that re-encode to as many ids, so every turn has ids to feed"
    if run.stopped and (why := engine.pin_file.untrained_reason(feeds)):
        pytest.skip(f"{why}; {run.stopped}")
    assert len(counts) == len(record.turns) == 3, \
        f"{record.id}: {len(counts)} turns ran, {len(record.turns)} asked" + (f"; {run.stopped}" if run.stopped else "")
    assert all(c > 0 for c in counts), f"{record.id}: an empty answer: {counts}"


def _held_port(what: str, ref_logits: Any, port_logits: Any, receipt: Receipt, tolerance: Tolerance) -> None:
    __tracebackhide__ = True
    fig = held_figures(what, ref_logits, port_logits)
    receipt.update(fig)
    assert_within_thresholds(what, fig, tolerance=tolerance)


def _shared_turns(ref: Any, *others: Any) -> int:
    """How many leading turns have the same prompt on every run: each turn up to and including the first
    whose tokens differ on some run (its warm logits are read before its tokens, from the shared prompt)."""
    n = min(len(ref.turns), *(len(o.turns) for o in others))
    for i in range(n):
        if any(first_divergence(ref.turns[i].tokens, o.turns[i].tokens) is not None for o in others):
            return i + 1
    return n


@pytest.mark.port
def test_chat_vs_reference(runs: Runs, reference: Engine, port: Engine, judge: Judge, record: ChatRecord,
                           receipt: Receipt) -> None:
    """Port vs reference (marker port): each turn's suffix ids and tokens equal, warm next-token logits
    within the port's bounds (``port.tolerance()``, oracles.checks.port). Under a band judgment
    (oracles.checks.judgment) the turns whose prompt the band engine, the reference and the port share
    are held to the band and their suffix ids compared; tokens may change at a near tie there."""
    ref, got = ex.chat(runs, reference, record), ex.chat(runs, port, record)
    firsts = [first_divergence(a.tokens, b.tokens) for a, b in zip(ref.turns, got.turns)]
    receipt.update(request_sha256=record.sha256, kind="chat", first_divergent_token_per_turn=firsts,
                   judgment=judge.judgment.as_json(), translations=list(judge.translations))
    assert len(got.turns) == len(ref.turns), (f"{record.id}: the port ran {len(got.turns)} turns, the reference "
                                              f"{len(ref.turns)} (port: {got.stopped}; reference: {ref.stopped})")
    turns, tolerance = len(ref.turns), judge.own
    if not judge.judgment.exact and judge.band is not None:
        band = ex.chat(runs, judge.band(), record)
        turns = _shared_turns(ref, got, band)
        tolerance, figures = judge.bounds(runs, ("chat", record.id, turns), np.stack([t.warm for t in ref.turns[:turns]]),
                                          lambda _engine: np.stack([t.warm for t in band.turns[:turns]]))
        receipt.update(band=figures, held_turns=turns, tolerance=tolerance.name)
    warm_ref = np.stack([t.warm for t in ref.turns[:turns]])
    warm_port = np.stack([t.warm for t in got.turns[:turns]])
    _held_port(judge.label(f"{record.id}: warm next-token logits per turn"), warm_ref, warm_port, receipt, tolerance)
    for a, b in zip(ref.turns[:turns], got.turns[:turns]):
        assert_ids_equal(b.suffix, a.suffix, f"{record.id} turn {a.index + 1}: suffix ids")
        if judge.judgment.exact:
            assert_ids_equal(b.tokens, a.tokens, judge.label(f"{record.id} turn {a.index + 1}: port {port.id} tokens "
                                                             "vs reference"))
