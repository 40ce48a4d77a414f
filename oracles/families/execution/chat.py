"""mtplx_chat family: a multi-turn chat through one live KV cache (the prompt cache), turn by turn.

A record (``oracles/builtin/records/mtplx/chat.json``) is ``{"id", "turns": [str | {"prompt": ID}],
"max_new_tokens", "sha256"}``: each turn is a user message, or the message of prompt record ``ID``
of ``prompts.json`` (so the README-summary turn is that record's frozen request); ``sha256`` is the
canonical sha256 of the resolved user messages and the cap (the request's identity across receipts).

Each turn: render the whole conversation with the chat template (generation prompt added); the ids
the live cache already holds must be a prefix of it (the *frontier*); append the rest (the suffix) to
the live cache, decode greedily through it to a stop token, then append the stop token too, so the
cache holds exactly the conversation's ids. Around the turn: a snapshot taken before it (digest before
and after), a cold prefill of the same full ids (warm vs cold next-token logits), and the snapshot
restored into a fresh cache with the suffix and the turn's tokens run through it in one forward
(teacher forcing): its argmax rows must give the turn's tokens again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oracles.checks.port import first_divergence
from oracles.engines.base import Engine
from oracles.errors import FixtureError
from oracles.families.execution.decode import greedy_steps
from oracles.families.execution.prompts import PROMPTS, load_prompts
from oracles.families.records import RECORDS, canonical_sha256, load_record_list, require

CHATS = RECORDS / "mtplx" / "chat.json"


@dataclass(frozen=True)
class ChatRecord:
    id: str
    turns: tuple[str, ...]
    max_new_tokens: int
    sha256: str

    def port_tokens(self, pin: str) -> int:
        """A rough size of the user text (characters / 4, not a token count: the conversation is rendered
        at run time), what ``--port-records`` compares."""
        return sum(len(t) for t in self.turns) // 4


def chat_request(turns: list[str], max_new_tokens: int) -> dict[str, Any]:
    """The canonical request a chat record's ``sha256`` hashes."""
    return {"turns": [{"role": "user", "content": t} for t in turns], "max_new_tokens": max_new_tokens}


def load_chats(path: Path = CHATS, prompts: Path = PROMPTS) -> list[ChatRecord]:
    """Read and verify the chat records.

    Raises:
        FixtureError: malformed file (path and line), a turn that is neither a string nor
            ``{"prompt": ID}`` of a known single-message prompt record, a cap that is not a positive
            int, or a ``sha256`` that does not match (path, record id, field named).
    """
    _, records = load_record_list(path, family="mtplx_chat", fields=("id", "turns", "max_new_tokens", "sha256"))
    by_id = {p.id: p for p in load_prompts(prompts)}
    out = []
    for rec in records:
        where = f"{path}: record {rec['id']!r}"
        turns = []
        for j, turn in enumerate(require(rec, "turns", list, where)):
            if isinstance(turn, dict) and turn.get("prompt") in by_id and len(by_id[turn["prompt"]].messages) == 1:
                turns.append(by_id[turn["prompt"]].messages[0]["content"])
            elif isinstance(turn, str) and turn:
                turns.append(turn)
            else:
                raise FixtureError(f"{where}: field 'turns[{j}]' must be a non-empty str or {{'prompt': ID}} of a "
                                   f"one-message record of {prompts}")
        cap = require(rec, "max_new_tokens", int, where)
        if cap < 1:
            raise FixtureError(f"{where}: field 'max_new_tokens' must be >= 1")
        sha = require(rec, "sha256", str, where)
        actual = canonical_sha256(chat_request(turns, cap))
        if sha != actual:
            raise FixtureError(f"{where}: field 'sha256' is {sha} but the turns hash to {actual}")
        out.append(ChatRecord(rec["id"], tuple(turns), cap, sha))
    return out


@dataclass
class ChatTurn:
    """One turn's figures. Logit rows are ``[V]`` float32.

    frontier: ids the live cache held before the turn; rendered_prefix: the same length's prefix of
    the template's rendering of the conversation (equal when the cache holds what the template says);
    suffix: the ids appended; warm/cold: next-token logits after the suffix through the live cache,
    and from a cold prefill of ``frontier + suffix``; replay: the turn's tokens recovered by teacher
    forcing through the restored snapshot.
    """

    index: int
    user: str
    frontier: list[int]
    rendered_prefix: list[int]
    suffix: list[int]
    tokens: list[int]
    finish_reason: str
    warm: np.ndarray
    cold: np.ndarray
    digest_before: str
    digest_after: str
    replay: list[int]
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def completion_tokens(self) -> int:
        """Generated tokens, the stop token not counted."""
        return len(self.tokens) - (1 if self.finish_reason == "stop" else 0)


@dataclass
class ChatRun:
    """A conversation's turns as run; ``stopped`` says why it ended before its last turn (None: it ran all)."""

    record_id: str
    turns: list[ChatTurn] = field(default_factory=list)
    final_ids: list[int] = field(default_factory=list)
    stopped: str | None = None


def run_chat(engine: Engine, record: ChatRecord) -> ChatRun:
    """Run ``record``'s turns through one live cache of ``engine`` (greedy, stop token kept).

    A turn whose rendering of the conversation is no longer than the cache has nothing to feed: the
    model's tokens re-encode to fewer ids (an untrained model repeating "\\n" 320 times: BPE merges the
    run). The conversation stops there, saying so in ``ChatRun.stopped``; the tests judge it (a trained
    pin fails naming the turn, an untrained one skips what needs every turn).

    Raises whatever ``engine.forward`` raises (a conversation longer than the context, for one).
    """
    cache = engine.make_cache()
    cached: list[int] = []
    messages: list[dict[str, str]] = []
    run = ChatRun(record.id)
    for index, user in enumerate(record.turns):
        messages.append({"role": "user", "content": user})
        full = engine.chat_ids(messages)
        rendered_prefix = full[: len(cached)]
        suffix = full[len(cached):]
        if not suffix:
            run.stopped = (f"{record.id} turn {index + 1}: the template renders the conversation as {len(full)} ids, "
                           f"no more than the {len(cached)} the cache holds (first difference at "
                           f"{first_divergence(cached, full)}): the model's tokens re-encode to fewer ids")
            break
        saved = engine.snapshot(cache)
        before = engine.snapshot_digest(saved)
        t0 = time.perf_counter()
        warm = engine.forward(suffix, cache, keep=1).logits[-1]
        t1 = time.perf_counter()
        tokens, _rows, finish = greedy_steps(engine, cache, warm, record.max_new_tokens)
        engine.forward([tokens[-1]], cache, keep=1)  # the stop token joins the cache as the template renders it
        t2 = time.perf_counter()
        after = engine.snapshot_digest(saved)
        cold = engine.forward(cached + suffix, None, keep=1).logits[-1]  # what the live cache holds
        restored = engine.restore(saved)
        replayed = engine.forward(suffix + tokens[:-1], restored, keep=len(tokens)).logits
        run.turns.append(ChatTurn(index=index, user=user, frontier=list(cached), rendered_prefix=list(rendered_prefix),
                                  suffix=list(suffix), tokens=tokens, finish_reason=finish, warm=warm, cold=cold,
                                  digest_before=before, digest_after=after,
                                  replay=[int(i) for i in replayed.argmax(-1)],
                                  prefill_seconds=t1 - t0, decode_seconds=t2 - t1))
        cached = cached + suffix + tokens
        content = tokens[:-1] if finish == "stop" else tokens
        messages.append({"role": "assistant", "content": engine.decode(content)})
    run.final_ids = cached
    return run
