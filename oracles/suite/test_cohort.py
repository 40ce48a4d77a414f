"""The cohort family (marker ``cohort``): four lanes decoded one at a time and as one batch whose rows
hold them in another order, every step, every lane, every cache buffer, bit for bit; a positive control
that must fail; identical lanes in rows 0 and 1; row isolation; grow and anchor; snapshot/restore; and
the paired benchmark. Runs on every pin ``--pin`` selects (default: SmolLM2-135M and the hybrid twin,
``oracles.families``) and every engine; the runs are made once per (pin, engine) (``runs``) by :mod:`oracles.families.cohort.run`.

An engine whose batched decode is not bit-equal to its serial decode says so
(:meth:`oracles.engines.base.Engine.batch_variance`, with the measured figures): its bit-exact
serial-vs-cohort tests are strict xfails with that reason, and everything else still holds for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oracles.checks.cohort import Tally, compose, fixed_lanes
from oracles.checks.exact import diff
from oracles.engines.base import Engine
from oracles.families.cohort import run as fam
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt

pytestmark = pytest.mark.cohort
slow = pytest.mark.slow
LANE_IDS = [f"lane{q}" for q in range(fam.LANES)]


@pytest.fixture(params=range(fam.LANES), ids=LANE_IDS)
def lane(request: pytest.FixtureRequest) -> int:
    """A logical lane."""
    return int(request.param)


@pytest.fixture
def spec(pytestconfig: pytest.Config, engine_id: str, pin_file: Any) -> fam.CohortSpec:
    """FULL, or SAMPLE for a port too slow for it under ``--port-records`` (:func:`fam.choose_spec`)."""
    from oracles.plugin.state import settings_of

    settings = settings_of(pytestconfig)
    return fam.choose_spec(engine_id != settings.reference, settings.port_scope, fam.weight_bytes(pin_file),
                           str(pin_file.model_class or ""))


@pytest.fixture
def parity(runs: Runs, engine: Engine, pin: str, spec: fam.CohortSpec) -> Any:
    """The span's lockstep on this (pin, engine), made once per session (:func:`fam.run_parity`)."""
    return runs(("cohort", pin, engine.id, spec.scope), lambda: fam.run_parity(engine, spec))


@pytest.fixture
def anchor(runs: Runs, parity: Any, engine: Engine, pin: str, spec: fam.CohortSpec) -> Any:
    """The grow-and-anchor phase on the span's final caches, once per session; apart from the span's
    run, so an engine that cannot grow a cache still has its span proven."""
    from oracles.families.cohort.anchor import run_anchor

    def make() -> Any:
        done = run_anchor(engine, spec, parity.serial, parity.cohort)
        parity.serial, parity.cohort = [], []  # the span's live caches: the anchor holds grown copies
        return done

    return runs(("cohort-anchor", pin, engine.id, spec.scope), make)


def _xfail_if_batch_variant(request: pytest.FixtureRequest, engine: Engine) -> None:
    reason = engine.batch_variance()
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"{engine.id}: {reason}"))


def _figures(tally: Tally, lane: int | None = None) -> dict[str, Any]:
    lanes = range(fam.LANES) if lane is None else [lane]
    return {"steps": tally.steps, "comparisons": tally.comparisons, "max_abs": tally.max_abs_by_kind(lane),
            "mismatching": sum(tally.lane_count(q) for q in lanes),
            "first": [m.to_json() for q in lanes for m in tally.lane_mismatches(q)[:3]]}


def _where(pin: str, engine: Engine, spec: fam.CohortSpec) -> str:
    return f"{pin} ({engine.id}, {spec.scope} span)"


@pytest.mark.dry
def test_lane_map_moves_every_lane(receipt: Receipt) -> None:
    """The vacuity guard: the map moves every lane (so an un-permuting error compares two lanes), a
    map applied twice moves every lane too, and both spans' tokens are distinct where they must be."""
    assert fixed_lanes(fam.PHYSICAL_TO_LOGICAL) == [], f"lanes {fixed_lanes(fam.PHYSICAL_TO_LOGICAL)} do not move"
    twice = compose(fam.PHYSICAL_TO_LOGICAL, fam.PHYSICAL_TO_LOGICAL)
    assert all(a != b for a, b in zip(twice, fam.PHYSICAL_TO_LOGICAL)), f"map twice {twice} agrees with the map"
    assert fixed_lanes([0, 2, 1, 3]) == [0, 3], "the guard must name the lanes a map leaves in place"
    for spec in (fam.FULL, fam.SAMPLE):
        spec.check(49152)  # SmolLM2's vocabulary, the smallest of the default pins
    receipt.update(physical_to_logical=list(fam.PHYSICAL_TO_LOGICAL), applied_twice=twice,
                   full=fam.FULL.to_json(), sample=fam.SAMPLE.to_json())


