"""Decode cohort: ``B`` lanes, each with its own KV cache, advanced one token each by one batched
forward (``engine.decode_cohort``), held against the same lanes decoded one at a time.

A *lane* is a prompt cut from a record's ids (a slice, so the lanes have different lengths and the
batch needs padding). Both ways start from the same prefilled caches: each lane is prefilled once,
snapshotted, and both the serial and the cohort decode run on caches restored from that snapshot.

    serial  lane b alone: ``forward([tok], cache_b, keep=1)``, N greedy steps, then one more forward
    cohort  all lanes at once: ``decode_cohort([tok_0 .. tok_B-1], [cache_0 .. cache_B-1])``, N steps,
            then the same one more ``forward`` of the serial lane's token N through each cohort cache

Numpy only; the engine is duck-typed (:class:`oracles.engines.base.Engine`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Lane:
    """One lane's prompt: ``record.ids[start:stop]``.

    id: stable test id, ``"<record>[start:stop]"``.
    """

    record: str
    start: int
    stop: int
    ids: tuple[int, ...]

    @property
    def id(self) -> str:
        return f"{self.record}[{self.start}:{self.stop}]"


def cut_lanes(record_id: str, ids: Sequence[int], slices: Sequence[tuple[int, int]]) -> list[Lane]:
    """Lanes cut from one record's ids, one per ``(start, stop)`` slice.

    Raises:
        ValueError: a slice that is empty or does not lie inside the record's ids (names the record).
    """
    lanes = []
    for start, stop in slices:
        if not 0 <= start < stop <= len(ids):
            raise ValueError(f"record {record_id!r}: lane slice [{start}:{stop}] is empty or outside its "
                             f"{len(ids)} ids")
        lanes.append(Lane(record_id, start, stop, tuple(int(i) for i in ids[start:stop])))
    return lanes


@dataclass
class CohortRun:
    """Serial and cohort greedy decodes of the same lanes from the same prefilled caches.

    serial_tokens / cohort_tokens: per lane, ``N + 1`` ids: token 0 is the argmax of the lane's
        prefill row, token ``s + 1`` the argmax of step ``s``'s logits.
    serial_logits / cohort_logits: ``[B, N, V]`` float32; ``[b, s]`` the logits step ``s`` of lane
        ``b`` gave (serial: one-token forward; cohort: row ``b`` of the ``s``-th ``decode_cohort``).
    cohort_hidden: ``[B, N, D]`` float32, the cohort's final-norm hidden rows.
    head_rerun: ``[B, V]`` float32, ``engine.lm_head`` of the last step's cohort hidden rows.
    serial_next / cohort_next: ``[B, V]`` float32, one more ``forward`` of the serial lane's token
        ``N`` through the serial cache and through the cohort cache.
    cohort_lengths: per lane, ``cache_length`` of the cohort cache after the ``N`` steps.
    digest_before / digest_after: per lane, ``snapshot_digest`` of the prefill snapshot before the
        serial and cohort decodes and after both.
    """

    lanes: list[Lane]
    steps: int
    serial_tokens: list[list[int]]
    cohort_tokens: list[list[int]]
    serial_logits: np.ndarray
    cohort_logits: np.ndarray
    cohort_hidden: np.ndarray
    head_rerun: np.ndarray
    serial_next: np.ndarray
    cohort_next: np.ndarray
    cohort_lengths: list[int]
    digest_before: list[str]
    digest_after: list[str]
    seconds: dict[str, float] = field(default_factory=dict)


def run_cohort(engine: Any, lanes: Sequence[Lane], steps: int) -> CohortRun:
    """Prefill each lane, snapshot it, then decode ``steps`` greedy steps serially and as a cohort.

    Greedy: argmax, lowest id on ties (``numpy.argmax``); no stop token ends a lane (every lane runs
    ``steps`` steps, so the cohort keeps its ``B`` rows). Raises whatever the engine raises.
    """
    if steps < 1 or not lanes:
        raise ValueError(f"run_cohort: need >= 1 lane and >= 1 step, got {len(lanes)} lanes, {steps} steps")
    t0 = time.perf_counter()
    snapshots, first = [], []
    for lane in lanes:
        cache = engine.make_cache()
        first.append(int(np.argmax(engine.forward(list(lane.ids), cache, keep=1).logits[-1])))
        snapshots.append(engine.snapshot(cache))
    before = [engine.snapshot_digest(s) for s in snapshots]
    t1 = time.perf_counter()

    serial_tokens, serial_rows, serial_caches = [], [], []
    for b in range(len(lanes)):
        cache, tokens, rows = engine.restore(snapshots[b]), [first[b]], []
        for _ in range(steps):
            rows.append(engine.forward([tokens[-1]], cache, keep=1).logits[-1])
            tokens.append(int(np.argmax(rows[-1])))
        serial_tokens.append(tokens)
        serial_rows.append(np.stack(rows))
        serial_caches.append(cache)
    t2 = time.perf_counter()

    caches = [engine.restore(s) for s in snapshots]
    cohort_tokens = [[f] for f in first]
    logits, hidden = [], []
    for _ in range(steps):
        step = engine.decode_cohort([t[-1] for t in cohort_tokens], caches)
        logits.append(step.logits)
        hidden.append(step.hidden)
        for b, row in enumerate(step.logits):
            cohort_tokens[b].append(int(np.argmax(row)))
    t3 = time.perf_counter()
    lengths = [int(engine.cache_length(c)) for c in caches]
    head = engine.lm_head(hidden[-1])
    cohort_next = [engine.forward([serial_tokens[b][-1]], c, keep=1).logits[-1] for b, c in enumerate(caches)]
    serial_next = [engine.forward([serial_tokens[b][-1]], c, keep=1).logits[-1] for b, c in enumerate(serial_caches)]
    after = [engine.snapshot_digest(s) for s in snapshots]
    t4 = time.perf_counter()
    return CohortRun(
        lanes=list(lanes), steps=steps, serial_tokens=serial_tokens, cohort_tokens=cohort_tokens,
        serial_logits=np.stack(serial_rows).astype("<f4"),
        cohort_logits=np.stack(logits, axis=1).astype("<f4"),
        cohort_hidden=np.stack(hidden, axis=1).astype("<f4"),
        head_rerun=np.asarray(head, dtype="<f4"),
        serial_next=np.stack(serial_next).astype("<f4"), cohort_next=np.stack(cohort_next).astype("<f4"),
        cohort_lengths=lengths, digest_before=before, digest_after=after,
        seconds={"prefill": t1 - t0, "serial": t2 - t1, "cohort": t3 - t2, "after": t4 - t3})
