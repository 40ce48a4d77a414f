"""Decode cohort (mtplx): ``B`` lanes with their own KV caches advanced by one batched forward each
step (``engine.decode_cohort``) give what the lanes give decoded one at a time, and leave each lane's
cache holding its tokens and usable by ``forward``.

Lanes are slices of the "arith" generation record's ids (different lengths, so the batch is padded):
the chat prompt without its system turn, the system turn alone, and the user turn cut after the
question. Runs on the reference and on every port; the serial and cohort decodes run once per engine
per session (``runs``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from oracles.checks.exact import diff
from oracles.checks.port import first_divergence
from oracles.families import execution as ex
from oracles.families.cohort_decode import CohortRun, Lane, cut_lanes, run_cohort

pytestmark = [pytest.mark.mtplx, pytest.mark.slow]

RECORD = next(r for r in ex.GENERATION if r.id == "arith")
#: (start, stop) slices of the record's 45 ids: [21:45] the user turn and the generation prompt (24
#: ids), [0:21] the system turn (21 ids), [21:32] the user turn up to "What is 7 times 8?" (11 ids).
#: Three lengths, so two lanes are left-padded (by 3 and 13) in every cohort step. Short on purpose:
#: the MLX CPU backend here prefills ~5 tokens/s.
SLICES = ((21, 45), (0, 21), (21, 32))
#: Greedy steps per lane; each costs B one-token forwards twice (serial and cohort), ~0.4 s each on MLX.
STEPS = 8

#: Cohort vs serial logits (every step, and the one-more-token forward through the cohort cache).
#: Serial lanes multiply one row through every matmul; the cohort multiplies B rows at once, and the
#: cohort's cached keys/values were themselves computed B rows at a time, so float32 sums are
#: reordered and the reordering compounds over 30 layers and the steps. Measured on this machine
#: with these lanes and 8 steps: torch (MKL, a B-row sgemm vs a one-row product) max |dlogit| 5.1e-5,
#: never bit-equal; MLX CPU (reference BLAS) bit-equal at every step. 1e-3 is 20x the torch figure;
#: the cohort bugs it must catch are four orders larger (measured on the reference at step 0 by
#: breaking decode_cohort: the padding left unmasked moves the padded lanes' logits by 2.2 and 4.8, a
#: position id one off by 1.9 to 6.2). Bit equality and max |dlogit| are recorded per lane and step.
COHORT_ATOL = 1e-3
#: lm_head on the cohort's hidden rows vs the cohort's logits: the same float32 rows through the same
#: head weight; only BLAS blocking may differ, a few ULPs of logits <= 32 (ULP(32) = 3.8e-6).
HEAD_RERUN_ATOL = 1e-5


@pytest.fixture(params=range(len(SLICES)), ids=[f"{RECORD.id}[{a}:{b}]" for a, b in SLICES])
def lane(request: pytest.FixtureRequest) -> int:
    """The lane's index into :data:`SLICES` (and into the run's per-lane arrays)."""
    return int(request.param)


def cohort(runs: Callable[..., Any], engine: Any) -> CohortRun:
    record = RECORD.bind(engine.pin)
    lanes = cut_lanes(record.id, record.ids, SLICES)
    return runs(("cohort", engine.id, engine.pin, RECORD.id), lambda: run_cohort(engine, lanes, STEPS))


def _comparable_steps(run: CohortRun, b: int) -> int:
    """Steps whose fed tokens agree (step ``s`` feeds token ``s``): rows past a token divergence follow
    different sequences and are not compared."""
    d = first_divergence(run.serial_tokens[b], run.cohort_tokens[b])
    return run.steps if d is None else min(d + 1, run.steps)


def test_cohort_tokens_equal_serial(runs: Callable[..., Any], engine: Any, lane: int, receipt: Any) -> None:
    """Each lane's greedy tokens from the cohort equal its tokens decoded alone."""
    run = cohort(runs, engine)
    this: Lane = run.lanes[lane]
    serial, batched = run.serial_tokens[lane], run.cohort_tokens[lane]
    d = first_divergence(serial, batched)
    receipt.update(request_sha256=RECORD.sha256, engine=engine.id, lane=this.id, slice=[this.start, this.stop],
                   prompt_tokens=len(this.ids), lanes=[ln.id for ln in run.lanes], steps=run.steps,
                   serial_tokens=serial, cohort_tokens=batched, first_divergent_step=d,
                   seconds={k: round(v, 4) for k, v in run.seconds.items()})
    where = "the prefill's argmax" if d == 0 else f"from step {(d or 1) - 1}'s logits"
    assert d is None, (f"{this.id} ({engine.id}): first divergent token {d} ({where}): cohort {batched[d]}, "
                       f"lane alone {serial[d]}; serial {serial}, cohort {batched}")


def test_cohort_logits_match_serial(runs: Callable[..., Any], engine: Any, lane: int, receipt: Any) -> None:
    """Each step's cohort row agrees with the lane's serial one-token forward within COHORT_ATOL."""
    run = cohort(runs, engine)
    this = run.lanes[lane]
    n = _comparable_steps(run, lane)
    figures, failures = [], []
    for s in range(n):
        a, b = run.cohort_logits[lane, s], run.serial_logits[lane, s]
        bits, near = diff(a, b), diff(a, b, atol=COHORT_ATOL)
        figures.append({"step": s, "cache_tokens": len(this.ids) + s, "bit_equal": bits.equal,
                        "max_abs": bits.max_abs, "max_ulp": bits.max_ulp})
        if not near.equal:
            failures.append(near.describe(f"step {s}", f"differ by more than {COHORT_ATOL:g}"))
    receipt.update(engine=engine.id, lane=this.id, atol=COHORT_ATOL, compared_steps=n, steps=figures,
                   bit_equal=all(f["bit_equal"] for f in figures), max_abs=max(f["max_abs"] for f in figures))
    assert n == run.steps, f"{this.id} ({engine.id}): tokens diverge, only {n} of {run.steps} steps comparable"
    assert not failures, (f"{this.id} ({engine.id}): cohort vs serial logits, {len(failures)} of {n} steps fail: "
                          + "; ".join(failures))


