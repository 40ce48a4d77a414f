"""llama-perplexity's ``--kl-divergence-base`` file: written from a reference's logits, read back.

Byte layout, as llama.cpp ``tools/perplexity/perplexity.cpp`` (commit
:data:`oracles.checks.kld.LLAMA_CPP_COMMIT`) writes it in ``perplexity()`` and reads it in
``kl_divergence()``, little-endian:

- 8 bytes ``_logits_`` (:data:`MAGIC`); int32 ``n_ctx``; int32 ``n_vocab``; int32 ``n_chunk``;
- int32 ``tokens[n_chunk * n_ctx]``: the evaluated token stream as tokenised (a chunk's first token
  stays as it was; llama.cpp swaps in BOS only in the batch it decodes);
- per chunk, ``n_ctx - 1 - n_ctx/2`` rows (positions ``n_ctx/2 .. n_ctx-2``, each predicting the next
  token) of :func:`row_width` uint16: two float32 (``scale``, ``min_log_prob``) in the first four
  uint16, then one uint16 per vocabulary entry, padded to an even count.

The quantisation is ``log_softmax(int n_vocab, const float * logits, uint16_t * log_prob, int tok)``
(:func:`quantize_rows`); its inverse is the ``scale*base_log_prob[i] + min_log_prob`` of the reader
(:func:`dequantize_rows`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from oracles.errors import OracleError

#: The file's first 8 bytes (``logits_stream.write("_logits_", 8)``).
MAGIC = b"_logits_"
#: magic, n_ctx, n_vocab, n_chunk.
HEADER_BYTES = 8 + 3 * 4
#: ``min_logit = std::max(min_logit, max_logit - 16)``: the quantised range spans at most 16 nats.
RANGE = 16.0


class KldFileError(OracleError):
    """A ``--kl-divergence-base`` file is not what a reader needs (file and field named in one line)."""


def row_width(n_vocab: int) -> int:
    """uint16 per row: ``nv = 2*((n_vocab + 1)/2) + 4`` (two float32, then the vocabulary, even)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_rows(n_ctx: int) -> int:
    """Rows a chunk contributes: ``n_ctx - 1 - first`` with ``first = n_ctx/2``."""
    return n_ctx - 1 - n_ctx // 2


def quantize_rows(logits: Any) -> np.ndarray:
    """``[n, V]`` float32 logits -> ``[n, row_width(V)]`` uint16 rows, as llama.cpp's quantising
    ``log_softmax`` does, in float32 with the exp sum in float64:
    ``min_logit = max(min, max - 16)``, ``scale = (max - min_logit)/65535``,
    ``min_log_prob = min_logit - max - log(sum exp(x - max))``,
    ``q = x > min_logit ? nearest_int((x - min_logit)/scale) : 0`` (round half to even, as its
    ``+ 12582912.f`` trick does below 2^22); all zero when ``scale`` is 0.

    Raises:
        ValueError: ``logits`` is not 2-D or not finite.
    """
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim != 2 or not np.isfinite(x).all():
        raise ValueError(f"quantize_rows: logits must be finite [n, V], got shape {list(x.shape)}")
    n, v = x.shape
    out = np.zeros((n, row_width(v)), dtype=np.uint16)
    mx = x.max(axis=1, keepdims=True)
    mn = np.maximum(x.min(axis=1, keepdims=True), mx - np.float32(RANGE))
    sum_exp = np.exp(x - mx).astype(np.float64).sum(axis=1, keepdims=True)
    log_sum_exp = np.log(sum_exp).astype(np.float32)
    min_log_prob = (mn - mx - log_sum_exp).astype(np.float32)
    scale = ((mx - mn) / np.float32(65535.0)).astype(np.float32)
    head = np.concatenate([scale, min_log_prob], axis=1).astype("<f4")
    out[:, :4] = head.view("<u2")
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(scale > 0, np.float32(1.0) / scale, np.float32(0.0)).astype(np.float32)
        q = np.rint(inv * (x - mn)).astype(np.float32)
    q = np.where(x > mn, np.clip(q, 0, 65535), 0)  # clip: 65535 * (1 + 2^-24) still rounds to 65535
    out[:, 4:4 + v] = q.astype(np.uint16)
    return out