@slow
def test_cohort_bits_equal_serial(request: pytest.FixtureRequest, parity: Any, engine: Engine, pin: str, spec: Any,
                                  lane: int, receipt: Receipt) -> None:
    """At every step the lane's hidden state, logits and every cache buffer in the cohort, un-permuted,
    equal the serial lane's bit for bit."""
    _xfail_if_batch_variant(request, engine)
    tally = parity.main
    receipt.update(engine=engine.id, pin=pin, lane=lane, spec=spec.to_json(), **_figures(tally, lane))
    assert tally.lane_count(lane) == 0, tally.report(lane, f"{_where(pin, engine, spec)} cohort vs serial")


@slow
def test_cohort_positive_control(parity: Any, engine: Engine, pin: str, spec: Any, receipt: Receipt) -> None:
    """The same comparison made without un-permuting fails for every lane at every step."""
    control = parity.control
    receipt.update(engine=engine.id, pin=pin, comparisons=control.comparisons, caught_by=control.caught_by,
                   missed=[list(m) for m in control.missed[:20]])
    assert control.comparisons == fam.LANES * spec.steps, f"control compared {control.comparisons} lanes"
    assert not control.missed, (f"{_where(pin, engine, spec)}: the comparison without un-permuting passed for "
                                f"{len(control.missed)} (step, physical lane) pairs, first {control.missed[:5]}: "
                                "a proof that cannot fail there proves nothing")


@slow
def test_cohort_crosses_compression_boundaries(parity: Any, engine: Engine, pin: str, spec: Any,
                                               receipt: Receipt) -> None:
    """On a cache with compressed entries (``*.compressed_kv`` buffers), the span is no vacuous proof:
    every lane's every compressed buffer closes at least one entry inside it, at a step the bit-for-bit
    comparison covered (so the comparisons above saw entries close)."""
    before, after = parity.entries.get("before", {}), parity.entries.get("after", {})
    receipt.update(engine=engine.id, pin=pin, before=before, after=after, closed_at=parity.closed_at)
    if not before:
        pytest.skip(f"{pin} ({engine.id}): its cache holds no compressed entries (no *.compressed_kv buffer)")
    lanes_before = [{name: n[q] for name, n in before.items()} for q in range(fam.LANES)]
    lanes_after = [{name: n[q] for name, n in after.items()} for q in range(fam.LANES)]
    missed = fam.uncrossed(lanes_before, lanes_after)
    assert not missed, f"{_where(pin, engine, spec)}: compressed buffers closed no entry in the span: {missed[:6]}"
    late = {name: steps for name, steps in parity.closed_at.items() if not steps or max(steps) >= spec.steps}
    assert not late and set(parity.closed_at) == set(before), (
        f"{_where(pin, engine, spec)}: lane 0's entry closures {parity.closed_at} do not cover {sorted(before)}")


@slow
def test_cohort_identical_lanes_agree(parity: Any, engine: Engine, pin: str, spec: Any, receipt: Receipt) -> None:
    """In the twin run, rows 0 and 1 hold one lane (prompt and tokens): they agree bit for bit at every
    step, hidden, logits and every buffer."""
    tally = parity.twins
    receipt.update(engine=engine.id, pin=pin, twin=[fam.TWIN, fam.TWIN_SOURCE], **_figures(tally))
    assert tally.steps == spec.isolation_steps, f"twin run compared {tally.steps} steps"
    assert tally.lane_count(fam.TWIN) == 0, tally.report(fam.TWIN, f"{_where(pin, engine, spec)} identical lanes")


@slow
def test_cohort_row_isolation(request: pytest.FixtureRequest, parity: Any, engine: Engine, pin: str, spec: Any,
                              lane: int, receipt: Receipt) -> None:
    """A lane kept in its row of a same-shaped batch keeps its bits when every other lane's tokens
    change (and, in the twin run, when lane 0 holds another prompt)."""
    iso, twin = parity.isolation, parity.twin_isolation
    row_variance = getattr(engine, "row_variance", None)  # an engine's own capability (torch's: DeepSeek-V4)
    reason = row_variance() if callable(row_variance) else None
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"{engine.id} on {pin}: {reason}"))
    receipt.update(engine=engine.id, pin=pin, lane=lane, others_changed=_figures(iso, lane),
                   twin_run=_figures(twin, lane))
    assert iso.steps == spec.isolation_steps, f"isolation runs compared {iso.steps} steps"
    where = _where(pin, engine, spec)
    assert iso.lane_count(lane) == 0, iso.report(lane, f"{where} row isolation, every other lane changed")
    assert twin.lane_count(lane) == 0, twin.report(lane, f"{where} row isolation in the twin run")


