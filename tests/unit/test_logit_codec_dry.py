"""The 2-byte logit code: its stated error holds, what it states exactly is exact, a residual keeps the
difference from its base, and the bytes are 2 a logit at any vocabulary. Numpy only."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from oracles.checks.logit_codec import RESIDUAL_DIVISOR, decode, encode, plane_bits, rows_of, stats_of
from oracles.checks.port import top2_gap

pytestmark = [pytest.mark.dry]


def _rows(seed: int, shape: tuple[int, ...], scale: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, shape).astype("<f4")


@pytest.mark.parametrize("shape", [(64,), (1, 257), (7, 1000), (3, 151_936)], ids=["row", "slot", "steps", "qwen"])
def test_the_stated_error_bounds_every_logit(shape: tuple[int, ...]) -> None:
    """Decoded as a reader decodes, every logit is within the stated error, and the error is what a
    2-byte affine code of the row's range gives (half a step, plus float32 rounding)."""
    a = _rows(1, shape)
    c = encode(a)
    got = decode(c.codec, c.planes, c.lo, c.step, c.shape)
    assert c.codec == "u16" and got.shape == a.shape and got.dtype == np.float32
    assert np.abs(got.astype(np.float64) - a).max() <= c.error
    rows = rows_of(a)
    half_step = float(((rows.max(-1).astype(np.float64) - rows.min(-1)) / 65535 / 2).max())
    assert half_step * 0.5 < c.error <= half_step + float(np.spacing(np.abs(a).max()))
    assert c.planes.nbytes == 2 * a.size  # two bytes a logit, whatever the vocabulary


def test_rows_that_barely_move_are_coded_on_the_row_before() -> None:
    """Steps of one sequence that differ by little (a small model's decode) take ``r16``: each row on the
    one before it as decoded, at its own step, so its error is ``u16``'s; rows that move as much as they
    vary stay ``u16``."""
    rng = np.random.default_rng(12)
    steps = (_rows(13, (1, 3000)) + np.cumsum(rng.normal(0, 0.01, (40, 3000)), axis=0)).astype("<f4")
    c, alone = encode(steps), encode(steps[:1])
    got = decode(c.codec, c.planes, c.lo, c.step, c.shape)
    assert c.codec == "r16" and np.abs(got.astype(np.float64) - steps).max() <= c.error
    assert c.error <= c.step.max() / 2 + float(np.spacing(np.float32(np.abs(steps).max())))
    assert alone.codec == "u16" and plane_bits(c.planes) < 0.6 * plane_bits(alone.planes)
    assert encode(_rows(14, (40, 3000))).codec == "u16"


def test_statistics_are_exact() -> None:
    """argmax (first maximum), top-2 gap and sha256 per row come from the attached float32 rows."""
    a = _rows(2, (5, 300))
    a[3, [7, 9]] = a[3].max() + 1  # a tie: the first index, as numpy.argmax
    s = encode(a).stats
    assert s.argmax.tolist() == a.argmax(-1).tolist() and s.argmax[3] == 7
    assert np.array_equal(s.gap, top2_gap(a)) and s.gap[3] == 0.0
    assert [bytes(r).hex() for r in s.sha] == [hashlib.sha256(r.tobytes()).hexdigest() for r in a]


def test_bfloat16_rows_are_stored_losslessly() -> None:
    """A bfloat16 engine's logits cast to float32 (low 16 bits zero) take 2 bytes with error 0."""
    a = (_rows(3, (4, 500)).view(np.uint32) & 0xFFFF0000).view(np.float32)
    c = encode(a)
    assert c.codec == "bf16" and c.error == 0.0
    assert np.array_equal(decode(c.codec, c.planes, c.lo, c.step, c.shape), a)


@pytest.mark.parametrize("noise", [1e-5, 1e-3, 0.1])
def test_a_residual_keeps_the_difference_from_its_base(noise: float) -> None:
    """A port coded on the reference: its difference from the decoded reference is within half the
    residual step of the attached difference (so a pair coded together is held almost exactly), and its
    own error is the reference's plus that half step."""
    ref = _rows(4, (6, 2000))
    port = (ref + np.random.default_rng(5).normal(0, noise, ref.shape)).astype("<f4")
    base = encode(ref)
    ref_dec = decode(base.codec, base.planes, base.lo, base.step, base.shape)
    c = encode(port, (ref, ref_dec))
    assert c.codec == "d16"
    got = decode(c.codec, c.planes, c.lo, c.step, c.shape, ref_dec).astype(np.float64)
    moved = np.abs((got - ref_dec) - (port.astype(np.float64) - ref)).max()
    u16_step = float(((ref.max(-1).astype(np.float64) - ref.min(-1)) / 65535).max())
    assert moved <= c.step.max() / 2 + 2 * float(np.spacing(np.float32(np.abs(port).max())))
    assert c.step.max() <= u16_step and (noise > 0.05 or c.step.max() <= u16_step / RESIDUAL_DIVISOR * 1.01)
    assert np.abs(got - port).max() <= c.error <= base.error + c.step.max() / 2 + 1e-5


def test_a_residual_too_coarse_falls_back_to_its_own_code() -> None:
    """A base far from the array (a quantized port against float32: logits off by whole units) gives
    no residual finer than the array's own code: it is coded alone."""
    ref = _rows(6, (2, 800))
    far = (ref + 40 * _rows(7, ref.shape, 1.0)).astype("<f4")
    assert encode(far, (ref, ref)).codec == "u16"


def test_bad_rows_are_refused() -> None:
    a = _rows(8, (2, 10))
    a[1, 4] = np.nan
    with pytest.raises(ValueError, match="1 non-finite values; first at row 1, token 4"):
        encode(a)
    with pytest.raises(ValueError, match=r"not shape \[2, 2, 2\]"):
        rows_of(np.zeros((2, 2, 2)))
    c = encode(_rows(9, (2, 10)))
    with pytest.raises(ValueError, match="codec 'zip' is not one of"):
        decode("zip", c.planes, c.lo, c.step, c.shape)
    with pytest.raises(ValueError, match=r"a d16 code needs base rows \[2, 10\]"):
        decode("d16", c.planes, c.lo, c.step, c.shape)
    assert stats_of(rows_of(np.ones(1))).gap.tolist() == [0.0]
