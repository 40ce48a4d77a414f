"""Running engines over the corpus: per-chunk logits, the graded figures of a port against a
reference, a ``--kl-divergence-base`` file written or held against.

Memory stays bounded at V = 152k: one chunk's logits per engine at a time (``[n_ctx, V]`` float32,
311 MB at 512 x 152k, what llama.cpp holds too), widened to float64 only by blocks of
:data:`oracles.checks.kld.BLOCK_ROWS` rows; what is kept across chunks is :class:`Positions` (six
numbers a scored position). A receipt's npz holds :meth:`Positions.receipt_arrays`: 24 bytes a
position whatever V (measured in docs/measurements.md); the base file holds llama.cpp's 2-byte quantised
rows, ``2 * (V + 4)`` bytes a position (98 MB per 1,000 positions at SmolLM2's 49,152, 304 MB at 152k),
so it is an export, never a receipt sidecar.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numpy as np

from oracles.checks.close import log_softmax64
from oracles.checks.kld import BLOCK_ROWS, Positions, positions, statistics
from oracles.families.graded.corpus import Corpus, CorpusError, bos_of, checked_chunks, corpus_for
from oracles.families.graded.kld_file import BaseFile, BaseWriter, KldFileError, iter_chunks, quantize_rows


class LogitsEngine(Protocol):
    """What a graded run asks of an engine (:class:`oracles.engines.base.Engine` is one): its tokenizer
    and ``forward(ids).logits``, ``[T, V]`` float32 from an empty cache."""

    tokenizer: Any

    def forward(self, prompt: Any) -> Any: ...


def chunk_logits(engine: LogitsEngine, corpus: Corpus, chunk: int) -> np.ndarray:
    """``[corpus.scored, V]`` float32: the engine's logits at chunk ``chunk``'s scored positions
    (``first .. n_ctx-2`` of one forward over :meth:`Corpus.chunk_input`).

    Raises:
        CorpusError: the chunk index is out of range, or the forward returned another shape than ``[n_ctx, V]``.
    """
    logits = np.asarray(engine.forward(corpus.chunk_input(chunk)).logits, dtype=np.float32)
    if logits.ndim != 2 or logits.shape[0] != corpus.n_ctx:
        raise CorpusError(f"corpus chunk {chunk}: {type(engine).__name__}.forward gave logits {list(logits.shape)}, "
                          f"expected [{corpus.n_ctx}, V]")
    return logits[corpus.first:corpus.n_ctx - 1]


def corpus_logprobs(engine: LogitsEngine, corpus: Corpus,
                    chunks: Sequence[int] | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per chunk ``(chunk, rows, targets)``: llama.cpp's quantised log-probs ``[corpus.scored,
    row_width(V)]`` uint16 (:func:`oracles.families.graded.kld_file.quantize_rows`) and the next tokens
    ``[corpus.scored]`` int64; one chunk in memory at a time.

    Raises:
        CorpusError: as :func:`chunk_logits` and :func:`checked_chunks`.
    """
    for c in checked_chunks(corpus, chunks):
        yield c, quantize_rows(chunk_logits(engine, corpus, c)), corpus.chunk_targets(c)


def logit_positions(ref_logits: np.ndarray, port_logits: np.ndarray, targets: np.ndarray) -> Positions:
    """:func:`oracles.checks.kld.positions` of two ``[N, V]`` float32 logit arrays: each side's
    log-softmax in float64 by blocks (no float32 rounding of the log-probs: a faithful float32 port's
    KL is ~1e-11, below what storing them in float32 would add)."""
    parts = [positions(log_softmax64(ref_logits[s:s + BLOCK_ROWS]), log_softmax64(port_logits[s:s + BLOCK_ROWS]),
                       targets[s:s + BLOCK_ROWS]) for s in range(0, ref_logits.shape[0], BLOCK_ROWS)]
    return Positions.concat(parts)


def same_tokens(corpus: Corpus, engine: LogitsEngine, role: str) -> None:
    """Refuse an engine whose tokenizer cuts the corpus otherwise (tokens sha256 of both named).

    Raises:
        CorpusError: the digests differ.
    """
    if not corpus.text:
        return  # a stream read from a base file: the engine runs on those ids as they are
    own = corpus_for(engine.tokenizer, corpus.n_ctx, corpus.text)
    if own.tokens_sha256 != corpus.tokens_sha256 or own.bos != corpus.bos:
        raise CorpusError(f"corpus: the {role}'s tokenizer gives tokens sha256 {own.tokens_sha256[:12]} (bos {own.bos}), "
                          f"the corpus {corpus.tokens_sha256[:12]} (bos {corpus.bos}): another tokenizer")