@slow
def test_cohort_close_to_serial(parity: Any, engine: Engine, pin: str, spec: Any, lane: int, receipt: Receipt) -> None:
    """Engine-independent: the cohort's logits of the lane are within the engine's ``cohort_atol`` of the
    serial lane's at every step, with the same argmax."""
    gap, same = parity.logit_gap[:, lane], parity.argmax_equal[:, lane]
    worst, atol = int(np.argmax(gap)), engine.tolerance().cohort_atol
    receipt.update(engine=engine.id, pin=pin, lane=lane, atol=atol, max_abs=float(gap.max()),
                   worst_step=worst, bit_equal_steps=int((gap == 0).sum()), argmax_equal_steps=int(same.sum()))
    assert gap.max() <= atol, (f"{_where(pin, engine, spec)} lane {lane}: cohort vs serial max |d logit| "
                               f"{gap.max():.3e} at step {worst} > {atol:g}")
    assert same.all(), f"{_where(pin, engine, spec)} lane {lane}: argmax differs at steps {np.flatnonzero(~same)[:8]}"


@slow
def test_cohort_hidden_feeds_head(parity: Any, engine: Engine, pin: str, spec: Any, receipt: Receipt) -> None:
    """The cohort's hidden rows of the last step are what its logits rows were read from (lm_head re-run),
    with the contract's shapes, within the engine's ``head_rerun_atol``."""
    hidden, logits = parity.last_hidden, parity.last_logits
    assert hidden.shape == (fam.LANES, engine.hidden_size), f"hidden rows {hidden.shape}"
    assert logits.shape == (fam.LANES, engine.vocab_size), f"logits rows {logits.shape}"
    atol = engine.tolerance().head_rerun_atol
    d = diff(engine.lm_head(hidden), logits, atol=atol)
    receipt.update(engine=engine.id, pin=pin, atol=atol, max_abs=d.max_abs)
    assert d.equal, d.describe(f"{_where(pin, engine, spec)}: lm_head(cohort hidden) vs cohort logits",
                               f"differ by more than {atol:g}")


@slow
def test_cohort_cache_lengths(parity: Any, engine: Engine, pin: str, spec: Any, receipt: Receipt) -> None:
    """After the span each cohort cache holds its prompt plus the steps."""
    expected = [spec.prefix[q] + spec.steps for q in fam.PHYSICAL_TO_LOGICAL]
    receipt.update(engine=engine.id, pin=pin, lengths=parity.lengths, expected=expected, seconds=parity.seconds)
    assert parity.lengths == expected, f"{_where(pin, engine, spec)}: cohort caches hold {parity.lengths}"


@slow
def test_cohort_grow_keeps_rows(anchor: Any, engine: Engine, pin: str, spec: Any, receipt: Receipt) -> None:
    """Growing every cache gives it at least the capacity asked, more than it had, with every buffer's
    valid rows bit-equal to the source's; extended, every lane holds ``anchor`` positions."""
    grown = anchor.grown
    if anchor.grow_refusal is not None:
        assert anchor.positions == [spec.anchor] * fam.LANES, f"anchor positions {anchor.positions}"
        receipt.update(engine=engine.id, pin=pin, anchor_positions=anchor.positions, refusal=anchor.grow_refusal)
        pytest.skip(f"{pin}: {anchor.grow_refusal} (extended as they are; the anchor proofs ran)")
    receipt.update(engine=engine.id, pin=pin, anchor_positions=anchor.positions, seconds=anchor.seconds, grown=[
        {"side": g.side, "logical": g.logical, "length": g.length, "capacity_before": g.capacity_before,
         "capacity_after": g.capacity_after, "mismatches": [m.to_json() for m in g.mismatches[:2]]} for g in grown])
    assert len(grown) == 2 * fam.LANES
    for g in grown:
        what = f"{_where(pin, engine, spec)} {g.side} logical lane {g.logical}"
        assert g.capacity_after >= g.requested > g.capacity_before, (
            f"{what}: capacity {g.capacity_before} -> {g.capacity_after}, asked {g.requested}")
        assert not g.mismatches, f"{what}: grow changed " + "; ".join(m.describe() for m in g.mismatches[:3])
    assert anchor.positions == [spec.anchor] * fam.LANES, f"anchor positions {anchor.positions}"


