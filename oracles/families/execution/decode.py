"""Cache-continuation decode: greedy decoding through an engine's KV cache, with full recomputes.

The decode loop runs the prompt once (prefill, cache kept) and then one token a forward through the
cache, to the first stop token or the cap. A *recompute* of step ``s`` is a cold forward of the whole
prefix ``prompt + tokens[:s]`` without a cache; its last row must agree with the cached row that chose
``tokens[s]``. A recompute costs a prefill, so only the steps of :func:`recompute_steps` are compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from oracles.engines.base import Engine


@dataclass
class DecodeRun:
    """One greedy cache-continuation decode.

    step_logits: ``[N, V]`` float32, row ``s`` the cached logits ``tokens[s]`` was chosen from
        (row 0 from the prefill, row ``s > 0`` from the one-token forward of ``tokens[s-1]``).
    recomputed: step -> ``[V]`` float32, the last row of a cold forward of ``prompt + tokens[:s]``.
    """

    prompt: list[int]
    tokens: list[int]
    finish_reason: str
    max_new_tokens: int
    every: int
    step_logits: np.ndarray
    recomputed: dict[int, np.ndarray] = field(default_factory=dict)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    recompute_seconds: float = 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        n = max(len(self.tokens) - 1, 0)
        return n / self.decode_seconds if self.decode_seconds > 0 else 0.0


def recompute_steps(n: int, every: int) -> list[int]:
    """The compared steps of an ``n``-token decode: the first, the last and every ``every``-th.

    >>> recompute_steps(18, 6)
    [0, 6, 12, 17]
    """
    if n <= 0:
        return []
    if every < 1:
        raise ValueError(f"recompute_steps: every must be >= 1, got {every}")
    return sorted({0, n - 1, *range(0, n, every)})


def greedy_steps(engine: Engine, cache: Any, first: np.ndarray, max_new_tokens: int) -> tuple[list[int], list[np.ndarray], str]:
    """Greedy decoding through a live cache: the one loop the execution oracles share.

    ``first`` is the ``[V]`` logits row after the prompt (already in ``cache``). Each step takes the
    argmax (ties to the lowest id, ``numpy.argmax``), stops at a stop token (kept) or after
    ``max_new_tokens`` tokens, else feeds the token through ``cache`` (one-token ``forward``, keep=1).
    The last token is not fed: ``cache`` holds the prompt and every token but the last.

    Returns:
        (tokens, rows, finish): ``rows[s]`` the ``[V]`` float32 logits ``tokens[s]`` was chosen from,
        ``finish`` ``"stop"`` or ``"length"``.
    """
    tokens: list[int] = []
    rows = [first]
    while True:
        tokens.append(int(np.argmax(rows[-1])))
        if tokens[-1] in engine.eos_token_ids:
            return tokens, rows, "stop"
        if len(tokens) >= max_new_tokens:
            return tokens, rows, "length"
        rows.append(engine.forward([tokens[-1]], cache, keep=1).logits[-1])


def greedy_decode(engine: Engine, ids: Sequence[int], max_new_tokens: int, every: int) -> DecodeRun:
    """Greedy decode of ``ids`` through ``engine``'s KV cache (:func:`greedy_steps`), then the
    scheduled recomputes (none for ``every`` 0: a run whose step logits alone are held).

    Raises whatever ``engine.forward`` raises (a prompt longer than the context, for one).
    """
    cache = engine.make_cache()
    t0 = time.perf_counter()
    first = engine.forward(list(ids), cache, keep=1).logits[-1]
    t1 = time.perf_counter()
    tokens, rows, finish = greedy_steps(engine, cache, first, max_new_tokens)
    t2 = time.perf_counter()
    run = DecodeRun(prompt=list(ids), tokens=tokens, finish_reason=finish, max_new_tokens=max_new_tokens,
                    every=every, step_logits=np.stack(rows).astype("<f4"), prefill_seconds=t1 - t0,
                    decode_seconds=t2 - t1)
    for s in recompute_steps(len(tokens), every) if every else []:
        run.recomputed[s] = engine.forward(list(ids) + tokens[:s], None, keep=1).logits[-1]
    run.recompute_seconds = time.perf_counter() - t2
    return run