def graded_positions(ref: LogitsEngine, port: LogitsEngine, corpus: Corpus,
                     chunks: Sequence[int] | None = None) -> tuple[dict[int, Positions], dict[str, float]]:
    """Both engines over the same chunks; ``({chunk: Positions}, {"ref_s", "port_s"})`` (seconds of forwards).

    Raises:
        CorpusError: a tokenizer that cuts the corpus otherwise, a bad chunk index, a logits shape.
        ValueError: the two engines' vocabulary sizes differ, or a row is not finite.
    """
    same_tokens(corpus, ref, "reference")
    same_tokens(corpus, port, "port")
    out: dict[int, Positions] = {}
    seconds = {"ref_s": 0.0, "port_s": 0.0}
    for c in checked_chunks(corpus, chunks):
        t0 = time.perf_counter()
        r = chunk_logits(ref, corpus, c)
        t1 = time.perf_counter()
        p = chunk_logits(port, corpus, c)
        seconds["ref_s"] += t1 - t0
        seconds["port_s"] += time.perf_counter() - t1
        out[c] = logit_positions(r, p, corpus.chunk_targets(c))
    return out, seconds


def figures(per_chunk: dict[int, Positions], corpus: Corpus | None = None) -> dict[str, Any]:
    """JSON-safe figures: ``pooled`` (:func:`oracles.checks.kld.statistics` of every position),
    ``chunks`` (``{"chunk": i, **statistics}`` of each chunk alone), and ``corpus`` (its facts) when given.

    Raises:
        ValueError: no chunk.
    """
    if not per_chunk:
        raise ValueError("graded figures: no chunk was run")
    out: dict[str, Any] = {"pooled": statistics(Positions.concat([per_chunk[c] for c in sorted(per_chunk)])),
                           "chunks": [{"chunk": c, **statistics(per_chunk[c])} for c in sorted(per_chunk)]}
    if corpus is not None:
        out["corpus"] = {**corpus.describe(), "chunks_run": sorted(per_chunk)}
    return out


def graded(ref: LogitsEngine, port: LogitsEngine, corpus: Corpus, chunks: Sequence[int] | None = None) -> dict[str, Any]:
    """The graded figures of ``port`` against ``ref`` over ``chunks`` of ``corpus`` (all when None):
    :func:`figures` plus ``seconds`` (each engine's forwards).

    Raises:
        as :func:`graded_positions`.
    """
    per_chunk, seconds = graded_positions(ref, port, corpus, chunks)
    return {**figures(per_chunk, corpus), "seconds": seconds}


