"""A numpy engine for the cohort family's unit tests: deterministic, batch-invariant by construction,
with switches that plant the bugs the family must catch. No torch, no mlx.

Each lane's cache holds per layer ``keys`` ``[1, H, n, d]`` (valid rows; ``capacity`` rows allocated)
and a ``recurrent_state`` ``[1, S]``; a token's hidden state depends on the token, its position and the
lane's whole history, so two lanes that differ anywhere differ in every quantity.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Step, Unsupported, check_cohort
from oracles.pins.pin import Pin

V, D, H, DK, S, L = 2003, 8, 2, 4, 6, 2  # V: a vocabulary where the span formulas never repeat a token


def fake_pin(name: str, model_class: str = "FakeForCausalLM") -> Pin:
    """A pin named ``name`` for an engine built outside any pin store (engines are built with a
    :class:`Pin`): a text model that pins no file, so there is nothing to verify."""
    return Pin(name=name, source="local:.", source_sha256=None, model_class=model_class, files={},
               safetensors_headers={}, built_with={}, path=Path(f"{name}.json"))


class NoForward:
    """The core methods (:data:`oracles.engines.base.CORE_METHODS`) of a fake engine whose tests never
    run a forward (a load, a contract or a context check): mixed in before Engine, so the class can be
    built; its forward is refused as a capability it lacks."""

    def forward(self, prompt: Any, cache: Any | None = None, keep: int = 0, layers: bool = False) -> Step:
        raise Unsupported(str(getattr(self, "id", "?")), "forward", "a fake engine that never runs one")

    def make_cache(self) -> Any:
        return []

    def cache_length(self, cache: Any) -> int:
        return 0 if cache is None else len(cache)


@dataclass
class FakeCache:
    keys: list[np.ndarray] = field(default_factory=lambda: [np.zeros((1, H, 0, DK), "<f4") for _ in range(L)])
    states: list[np.ndarray] = field(default_factory=lambda: [np.zeros((1, S), "<f4") for _ in range(L)])
    capacity: int = 0

    @property
    def n(self) -> int:
        return int(self.keys[0].shape[2])


class FakeEngine(Engine):
    """``bug``: None (correct), ``"rows_permuted"`` (decode_cohort returns its rows in the lane map's
    order), ``"row1_corrupted"`` (rows >= 1 of a batch are off by one ULP-scale step, the shape of
    mlx #3494), ``"bleed"`` (row b reads lane 0's token)."""

    id = "fake"

    def __init__(self, bug: str | None = None, map_for_bug: Sequence[int] = (2, 0, 3, 1)) -> None:
        super().__init__(Path("."), fake_pin("fake-pin"), 0)
        rng = np.random.default_rng(0)
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = V, D, L, 0
        self.emb = rng.standard_normal((V, D)).astype("<f4")
        self.wk = rng.standard_normal((L, H * DK, D)).astype("<f4") / 3
        self.ws = rng.standard_normal((L, S, D)).astype("<f4") / 3
        self.wo = rng.standard_normal((L, D, H * DK + S)).astype("<f4") / 3
        self.head = rng.standard_normal((V, D)).astype("<f4")
        self.bug, self.map_for_bug = bug, list(map_for_bug)

    def _one(self, token: int, cache: FakeCache) -> np.ndarray:
        """One token through the layers, appending to ``cache``; returns the final hidden ``[D]``."""
        pos = cache.n
        x = self.emb[token] + np.float32(np.sin(pos))
        for layer in range(L):
            k = np.tanh(self.wk[layer] @ x).astype("<f4").reshape(1, H, 1, DK)
            cache.keys[layer] = np.concatenate([cache.keys[layer], k], axis=2)
            cache.states[layer] = (np.float32(0.5) * cache.states[layer] + np.tanh(self.ws[layer] @ x)).astype("<f4")
            ctx = np.concatenate([cache.keys[layer].mean(axis=2).reshape(-1), cache.states[layer].reshape(-1)])
            x = (x + np.tanh(self.wo[layer] @ ctx)).astype("<f4")
        cache.capacity = max(cache.capacity, cache.n)
        return x

    def make_cache(self) -> FakeCache:
        return FakeCache()

    def cache_length(self, cache: Any) -> int:
        return 0 if cache is None else cache.n

    def forward(self, prompt: Any, cache: Any | None = None, keep: int = 0, layers: bool = False) -> Step:
        cache = cache if cache is not None else FakeCache()
        hidden = np.stack([self._one(int(t), cache) for t in prompt])
        hidden = hidden[-keep:] if keep else hidden
        return Step(logits=self.lm_head(hidden), hidden=hidden)

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        """Row by row (a BLAS matmul of B rows need not give a 1-row product's bits)."""
        return np.stack([self.head @ h for h in np.asarray(hidden, "<f4")]).astype("<f4")

    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        check_cohort(self, tokens, caches)
        feed = [int(tokens[0])] * len(tokens) if self.bug == "bleed" else [int(t) for t in tokens]
        hidden = np.stack([self._one(t, c) for t, c in zip(feed, caches)])
        if self.bug == "row1_corrupted":
            hidden[1:] = hidden[1:] * np.float32(1.0001)
        if self.bug == "rows_permuted":
            hidden = hidden[self.map_for_bug]
        return Step(logits=self.lm_head(hidden), hidden=hidden)

    def snapshot(self, cache: Any) -> FakeCache:
        return copy.deepcopy(cache)

    def restore(self, snapshot: Any) -> FakeCache:
        return copy.deepcopy(snapshot)

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        out = {}
        for i in range(L):
            out[f"layers.{i}.keys"] = snapshot.keys[i].copy()
            out[f"layers.{i}.recurrent_state"] = snapshot.states[i].copy()
        return out

    def cache_capacity(self, cache: Any) -> int:
        return int(cache.capacity)

    def grow(self, cache: Any, capacity: int) -> FakeCache:
        if capacity < cache.n:
            raise ValueError(f"grow: capacity {capacity} below {cache.n}")
        grown = copy.deepcopy(cache)
        grown.capacity = capacity
        return grown

    def resident_bytes(self, obj: Any) -> int:
        return sum(a.nbytes for a in obj.keys) + sum(a.nbytes for a in obj.states)

    def weight_bytes(self) -> int:
        return sum(a.nbytes for a in (self.emb, self.wk, self.ws, self.wo, self.head))


class DryTokenizer:
    """A :class:`oracles.engines.types.Tokenizer` over a snapshot's tokenizer files without transformers
    (the ``tokenizers`` library and the chat template, :class:`oracles.pins.tokenizer.LightTokenizer`): it
    encodes the canary as the pin's dry tokenizer does, so an engine holding it passes the load's check."""

    def __init__(self, root: Path) -> None:
        from oracles.pins.tokenizer import load_tokenizer

        self.light = load_tokenizer(root)
        self.chat_template = self.light.template

    def apply_chat_template(self, conversation: list[dict[str, str]], *, add_generation_prompt: bool = False,
                            tokenize: bool = True, return_dict: bool = False) -> list[int]:
        return self.light.chat_ids(conversation, add_generation_prompt)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.light.encode(text)

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return str(self.light.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [str(self.light.tokenizer.id_to_token(i)) for i in ids]
