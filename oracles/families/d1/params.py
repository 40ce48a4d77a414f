"""The d1 suite's test parameters as records that know their size on a pin
(:class:`oracles.families.port_scope.ScopedRecord`), so ``--port-records`` is applied when the tests are
collected: a port's test of a request longer than the scope is never made (the reference runs it).

A request's size on a pin is its longest row on that pin's tokenizer (:attr:`RowsView.row_tokens`); the
parameters stay what the tests index with (a question key is a ``(request, question)`` tuple, a
request id a ``str``, a bucket an ``int``). Reading a pin's rows needs its d1 token ids only (no
weights); a pin without them raises :class:`oracles.errors.TokensMissing`, which collection reports.
"""

from __future__ import annotations

import functools

from oracles.families.d1.rows import RowsView, rows_view
from oracles.families.port_scope import D1_SAMPLE_TOKENS

#: Rows whose every position is also run (``keep=0``) to check hidden states ``[L, D]``: the first
#: question of the first request of each of these buckets (a full ``[L, V]`` logits array of a
#: 512-token row is 100 MB; longer rows keep the answer slot only).
FULL_BUCKETS = (64, 128, 256, 512)


@functools.lru_cache(maxsize=8)
def view(pin: str) -> RowsView:
    """The pin's d1 rows, read once per pin per process.

    Raises:
        TokensMissing: the pin's tokenizer has no d1 token ids (the command to write them named).
    """
    return rows_view(pin)


class QuestionKey(tuple[str, str]):
    """One question of a request: the tuple ``(request id, question id)``; its size is its request's."""

    sample_tokens = D1_SAMPLE_TOKENS

    def __new__(cls, rid: str, qid: str) -> "QuestionKey":
        return super().__new__(cls, (rid, qid))

    @property
    def rid(self) -> str:
        return self[0]

    @property
    def qid(self) -> str:
        return self[1]

    @property
    def id(self) -> str:
        return self.rid

    @property
    def label(self) -> str:
        """``request/question``, the test id."""
        return f"{self.rid}/{self.qid}"

    def port_tokens(self, pin: str) -> int:
        """The request's longest row on ``pin`` (0 where the tokenizer rejects every question)."""
        return view(pin).row_tokens.get(self.rid, 0)


class RequestId(str):
    """A request id as a test parameter (a ``str``); its size is its longest row."""

    sample_tokens = D1_SAMPLE_TOKENS

    @property
    def id(self) -> str:
        return str(self)

    def port_tokens(self, pin: str) -> int:
        return view(pin).row_tokens.get(str(self), 0)


class ArmKey(tuple[str, str]):
    """A red arm: the tuple ``(base request id, arm id)``; it runs with its base request, whose size it has."""

    sample_tokens = D1_SAMPLE_TOKENS

    def __new__(cls, base: str, arm: str) -> "ArmKey":
        return super().__new__(cls, (base, arm))

    @property
    def base(self) -> str:
        return self[0]

    @property
    def id(self) -> str:
        return self[0]

    def port_tokens(self, pin: str) -> int:
        return view(pin).row_tokens.get(self[0], 0)


def full_keys(pin: str) -> list[QuestionKey]:
    """The first question of the first request of each of :data:`FULL_BUCKETS` present on ``pin``."""
    v = view(pin)
    return [QuestionKey(*next(k for k in v.rows if v.meta[k[0]]["bucket"] == b)) for b in FULL_BUCKETS
            if any(m["bucket"] == b for m in v.meta.values())]


class Bucket(int):
    """A size bucket whose first question also runs every position; its size is that request's (0 where
    the pin has no request in the bucket: the test then skips naming it)."""

    sample_tokens = D1_SAMPLE_TOKENS

    @property
    def id(self) -> str:
        return f"bucket {int(self)}"

    def key(self, pin: str) -> QuestionKey | None:
        """The bucket's question on ``pin``, or None."""
        return next((k for k in full_keys(pin) if view(pin).meta[k.rid]["bucket"] == int(self)), None)

    def port_tokens(self, pin: str) -> int:
        key = self.key(pin)
        return 0 if key is None else view(pin).row_tokens.get(key.rid, 0)
