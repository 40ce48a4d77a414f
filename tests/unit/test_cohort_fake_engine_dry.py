"""The cohort family's runs on a numpy fake engine (tests/unit/cohort_fake.py): a correct engine passes
every proof; a lane map applied twice, or not undone, is caught naming each lane; planted engine bugs
(rows returned permuted, a corrupted row >= 1, a row that reads another lane) are caught by the
proof each is meant for."""

from __future__ import annotations

import re

import pytest
from cohort_fake import FakeEngine

from oracles.checks.cohort import compare_cohort, compose
from oracles.families.cohort import run as fam
from oracles.families.cohort.anchor import run_cohort
from oracles.families.cohort.bench import run_bench

pytestmark = pytest.mark.dry

SMALL = fam.CohortSpec(prefix=(5, 6, 4, 7), steps=6, isolation_steps=3, anchor=20, capacity=24, scope="test")


def _states(engine: FakeEngine) -> tuple[list, list]:
    """One step of serial lanes (logical order) and of the cohort (physical order) from fresh prompts."""
    V = engine.vocab_size
    serial, cohort = [], []
    for q in range(fam.LANES):
        c = engine.make_cache()
        engine.forward(fam.prefix_tokens(q, SMALL.prefix[q], V), c, keep=1)
        serial.append(c)
    cohort = [engine.restore(engine.snapshot(serial[q])) for q in fam.PHYSICAL_TO_LOGICAL]
    tok = fam.supplied_tokens(0, V)
    return (fam.serial_step(engine, serial, tok),
            fam.cohort_step(engine, cohort, [tok[q] for q in fam.PHYSICAL_TO_LOGICAL]))


def test_correct_engine_passes_every_proof() -> None:
    run = run_cohort(FakeEngine(), SMALL)
    p, a = run.parity, run.anchor
    for tally in (p.main, p.twins, p.isolation, p.twin_isolation, a.caches, a.transaction):
        assert tally.counts == {}, tally.counts
    assert p.control.missed == [] and p.control.comparisons == fam.LANES * SMALL.steps
    assert p.main.steps == SMALL.steps and p.isolation.steps == SMALL.isolation_steps
    assert a.failures == {k: [] for k in a.failures}
    assert a.positions == [SMALL.anchor] * fam.LANES
    assert all(g.capacity_after >= SMALL.capacity and not g.mismatches for g in a.grown)


@pytest.mark.parametrize("wrong", ["not undone", "applied twice"])
def test_wrong_unpermuting_is_caught_naming_each_lane(wrong: str) -> None:
    serial, cohort = _states(FakeEngine())
    assert compare_cohort(serial, cohort, fam.PHYSICAL_TO_LOGICAL, step="0") == []
    lane_map = fam.IDENTITY if wrong == "not undone" else compose(fam.PHYSICAL_TO_LOGICAL, fam.PHYSICAL_TO_LOGICAL)
    found = compare_cohort(serial, cohort, lane_map, step="0")
    caught = {m.logical for m in found}
    assert caught == set(range(fam.LANES)), f"{wrong}: lanes caught {caught}"
    for m in found:
        text = m.describe()
        assert re.search(rf"step 0, logical lane {m.logical} \(physical lane {m.physical}\)", text), text
        assert lane_map[m.physical] == m.logical


def test_rows_returned_permuted_are_caught_per_lane() -> None:
    run = run_cohort(FakeEngine(bug="rows_permuted"), SMALL).parity
    for q in range(fam.LANES):
        assert run.main.lane_count(q) > 0
        report = run.main.report(q, "fake")
        assert f"logical lane {q}" in report and "hidden" in report and "first at index" in report, report
    assert set(run.main.max_abs_by_kind()) >= {"hidden", "logits", "keys"}
    assert run.main.max_abs_by_kind()["keys"] == 0.0, "the caches are right; only the rows are misplaced"


def test_corrupted_row_is_caught_by_the_identical_lanes() -> None:
    run = run_cohort(FakeEngine(bug="row1_corrupted"), SMALL).parity
    assert run.twins.lane_count(fam.TWIN) == SMALL.isolation_steps * 2  # hidden and logits, every twin step
    assert "row 0 (lane 2)" in run.twins.report(fam.TWIN, "fake")
    row0_lane = fam.PHYSICAL_TO_LOGICAL[0]
    assert run.main.lane_count(row0_lane) == 0, "row 0 is never corrupted"


def test_a_row_reading_another_lane_breaks_isolation() -> None:
    run = run_cohort(FakeEngine(bug="bleed"), SMALL).parity
    read = fam.PHYSICAL_TO_LOGICAL[0]  # every row reads row 0's token: lane 2's
    for q in range(fam.LANES):
        assert (run.isolation.lane_count(q) > 0) == (q != read), f"lane {q}"


def test_the_benchmark_times_the_proven_transaction() -> None:
    engine = FakeEngine()
    run = run_cohort(engine, SMALL)
    section = run_bench(engine, run.anchor, pairs=2)
    assert [t["arm"] for t in section["trials"][:4]] == ["serial", "cohort", "cohort", "serial"]
    for t in section["trials"]:
        assert t["outputs"] == [{k: o[k] for k in ("hidden", "logits")} for o in run.anchor.outputs[t["arm"]]]
    assert section["conditioned"]["prime_ms"]["serial"] and all(
        t["prime_ms"] is not None for t in section["trials"] if t["protocol"] == "conditioned")
    assert set(section["paired"]) >= {"speedup", "paired_ratio_iqr", "even_speedup", "odd_delta_median_ms"}
    assert section["resident_bytes"]["weights"] == engine.weight_bytes()
