"""oracles.checks.exact: first mismatch with both values, counts, ULP distance, NaN handling."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from oracles.checks.exact import assert_bits_equal, assert_ids_equal, assert_within, diff, ulp_distance

pytestmark = pytest.mark.dry


def _bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def _from_bits(i: int) -> float:
    return struct.unpack("<f", struct.pack("<i", i))[0]


@pytest.mark.parametrize(("a", "b", "ulps"), [
    (1.0, 1.0, 0),
    (0.0, -0.0, 0),  # +0 and -0 compare equal and are 0 ULP apart
    (1.0, _from_bits(_bits(1.0) + 1), 1),
    (1.0, _from_bits(_bits(1.0) + 5), 5),
    (-1.0, _from_bits(_bits(-1.0) + 3), 3),  # the bit pattern of a negative float grows away from zero
    (_from_bits(1), _from_bits(-2**31 + 1), 2),  # smallest subnormals of both signs: across zero
    (-2.0, 2.0, 2 * (_bits(2.0))),
])
def test_ulp_distance(a: float, b: float, ulps: int) -> None:
    a32, b32 = np.array([a], np.float32), np.array([b], np.float32)
    assert ulp_distance(a32, b32).tolist() == [ulps]
    assert ulp_distance(b32, a32).tolist() == [ulps]


def test_diff_first_mismatch_and_figures() -> None:
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    b = a.copy()
    b[0, 2] = 3.5
    b[1, 1] = 4.0
    d = diff(a, b)
    assert (d.mismatches, d.total, d.first, d.first_values) == (2, 6, (0, 2), (3.0, 3.5))
    assert d.max_abs == 1.0 and d.max_rel == pytest.approx(0.25)
    assert d.share == pytest.approx(2 / 6) and not d.equal


def test_assert_bits_equal_message() -> None:
    a = np.zeros(10, dtype=np.float32)
    b = a.copy()
    b[7] = 1e-3
    with pytest.raises(AssertionError) as info:
        assert_bits_equal(a, b, "ping logits")
    message = str(info.value)
    assert message.startswith("ping logits: 1 of 10 values differ in bits (10.00%); first at index [7]: 0.0 vs ")
    assert "max abs error 1.000e-03" in message and "max ULP" in message


def test_bits_equal_tells_zero_signs_apart() -> None:
    """Bit equality is bit equality: -0.0 is not +0.0, although they are 0 ULP apart."""
    with pytest.raises(AssertionError, match=r"1 of 1 values differ in bits .* first at index \[0\]: 0\.0 vs -0\.0"):
        assert_bits_equal(np.array([0.0], np.float32), np.array([-0.0], np.float32), "x")
    assert diff(np.array([0.0], np.float32), np.array([-0.0], np.float32)).max_ulp == 0


def test_assert_within_tolerance() -> None:
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    b = a + np.float32(5e-6)
    d = assert_within(a, b, atol=1e-5, what="head re-run")
    assert d.mismatches == 3, "the returned Diff carries the bit figures"
    with pytest.raises(AssertionError, match=r"head re-run: 3 of 3 values differ by more than 1e-06"):
        assert_within(a, b, atol=1e-6, what="head re-run")


def test_nan_handling() -> None:
    nan = np.float32("nan")
    a = np.array([1.0, nan, 3.0], dtype=np.float32)
    same_bits = a.copy()
    assert diff(a, same_bits).equal, "identical NaN bits are equal bits"
    with pytest.raises(AssertionError, match=r"1 of 3 values differ by more than 1 .*first at index \[1\]: nan vs nan"):
        assert_within(a, same_bits, atol=1.0, what="x")  # with a tolerance a NaN never passes
    other = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    d = diff(a, other)
    assert (d.mismatches, d.first) == (1, (1,)) and d.first_values is not None and np.isnan(d.first_values[0])
    assert d.max_abs == 0.0, "max abs error is over finite differences only"


def test_shape_mismatch_refused() -> None:
    with pytest.raises(ValueError, match=r"shapes differ: \[2\] vs \[3\]"):
        diff(np.zeros(2), np.zeros(3))


@pytest.mark.parametrize(("actual", "expected", "message"), [
    ([1, 2, 3], [1, 5, 3], "ids differ at position 1: 2 vs 5; lengths 3 vs 3; 1 positions differ"),
    ([1, 2], [1, 2, 3], "ids differ at position 2: <end> vs 3; lengths 2 vs 3; 1 positions differ"),
])
def test_assert_ids_equal(actual: list[int], expected: list[int], message: str) -> None:
    assert_ids_equal([4, 5], [4, 5], "same")
    with pytest.raises(AssertionError) as info:
        assert_ids_equal(actual, expected, "chat ids")
    assert str(info.value) == f"chat ids: {message}"