def graded_many(ref: LogitsEngine, others: Mapping[str, LogitsEngine], corpus: Corpus,
                chunks: Sequence[int] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`graded` of each of ``others`` (by label) against ``ref``, the reference's forward of each
    chunk made once and shared (one chunk's logits per engine in memory at a time).

    Raises:
        as :func:`graded_positions`.
    """
    same_tokens(corpus, ref, "reference")
    for label, other in others.items():
        same_tokens(corpus, other, label)
    per_chunk: dict[str, dict[int, Positions]] = {label: {} for label in others}
    seconds = {label: 0.0 for label in ["reference", *others]}
    for c in checked_chunks(corpus, chunks):
        t0 = time.perf_counter()
        r = chunk_logits(ref, corpus, c)
        seconds["reference"] += time.perf_counter() - t0
        for label, other in others.items():
            t1 = time.perf_counter()
            per_chunk[label][c] = logit_positions(r, chunk_logits(other, corpus, c), corpus.chunk_targets(c))
            seconds[label] += time.perf_counter() - t1
    return {label: {**figures(per_chunk[label], corpus), "seconds": {"ref_s": seconds["reference"],
                                                                    "port_s": seconds[label]}}
            for label in others}


def export_base(engine: LogitsEngine, corpus: Corpus, path: Path, chunks: int | None = None) -> dict[str, Any]:
    """Write ``engine``'s corpus log-probs as a ``--kl-divergence-base`` file at ``path`` (the first
    ``chunks`` chunks, all when None, as ``llama-perplexity --chunks N``); returns its facts.

    Raises:
        KldFileError: ``path`` exists (nothing is written), or a chunk's logits have another shape.
        CorpusError: as :func:`chunk_logits`.
    """
    n = corpus.n_chunk if chunks is None else min(int(chunks), corpus.n_chunk)
    if n < 1:
        raise CorpusError(f"corpus: {chunks} chunks asked; at least 1")
    if Path(path).exists():
        raise KldFileError(f"{path}: exists; a base file is never overwritten")
    sub = Corpus(corpus.tokens[:n * corpus.n_ctx], corpus.n_ctx, corpus.bos, corpus.text)
    t0 = time.perf_counter()
    first = chunk_logits(engine, sub, 0)  # the vocabulary size the header records
    with BaseWriter(path, sub.n_ctx, first.shape[1], sub.evaluated_tokens()) as writer:
        writer.add_chunk(first)
        del first
        for c in range(1, n):
            writer.add_chunk(chunk_logits(engine, sub, c))
    return {**sub.describe(), "path": str(path), "bytes": Path(path).stat().st_size,
            "n_vocab": writer.n_vocab, "seconds": time.perf_counter() - t0}


def base_corpus(base: BaseFile, bos: int | None) -> Corpus:
    """A :class:`Corpus` of a base file's own tokens (how llama.cpp's ``kl_divergence`` evaluates them),
    with ``bos`` swapped in at each chunk's start (the engine's own :func:`bos_of`)."""
    return Corpus(base.tokens.astype(np.int64), base.n_ctx, bos, "")


def against_base(engine: LogitsEngine, base: BaseFile, chunks: Sequence[int] | None = None) -> dict[int, Positions]:
    """``engine`` as the port against the base file's rows, on the file's tokens (what
    ``llama-perplexity --kl-divergence`` does with the model it loads).

    Raises:
        KldFileError: a chunk index outside the file, or the engine's vocabulary is not the file's.
    """
    corpus = base_corpus(base, bos_of(engine.tokenizer))
    out: dict[int, Positions] = {}
    for c in iter_chunks(base, list(chunks) if chunks is not None else None):
        logits = chunk_logits(engine, corpus, c)
        if logits.shape[1] != base.n_vocab:
            raise KldFileError(f"{base.path}: n_vocab = {base.n_vocab}, the engine's logits have {logits.shape[1]}")
        ref = base.chunk_logprobs(c)
        out[c] = Positions.concat([positions(ref[s:s + BLOCK_ROWS], log_softmax64(logits[s:s + BLOCK_ROWS]),
                                             base.chunk_targets(c)[s:s + BLOCK_ROWS])
                                   for s in range(0, ref.shape[0], BLOCK_ROWS)])
    return out


def compare_bases(ref: BaseFile, port: BaseFile, chunks: Sequence[int] | None = None) -> dict[int, Positions]:
    """The port file's rows held against the reference file's, chunk by chunk, both sides' dequantised
    log-probs as they are (so a file against itself is exactly 0; both carry the same 2-byte
    quantisation, where llama.cpp's own run holds exact model logits against one quantised side).
    Both must hold the same n_ctx, n_vocab and tokens; the chunks both hold are compared (all of
    them when ``chunks`` is None).

    Raises:
        KldFileError: another n_ctx or n_vocab (the port file named), or tokens that differ (the first index).
    """
    for field in ("n_ctx", "n_vocab"):
        if getattr(port, field) != getattr(ref, field):
            raise KldFileError(f"{port.path}: {field} = {getattr(port, field)}, {ref.path} has {getattr(ref, field)}")
    common = min(ref.n_chunk, port.n_chunk) * ref.n_ctx
    differ = np.flatnonzero(ref.tokens[:common] != port.tokens[:common])
    if differ.size:
        i = int(differ[0])
        raise KldFileError(f"{port.path}: tokens[{i}] = {int(port.tokens[i])}, {ref.path} has {int(ref.tokens[i])}")
    wanted = list(range(min(ref.n_chunk, port.n_chunk))) if chunks is None else list(chunks)
    out: dict[int, Positions] = {}
    for c in iter_chunks(port, list(iter_chunks(ref, wanted))):
        a, b, t = ref.chunk_logprobs(c), port.chunk_logprobs(c), ref.chunk_targets(c)
        out[c] = positions(a, b, t)
    return out