@slow
def test_cohort_anchor_bits_equal_serial(request: pytest.FixtureRequest, anchor: Any, engine: Engine, pin: str,
                                         spec: Any, receipt: Receipt) -> None:
    """At the anchor the cohort caches, un-permuted, equal the serial ones, and one more transaction
    (hidden, logits, every buffer after it) is bit-exact."""
    _xfail_if_batch_variant(request, engine)
    caches, step = anchor.caches, anchor.transaction
    receipt.update(engine=engine.id, pin=pin, anchor=spec.anchor, caches=_figures(caches), transaction=_figures(step))
    where = f"{_where(pin, engine, spec)} at the anchor"
    for lane in range(fam.LANES):
        assert caches.lane_count(lane) == 0, caches.report(lane, f"{where}, caches before the transaction")
        assert step.lane_count(lane) == 0, step.report(lane, f"{where}, transaction")


@slow
def test_cohort_snapshot_restore(anchor: Any, engine: Engine, pin: str, spec: Any, receipt: Receipt) -> None:
    """Per buffer: each live cache matches its snapshot, the snapshot is unchanged by the transaction,
    and ``restore`` (and growing it again) gives the snapshot's bytes back."""
    f = anchor.failures
    proofs = ("live_vs_snapshot", "snapshot_after", "restored", "regrown")
    receipt.update(engine=engine.id, pin=pin, buffers=len(anchor.digests["serial"][0]),
                   failures={k: f[k] for k in proofs})
    lines = [line for k in proofs for line in f[k]]
    assert not lines, f"{_where(pin, engine, spec)}: {len(lines)} failures: " + "; ".join(lines[:6])


@slow
def test_cohort_replay_after_restore(anchor: Any, engine: Engine, pin: str, spec: Any, receipt: Receipt) -> None:
    """The transaction replayed on restored caches gives the first time's bits (hidden, logits, buffers)."""
    lines = anchor.failures["replay"]
    receipt.update(engine=engine.id, pin=pin, failures=lines)
    assert not lines, f"{_where(pin, engine, spec)}: " + "; ".join(lines[:6])


@slow
def test_cohort_benchmark(runs: Runs, anchor: Any, engine: Engine, pin: str, spec: Any,
                          receipt: Receipt) -> None:
    """The paired benchmark from the anchor snapshots (a receipt section, no timed assertion); every
    timed trial must have decoded the anchor transaction (its outputs' digests are the proof's)."""
    from oracles.families.cohort.bench import run_bench

    if spec.scope != "full":
        pytest.skip(f"port {engine.id} on {pin}: the benchmark runs with the full span (pass --port-records all)")
    section = runs(("cohort-bench", pin, engine.id), lambda: run_bench(engine, anchor, spec.bench_pairs))
    proof = anchor.outputs
    wrong = [f"{t['protocol']} pair {t['pair']} {t['arm']} lane {i}" for t in section["trials"]
             for i, out in enumerate(t["outputs"]) if any(out[k] != proof[t["arm"]][i][k] for k in out)]
    receipt["cohort_benchmark"] = {**section, "trials": [{k: v for k, v in t.items() if k != "outputs"}
                                                         for t in section["trials"]]}
    assert len(section["trials"]) == 4 * spec.bench_pairs, f"{len(section['trials'])} trials"
    assert not wrong, f"{_where(pin, engine, spec)}: timed trials that did not decode the proven transaction: {wrong[:5]}"


@slow
def test_cohort_bad_input(engine: Engine, pin: str, monkeypatch: pytest.MonkeyPatch, receipt: Receipt) -> None:
    """Mismatched counts, an empty cohort, one cache for two lanes and a lane past the context are
    refused with a ValueError naming the problem, before any lane's cache changes."""
    a, b = engine.make_cache(), engine.make_cache()
    engine.forward(fam.prefix_tokens(0, 2, engine.vocab_size), a, keep=1)
    engine.forward(fam.prefix_tokens(1, 1, engine.vocab_size), b, keep=1)
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
    receipt.update(engine=engine.id, pin=pin, messages=messages, cache_lengths_after=lengths)
    assert lengths == [2, 1], f"{engine.id}: refused cohorts changed the caches: lengths {lengths}, expected [2, 1]"
