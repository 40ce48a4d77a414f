"""The MTP rounds (:mod:`oracles.families.execution.mtp`) on a fake numpy head: a bigram trunk and an MTP
layer that is right except where told, with trimmable and untrimmable (snapshot/restore) caches.
No weights: the logic of drafts, verify, commit, history update and the invariants alone."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pytest

from oracles.families.execution.mtp import greedy_tokens, mtp_generate

pytestmark = pytest.mark.dry

V = 11


def _next(tok: int) -> int:
    """The fake trunk's greedy rule (a bigram over V ids)."""
    return (3 * tok + 1) % V


def _onehot(tok: int) -> np.ndarray:
    row = np.zeros(V, dtype=np.float32)
    row[tok] = 1.0
    return row


class FakeHead:
    """Trunk: logits of ``_next(token)``, hidden = [token]; MTP: from the pair (state, token) predicts
    ``_next(token)``, except at the positions in ``wrong`` (then ``_next(token) + 1``). Caches are
    lists of positions; ``trimmable`` False makes the rounds restore snapshots instead (an engine's
``restore``: a fresh cache from the snapshot)."""

    def __init__(self, wrong: frozenset[int] = frozenset(), trimmable: bool = True) -> None:
        self.wrong, self.trimmable = wrong, trimmable

    def mtp_trunk_cache(self) -> list[int]:
        return []

    def mtp_history_cache(self) -> list[int]:
        return []

    def cache_length(self, cache: list[int]) -> int:
        return len(cache)

    def is_trimmable(self, cache: list[int]) -> bool:
        return self.trimmable

    def trim(self, cache: list[int], n: int) -> bool:
        if not self.trimmable and n:
            return False
        del cache[len(cache) - n:]
        return True

    def snapshot(self, cache: list[int]) -> list[int]:
        return list(cache)

    def restore(self, snapshot: list[int]) -> list[int]:
        return list(snapshot)

    def mtp_trunk(self, ids: Sequence[int], cache: list[int]) -> tuple[np.ndarray, np.ndarray]:
        cache.extend(range(len(cache), len(cache) + len(ids)))
        return (np.stack([_onehot(_next(t)) for t in ids]),
                np.array([[float(t)] for t in ids], dtype=np.float32))

    def mtp_draft(self, tokens: Sequence[int], state: np.ndarray, start: int, history: list[int],
                  depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
        assert len(history) + 1 == start, f"MTP step at {start} on a history of {len(history)}"
        rows = []
        for i, t in enumerate(tokens):
            history.append(start + i)
            rows.append(_onehot((_next(t) + (start + i in self.wrong)) % V))
        return np.stack(rows), np.array([[float(t)] for t in tokens], dtype=np.float32)


IDS = [1, 4, 2, 7]


@pytest.mark.parametrize("trimmable", [True, False])
def test_rounds_equal_greedy_and_count(trimmable: bool) -> None:
    head: Any = FakeHead(wrong=frozenset({6, 11}), trimmable=trimmable)
    run = mtp_generate(head, IDS, 3, 12, frozenset())
    assert run.tokens == greedy_tokens(head, IDS, 12, frozenset())
    assert run.prefill_history == len(IDS) - 1
    assert 0 < run.accepted < run.drafted
    assert all(r.committed == [*r.drafts[: r.accepted], r.correction if r.correction is not None else r.bonus]
               for r in run.rounds)


def test_all_right_drafts_give_bonus_tokens() -> None:
    run = mtp_generate(FakeHead(), IDS, 2, 9, frozenset())
    assert all(r.bonus is not None and r.accepted == len(r.drafts) for r in run.rounds)


def test_history_windows_change_nothing() -> None:
    head: Any = FakeHead(wrong=frozenset({6}))
    a, b = mtp_generate(head, IDS, 2, 10, frozenset()), mtp_generate(head, IDS, 2, 10, frozenset(), window=2)
    assert a.tokens == b.tokens and [r.drafts for r in a.rounds] == [r.drafts for r in b.rounds]


def test_stop_token_ends_the_run() -> None:
    greedy = greedy_tokens(FakeHead(), IDS, 12, frozenset())
    stop = greedy[4]
    run = mtp_generate(FakeHead(), IDS, 3, 12, frozenset({stop}))
    assert run.finish_reason == "stop" and run.tokens == greedy[: greedy.index(stop) + 1]


def test_a_cut_that_does_nothing_is_named() -> None:
    """Positive control: a head whose trims keep the rejected entries breaks the cache invariant (the
    rounds' own check, or the history's position check, whichever meets it first)."""
    class NoCut(FakeHead):
        def trim(self, cache: list[int], n: int) -> bool:
            return True

    with pytest.raises(AssertionError, match=r"round 0: caches hold trunk|MTP step at \d+ on a history of"):
        mtp_generate(NoCut(wrong=frozenset({5})), IDS, 3, 12, frozenset())


@pytest.mark.parametrize("depth, ids", [(0, IDS), (2, [1])])
def test_bad_input_is_one_line(depth: int, ids: list[int]) -> None:
    with pytest.raises(ValueError, match=r"need depth >= 1 and >= 2 prompt ids"):
        mtp_generate(FakeHead(), ids, depth, 8, frozenset())


def test_a_cache_that_says_trimmable_and_refuses_is_named() -> None:
    """An engine whose ``is_trimmable`` says yes and whose ``trim`` then refuses has no snapshot taken: the
    rounds fail naming the cache and the cut, not deep in the engine's ``restore``."""
    class Liar(FakeHead):
        def trim(self, cache: list[int], n: int) -> bool:
            return n == 0

    with pytest.raises(AssertionError, match=r"the trunk cache reported is_trimmable, then trim\(\d\) refused"):
        mtp_generate(Liar(wrong=frozenset({5})), IDS, 3, 12, frozenset())
