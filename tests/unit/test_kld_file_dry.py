"""oracles.families.graded.kld_file: llama-perplexity's --kl-divergence-base layout, written and read.

The layout is read back here byte by byte with ``struct`` at the offsets llama.cpp's
``perplexity()`` writes (magic, int32 n_ctx, n_vocab, n_chunk, int32 tokens, per scored row two
float32 then uint16 per vocabulary entry padded to even), not by the reader under test; the
quantised values are worked out by hand from llama.cpp's formula.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest
from kld_fakes import BigramEngine

from oracles.checks.kld import statistics
from oracles.families.graded.corpus import corpus_for
from oracles.families.graded.kld_file import (
    MAGIC,
    BaseWriter,
    KldFileError,
    dequantize_rows,
    quantize_rows,
    read_base,
    row_width,
    scored_rows,
)
from oracles.families.graded.run import against_base, compare_bases, export_base, figures

pytestmark = pytest.mark.dry

TEXT = "We hold these truths to be self-evident, that all men are created equal. " * 3


def test_row_width_and_scored_rows() -> None:
    assert [row_width(v) for v in (3, 4, 5, 49152)] == [8, 8, 10, 49156]
    assert [scored_rows(n) for n in (512, 8, 9)] == [255, 3, 4]


def test_quantized_row_by_hand() -> None:
    """logits [0, -1, -2, -20]: max 0, min clamped to -16, scale 16/65535; -20 is below the range."""
    q = quantize_rows(np.array([[0.0, -1.0, -2.0, -20.0]], dtype=np.float32))
    scale, min_log_prob = struct.unpack("<ff", q[0, :4].astype("<u2").tobytes())
    lse = math.log(1 + math.exp(-1) + math.exp(-2) + math.exp(-20))
    assert scale == pytest.approx(16 / 65535, rel=1e-7)
    assert min_log_prob == pytest.approx(-16 - lse, rel=1e-7)
    assert q[0, 4:].tolist() == [65535, round(15 * 65535 / 16), round(14 * 65535 / 16), 0]
    assert q.shape == (1, 8)
    back = dequantize_rows(q, 4)[0]
    truth = [0 - lse, -1 - lse, -2 - lse]
    assert np.abs(back[:3] - truth).max() <= scale / 2 + 1e-6  # half a step, plus float32 rounding of ~16
    assert back[3] == pytest.approx(min_log_prob)  # below the range reads as its floor


def test_flat_row_has_zero_scale() -> None:
    q = quantize_rows(np.zeros((1, 3), dtype=np.float32))
    scale, min_log_prob = struct.unpack("<ff", q[0, :4].astype("<u2").tobytes())
    assert scale == 0.0 and min_log_prob == pytest.approx(-math.log(3), rel=1e-7) and q[0, 4:7].tolist() == [0, 0, 0]


def _write(path: Path, n_ctx: int = 8, n_vocab: int = 5, n_chunk: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, n_vocab, n_chunk * n_ctx)
    logits = rng.standard_normal((n_chunk, scored_rows(n_ctx), n_vocab)).astype(np.float32)
    with BaseWriter(path, n_ctx, n_vocab, tokens) as w:
        for c in range(n_chunk):
            w.add_chunk(logits[c])
    return tokens, logits


def test_layout_byte_by_byte(tmp_path: Path) -> None:
    path = tmp_path / "base.kld"
    tokens, logits = _write(path, n_ctx=8, n_vocab=5, n_chunk=2)
    data = path.read_bytes()
    assert data[:8] == b"_logits_" == MAGIC
    assert struct.unpack_from("<iii", data, 8) == (8, 5, 2)
    assert list(struct.unpack_from("<16i", data, 20)) == tokens.tolist()
    nv = 2 * ((5 + 1) // 2) + 4  # 10 uint16 a row
    assert len(data) == 20 + 16 * 4 + 2 * 3 * nv * 2
    row0 = struct.unpack_from(f"<ff{nv - 4}H", data, 20 + 64)
    assert list(row0[2:]) == quantize_rows(logits[0])[0, 4:].tolist()
    base = read_base(path)
    assert (base.n_ctx, base.n_vocab, base.n_chunk) == (8, 5, 2)
    assert base.chunk_targets(1).tolist() == tokens[8 + 4 + 1:16].tolist()
    assert np.array_equal(base.chunk_rows(1), quantize_rows(logits[1]))


@pytest.mark.parametrize(("cut", "field"), [
    (5, "magic"), (14, "header field n_vocab"), (40, "tokens"), (20 + 64 + 2 * 3 * 10 * 2 - 1, "chunk 1 of 2"),
])
def test_truncated_file_names_the_field(tmp_path: Path, cut: int, field: str) -> None:
    path = tmp_path / "base.kld"
    _write(path)
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(KldFileError, match=f"{path}: .*{field}"):
        read_base(path)


def test_wrong_magic_other_vocab_other_ctx_trailing_bytes(tmp_path: Path) -> None:
    path = tmp_path / "base.kld"
    _write(path)
    good = path.read_bytes()
    path.write_bytes(b"_logitz_" + good[8:])
    with pytest.raises(KldFileError, match=rf"{path}: magic: b'_logitz_', expected b'_logits_'"):
        read_base(path)
    path.write_bytes(good)
    with pytest.raises(KldFileError, match=rf"{path}: n_vocab = 5, expected 7"):
        read_base(path, n_vocab=7)
    with pytest.raises(KldFileError, match=rf"{path}: n_ctx = 8, expected 512"):
        read_base(path, n_ctx=512)
    path.write_bytes(good + b"\0\0")
    with pytest.raises(KldFileError, match="2 bytes after the last chunk"):
        read_base(path)
    with pytest.raises(KldFileError, match="cannot read"):
        read_base(tmp_path / "absent.kld")


def test_writer_never_overwrites_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    path = tmp_path / "base.kld"
    path.write_bytes(b"keep")
    with pytest.raises(KldFileError, match="exists"):
        BaseWriter(path, 8, 5, np.zeros(16, dtype=np.int64))
    assert path.read_bytes() == b"keep"
    other = tmp_path / "short.kld"
    with pytest.raises(KldFileError, match="1 of 2 chunks written; no file left"):
        with BaseWriter(other, 8, 5, np.zeros(16, dtype=np.int64)) as w:
            w.add_chunk(np.zeros((3, 5), dtype=np.float32))
    with pytest.raises(KldFileError, match=r"chunk 0: logits \[3, 4\], expected \[3, 5\]"):
        with BaseWriter(other, 8, 5, np.zeros(16, dtype=np.int64)) as w:
            w.add_chunk(np.zeros((3, 4), dtype=np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.kld"]


def test_export_then_hold_the_reference_against_its_own_file(tmp_path: Path) -> None:
    """The reference against its own base file: only the 2-byte quantisation separates them, so |KL|
    stays within half a step and the top token agrees; compare of a file with itself is 0."""
    ref = BigramEngine()
    corpus = corpus_for(ref.tokenizer, n_ctx=16, text=TEXT)
    path = tmp_path / "ref.kld"
    facts = export_base(ref, corpus, path)
    assert facts["n_chunk"] == corpus.n_chunk == len(TEXT.encode()) // 16 and facts["bytes"] == path.stat().st_size
    base = read_base(path, n_vocab=256, n_ctx=16)
    assert np.array_equal(base.tokens, corpus.evaluated_tokens())
    own = figures(against_base(ref, base))["pooled"]
    # KL = sum p_i e^d_i d_i for base errors d_i of at most half a step, (16/65535)/2 = 1.22e-4 nats,
    # so |KL| <= 1.22e-4 * e^1.22e-4 plus float32 rounding of the dequantised ~16 (1e-6): 1.3e-4
    assert own["kld"]["max"] > 0 and max(own["kld"]["max"], -own["kld"]["min"]) < 1.3e-4
    assert own["same_top_p"]["value"] == 1.0
    same = figures(compare_bases(base, read_base(path)))["pooled"]
    assert same["kld"]["max"] == 0.0 and same["delta_p"]["rms"] == 0.0
    port_path = tmp_path / "port.kld"
    export_base(BigramEngine(scale=1.3), corpus, port_path)
    moved = statistics(compare_bases(base, read_base(port_path))[0])
    assert moved["kld"]["mean"] > 1e-3  # the positive control: a port with a scaled half of the table


def test_compare_refuses_files_that_differ(tmp_path: Path) -> None:
    a, b = tmp_path / "a.kld", tmp_path / "b.kld"
    _write(a, n_vocab=5)
    _write(b, n_vocab=6)
    with pytest.raises(KldFileError, match=rf"{b}: n_vocab = 6, {a} has 5"):
        compare_bases(read_base(a), read_base(b))
    c = tmp_path / "c.kld"
    tokens = np.zeros(16, dtype=np.int64)
    with BaseWriter(c, 8, 5, tokens) as w:
        w.add_chunk(np.zeros((3, 5), dtype=np.float32))
        w.add_chunk(np.zeros((3, 5), dtype=np.float32))
    with pytest.raises(KldFileError, match=rf"{c}: tokens\[\d+\] = 0, {a} has [1-4]"):
        compare_bases(read_base(a), read_base(c))
