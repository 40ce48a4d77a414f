"""A byte tokenizer and a tiny seeded bigram model: engines a graded run can drive in the dry suite.

The model's logits at position t are ``E[ids[t]] + 0.5 * E[ids[t-1]]`` for a seeded ``[256, 256]``
table ``E``; ``scale`` multiplies the table's second half of columns, so a port with ``scale != 1``
is a perturbed reference.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

V = 256


class ByteTokenizer:
    """UTF-8 bytes as ids; ``bos`` prepended when special tokens are asked, ``eos`` appended."""

    def __init__(self, bos: int | None = None, eos: int | None = None) -> None:
        self.bos, self.eos = bos, eos

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        ids = list(text.encode("utf-8"))
        if add_special_tokens:
            ids = ([self.bos] if self.bos is not None else []) + ids + ([self.eos] if self.eos is not None else [])
        return ids


class BigramEngine:
    """``forward(ids).logits``: ``[T, 256]`` float32 from a seeded table (see the module)."""

    def __init__(self, tokenizer: Any = None, scale: float = 1.0, seed: int = 0) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        table = np.random.default_rng(seed).standard_normal((V, V)) * 2.0
        table[:, V // 2:] *= scale
        self.table = table.astype(np.float32)
        self.calls = 0

    def forward(self, prompt: Sequence[int]) -> Any:
        ids = np.asarray(list(prompt), dtype=np.int64)
        prev = np.concatenate([ids[:1], ids[:-1]])
        self.calls += 1
        return SimpleNamespace(logits=(self.table[ids] + np.float32(0.5) * self.table[prev]).astype(np.float32))
