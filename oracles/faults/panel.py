"""The panel's family runs: every family the suite has, run on one engine with the families' own run
functions, on short real records so that a dozen fault ports fit in the test budget.

    forward      ``engine.forward`` of the prompt record "ping" (31 ids), every row
    decode       :func:`oracles.families.execution.decode.greedy_decode` of "arith" (45 ids), 20 tokens at most,
                 recomputed at steps 0, 9 and the last
    generation   the engine's own greedy ``generate`` of "arith"
    speculative  :func:`oracles.families.execution.speculative.speculate` of "arith", the draft twin drafting
    chat         :func:`oracles.families.execution.chat.run_chat` of the first two turns of "brief-story-prime",
                 8 tokens a turn
    d1           :func:`oracles.families.d1.run.run_request` of "fact_water" (two questions: rows and a tree)
    cohort       :func:`run_cohort`: ``decode_cohort`` of three lanes cut from "arith" against each lane
                 decoded alone with ``forward``, 4 steps (the cohort family proper is built elsewhere;
                 README: how this column moves to it)

Each returns the family's own run object; :mod:`oracles.faults.matrix` holds them to the checks.
Numpy at the boundary; the engines do every forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from oracles.engines.base import Engine, Sampler
from oracles.families.d1 import records as d1
from oracles.families.d1.run import run_request
from oracles.families.execution.chat import ChatRecord, chat_request, run_chat
from oracles.families.execution.decode import greedy_decode
from oracles.families.execution.prompts import load_prompts
from oracles.families.execution.runs import CHATS, DRAFT_PIN, GENERATION, NUM_DRAFT
from oracles.families.execution.speculative import speculate
from oracles.families.records import canonical_sha256

#: The run paths the panel drives (not families: a family runs several of them).
PANEL_RUNS = ("forward", "decode", "generation", "speculative", "chat", "d1", "cohort")

#: The records, unbound: their token ids are the pin's (:meth:`PromptRecord.bind`).
PING = next(p for p in load_prompts() if p.id == "ping")
ARITH = next(r for r in GENERATION if r.id == "arith")
#: The decode, generation and speculative cap: the reference's greedy answer to "arith" is 18 tokens,
#: the stop token included; 20 leaves room and bounds a fault port that never stops.
MAX_NEW_TOKENS = 20
#: Decode recomputes at steps 0, 9 and the last (the family's own test: every 6th; a recompute is a
#: 45..64-id prefill, ~0.2 s of one thread, and the panel runs a dozen decodes).
RECOMPUTE_EVERY = 9
#: The chat: the first two turns of a real record, each capped at 8 tokens (a turn that reaches the
#: cap has finish_reason "length"; the cache checks hold either way).
CHAT_TURNS, CHAT_CAP = 2, 8
_BRIEF = next(c for c in CHATS if c.id == "brief-story-prime")
CHAT = ChatRecord(f"{_BRIEF.id}[:{CHAT_TURNS}]", _BRIEF.turns[:CHAT_TURNS], CHAT_CAP,
                  canonical_sha256(chat_request(list(_BRIEF.turns[:CHAT_TURNS]), CHAT_CAP)))
#: d1: the smallest tree request (bucket 64, rows of 77 and 76 ids sharing a 50-id trunk).
D1_REQUEST = "fact_water"
#: The cohort's lanes, three cuts of the "arith" record of 24, 21 and 11 ids, so two lanes are
#: left-padded (by 3 and 13) in every step; 4 greedy steps (an unmasked pad, the cohort_sees_padding
#: fault, moves the padded lanes by 2 to 6 logits from step 0 on).
COHORT_SLICES = ((21, 45), (0, 21), (21, 32))
COHORT_STEPS = 4


@dataclass
class CohortRun:
    """Lanes decoded alone and as a cohort from the same prefilled caches.

    tokens_serial / tokens_cohort: per lane, ``N + 1`` ids (token 0 from the prefill's argmax).
    serial / cohort: ``[B, N, V]`` float32 logits, ``[b, s]`` lane ``b``'s step ``s``.
    """

    lanes: list[str]
    tokens_serial: list[list[int]]
    tokens_cohort: list[list[int]]
    serial: np.ndarray
    cohort: np.ndarray


def run_cohort(engine: Engine, ids: Sequence[int], slices: Sequence[tuple[int, int]], steps: int) -> CohortRun:
    """Prefill each lane ``ids[a:b]`` once, snapshot it; decode ``steps`` greedy steps per lane alone
    (``forward``, one token) and all lanes together (``decode_cohort``), each from a restored snapshot.

    Raises:
        oracles.engines.base.Unsupported: the engine has no batched decode (or cannot snapshot).
    """
    snaps, first = [], []
    for a, b in slices:
        cache = engine.make_cache()
        first.append(int(np.argmax(engine.forward(list(ids[a:b]), cache, keep=1).logits[-1])))
        snaps.append(engine.snapshot(cache))
    serial_tokens, serial_rows = [], []
    for lane, snap in enumerate(snaps):
        cache, tokens, rows = engine.restore(snap), [first[lane]], []
        for _ in range(steps):
            rows.append(engine.forward([tokens[-1]], cache, keep=1).logits[-1])
            tokens.append(int(np.argmax(rows[-1])))
        serial_tokens.append(tokens)
        serial_rows.append(np.stack(rows))
    caches = [engine.restore(s) for s in snaps]
    cohort_tokens, cohort_rows = [[f] for f in first], []
    for _ in range(steps):
        step = engine.decode_cohort([t[-1] for t in cohort_tokens], caches)
        cohort_rows.append(step.logits)
        for lane, row in enumerate(step.logits):
            cohort_tokens[lane].append(int(np.argmax(row)))
    return CohortRun(lanes=[f"{ARITH.id}[{a}:{b}]" for a, b in slices], tokens_serial=serial_tokens,
                     tokens_cohort=cohort_tokens, serial=np.stack(serial_rows).astype("<f4"),
                     cohort=np.stack(cohort_rows, axis=1).astype("<f4"))


def d1_inputs(pin: str) -> tuple[d1.Request, dict[str, dict[str, Any]]]:
    """The d1 request of the panel and its rows for ``pin``'s tokenizer (question id -> row).

    Raises:
        TokensMissing: the d1 family has no rows for that tokenizer (the command to run named).
    """
    request = next(r for r in d1.load_requests() if r.id == D1_REQUEST)
    return request, {r["qid"]: r for r in d1.rows_doc(pin)["rows"] if r["id"] == D1_REQUEST}


def family_runner(family: str, engine: Engine, draft: Callable[[], Engine]) -> Callable[[], Any]:
    """The zero-argument run of ``family`` on ``engine`` (``draft()`` gives the speculative draft engine),
    the records' token ids those of the engine's pin.

    Raises:
        KeyError: an unknown family.
    """
    pin = engine.pin
    if family == "forward":
        return lambda: engine.forward(list(PING.bind(pin).ids))
    if family == "decode":
        return lambda: greedy_decode(engine, ARITH.bind(pin).ids, MAX_NEW_TOKENS, RECOMPUTE_EVERY)
    if family == "generation":
        return lambda: engine.generate(list(ARITH.bind(pin).ids), Sampler(), MAX_NEW_TOKENS)
    if family == "speculative":
        return lambda: speculate(engine, draft(), ARITH.bind(pin).ids, NUM_DRAFT, MAX_NEW_TOKENS)
    if family == "chat":
        return lambda: run_chat(engine, CHAT)
    if family == "d1":
        return lambda: run_request(engine, *d1_inputs(pin))
    if family == "cohort":
        return lambda: run_cohort(engine, ARITH.bind(pin).ids, COHORT_SLICES, COHORT_STEPS)
    raise KeyError(f"unknown family {family!r}; known: {', '.join(PANEL_RUNS)}")


__all__ = [
    "ARITH",
    "CHAT",
    "COHORT_SLICES",
    "COHORT_STEPS",
    "D1_REQUEST",
    "DRAFT_PIN",
    "PANEL_RUNS",
    "MAX_NEW_TOKENS",
    "PING",
    "RECOMPUTE_EVERY",
    "CohortRun",
    "d1_inputs",
    "family_runner",
    "run_cohort",
]