def dequantize_rows(rows: Any, n_vocab: int) -> np.ndarray:
    """``[n, row_width(V)]`` uint16 -> ``[n, V]`` float32 log-probs ``scale*q + min_log_prob``, as
    llama.cpp's reader computes ``p_log_base`` (entries below the range read as ``min_log_prob``)."""
    r = np.asarray(rows, dtype=np.uint16)
    head = np.ascontiguousarray(r[:, :4]).astype("<u2").view("<f4")
    scale, min_log_prob = head[:, :1], head[:, 1:2]
    return (scale * r[:, 4:4 + n_vocab].astype(np.float32) + min_log_prob).astype(np.float32)


@dataclass(frozen=True)
class BaseFile:
    """A read ``--kl-divergence-base`` file: its header, tokens and rows (memory-mapped, so a file of
    many chunks at V = 152k is never read whole)."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # [n_chunk * n_ctx] int32
    rows: np.ndarray  # [n_chunk * scored_rows(n_ctx), row_width(n_vocab)] uint16 (a memmap)

    def chunk_rows(self, chunk: int) -> np.ndarray:
        """Chunk ``chunk``'s quantised rows ``[scored_rows(n_ctx), row_width(n_vocab)]`` uint16."""
        s = scored_rows(self.n_ctx)
        return np.asarray(self.rows[chunk * s:(chunk + 1) * s])

    def chunk_logprobs(self, chunk: int) -> np.ndarray:
        """Chunk ``chunk``'s dequantised log-probs ``[scored_rows(n_ctx), n_vocab]`` float32."""
        return dequantize_rows(self.chunk_rows(chunk), self.n_vocab)

    def chunk_targets(self, chunk: int) -> np.ndarray:
        """The next token of each of chunk ``chunk``'s rows: ``tokens[start + first + 1 .. start + n_ctx - 1]``."""
        start, first = chunk * self.n_ctx, self.n_ctx // 2
        return self.tokens[start + first + 1:start + self.n_ctx].astype(np.int64)


