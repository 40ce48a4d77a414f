"""MTP draft/verify/commit rounds written out on a trunk and its multi-token-prediction layer, greedy, as
the MTPLX execution reference records them (trunk, history, drafts, verify, commit, history update).

An MTP layer pairs the trunk's hidden state at position ``i`` with the embedding of the token at
``i + 1`` and predicts the token at ``i + 2`` (DeepSeek-V3's MTP module, arXiv:2412.19437 section 2.2;
Gloeckle et al., arXiv:2404.19737). Its cache, the *history*, holds one entry per such pair.

Prefill: the trunk runs the prompt ``c[0..n-1]`` (its cache holds ``n`` positions) and chooses ``t``
at position ``n``; the history is prefilled with the ``n - 1`` committed pairs ``(h[i], c[i+1])``,
in windows of ``window`` pairs (MTPLX's history windows) or all at once.

One round, ``d`` drafts, ``t`` the last committed token at position ``p``, ``h`` the trunk's hidden
state at ``p - 1``:

1. drafts: depth 0 runs the MTP layer on ``(h, t)``: draft ``x_1``; depth ``j`` runs it on (depth
   ``j - 1``'s hidden state, ``x_j``): draft ``x_{j+1}`` (one layer is reused at every depth, as
   mlx-vlm's drafter does; layer ``min(j, L - 1)`` of ``L``);
2. verify: the trunk runs ``[t, x_1 .. x_d]`` in one forward and takes its argmax after each;
3. commit: the first ``k`` drafts equal to the trunk's choices, then the trunk's choice at ``k`` (the
   correction, or the bonus when ``k = d``); the trunk cache is trimmed by ``d - k``; the history is
   trimmed to its depth-0 entry ``(h, t)`` (deeper entries pair a draft state, not a trunk state);
   a cache the engine cannot trim (``is_trimmable`` False: mlx-vlm's short-convolution states) is
   restored from a snapshot taken before the round and the kept inputs replayed (mlx-vlm's own rollback);
4. history update: the pairs ``(verify hidden at p + j, x_{j+1})`` for ``j < k`` are appended;
5. continuation from the committed token with the verify hidden state before it.

Invariants between rounds: the trunk cache holds every committed position but the last (``p``), the
history ``p - 1`` pairs. At temperature 0 the committed tokens equal greedy autoregressive decoding.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np


class MtpHead(Protocol):
    """What the rounds ask of an engine: its MTP capabilities (:class:`oracles.engines.systems.MtpDrafting`)
    and its cache methods, float32 numpy at the boundary; every :class:`oracles.engines.base.Engine` is one
    (an engine without an MTP layer refuses at the first call)."""

    def mtp_trunk_cache(self) -> Any: ...
    def mtp_history_cache(self) -> Any: ...
    def cache_length(self, cache: Any) -> int: ...
    def is_trimmable(self, cache: Any) -> bool: ...
    def trim(self, cache: Any, n: int) -> bool: ...
    def snapshot(self, cache: Any) -> Any: ...
    def restore(self, snapshot: Any) -> Any: ...
    def mtp_trunk(self, ids: Sequence[int], cache: Any) -> tuple[np.ndarray, np.ndarray]: ...
    def mtp_draft(self, tokens: Sequence[int], state: np.ndarray, start: int, history: Any,
                  depth: int = 0) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class MtpRound:
    """One round: ``drafts`` (depth 0..d-1), ``accepted`` k, ``correction`` / ``bonus`` (exactly one
    set), ``committed`` (``drafts[:k]`` + the trunk's token), ``history`` and ``trunk`` the two caches'
    lengths after the commit, ``draft_top`` each draft's top logit (float)."""

    drafts: list[int]
    accepted: int
    correction: int | None
    bonus: int | None
    committed: list[int]
    history: int
    trunk: int
    draft_top: list[float]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MtpRun:
    """Greedy MTP generation written out: ``tokens`` (stop token kept), rounds, the first round's
    depth-0 draft logits ``first_draft`` [V] and the MTP layer's state behind them ``first_draft_hidden``
    [D] (float32), and the prefilled history's length."""

    tokens: list[int]
    finish_reason: str
    depth: int
    window: int
    rounds: list[MtpRound] = field(default_factory=list)
    first_draft: np.ndarray | None = None
    first_draft_hidden: np.ndarray | None = None
    prefill_history: int = 0
    seconds: float = 0.0

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def drafted(self) -> int:
        return sum(len(r.drafts) for r in self.rounds)


def prefill_history(head: MtpHead, ids: Sequence[int], hidden: np.ndarray, cache: Any, window: int) -> None:
    """Append the ``len(ids) - 1`` committed pairs ``(hidden[i], ids[i+1])`` to ``cache`` in windows
    of ``window`` pairs (0: one call). ``hidden`` [len(ids), D] float32."""
    n = len(ids) - 1
    step = window or n
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        head.mtp_draft(list(ids[lo + 1: hi + 1]), hidden[lo:hi], lo + 1, cache)


def _argmax(row: np.ndarray) -> int:
    return int(np.argmax(row))


def _drafts(head: MtpHead, t: int, h: np.ndarray, p: int, cache: Any,
            d: int) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
    """``d`` chained drafts from ``(h, t)`` at position ``p``: the tokens, their logits rows and the
    MTP layer's states."""
    tokens: list[int] = []
    rows: list[np.ndarray] = []
    states: list[np.ndarray] = []
    tok, state = t, h
    for j in range(d):
        logits, out = head.mtp_draft([tok], state[None], p + j, cache, depth=j)
        tok, state = _argmax(logits[-1]), out[-1]
        tokens.append(tok)
        rows.append(logits[-1])
        states.append(state)
    return tokens, rows, states


def _snapshot(head: MtpHead, cache: Any) -> Any:
    """A snapshot to roll ``cache`` back to, where the engine cannot trim it (else None: it is cut)."""
    return None if head.is_trimmable(cache) else head.snapshot(cache)


def _commit(head: MtpHead, tc: Any, mc: Any, saved: tuple[Any, Any], last: tuple[int, np.ndarray, int],
            drafts: list[int], k: int, vhidden: np.ndarray) -> tuple[Any, Any]:
    """Cut both caches back to the committed prefix (trim, else restore + replay) and append the
    history's new pairs (steps 3 and 4 of the module docstring); the caches to go on with."""
    t, h, p = last
    d = len(drafts)
    if not head.trim(tc, d - k):
        tc = _restored(head, saved[0], "trunk cache", d - k)
        head.mtp_trunk([t, *drafts[:k]], tc)
    if head.trim(mc, d - 1):
        if k:
            head.mtp_draft(drafts[:k], vhidden[:k], p + 1, mc)
        return tc, mc
    mc = _restored(head, saved[1], "MTP history", d - 1)
    head.mtp_draft([t, *drafts[:k]], np.concatenate([h[None], vhidden[:k]]), p, mc)
    return tc, mc


def _restored(head: MtpHead, saved: Any, what: str, n: int) -> Any:
    """The cache restored from ``saved``.

    Raises:
        AssertionError: no snapshot was taken (``is_trimmable`` said the cache could be cut, then ``trim``
            refused), naming the cache and the cut.
    """
    if saved is None:
        raise AssertionError(f"the {what} reported is_trimmable, then trim({n}) refused: no snapshot to roll back to")
    return head.restore(saved)


def mtp_generate(head: MtpHead, ids: Sequence[int], depth: int, max_new_tokens: int, eos: frozenset[int],
                 window: int = 0) -> MtpRun:
    """Greedy MTP generation of ``max_new_tokens`` (or to a stop token in ``eos``), round by round.

    Raises:
        ValueError: ``depth < 1`` or a prompt shorter than 2 ids.
        AssertionError: a cache length off its invariant after a commit (named: round, cache, both lengths).
    """
    if depth < 1 or len(ids) < 2:
        raise ValueError(f"mtp_generate: need depth >= 1 and >= 2 prompt ids, got {depth} and {len(ids)}")
    start = time.perf_counter()
    tc, mc = head.mtp_trunk_cache(), head.mtp_history_cache()
    logits, hidden = head.mtp_trunk(list(ids), tc)
    prefill_history(head, ids, hidden, mc, window)
    run = MtpRun(tokens=[], finish_reason="length", depth=depth, window=window, prefill_history=head.cache_length(mc))
    t, h, p = _argmax(logits[-1]), hidden[-1], len(ids)
    run.tokens.append(t)
    while len(run.tokens) < max_new_tokens and t not in eos:
        d = min(depth, max_new_tokens - len(run.tokens))
        msaved, tsaved = _snapshot(head, mc), _snapshot(head, tc)
        drafts, rows, states = _drafts(head, t, h, p, mc, d)
        if run.first_draft is None:
            run.first_draft, run.first_draft_hidden = rows[0], states[0]
        vlogits, vhidden = head.mtp_trunk([t, *drafts], tc)
        choice = [_argmax(r) for r in vlogits]
        k = 0
        while k < d and drafts[k] == choice[k]:
            k += 1
        tc, mc = _commit(head, tc, mc, (tsaved, msaved), (t, h, p), drafts, k, vhidden)
        committed = [*drafts[:k], choice[k]]
        t, h, p = choice[k], vhidden[k], p + k + 1
        lengths = head.cache_length(tc), head.cache_length(mc)
        assert lengths == (p, p - 1), (f"round {len(run.rounds)}: caches hold trunk {lengths[0]}, history {lengths[1]} "
                                       f"after committing to position {p}; expected {p} and {p - 1}")
        run.rounds.append(MtpRound(drafts=drafts, accepted=k, correction=choice[k] if k < d else None,
                                   bonus=choice[k] if k == d else None, committed=committed, history=lengths[1],
                                   trunk=lengths[0], draft_top=[float(r.max()) for r in rows]))
        for tok in committed:
            run.tokens.append(tok)
            if tok in eos or len(run.tokens) == max_new_tokens:
                break
    if run.tokens[-1] in eos:
        run.finish_reason = "stop"
    run.seconds = time.perf_counter() - start
    return run


def greedy_tokens(head: MtpHead, ids: Sequence[int], max_new_tokens: int, eos: frozenset[int]) -> list[int]:
    """Plain greedy decoding on the trunk through its cache, one token a forward (the AR baseline)."""
    cache = head.mtp_trunk_cache()
    logits, _ = head.mtp_trunk(list(ids), cache)
    out = [_argmax(logits[-1])]
    while len(out) < max_new_tokens and out[-1] not in eos:
        logits, _ = head.mtp_trunk([out[-1]], cache)
        out.append(_argmax(logits[-1]))
    return out
