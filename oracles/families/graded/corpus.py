"""The graded family's corpus and its chunking, as llama-perplexity chunks a text.

The text ships in ``oracles/builtin/corpus/`` (:data:`CORPUS_FILES`, joined by a blank line): the
Declaration of Independence and the Constitution of the United States with the Bill of Rights,
public domain (its README says why and how it was transcribed); 7,993 SmolLM2 tokens, 15 chunks
of 512. Chunking follows llama.cpp ``tools/perplexity/perplexity.cpp`` ``perplexity()`` and
``kl_divergence()`` (commit :data:`oracles.checks.kld.LLAMA_CPP_COMMIT`): the text is tokenised once
(``common_tokenize(ctx, prompt, true)``: BOS first where the vocabulary adds one), cut into
``n_chunk = n_tokens / n_ctx`` chunks of ``n_ctx`` tokens (the rest dropped), each evaluated from an
empty cache with its first token replaced by BOS where the vocabulary adds one, and only the
positions ``first = n_ctx/2 .. n_ctx-2`` scored, each against the next token: ``n_ctx - 1 - first``
per chunk (255 at the default 512).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from oracles.errors import OracleError

#: The corpus folder inside the package.
CORPUS_DIR = Path(__file__).resolve().parents[2] / "builtin" / "corpus"
#: The corpus, in order.
CORPUS_FILES = ("declaration.txt", "constitution.txt")
#: llama-perplexity's default context (``params.n_ctx = 512`` in its ``main``).
N_CTX = 512
#: llama.cpp refuses a text of fewer than ``2*n_ctx`` tokens ("you need at least %d tokens").
MIN_CHUNKS = 2
#: Text a tokenizer's BOS is probed with (any short text whose plain ids are not empty).
BOS_PROBE = "Hello"


class CorpusError(OracleError):
    """The corpus cannot be chunked as asked (the tokenizer, n_ctx, a chunk index named)."""


def corpus_text(folder: Path = CORPUS_DIR) -> str:
    """The corpus text: :data:`CORPUS_FILES` read as UTF-8, joined by a blank line.

    Raises:
        CorpusError: a file is missing (path named).
    """
    parts = []
    for name in CORPUS_FILES:
        try:
            parts.append((folder / name).read_text(encoding="utf-8").strip("\n"))
        except OSError as exc:
            raise CorpusError(f"{folder / name}: cannot read the corpus: {exc.strerror or exc}") from None
    return "\n\n".join(parts) + "\n"


def bos_of(tokenizer: Any) -> int | None:
    """The BOS id the tokenizer adds (llama.cpp's ``llama_vocab_get_add_bos``), None when it adds none:
    ``encode(probe, add_special_tokens=True)`` against ``add_special_tokens=False``.

    Raises:
        CorpusError: it adds anything else (an EOS too: llama.cpp asserts ``!llama_vocab_get_add_eos``).
    """
    plain = [int(i) for i in tokenizer.encode(BOS_PROBE, add_special_tokens=False)]
    special = [int(i) for i in tokenizer.encode(BOS_PROBE, add_special_tokens=True)]
    if special == plain:
        return None
    if len(special) == len(plain) + 1 and special[1:] == plain:
        return special[0]
    raise CorpusError(f"tokenizer {type(tokenizer).__name__}: special tokens {special} around {plain} for {BOS_PROBE!r}; "
                      "llama-perplexity's chunking allows a BOS only")


@dataclass(frozen=True)
class Corpus:
    """A tokenised corpus cut into llama-perplexity chunks.

    tokens: ``[n]`` int64, the whole stream as tokenised (BOS first when ``bos`` is not None).
    n_ctx: tokens a chunk; ``bos``: the id swapped in at each chunk's start, or None.
    text: the text tokenised ("" for a stream read from a base file).
    """

    tokens: np.ndarray
    n_ctx: int
    bos: int | None
    text: str

    @property
    def text_sha256(self) -> str:
        """sha256 of the UTF-8 text ("" for a stream read from a base file)."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest() if self.text else ""

    @property
    def n_chunk(self) -> int:
        """Whole chunks: ``tokens.size() / n_ctx``."""
        return int(self.tokens.shape[0]) // self.n_ctx

    @property
    def first(self) -> int:
        """The first scored position of a chunk: ``n_ctx/2``."""
        return self.n_ctx // 2

    @property
    def scored(self) -> int:
        """Positions scored a chunk: ``n_ctx - 1 - first``."""
        return self.n_ctx - 1 - self.first

    def evaluated_tokens(self) -> np.ndarray:
        """``[n_chunk * n_ctx]`` int32: the tokens a base file records (chunk starts not swapped)."""
        return self.tokens[:self.n_chunk * self.n_ctx].astype("<i4")

    @property
    def tokens_sha256(self) -> str:
        """sha256 of :meth:`evaluated_tokens` as little-endian int32 bytes (what a receipt records)."""
        return hashlib.sha256(self.evaluated_tokens().tobytes()).hexdigest()

    def chunk_input(self, chunk: int) -> list[int]:
        """The ``n_ctx`` ids chunk ``chunk`` is evaluated on, BOS first where the vocabulary adds one.

        Raises:
            CorpusError: ``chunk`` is outside ``[0, n_chunk)``.
        """
        self._check(chunk)
        ids = [int(i) for i in self.tokens[chunk * self.n_ctx:(chunk + 1) * self.n_ctx]]
        if self.bos is not None:
            ids[0] = self.bos
        return ids

    def chunk_targets(self, chunk: int) -> np.ndarray:
        """``[scored]`` int64: the next token of each scored position of chunk ``chunk``."""
        self._check(chunk)
        start = chunk * self.n_ctx
        return self.tokens[start + self.first + 1:start + self.n_ctx].astype(np.int64)

    def _check(self, chunk: int) -> None:
        if not 0 <= chunk < self.n_chunk:
            raise CorpusError(f"corpus: chunk {chunk}: there are chunks 0..{self.n_chunk - 1} of {self.n_ctx} tokens")

    def describe(self) -> dict[str, Any]:
        """JSON-safe facts a receipt records: files, text and token digests, n_ctx, chunks, scored."""
        shipped = self.text == corpus_text()
        return {"files": [f"oracles/builtin/corpus/{n}" for n in CORPUS_FILES] if shipped else [],
                "text_sha256": self.text_sha256, "tokens": int(self.tokens.shape[0]), "tokens_sha256": self.tokens_sha256,
                "n_ctx": self.n_ctx, "n_chunk": self.n_chunk, "scored_per_chunk": self.scored, "bos": self.bos}


def corpus_for(tokenizer: Any, n_ctx: int = N_CTX, text: str | None = None) -> Corpus:
    """The corpus as ``tokenizer`` cuts it: ``encode(text, add_special_tokens=False)``, BOS first where
    :func:`bos_of` finds one (``text``: default :func:`corpus_text`).

    Raises:
        CorpusError: ``n_ctx`` below 4 (no position to score), the text is shorter than
            ``MIN_CHUNKS * n_ctx`` tokens (as llama.cpp refuses), or as :func:`bos_of`.
    """
    if n_ctx < 4:
        raise CorpusError(f"corpus: n_ctx = {n_ctx}; at least 4 so that a chunk scores a position")
    body = corpus_text() if text is None else text
    bos = bos_of(tokenizer)
    ids = ([] if bos is None else [bos]) + [int(i) for i in tokenizer.encode(body, add_special_tokens=False)]
    if len(ids) < MIN_CHUNKS * n_ctx:
        raise CorpusError(f"corpus: {len(ids)} tokens, fewer than {MIN_CHUNKS} chunks of n_ctx = {n_ctx}")
    return Corpus(np.asarray(ids, dtype=np.int64), n_ctx, bos, body)


def sample_chunks(n_chunk: int, k: int | None) -> list[int]:
    """``k`` chunk indices spread evenly over ``0 .. n_chunk-1`` (the first and, for k > 1, the last
    included; all when ``k`` is None or at least ``n_chunk``): a slow port's sample.

    Raises:
        CorpusError: ``k`` below 1.
    """
    if k is None or k >= n_chunk:
        return list(range(n_chunk))
    if k < 1:
        raise CorpusError(f"corpus: a sample of {k} chunks; at least 1")
    return sorted({int(round(x)) for x in np.linspace(0, n_chunk - 1, k)})


def checked_chunks(corpus: Corpus, chunks: Sequence[int] | None) -> list[int]:
    """``chunks`` (all when None), each checked against the corpus.

    Raises:
        CorpusError: an index outside ``[0, n_chunk)``, or a repeated one.
    """
    out = list(range(corpus.n_chunk)) if chunks is None else [int(c) for c in chunks]
    for c in out:
        corpus._check(c)
    if len(set(out)) != len(out):
        raise CorpusError(f"corpus: chunks {out} repeat an index")
    return out