def expected_size(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    """The file's byte count for the header values given."""
    return HEADER_BYTES + 4 * n_chunk * n_ctx + 2 * n_chunk * scored_rows(n_ctx) * row_width(n_vocab)


def read_base(path: Path, *, n_vocab: int | None = None, n_ctx: int | None = None) -> BaseFile:
    """Open a ``--kl-divergence-base`` file and check it whole before any row is used.

    Args:
        path: the file.
        n_vocab, n_ctx: when given, the values the caller's engine or other file has; a file of
            another size is refused (llama.cpp logs "inconsistent vocabulary" and goes on; here that
            would compare unrelated rows).

    Raises:
        KldFileError: missing file, wrong magic, a header value not positive, another ``n_vocab`` or
            ``n_ctx``, a truncated file (the first field it ends inside), or bytes past the last row
            (one line naming the file and the field).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(HEADER_BYTES)
    except OSError as exc:
        raise KldFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if head[:8] != MAGIC:
        raise KldFileError(f"{path}: magic: {head[:8]!r}, expected {MAGIC!r} (not a llama-perplexity "
                           "--kl-divergence-base file)")
    if len(head) < HEADER_BYTES:
        field = ("n_ctx", "n_vocab", "n_chunk")[max(0, len(head) - 8) // 4]
        raise KldFileError(f"{path}: truncated in the header field {field} ({size} bytes)")
    ctx, vocab, chunks = (int(v) for v in np.frombuffer(head[8:], dtype="<i4"))
    for field, value in (("n_ctx", ctx), ("n_vocab", vocab), ("n_chunk", chunks)):
        if value <= 0:
            raise KldFileError(f"{path}: {field} = {value}, expected a positive count")
    if ctx < 4:
        raise KldFileError(f"{path}: n_ctx = {ctx}: no position is scored below 4")
    for field, value, wanted in (("n_vocab", vocab, n_vocab), ("n_ctx", ctx, n_ctx)):
        if wanted is not None and value != wanted:
            raise KldFileError(f"{path}: {field} = {value}, expected {wanted} (another model or context)")
    _check_size(path, size, ctx, vocab, chunks)
    tokens = np.fromfile(path, dtype="<i4", count=chunks * ctx, offset=HEADER_BYTES)
    rows = np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES + 4 * chunks * ctx,
                     shape=(chunks * scored_rows(ctx), row_width(vocab)))
    if tokens.min() < 0 or tokens.max() >= vocab:
        bad = int(np.flatnonzero((tokens < 0) | (tokens >= vocab))[0])
        raise KldFileError(f"{path}: tokens[{bad}] = {int(tokens[bad])}, outside the vocabulary [0, {vocab})")
    return BaseFile(path, ctx, vocab, chunks, tokens, rows)


def _check_size(path: Path, size: int, ctx: int, vocab: int, chunks: int) -> None:
    """Refuse a file shorter or longer than its header says, naming the field it ends inside."""
    want = expected_size(ctx, vocab, chunks)
    if size == want:
        return
    if size > want:
        raise KldFileError(f"{path}: {size - want} bytes after the last chunk's log-probs ({size} bytes, header says {want})")
    tokens_end = HEADER_BYTES + 4 * chunks * ctx
    if size < tokens_end:
        raise KldFileError(f"{path}: truncated in tokens ({size} bytes, tokens end at {tokens_end})")
    chunk = (size - tokens_end) // (2 * scored_rows(ctx) * row_width(vocab))
    raise KldFileError(f"{path}: truncated in the log-probs of chunk {chunk} of {chunks} ({size} bytes, expected {want})")


class BaseWriter:
    """Writes a ``--kl-divergence-base`` file chunk by chunk to a temporary name beside ``path``, and
    renames it into place only when every chunk the header announced is written (with
    ``with BaseWriter(...) as w: w.add_chunk(logits)``); an error leaves no file behind.

    Raises (at construction):
        KldFileError: ``path`` exists (never overwritten), or ``tokens`` does not hold ``n_chunk * n_ctx`` ids.
    """

    def __init__(self, path: Path, n_ctx: int, n_vocab: int, tokens: Any) -> None:
        self.path, self.n_ctx, self.n_vocab = Path(path), int(n_ctx), int(n_vocab)
        ids = np.asarray(tokens, dtype="<i4").reshape(-1)
        if self.path.exists():
            raise KldFileError(f"{self.path}: exists; a base file is never overwritten")
        if ids.size == 0 or ids.size % self.n_ctx:
            raise KldFileError(f"{self.path}: tokens: {ids.size} ids is not a whole number of {self.n_ctx}-token chunks")
        self.n_chunk, self.written = ids.size // self.n_ctx, 0
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.fh = self.tmp.open("xb")
        self.fh.write(MAGIC + np.array([self.n_ctx, self.n_vocab, self.n_chunk], dtype="<i4").tobytes())
        self.fh.write(ids.tobytes())

    def add_chunk(self, logits: Any) -> None:
        """Quantise and append one chunk's scored rows: ``logits`` ``[scored_rows(n_ctx), n_vocab]``
        float32 (positions ``n_ctx/2 .. n_ctx-2`` of the chunk's forward).

        Raises:
            KldFileError: the shape is not that, or every announced chunk is written already.
        """
        x = np.asarray(logits, dtype=np.float32)
        want = (scored_rows(self.n_ctx), self.n_vocab)
        if x.shape != want or self.written >= self.n_chunk:
            raise KldFileError(f"{self.path}: chunk {self.written}: logits {list(x.shape)}, expected {list(want)} "
                               f"and at most {self.n_chunk} chunks")
        self.fh.write(quantize_rows(x).astype("<u2").tobytes())
        self.written += 1

    def __enter__(self) -> "BaseWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ok = exc_type is None and self.written == self.n_chunk
        try:
            if ok:
                self.fh.flush()
                os.fsync(self.fh.fileno())
            self.fh.close()
            if ok:
                os.link(self.tmp, self.path)  # fails rather than replace a file made meanwhile
        finally:
            self.tmp.unlink(missing_ok=True)
        if not ok and exc_type is None:
            raise KldFileError(f"{self.path}: {self.written} of {self.n_chunk} chunks written; no file left")


def iter_chunks(base: BaseFile, chunks: list[int] | None = None) -> Iterator[int]:
    """The chunk indices to read (all when None), each checked against ``n_chunk``.

    Raises:
        KldFileError: an index outside ``[0, n_chunk)``.
    """
    for c in range(base.n_chunk) if chunks is None else chunks:
        if not 0 <= c < base.n_chunk:
            raise KldFileError(f"{base.path}: chunk {c}: the file holds chunks 0..{base.n_chunk - 1}")
        yield c
