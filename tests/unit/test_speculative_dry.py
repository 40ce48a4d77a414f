"""Draft/verify/commit bookkeeping and the decode schedule on fake engines (no weights, no torch).

The fake target's next token is a fixed function of the sequence so far, so greedy AR output is
known in closed form; the fake draft agrees with it except at chosen positions.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import pytest

from oracles.engines.base import Engine, Prompt, Step
from oracles.families.execution.decode import greedy_decode, recompute_steps
from oracles.families.execution.speculative import speculate

pytestmark = [pytest.mark.dry]

V, STOP = 32, 2


def rule(seq: list[int]) -> int:
    """The target's greedy choice after ``seq``: stop after 12 generated tokens, else a hash of the tail."""
    return STOP if len(seq) >= 20 else 3 + (seq[-1] * 7 + len(seq)) % (V - 3)


class Fake(Engine):
    """A fake engine: its KV cache is the list of ids it has seen; logits one-hot (+0.5 off-peak noise).
    ``trimmable=False`` makes it a cache that cannot be cut (recurrent state): rollback by snapshot/restore."""

    id = "fake"

    def __init__(self, wrong_at: Iterable[int] = frozenset(), trimmable: bool = True) -> None:
        self.wrong_at, self.eos_token_ids, self.max_context = set(wrong_at), frozenset({STOP}), 64
        self.trimmable = trimmable
        self.forwards = 0

    def make_cache(self) -> list[int]:
        return []

    def cache_length(self, cache: list[int] | None) -> int:
        return 0 if cache is None else len(cache)

    def _row(self, seq: list[int]) -> np.ndarray:
        tok = rule(seq)
        if len(seq) in self.wrong_at:
            tok = 3 + (tok + 1 - 3) % (V - 3)
        row = np.full(V, 0.5, "<f4")
        row[tok] = 10.0
        return row

    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        if layers:
            raise self._unsupported("return per-layer states", "a fake without layers")
        self.forwards += 1
        seq = list(cache) if cache is not None else []
        rows = []
        for t in self.text_ids(prompt):
            seq.append(int(t))
            rows.append(self._row(seq))
        if cache is not None:
            cache[:] = seq
        logits = np.stack(rows)
        logits = logits[-keep:] if keep else logits
        return Step(logits=logits, hidden=np.zeros((len(logits), 4), "<f4"))

    def is_trimmable(self, cache: list[int]) -> bool:
        return self.trimmable

    def trim(self, cache: list[int], n: int) -> bool:
        if not self.trimmable:
            return n == 0
        del cache[len(cache) - n:]
        return True

    def snapshot(self, cache: list[int]) -> list[int]:
        return list(cache)

    def restore(self, snap: list[int]) -> list[int]:
        return list(snap)


PROMPT = [1, 5, 9, 4]


def ar(prompt: list[int], cap: int = 64) -> list[int]:
    seq = list(prompt)
    out: list[int] = []
    while len(out) < cap:
        out.append(rule(seq))
        seq.append(out[-1])
        if out[-1] == STOP:
            break
    return out


@pytest.mark.parametrize("wrong_at", [set(), {6, 7, 11}, set(range(4, 30))],
                         ids=["all-accepted", "some-rejected", "all-rejected"])
@pytest.mark.parametrize("num_draft", [1, 3])
def test_speculate_equals_ar(wrong_at: set[int], num_draft: int) -> None:
    run = speculate(Fake(), Fake(wrong_at), PROMPT, num_draft, 64)
    assert run.tokens == ar(PROMPT) and run.finish_reason == "stop"
    assert [t for c in run.cycles for t in c.committed][: len(run.tokens)] == run.tokens
    for c in run.cycles:
        assert (c.correction is None) == (c.accepted == len(c.drafts))
    if not wrong_at:
        assert run.accepted == run.drafted
    if wrong_at == set(range(4, 30)):
        assert run.accepted == 0


@pytest.mark.parametrize("which", ["target", "draft", "both"])
def test_speculate_without_trim_uses_restore(which: str) -> None:
    target = Fake(trimmable=which == "draft")
    draft = Fake({6, 9}, trimmable=which == "target")
    run = speculate(target, draft, PROMPT, 3, 64)
    assert run.tokens == ar(PROMPT)
    rollbacks = {c.rollback for c in run.cycles if c.accepted < len(c.drafts)}
    assert rollbacks == ({"trim"} if which == "draft" else {"restore"})


def test_speculate_cap_is_length() -> None:
    run = speculate(Fake(), Fake({8}), PROMPT, 3, 5)
    assert run.tokens == ar(PROMPT)[:5] and run.finish_reason == "length"


def test_speculate_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_draft >= 1"):
        speculate(Fake(), Fake(), PROMPT, 0, 8)


def test_decode_and_schedule() -> None:
    run = greedy_decode(Fake(), PROMPT, 64, 5)
    assert run.tokens == ar(PROMPT) and run.finish_reason == "stop"
    assert sorted(run.recomputed) == recompute_steps(len(run.tokens), 5) == [0, 5, 10, 15, 16]
    for s, row in run.recomputed.items():
        assert int(row.argmax()) == run.tokens[s]
    capped = greedy_decode(Fake(), PROMPT, 3, 2)
    assert capped.tokens == ar(PROMPT)[:3] and capped.finish_reason == "length"
    assert recompute_steps(0, 3) == [] and recompute_steps(1, 3) == [0]
    with pytest.raises(ValueError):
        recompute_steps(4, 0)
