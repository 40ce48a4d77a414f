"""The execution oracles' records, caps and session runs (shared by the mtplx, mtplx_chat and port tests).

Every heavy run goes through the session's ``runs(key, fn)`` memo with one key scheme, so a port test
reuses exactly the run the family test made. A key is ``(kind, engine id, pin, record id, *rest)``:

    prefill                          cold forward of a prompt record, every row
    decode                           greedy cache-continuation decode + recomputes
    generate, mode, attempt          the engine's own generate; mode greedy|sampled
    speculate, draft                 draft/verify/commit cycles; draft self|twin
    library-speculative, draft, window   the library's own speculative generation
    generate-window, window          the library's generation with a bounded cache
    chat                             a chat record through one live cache

Records reach these functions bound to the engine's pin (:meth:`PromptRecord.bind`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oracles.engines.base import Engine, Generation, Sampler, Step, Unsupported, check_fits
from oracles.families.execution.chat import ChatRun, load_chats, run_chat
from oracles.families.execution.decode import DecodeRun, greedy_decode
from oracles.families.execution.prompts import GENERATION as GENERATION_FILE
from oracles.families.execution.prompts import PromptRecord, load_prompts
from oracles.families.execution.speculative import SpeculativeRun, speculate

if TYPE_CHECKING:
    from oracles.families.callables import Engines, Runs

DRAFT_PIN = "smollm2-draft-twin"
GENERATION = load_prompts(GENERATION_FILE)
CHATS = load_chats()

#: Cap of the decode and generation oracles. The reference's greedy answer to "arith" stops after 18
#: tokens and its seed-0 sample after 34; 64 leaves room and bounds a port that never stops
#: (finish_reason "length", recorded).
MAX_NEW_TOKENS = 64
#: Recompute every k-th decode step (plus the first and the last): a recompute is a prefill, about
#: 4 s of MLX CPU time at these lengths.
RECOMPUTE_EVERY = 6
#: Drafts a speculative cycle.
NUM_DRAFT = 3
#: mlx-lm's RotatingKVCache size for the long speculative case: the "arith" prompt (45 ids) fits,
#: its answer (18 tokens) carries the total to 63 and past the window after the 3rd token.
KV_WINDOW = 48
#: The oracle name engines key their measured gaps by (``Engine.known_gap``) for the KV-window case.
WINDOW_ORACLE = "speculative past a KV window"
#: Cap of the KV-window case: 45 prompt ids + 24 tokens = 69 positions, 21 past the window, which a
#: wrapped RotatingKVCache needs to show (its answer stops at 18 tokens; a speculative run that keeps
#: rejected drafts never stops, and at 64 tokens cost ~115 s of MLX time here).
WINDOW_MAX_NEW_TOKENS = 24

GREEDY = Sampler()
#: The MTPLX execution reference's sampled setting: temperature 0.6, top-p 0.95, top-k 20, seed 0.
SAMPLED = Sampler(temperature=0.6, top_p=0.95, top_k=20, seed=0)
SAMPLERS = {"greedy": GREEDY, "sampled": SAMPLED}


def key(kind: str, engine: Engine, record: Any, *rest: Any) -> tuple[Any, ...]:
    """The ``runs`` key of one run (module docstring)."""
    return (kind, engine.id, engine.pin, record.id, *rest)


def prefill(runs: Runs, engine: Engine, record: PromptRecord) -> Step:
    return runs(key("prefill", engine, record), lambda: engine.forward(list(record.ids)))


def greedy_decode_checked(engine: Engine, record: PromptRecord) -> DecodeRun:
    """:func:`greedy_decode` of a record after :func:`check_fits`."""
    check_fits(engine, record.id, len(record.ids))
    return greedy_decode(engine, record.ids, MAX_NEW_TOKENS, RECOMPUTE_EVERY)


def decode(runs: Runs, engine: Engine, record: PromptRecord) -> DecodeRun:
    return runs(key("decode", engine, record), lambda: greedy_decode_checked(engine, record))


def decode_steps(runs: Runs, engine: Engine, record: PromptRecord, shared: bool) -> DecodeRun:
    """The greedy cached decode a port test holds (its tokens and step logits): :func:`decode`'s run
    where an mtplx test makes it too (``shared``: the engine on one of the family's pins), else the same
    decode without the recomputes, which only test_decode's checks read (each a prefill: 6-10 s of
    mlx-lm on a 4-bit artifact here, 11 of them on a 64-token answer)."""
    if shared:
        return decode(runs, engine, record)

    def steps() -> DecodeRun:
        check_fits(engine, record.id, len(record.ids))
        return greedy_decode(engine, record.ids, MAX_NEW_TOKENS, 0)

    return runs(key("decode-steps", engine, record), steps)


def generate(runs: Runs, engine: Engine, record: PromptRecord, mode: str, attempt: int = 1) -> Generation:
    return runs(key("generate", engine, record, mode, attempt),
                lambda: engine.generate(list(record.ids), SAMPLERS[mode], MAX_NEW_TOKENS))


def draft_engine(engines: Engines, engine: Engine, draft: str) -> Engine:
    """``"self"``: the engine drafts for itself; ``"twin"``: the same framework on the draft twin pin.

    Raises:
        Unsupported: the draft twin's tokenizer is not the engine's pin's (its ids would mean other tokens),
            or the engine cannot load the draft twin's snapshot (a single-file runtime on a model folder).
    """
    if draft == "self":
        return engine
    from oracles.pins.pin import load_pin

    twin = load_pin(DRAFT_PIN)
    if twin.tokenizer_sha256 != engine.pin_file.tokenizer_sha256:
        raise Unsupported(engine.id, f"draft with {DRAFT_PIN} on pin {engine.pin}",
                          "the draft's tokenizer differs from the pin's")
    if (why := type(engine).unsupported_pin(twin)) is not None:
        raise Unsupported(engine.id, f"draft with {DRAFT_PIN} on pin {engine.pin}", why)
    return engines(engine.id, DRAFT_PIN)


def speculative(runs: Runs, engines: Engines, engine: Engine, record: PromptRecord, draft: str) -> SpeculativeRun:
    return runs(key("speculate", engine, record, draft),
                lambda: speculate(engine, draft_engine(engines, engine, draft), record.ids, NUM_DRAFT, MAX_NEW_TOKENS))


def library_speculative(runs: Runs, engines: Engines, engine: Engine, record: PromptRecord, draft: str,
                        window: int | None = None) -> Generation:
    def go() -> Generation:
        other = draft_engine(engines, engine, draft)
        if window is None:
            return engine.speculative(list(record.ids), other, NUM_DRAFT, MAX_NEW_TOKENS)
        return engine.speculative(list(record.ids), other, NUM_DRAFT, WINDOW_MAX_NEW_TOKENS, max_kv_size=window)

    return runs(key("library-speculative", engine, record, draft, window), go)


def windowed_generate(runs: Runs, engine: Engine, record: PromptRecord, window: int) -> Generation:
    return runs(key("generate-window", engine, record, window),
                lambda: engine.generate(list(record.ids), GREEDY, WINDOW_MAX_NEW_TOKENS, max_kv_size=window))


def chat(runs: Runs, engine: Engine, record: Any) -> ChatRun:
    return runs(key("chat", engine, record), lambda: run_chat(engine, record))
