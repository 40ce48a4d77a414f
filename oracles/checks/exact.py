"""Bit-exact comparison of float32 arrays: first mismatch, counts, ULP distance.

Pure numpy; no pytest import. ``assert_*`` helpers raise AssertionError with the standard message
(first mismatching index with both values, count and share of mismatches, max abs / rel error) and
set ``__tracebackhide__`` so pytest shows the caller's line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Diff:
    """How two same-shape arrays differ. ``first`` is the first mismatching index (C order) or None."""

    shape: tuple[int, ...]
    mismatches: int
    total: int
    first: tuple[int, ...] | None
    first_values: tuple[float, float] | None
    max_abs: float
    max_rel: float
    max_ulp: int
    nonfinite: int = 0  # positions where |a - b| is NaN or inf (left out of max abs/rel, counted here)

    @property
    def share(self) -> float:
        return self.mismatches / self.total if self.total else 0.0

    @property
    def equal(self) -> bool:
        return self.mismatches == 0

    def to_json(self) -> dict[str, Any]:
        return {"mismatches": self.mismatches, "total": self.total, "share": self.share,
                "first": None if self.first is None else list(self.first),
                "first_values": None if self.first_values is None else list(self.first_values),
                "max_abs": self.max_abs, "max_rel": self.max_rel, "max_ulp": self.max_ulp,
                "nonfinite": self.nonfinite}

    def describe(self, what: str, mismatch: str = "differ") -> str:
        if self.first is None:
            return f"{what}: all {self.total} values equal"
        a, b = self.first_values or (float("nan"), float("nan"))
        return (f"{what}: {self.mismatches} of {self.total} values {mismatch} ({self.share:.2%}); first at index "
                f"{list(self.first)}: {a!r} vs {b!r}; max abs error {self.max_abs:.3e}, max rel error "
                f"{self.max_rel:.3e}, max ULP {self.max_ulp}"
                + (f"; {self.nonfinite} positions differ by NaN or inf (not in the max figures)" if self.nonfinite else ""))


def _f4(a: Any) -> np.ndarray:
    # np.asarray with order="C" keeps a 0-d array 0-d (ascontiguousarray would make it shape [1]).
    return np.asarray(a, dtype="<f4", order="C")


def ulp_distance(a: Any, b: Any) -> np.ndarray:
    """Units in the last place between float32 values, as int64 (0 for identical bits; +0 and -0 are 0 apart).

    Maps each float's bits onto a monotone integer line (negative floats mirrored), the standard
    trick of Bruce Dawson, "Comparing Floating Point Numbers" (2012).
    """
    ia = _f4(a).view("<i4").astype(np.int64)
    ib = _f4(b).view("<i4").astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def diff(a: Any, b: Any, atol: float | None = None) -> Diff:
    """Compare ``a`` and ``b`` (same shape) as float32. ``atol=None``: a mismatch is any bit difference;
    else a mismatch is ``|a - b| > atol``.

    Raises:
        ValueError: when the shapes differ.
    """
    fa, fb = _f4(a), _f4(b)
    if fa.shape != fb.shape:
        raise ValueError(f"shapes differ: {list(fa.shape)} vs {list(fb.shape)}")
    absdiff = np.abs(fa.astype(np.float64) - fb.astype(np.float64))
    if atol is None:
        bad = fa.view("<u4") != fb.view("<u4")
    else:
        bad = ~(absdiff <= atol)  # NaN counts as a mismatch
    count = int(bad.sum())
    first = None
    values = None
    if count:
        first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad.reshape(-1))), fa.shape))
        values = (float(fa[first]), float(fb[first]))
    finite = np.isfinite(absdiff)
    max_abs = float(absdiff[finite].max()) if finite.any() else 0.0
    denom = np.maximum(np.abs(fb.astype(np.float64)), np.finfo(np.float32).tiny)
    rel = absdiff / denom
    max_rel = float(rel[finite].max()) if finite.any() else 0.0
    return Diff(shape=tuple(fa.shape), mismatches=count, total=int(fa.size), first=first, first_values=values,
                max_abs=max_abs, max_rel=max_rel, max_ulp=int(ulp_distance(fa, fb).max()) if fa.size else 0,
                nonfinite=int(fa.size - int(finite.sum())))


def assert_bits_equal(actual: Any, expected: Any, what: str) -> Diff:
    """Assert two arrays are bit-identical as float32; returns the Diff for the receipt."""
    __tracebackhide__ = True
    d = diff(actual, expected)
    if not d.equal:
        raise AssertionError(d.describe(what, "differ in bits"))
    return d


def assert_within(actual: Any, expected: Any, atol: float, what: str) -> Diff:
    """Assert ``|actual - expected| <= atol`` everywhere; returns the Diff (bit figures included)."""
    __tracebackhide__ = True
    d = diff(actual, expected, atol=atol)
    if not d.equal:
        raise AssertionError(d.describe(what, f"differ by more than {atol:g}"))
    return diff(actual, expected)


def assert_ids_equal(actual: list[int], expected: list[int], what: str) -> None:
    """Assert two token-id lists are equal, naming the first differing position and both lengths."""
    __tracebackhide__ = True
    if list(actual) == list(expected):
        return
    n = min(len(actual), len(expected))
    first = next((i for i in range(n) if actual[i] != expected[i]), n)
    a = actual[first] if first < len(actual) else "<end>"
    b = expected[first] if first < len(expected) else "<end>"
    mismatches = sum(1 for i in range(n) if actual[i] != expected[i]) + abs(len(actual) - len(expected))
    raise AssertionError(f"{what}: ids differ at position {first}: {a} vs {b}; lengths {len(actual)} vs "
                         f"{len(expected)}; {mismatches} positions differ")
