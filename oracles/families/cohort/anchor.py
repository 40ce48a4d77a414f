"""The cohort family's grow-and-anchor phase and its snapshot/restore proof (the DeepSeek-V4 decode proof's
benchmark anchor).

After the parity span (:func:`oracles.families.cohort.run.run_parity`), every serial and cohort cache is
grown to ``spec.capacity`` (``engine.grow``: a new cache object, valid rows kept) and extended with its
lane's extension tokens to ``spec.anchor`` positions. There:

1. the serial caches and the un-permuted cohort caches are compared buffer by buffer;
2. every cache is snapshotted; each live cache's per-buffer digests equal its snapshot's;
3. one transaction (a serial step and a cohort step of the proof's step ``steps + 1`` tokens) is compared
   as every span step was;
4. the snapshots' digests are unchanged after it; ``restore`` gives caches whose per-buffer digests
   equal the snapshot's, and so does growing them again to the capacity;
5. the transaction replayed on the restored, grown caches gives the first time's bits: hidden, logits
   and every buffer after the step, per lane.

The snapshots, tokens and first outputs stay in the result for the benchmark
(:mod:`oracles.families.cohort.bench`). Numpy only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from oracles.checks.cohort import LaneState, Mismatch, Tally, compare_cohort, compare_lane, first_unequal, to_physical
from oracles.engines.base import Engine, digest_buffers
from oracles.engines.types import Unsupported
from oracles.families.cohort.run import (
    IDENTITY,
    LANES,
    PHYSICAL_TO_LOGICAL,
    CohortSpec,
    ParityRun,
    cohort_step,
    extension_tokens,
    serial_step,
    supplied_tokens,
)

SIDES = {"serial": IDENTITY, "cohort": PHYSICAL_TO_LOGICAL}


@dataclass(frozen=True)
class Grown:
    """One cache's growth: ``side`` serial or cohort, its logical and physical lane, its length, its
    capacity before and after (``requested`` asked), and its buffers' mismatches against the source."""

    side: str
    logical: int
    physical: int
    length: int
    capacity_before: int
    capacity_after: int
    requested: int
    mismatches: tuple[Mismatch, ...]


@dataclass
class AnchorRun:
    """What the anchor phase found (module docstring). ``failures`` maps a proof (``live_vs_snapshot``,
    ``snapshot_after``, ``restored``, ``regrown``, ``replay``) to its failure lines (empty: it held)."""

    spec: CohortSpec
    grown: list[Grown]
    positions: list[int]
    caches: Tally
    transaction: Tally
    failures: dict[str, list[str]]
    snapshots: dict[str, list[Any]]
    digests: dict[str, list[dict[str, str]]]
    tokens: list[int]
    outputs: dict[str, list[dict[str, str]]]
    seconds: dict[str, float] = field(default_factory=dict)
    grow_refusal: str | None = None


def state_digests(states: Sequence[LaneState]) -> list[dict[str, str]]:
    """Per lane, each quantity's own sha256 (:func:`oracles.engines.base.digest_buffers`)."""
    return [{name: digest_buffers({name: a}) for name, a in st.items()} for st in states]


def live_digests(engine: Engine, cache: Any) -> dict[str, str]:
    return {name: digest_buffers({name: a}) for name, a in engine.cache_views(cache).items()}


def _differ(label: str, lanes: Sequence[int], expected: Sequence[dict[str, str]],
            actual: Sequence[dict[str, str]]) -> list[str]:
    """A line for each lane whose digests differ, naming the first buffer that does."""
    out = []
    for lane, e, a in zip(lanes, expected, actual):
        name = first_unequal(e, a)
        if name is not None:
            out.append(f"{label}: logical lane {lane}: {name} digest {str(e.get(name))[:16]} vs {str(a.get(name))[:16]}")
    return out


def grow_and_extend(engine: Engine, spec: CohortSpec, side: str,
                    caches: Sequence[Any]) -> tuple[list[Any], list[Grown], str | None]:
    """Grow each cache of one side to ``spec.capacity`` and extend it to ``spec.anchor`` positions.

    An engine whose caches cannot grow (``cache_capacity`` or ``grow`` raise
    :class:`~oracles.engines.types.Unsupported`: transformers' DeepSeek-V4 cache, which grows by
    concatenation) has its caches extended as they are; the refusal is returned (third item) and no
    growth is recorded, so the grow check skips naming it and every anchor proof still runs."""
    V = int(engine.vocab_size)
    out, figures = [], []
    refusal: str | None = None
    for p, cache in enumerate(caches):
        q = SIDES[side][p]
        n = int(engine.cache_length(cache))
        try:
            cap0 = int(engine.cache_capacity(cache))
            before = {name: np.array(a, copy=True) for name, a in engine.cache_views(cache).items()}
            grown = engine.grow(cache, spec.capacity)
        except Unsupported as exc:
            refusal = str(exc)
            engine.forward(extension_tokens(q, n, spec.anchor, V), cache, keep=1)
            out.append(cache)
            continue
        found = compare_lane(before, engine.cache_views(grown), step="grow", logical=q, physical=p,
                             sides=("before", "grown"))
        figures.append(Grown(side, q, p, n, cap0, int(engine.cache_capacity(grown)), spec.capacity, tuple(found)))
        engine.forward(extension_tokens(q, n, spec.anchor, V), grown, keep=1)
        out.append(grown)
    return out, figures, refusal


