"""Speculative draft/verify/commit cycles written out on any two engines' ``forward`` and KV caches.

One cycle, greedy (the scheme of Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding", 2023, at temperature 0): the draft model proposes ``d`` tokens one at a time; the target
runs ``[last, draft_1 .. draft_d]`` in one forward and takes its own argmax after each position; the
first ``k`` drafts that equal the target's choice are accepted; then the target's choice at position
``k`` is committed too: the *correction* when a draft was rejected (``k < d``), the *bonus* token when
all ``d`` were accepted. Both caches are rolled back to the committed tokens (``engine.trim``, or a
snapshot/restore and re-forward where a cache cannot be trimmed). At temperature 0 the committed
tokens must equal greedy autoregressive decoding token for token.

Cache invariant between cycles: each cache holds every committed token but the last (``last``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from oracles.engines.base import Engine


@dataclass
class Cycle:
    """One draft/verify/commit cycle.

    drafts: the draft model's ``d`` proposals; accepted: how many the target accepted (0..d);
    correction: the target's token at the first rejected draft (None when all were accepted);
    bonus: the target's token after the last draft (None when a draft was rejected);
    committed: the tokens this cycle appended; rollback: how the caches were cut back
    (``"trim"`` or ``"restore"``).
    """

    drafts: list[int]
    accepted: int
    correction: int | None
    bonus: int | None
    committed: list[int]
    rollback: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SpeculativeRun:
    """Greedy speculative generation from a prompt: ``tokens`` (stop token kept), the cycles."""

    tokens: list[int]
    finish_reason: str
    num_draft: int
    max_new_tokens: int
    cycles: list[Cycle] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def accepted(self) -> int:
        return sum(c.accepted for c in self.cycles)

    @property
    def drafted(self) -> int:
        return sum(len(c.drafts) for c in self.cycles)


def _argmax(row: np.ndarray) -> int:
    return int(np.argmax(row))


def _cut(engine: Engine, cache: Any, n: int, saved: Any, replay: list[int]) -> tuple[Any, str]:
    """Drop the last ``n`` positions of ``cache``: trim in place, else restore ``saved`` and forward
    ``replay`` (the tokens the cut cache must hold after the saved point). Returns (cache, how)."""
    if n == 0:
        return cache, "trim"
    if saved is None and engine.trim(cache, n):
        return cache, "trim"
    if saved is None:
        raise RuntimeError(f"{engine.id}: cache cannot be trimmed by {n} and no snapshot was taken")
    cache = engine.restore(saved)
    if replay:
        engine.forward(replay, cache, keep=1)
    return cache, "restore"


def speculate(target: Engine, draft: Engine, ids: Sequence[int], num_draft: int, max_new_tokens: int) -> SpeculativeRun:
    """Greedy speculative generation of ``target`` with ``draft``, cycle by cycle.

    Args:
        target, draft: engines sharing token ids; each cache is cut by ``trim`` where the engine's
            ``is_trimmable`` says it can, else rolled back by ``snapshot``/``restore`` and a re-forward
            (recurrent state cannot be cut); ``draft`` may be ``target`` itself (separate caches).
        ids: the prompt ids (at least 2: all but the last are prefilled).
        num_draft: drafts a cycle, ``d >= 1``.
        max_new_tokens: the cap; ``finish_reason`` is ``"length"`` when it is reached before a stop token.

    Raises:
        ValueError: ``num_draft < 1`` or a prompt shorter than 2 ids.
    """
    if num_draft < 1 or len(ids) < 2:
        raise ValueError(f"speculate: need num_draft >= 1 and >= 2 prompt ids, got {num_draft} and {len(ids)}")
    start = time.perf_counter()
    tcache, dcache = target.make_cache(), draft.make_cache()
    target.forward(list(ids[:-1]), tcache, keep=1)
    draft.forward(list(ids[:-1]), dcache, keep=1)
    last, finish = int(ids[-1]), "length"
    out: list[int] = []
    cycles: list[Cycle] = []
    while len(out) < max_new_tokens:
        d = min(num_draft, max_new_tokens - len(out) - 1)
        drafts: list[int] = []
        tok = last
        dsaved = None if draft.is_trimmable(dcache) else draft.snapshot(dcache)
        for _ in range(d):
            tok = _argmax(draft.forward([tok], dcache, keep=1).logits[-1])
            drafts.append(tok)
        window = [last, *drafts]
        saved = None if target.is_trimmable(tcache) else target.snapshot(tcache)
        choice = [_argmax(r) for r in target.forward(window, tcache).logits]
        k = 0
        while k < d and drafts[k] == choice[k]:
            k += 1
        committed = [*drafts[:k], choice[k]]
        tcache, how = _cut(target, tcache, d - k, saved, window[: k + 1])
        # The draft cache gained ``last, drafts[:d-1]`` (d entries); it must hold ``last, drafts[:k]``.
        if d > k + 1:
            dcache, _ = _cut(draft, dcache, d - (k + 1), dsaved, window[: k + 1])
        elif d < k + 1:
            draft.forward(window[d : k + 1], dcache, keep=1)
        cycles.append(Cycle(drafts=drafts, accepted=k, correction=choice[k] if k < d else None,
                            bonus=choice[k] if k == d else None, committed=committed, rollback=how))
        for t in committed:
            out.append(t)
            if t in target.eos_token_ids:
                finish = "stop"
                break
        if finish == "stop":
            break
        last = committed[-1]
    return SpeculativeRun(tokens=out, finish_reason=finish, num_draft=num_draft, max_new_tokens=max_new_tokens,
                          cycles=cycles, seconds=time.perf_counter() - start)
