"""Fingerprints: shape, "<f4" and sha256 of the little-endian float32 bytes of a contiguous copy.

Expected digests are built from ``struct.pack('<f', ...)`` bytes, independent of numpy's layout.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from oracles.checks.fingerprint import as_f4, fingerprint, row_fingerprints
from oracles.errors import NonFiniteError

pytestmark = pytest.mark.dry

VALUES = [[1.0, -2.5, 0.1, 3e-38], [-0.0, 65504.0, 1e30, -7.25]]


def _sha(values: list[float]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(values)}f", *values)).hexdigest()


def test_fingerprint_is_sha256_of_le_f4_bytes() -> None:
    flat = [v for row in VALUES for v in row]
    got = fingerprint(np.array(VALUES, dtype=np.float32))
    assert got == {"shape": [2, 4], "dtype": "<f4", "sha256": _sha(flat)}


@pytest.mark.parametrize("layout", ["transposed", "strided", "big-endian", "fortran", "float64", "list"])
def test_layout_does_not_change_the_fingerprint(layout: str) -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6) / 3
    if layout == "transposed":
        a = base.T
    elif layout == "strided":
        a = np.repeat(base, 2, axis=1)[:, ::2]  # every other column: base's values, a non-contiguous view
    elif layout == "big-endian":
        a = base.astype(">f4")
    elif layout == "fortran":
        a = np.asfortranarray(base)
    elif layout == "float64":
        a = base.astype(np.float64)  # exactly representable: the float32 cast gives the same bits
    else:
        a = base.tolist()
    expected_values = (base.T if layout == "transposed" else base).reshape(-1).tolist()
    if layout in ("strided", "transposed", "big-endian", "fortran"):
        assert not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.dtype == "<f4"), "the case is not exotic"
    fp = fingerprint(a)
    assert fp["sha256"] == _sha(expected_values)
    assert fp["shape"] == list(np.asarray(a).shape)


@pytest.mark.parametrize(("bad", "count", "first"), [
    (float("nan"), 1, (1, 2)),
    (float("inf"), 1, (1, 2)),
    (-float("inf"), 1, (1, 2)),
])
def test_non_finite_refused_with_count_and_first_index(bad: float, count: int, first: tuple[int, int]) -> None:
    a = np.ones((3, 4), dtype=np.float32)
    a[first] = bad
    with pytest.raises(NonFiniteError) as info:
        fingerprint(a, "logits")
    message = str(info.value)
    assert message.startswith("logits: ") and f"{count} of 12 values are not finite as float32" in message
    assert f"first at index {first}" in message, message


def test_non_finite_count_and_first_in_c_order() -> None:
    a = np.zeros((2, 3), dtype=np.float32)
    a[1, 0] = np.nan
    a[0, 2] = np.inf
    a[1, 2] = -np.inf
    with pytest.raises(NonFiniteError, match=r"3 of 6 values are not finite as float32; first at index \(0, 2\) = inf"):
        as_f4(a, "hidden")


def test_nan_from_float64_overflow_refused() -> None:
    """A float64 too large for float32 becomes inf in the cast, and is refused like any inf."""
    with pytest.raises(NonFiniteError, match=r"1 of 2 values"):
        fingerprint(np.array([1.0, 1e300]))


def test_row_fingerprints_per_row() -> None:
    rows = row_fingerprints(np.array(VALUES, dtype=np.float32))
    assert rows == [_sha(VALUES[0]), _sha(VALUES[1])]


def test_row_fingerprints_of_a_strided_slice() -> None:
    """Rows of a non-contiguous [T, V] slice hash their own values, not their neighbours in memory."""
    big = np.arange(40, dtype=np.float32).reshape(4, 10)
    view = big[::2, 1:9:2]
    assert row_fingerprints(view) == [_sha([1.0, 3.0, 5.0, 7.0]), _sha([21.0, 23.0, 25.0, 27.0])]


def test_row_fingerprints_need_two_dimensions() -> None:
    with pytest.raises(ValueError, match=r"logits: per-row fingerprints need a \[T, V\] array, got shape \[5\]"):
        row_fingerprints(np.zeros(5, dtype=np.float32))


def test_zero_dim_keeps_its_shape() -> None:
    assert fingerprint(np.float32(2.5)) == {"shape": [], "dtype": "<f4", "sha256": _sha([2.5])}


def test_large_array_hashed_while_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays of THREAD_MIN_BYTES and more take the threaded path: same digest, same refusal. The threshold is
    lowered to 4 KiB here so the path runs on a small array (at its 4 MiB this test took 76 ms of the dry smoke)."""
    from oracles.checks import fingerprint as module

    monkeypatch.setattr(module, "THREAD_MIN_BYTES", 4096)
    a = np.arange(module.THREAD_MIN_BYTES // 4 + 8, dtype=np.float32).reshape(-1, 8) / 16
    assert fingerprint(a)["sha256"] == hashlib.sha256(a.astype("<f4").tobytes()).hexdigest()
    assert row_fingerprints(a)[-1] == _sha(a[-1].tolist())
    a[-1, 3] = np.nan
    with pytest.raises(NonFiniteError, match=rf"1 of {a.size} values are not finite as float32; first at index "
                                             rf"\({a.shape[0] - 1}, 3\) = nan"):
        fingerprint(a, "big")


def test_huge_finite_values_are_not_refused() -> None:
    """The fast check's sum of squares overflows here; the exact check must still accept the array."""
    a = np.full((4, 4), 3e38, dtype=np.float32)
    assert fingerprint(a)["sha256"] == _sha([3e38] * 16)