def transaction(engine: Engine, live: dict[str, list[Any]], tokens: Sequence[int]) -> tuple[list[LaneState], list[LaneState]]:
    """One serial step (logical order) and one cohort step (physical order) of ``tokens`` (logical)."""
    ser = serial_step(engine, live["serial"], tokens)
    coh = cohort_step(engine, live["cohort"], to_physical(list(tokens), PHYSICAL_TO_LOGICAL))
    return ser, coh


def run_anchor(engine: Engine, spec: CohortSpec, serial: Sequence[Any], cohort: Sequence[Any]) -> AnchorRun:
    """The anchor phase on the span's final caches (serial in logical, cohort in physical order)."""
    t0 = time.perf_counter()
    live: dict[str, list[Any]] = {}
    grown: list[Grown] = []
    refusal: str | None = None
    for side, caches in (("serial", serial), ("cohort", cohort)):
        live[side], figures, refused = grow_and_extend(engine, spec, side, caches)
        grown += figures
        refusal = refusal or refused
    t1 = time.perf_counter()
    views = {side: [engine.cache_views(c) for c in live[side]] for side in SIDES}
    caches_tally = Tally()
    names = list(views["serial"][0])
    caches_tally.add(compare_cohort(views["serial"], views["cohort"], PHYSICAL_TO_LOGICAL, step="anchor"),
                     LANES * len(names), names)
    del views
    failures: dict[str, list[str]] = {k: [] for k in ("live_vs_snapshot", "snapshot_after", "restored", "regrown", "replay")}
    snapshots = {side: [engine.snapshot(c) for c in live[side]] for side in SIDES}
    digests = {side: [engine.buffer_digests(s) for s in snapshots[side]] for side in SIDES}
    for side in SIDES:
        failures["live_vs_snapshot"] += _differ(f"{side} live vs its snapshot", SIDES[side], digests[side],
                                                [live_digests(engine, c) for c in live[side]])
    tokens = supplied_tokens(spec.steps + 1, int(engine.vocab_size))  # the proof's anchor step tokens
    positions = [int(engine.cache_length(c)) for c in live["serial"]]
    ser, coh = transaction(engine, live, tokens)
    tally = Tally()
    tally.add(compare_cohort(ser, coh, PHYSICAL_TO_LOGICAL, step="anchor"), LANES * len(list(ser[0])), list(ser[0]))
    outputs = {"serial": state_digests(ser), "cohort": state_digests(coh)}
    del ser, coh, live
    for side in SIDES:
        failures["snapshot_after"] += _differ(f"{side} snapshot after the transaction", SIDES[side], digests[side],
                                              [engine.buffer_digests(s) for s in snapshots[side]])
    again: dict[str, list[Any]] = {}
    for side in SIDES:
        restored = [engine.restore(s) for s in snapshots[side]]
        failures["restored"] += _differ(f"{side} restored", SIDES[side], digests[side],
                                        [live_digests(engine, c) for c in restored])
        if refusal is not None:  # nothing to grow again: the replay runs on the restored caches
            again[side] = restored
            continue
        again[side] = [engine.grow(c, spec.capacity) for c in restored]
        failures["regrown"] += _differ(f"{side} restored and grown", SIDES[side], digests[side],
                                       [live_digests(engine, c) for c in again[side]])
    ser2, coh2 = transaction(engine, again, tokens)
    for side, states in (("serial", ser2), ("cohort", coh2)):
        lanes = SIDES[side]
        failures["replay"] += _differ(f"{side} replay after restore", lanes, outputs[side], state_digests(states))
    t2 = time.perf_counter()
    return AnchorRun(spec, grown, positions, caches_tally, tally, failures, snapshots, digests, list(tokens), outputs,
                     {"grow_extend": t1 - t0, "anchor_proofs": t2 - t1}, refusal)


@dataclass
class CohortRun:
    """The family's whole run on one (pin, engine): the span and the anchor."""

    parity: ParityRun
    anchor: AnchorRun


def run_cohort(engine: Engine, spec: CohortSpec) -> CohortRun:
    """:func:`oracles.families.cohort.run.run_parity` then :func:`run_anchor`; the span's live caches are
    dropped once the anchor's grown copies exist (the snapshots stay for the benchmark)."""
    from oracles.families.cohort.run import run_parity

    parity = run_parity(engine, spec)
    anchor = run_anchor(engine, spec, parity.serial, parity.cohort)
    parity.serial, parity.cohort = [], []
    return CohortRun(parity, anchor)
