"""oracles.families.graded.corpus and run: the shipped corpus, llama-perplexity's chunking, graded
figures on a tiny seeded bigram model, and the ``oracles kld`` command on base files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kld_fakes import BigramEngine, ByteTokenizer

from oracles.cli import main
from oracles.families.graded.corpus import (
    CORPUS_DIR,
    CORPUS_FILES,
    CorpusError,
    bos_of,
    checked_chunks,
    corpus_for,
    corpus_text,
    sample_chunks,
)
from oracles.families.graded.kld_file import row_width
from oracles.families.graded.run import corpus_logprobs, export_base, graded

pytestmark = pytest.mark.dry

SMOL = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"
TEXT = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"  # 40 bytes


class SmolTokenizer:
    """SmolLM2's committed tokenizer.json through the ``tokenizers`` library (no transformers), parsed once
    per process (the pins' tokenizer cache: the dry suite's other SmolLM2 tests share the parse)."""

    def __init__(self) -> None:
        from oracles.pins.tokenizer import parsed_tokenizer

        self.tok = parsed_tokenizer((SMOL / "tokenizer.json").read_bytes())

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)


def test_shipped_corpus_and_its_readme() -> None:
    text = corpus_text()
    assert text.startswith("IN CONGRESS, July 4, 1776.") and "Amendment X." in text
    readme = (CORPUS_DIR / "README.md").read_text()
    for name in CORPUS_FILES:
        assert name in readme
    assert "public domain" in readme.lower() and "transcri" in readme.lower()


def test_smollm2_cuts_the_corpus_into_15_chunks() -> None:
    corpus = corpus_for(SmolTokenizer())
    assert corpus.bos is None  # SmolLM2's tokenizer adds no BOS (llama.cpp's add_bos false)
    assert (corpus.tokens.shape[0], corpus.n_chunk, corpus.first, corpus.scored) == (7993, 15, 256, 255)
    assert corpus.describe()["tokens_sha256"] == corpus.tokens_sha256 and len(corpus.tokens_sha256) == 64


def test_chunking_as_llama_perplexity_with_bos() -> None:
    """41 tokens (BOS + 40 bytes) at n_ctx 8: 5 chunks, the rest dropped; each chunk's first token is
    BOS in the forward, kept as tokenised in the stream; positions 4..6 scored against tokens 5..7."""
    corpus = corpus_for(ByteTokenizer(bos=1), n_ctx=8, text=TEXT)
    stream = [1] + list(TEXT.encode())
    assert corpus.bos == 1 and corpus.tokens.tolist() == stream
    assert (corpus.n_chunk, corpus.first, corpus.scored) == (5, 4, 3)
    assert corpus.evaluated_tokens().tolist() == stream[:40]
    for c in range(5):
        assert corpus.chunk_input(c) == [1] + stream[8 * c + 1:8 * c + 8]
        assert corpus.chunk_targets(c).tolist() == stream[8 * c + 5:8 * c + 8]
    plain = corpus_for(ByteTokenizer(), n_ctx=8, text=TEXT)
    assert plain.bos is None and plain.chunk_input(0) == list(TEXT.encode())[:8]


def test_corpus_bad_input() -> None:
    with pytest.raises(CorpusError, match="llama-perplexity's chunking allows a BOS only"):
        bos_of(ByteTokenizer(bos=1, eos=2))
    with pytest.raises(CorpusError, match="40 tokens, fewer than 2 chunks of n_ctx = 32"):
        corpus_for(ByteTokenizer(), n_ctx=32, text=TEXT)
    with pytest.raises(CorpusError, match="n_ctx = 2"):
        corpus_for(ByteTokenizer(), n_ctx=2, text=TEXT)
    corpus = corpus_for(ByteTokenizer(), n_ctx=8, text=TEXT)
    with pytest.raises(CorpusError, match=r"chunk 5: there are chunks 0..4"):
        corpus.chunk_input(5)
    with pytest.raises(CorpusError, match="repeat"):
        checked_chunks(corpus, [1, 1])


def test_sample_chunks() -> None:
    assert sample_chunks(15, 3) == [0, 7, 14] and sample_chunks(15, 1) == [0]
    assert sample_chunks(15, None) == list(range(15)) == sample_chunks(15, 40)
    assert len(sample_chunks(15, 14)) == 14
    with pytest.raises(CorpusError, match="at least 1"):
        sample_chunks(15, 0)


def test_graded_reference_against_itself_and_a_perturbed_port() -> None:
    corpus = corpus_for(ByteTokenizer(), n_ctx=16, text=TEXT * 3)
    ref = BigramEngine()
    same = graded(ref, BigramEngine(), corpus)
    assert same["pooled"]["kld"]["max"] == 0.0 and same["pooled"]["same_top_p"]["value"] == 1.0
    assert same["pooled"]["count"] == corpus.n_chunk * corpus.scored
    assert [c["chunk"] for c in same["chunks"]] == list(range(corpus.n_chunk))
    assert same["corpus"]["chunks_run"] == list(range(corpus.n_chunk)) and json.dumps(same)
    moved = graded(ref, BigramEngine(scale=1.05), corpus, chunks=[0, 3])
    assert moved["pooled"]["kld"]["mean"] > 1e-4 and moved["pooled"]["count"] == 2 * corpus.scored
    assert [c["chunk"] for c in moved["chunks"]] == [0, 3]


def test_graded_refuses_another_tokenizer() -> None:
    corpus = corpus_for(ByteTokenizer(), n_ctx=16, text=TEXT * 3)
    with pytest.raises(CorpusError, match="the port's tokenizer gives tokens sha256 .* another tokenizer"):
        graded(BigramEngine(), BigramEngine(tokenizer=ByteTokenizer(bos=1)), corpus)


def test_kld_compare_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = corpus_for(ByteTokenizer(), n_ctx=16, text=TEXT * 3)
    a, b = tmp_path / "a.kld", tmp_path / "b.kld"
    export_base(BigramEngine(), corpus, a)
    export_base(BigramEngine(scale=1.05), corpus, b)
    assert main(["kld", "compare", str(a), str(a)]) == 0
    out = capsys.readouterr().out
    assert "Mean    KLD:   0.000000 ±   0.000000" in out and "Same top p: 100.000 ± 0.000 %" in out
    assert main(["kld", "compare", str(a), str(b), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pooled"]["kld"]["mean"] > 1e-4
    b.write_bytes(b.read_bytes()[:-3])
    assert main(["kld", "compare", str(a), str(b)]) == 2
    assert f"{b}: truncated in the log-probs of chunk" in capsys.readouterr().err


def test_corpus_logprobs_yields_each_chunk_quantised() -> None:
    """One chunk at a time: llama.cpp's uint16 rows of the scored positions and their next tokens."""
    corpus = corpus_for(ByteTokenizer(bos=1), n_ctx=8, text=TEXT)
    engine = BigramEngine(tokenizer=ByteTokenizer(bos=1))
    got = list(corpus_logprobs(engine, corpus, chunks=[1, 4]))
    assert [c for c, _, _ in got] == [1, 4] and engine.calls == 2
    for c, rows, targets in got:
        assert rows.shape == (3, row_width(256)) and rows.dtype.name == "uint16"
        assert targets.tolist() == corpus.chunk_targets(c).tolist()
        # the top entry of a row quantises to the top of the range, 65535
        logits = engine.forward(corpus.chunk_input(c)).logits[4:7]
        assert rows[:, 4:][range(3), logits.argmax(axis=1)].tolist() == [65535] * 3