def test_cohort_hidden_feeds_head(runs: Callable[..., Any], engine: Any, lane: int, receipt: Any) -> None:
    """The cohort's hidden row of the lane is what its logits row was read from (lm_head re-run), and
    the step arrays have the contract's shapes and dtype."""
    run = cohort(runs, engine)
    this, (B, N) = run.lanes[lane], (len(run.lanes), run.steps)
    expected = (B, N, engine.vocab_size)
    assert run.cohort_logits.shape == expected and run.cohort_logits.dtype == np.float32, \
        f"{engine.id}: cohort logits {run.cohort_logits.shape} {run.cohort_logits.dtype}, expected {expected} float32"
    assert run.cohort_hidden.shape == (B, N, engine.hidden_size), \
        f"{engine.id}: cohort hidden {run.cohort_hidden.shape}, expected {(B, N, engine.hidden_size)}"
    d = diff(run.head_rerun[lane], run.cohort_logits[lane, -1], atol=HEAD_RERUN_ATOL)
    receipt.update(engine=engine.id, lane=this.id, atol=HEAD_RERUN_ATOL,
                   bit_equal=diff(run.head_rerun[lane], run.cohort_logits[lane, -1]).equal, max_abs=d.max_abs)
    assert d.equal, d.describe(f"{this.id} ({engine.id}): lm_head(cohort hidden) vs cohort logits, last step",
                               f"differ by more than {HEAD_RERUN_ATOL:g}")


def test_cohort_cache_length(runs: Callable[..., Any], engine: Any, lane: int, receipt: Any) -> None:
    """After N cohort steps the lane's own cache holds its prefill plus N tokens."""
    run = cohort(runs, engine)
    this = run.lanes[lane]
    expected = len(this.ids) + run.steps
    receipt.update(engine=engine.id, lane=this.id, cache_length=run.cohort_lengths[lane], expected=expected)
    assert run.cohort_lengths[lane] == expected, (f"{this.id} ({engine.id}): cohort cache holds "
                                                  f"{run.cohort_lengths[lane]} tokens, expected {len(this.ids)} "
                                                  f"prefill + {run.steps} steps = {expected}")


def test_cohort_cache_usable(runs: Callable[..., Any], engine: Any, lane: int, receipt: Any) -> None:
    """One more forward through the lane's cache after the cohort agrees with the serial lane's next
    logits (the cohort left a live cache holding the right keys and values)."""
    run = cohort(runs, engine)
    this = run.lanes[lane]
    a, b = run.cohort_next[lane], run.serial_next[lane]
    bits, near = diff(a, b), diff(a, b, atol=COHORT_ATOL)
    receipt.update(engine=engine.id, lane=this.id, atol=COHORT_ATOL, bit_equal=bits.equal, max_abs=bits.max_abs,
                   argmax_cohort=int(a.argmax()), argmax_serial=int(b.argmax()))
    assert run.cohort_tokens[lane] == run.serial_tokens[lane], \
        f"{this.id} ({engine.id}): tokens diverge (test_cohort_tokens_equal_serial), the caches hold different ids"
    assert near.equal, near.describe(f"{this.id} ({engine.id}): forward after {run.steps} cohort steps vs serial",
                                     f"differ by more than {COHORT_ATOL:g}")


def test_cohort_leaves_snapshot_unchanged(runs: Callable[..., Any], engine: Any, lane: int, receipt: Any) -> None:
    """The prefill snapshot both decodes restored from has the same digest after the cohort."""
    run = cohort(runs, engine)
    this = run.lanes[lane]
    receipt.update(engine=engine.id, lane=this.id, digest_before=run.digest_before[lane],
                   digest_after=run.digest_after[lane])
    assert run.digest_after[lane] == run.digest_before[lane], (
        f"{this.id} ({engine.id}): snapshot digest {run.digest_before[lane][:16]}... before the decodes, "
        f"{run.digest_after[lane][:16]}... after")


def test_cohort_bad_input(engine: Any, monkeypatch: pytest.MonkeyPatch, receipt: Any) -> None:
    """Mismatched counts, an empty cohort, one cache for two lanes and a lane past the context are
    refused with a ValueError naming the problem, before any lane's cache changes."""
    a, b = engine.make_cache(), engine.make_cache()
    engine.forward([1, 9690], a, keep=1)
    messages = {}
    cases = {"mismatched": (([1, 2], [a]), r"2 tokens for 1 caches"),
             "empty": (([], []), r"empty cohort"),
             "shared": (([1, 2], [a, a]), r"lanes 0 and 1 share one cache"),
             "past_context": (([1, 2], [b, a]), r"lane 1: forward: 2 cached \+ 1 new tokens exceed the context of 2")}
    for name, ((tokens, caches), pattern) in cases.items():
        if name == "past_context":
            monkeypatch.setattr(engine, "max_context", 2)
        with pytest.raises(ValueError, match=pattern) as err:
            engine.decode_cohort(tokens, caches)
        messages[name] = str(err.value)
    lengths = [engine.cache_length(a), engine.cache_length(b)]
    receipt.update(engine=engine.id, messages=messages, cache_lengths_after=lengths)
    assert lengths == [2, 0], f"{engine.id}: refused cohorts changed the caches: lengths {lengths}, expected [2, 0]"
