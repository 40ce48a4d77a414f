"""d1 runs on any engine of the protocol (:mod:`oracles.engines.base`): the row path and the tree path.

Numpy only; the engine does every forward. Each pass keeps only the answer slot (``forward(ids,
keep=1)``): a 4,096-token row's full ``[T, V]`` logits would be 800 MB. What a pass computed is kept
as it ran (logits, final-norm hidden state, log-softmax, probabilities, seconds) so the checks read
the path's own values and recompute nothing in their place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from oracles.checks.readout import group_probabilities, log_softmax
from oracles.engines.base import Engine
from oracles.families.d1 import records as d1


@dataclass
class RowRun:
    """One question's row: ``logits`` ``[1, V]`` and ``hidden`` ``[1, D]`` float32 at the answer slot,
    ``logz`` ``[V]`` float32 (log-softmax of ``logits[0]``), ``probs`` one per read-out group."""

    ids: list[int]
    logits: np.ndarray
    hidden: np.ndarray
    logz: np.ndarray
    probs: list[float]
    seconds: float


@dataclass
class TreeRun:
    """One request's tree: ``trunk`` prefilled once, one ``branch`` per question from a restored
    snapshot of the trunk's KV cache. Per branch: ``logits`` ``[1, V]``, ``logz`` ``[V]``, ``probs``.
    ``digest_before``/``digest_after``: :meth:`snapshot_digest` of the trunk snapshot before the first
    and after the last branch (equal when restore leaves the snapshot untouched)."""

    trunk: list[int]
    branches: list[list[int]]
    logits: list[np.ndarray]
    logz: list[np.ndarray]
    probs: list[list[float]]
    digest_before: str
    digest_after: str
    trunk_seconds: float
    branch_seconds: list[float]

    @property
    def seconds(self) -> float:
        return self.trunk_seconds + sum(self.branch_seconds)


@dataclass
class FullRun:
    """Every position of a row: ``logits`` ``[L, V]`` and ``hidden`` ``[L, D]`` float32."""

    logits: np.ndarray
    hidden: np.ndarray


@dataclass
class RequestRun:
    """Everything one request ran on one engine: ``rows`` by question id, the tree (several questions),
    full passes by question id."""

    engine: str
    rows: dict[str, RowRun]
    tree: TreeRun | None
    full: dict[str, FullRun] = field(default_factory=dict)


def row_pass(engine: Engine, ids: Sequence[int], groups: Sequence[Sequence[int]]) -> RowRun:
    """Run one row cold and read it out at its last position."""
    start = time.perf_counter()
    step = engine.forward(list(ids), keep=1)
    logz = log_softmax(step.logits[0])
    probs = group_probabilities(logz, groups)
    return RowRun(list(ids), step.logits, step.hidden, logz, probs, time.perf_counter() - start)


def tree_pass(engine: Engine, trunk: Sequence[int], branches: Sequence[Sequence[int]],
              groups: Sequence[Sequence[Sequence[int]]]) -> TreeRun:
    """Prefill ``trunk`` once, snapshot its KV cache, then run each branch on a restored copy."""
    start = time.perf_counter()
    cache = engine.make_cache()
    engine.forward(list(trunk), cache, keep=1)
    snap = engine.snapshot(cache)
    trunk_seconds = time.perf_counter() - start
    before = engine.snapshot_digest(snap)
    logits, logz, probs, seconds = [], [], [], []
    for branch, g in zip(branches, groups):
        start = time.perf_counter()
        step = engine.forward(list(branch), engine.restore(snap), keep=1)
        z = log_softmax(step.logits[0])
        p = group_probabilities(z, g)
        seconds.append(time.perf_counter() - start)
        logits.append(step.logits)
        logz.append(z)
        probs.append(p)
    return TreeRun(list(trunk), [list(b) for b in branches], logits, logz, probs, before,
                   engine.snapshot_digest(snap), trunk_seconds, seconds)


def run_request(engine: Engine, request: d1.Request, rows: dict[str, dict[str, Any]], full: Sequence[str] = ()) -> RequestRun:
    """Both paths of ``request`` on ``engine``.

    Args:
        rows: question id -> its rows.json entry (the read-out groups are taken from there; the ids
            are the engine's own chat-template ids, which the checks hold against rows.json).
        full: question ids that also get a full pass (every position).
    """
    questions = [q for q in request.questions if q.qid in rows]
    out: dict[str, RowRun] = {}
    for q in questions:
        ids = engine.chat_ids(d1.row_messages(request.state, q))
        out[q.qid] = row_pass(engine, ids, rows[q.qid]["readout_ids"])
    tree = None
    if len(questions) > 1:
        trunk, branches = d1.tree_split(engine, request.state, questions)
        tree = tree_pass(engine, trunk, branches, [rows[q.qid]["readout_ids"] for q in questions])
    fulls = {}
    for qid in full:
        step = engine.forward(out[qid].ids, keep=0)
        fulls[qid] = FullRun(step.logits, step.hidden)
    return RequestRun(engine.id, out, tree, fulls)
