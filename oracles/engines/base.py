"""The engine protocol: what the reference and every port implement, numpy at the boundary.

All arrays crossing the boundary are float32 numpy arrays (``<f4``); token ids are Python ints.
A *cache* is the engine's own KV-cache object (opaque to the checks); a *snapshot* is an independent
copy of one that :meth:`Engine.restore` turns back into a live cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np


@dataclass
class Step:
    """One forward over ``T`` new tokens.

    logits: ``[T, V]`` float32, the lm_head output for each new position.
    hidden: ``[T, D]`` float32, the final-norm hidden states the lm_head read.
    """

    logits: np.ndarray
    hidden: np.ndarray


@dataclass(frozen=True)
class Sampler:
    """Sampling settings; ``temperature == 0`` means greedy (argmax, lowest id on ties)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


@dataclass
class Generation:
    """A generation from a prompt.

    tokens: generated ids, the stop token included when ``finish_reason == "stop"``.
    step_logits: ``[N, V]`` float32, the logits each generated token was chosen from (raw, before
        temperature), one row per generated token.
    prefill_seconds / decode_seconds: wall seconds of the prompt forward and of the rest.
    """

    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    step_logits: np.ndarray
    prefill_seconds: float
    decode_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_tokens_per_second(self) -> float:
        n = max(len(self.tokens) - 1, 0)
        return n / self.decode_seconds if self.decode_seconds > 0 else 0.0


def check_forward_length(engine: Any, cached: int, new: int) -> None:
    """Refuse an empty forward, or one whose ``cached + new`` positions pass ``engine.max_context``
    (the model config's ``max_position_embeddings``; 0 means no limit).

    Raises:
        ValueError: naming both counts, the context and the pin.
    """
    if new == 0:
        raise ValueError("forward: no token ids")
    if engine.max_context and cached + new > engine.max_context:
        raise ValueError(f"forward: {cached} cached + {new} new tokens exceed the context of "
                         f"{engine.max_context} (max_position_embeddings of {engine.pin})")


def check_cohort(engine: Any, tokens: Sequence[int], caches: Sequence[Any]) -> None:
    """Refuse a decode cohort that cannot run: ``len(tokens) != len(caches)``, no lanes, one cache
    object given for two lanes (both would append to it), or a lane whose one new token would pass
    ``engine.max_context`` (:func:`check_forward_length` per lane).

    Raises:
        ValueError: naming the counts, or the lane and its cached length.
    """
    if len(tokens) != len(caches):
        raise ValueError(f"decode_cohort: {len(tokens)} tokens for {len(caches)} caches "
                         f"(one token a lane, one cache a lane)")
    if not tokens:
        raise ValueError("decode_cohort: empty cohort (B = 0 lanes)")
    seen: dict[int, int] = {}
    for b, cache in enumerate(caches):
        if cache is None:
            raise ValueError(f"decode_cohort: lane {b} has no cache (None); make one with make_cache/forward")
        if id(cache) in seen:
            raise ValueError(f"decode_cohort: lanes {seen[id(cache)]} and {b} share one cache object")
        seen[id(cache)] = b
        try:
            check_forward_length(engine, engine.cache_length(cache), 1)
        except ValueError as exc:
            raise ValueError(f"decode_cohort: lane {b}: {exc}") from None


@runtime_checkable
class Engine(Protocol):
    """One framework's adapter. ``id`` is the engine id used in test ids ("torch", "mlx", ...)."""

    id: str
    pin: str
    vocab_size: int
    hidden_size: int
    eos_token_ids: frozenset[int]
    max_context: int

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` rendered by the snapshot's chat template."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def make_cache(self) -> Any:
        """An empty KV cache for :meth:`forward`."""
        ...

    def forward(self, ids: Sequence[int], cache: Any | None = None, keep: int = 0) -> Step:
        """Run ``ids`` after what ``cache`` holds (appending to it); ``cache=None`` is a cold prefill.

        ``keep > 0`` returns logits and hidden states of the last ``keep`` positions only (a long
        prefill's full ``[T, V]`` logits can be gigabytes); ``keep == 0`` returns every position.
        """
        ...

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        """``[T, D]`` final-norm hidden states -> ``[T, V]`` logits through the engine's own head."""
        ...

    def cache_length(self, cache: Any) -> int: ...

    def snapshot(self, cache: Any) -> Any:
        """An independent copy of ``cache``; later forwards on ``cache`` do not change it."""
        ...

    def restore(self, snapshot: Any) -> Any:
        """A fresh live cache holding what ``snapshot`` holds (the snapshot stays unchanged)."""
        ...

    def snapshot_digest(self, snapshot: Any) -> str:
        """sha256 over every buffer of a snapshot as little-endian float32, with shapes."""
        ...

    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        """Advance ``B`` lanes by one token each in one batched forward of the framework.

        Lane ``b`` is ``tokens[b]`` appended after what ``caches[b]`` holds; the caches are live KV
        caches of this engine (from :meth:`make_cache` / :meth:`forward` / :meth:`restore`) and may
        hold different lengths. Each lane is placed at its own positions (left padding, an attention
        mask and per-lane positions, or the framework's batch cache), so the result is, up to the
        float32 reordering of a ``B``-row matmul, what ``forward([tokens[b]], caches[b], keep=1)``
        would give lane by lane.

        Returns:
            Step with logits ``[B, V]`` and hidden ``[B, D]`` float32; row ``b`` is lane ``b``'s
            next-token logits and the final-norm hidden state they were read from.

        Side effects: each ``caches[b]`` gains lane ``b``'s token (its :meth:`cache_length` grows by
        one) and stays usable by :meth:`forward` and :meth:`decode_cohort`; snapshots are untouched.

        Raises:
            ValueError: ``len(tokens) != len(caches)``, ``B == 0``, one cache object given for two
                lanes, or a lane whose cached length + 1 passes :attr:`max_context`
                (:func:`check_cohort`).
        """
        ...

    def generate(self, ids: Sequence[int], sampler: Sampler, max_new_tokens: int) -> Generation:
        """Generate with the framework's own generation code from a cold prompt."""
        ...
