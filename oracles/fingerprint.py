"""Exact fingerprints of float32 arrays.

A fingerprint is ``{"shape": [...], "dtype": "<f4", "sha256": hex}`` over the little-endian float32
bytes of a C-contiguous copy, so two engines agree on a fingerprint only when they agree bit for bit.
"""

from __future__ import annotations

import hashlib
from typing import Any, TypedDict

import numpy as np

from oracles.errors import NonFiniteError


class Fingerprint(TypedDict):
    shape: list[int]
    dtype: str
    sha256: str


def as_f4(a: Any, name: str = "array") -> np.ndarray:
    """Return ``a`` as a C-contiguous little-endian float32 numpy array, refusing non-finite values.

    Args:
        a: anything ``numpy.asarray`` takes (numpy array, list, a torch CPU tensor via ``__array__``).
        name: what to call the array in an error message.

    Raises:
        NonFiniteError: when any value is NaN or +-inf; the message gives the count and the first index.
    """
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, refused just below
        arr = np.asarray(a, dtype="<f4", order="C")  # not ascontiguousarray: it turns a 0-d array into shape [1]
    finite = np.isfinite(arr)
    if not finite.all():
        bad = np.argwhere(~finite)
        first = tuple(int(i) for i in bad[0])
        raise NonFiniteError(
            f"{name}: {len(bad)} of {arr.size} values are not finite as float32; first at index {first} = "
            f"{float(arr[first])!r}"
        )
    return arr


def fingerprint(a: Any, name: str = "array") -> Fingerprint:
    """Fingerprint of a whole array: shape, ``"<f4"`` and sha256 of its little-endian float32 bytes.

    Raises:
        NonFiniteError: see :func:`as_f4`.
    """
    arr = as_f4(a, name)
    return {"shape": list(arr.shape), "dtype": "<f4", "sha256": hashlib.sha256(memoryview(arr).cast("B")).hexdigest()}


def row_fingerprints(a: Any, name: str = "logits") -> list[str]:
    """sha256 of each row of a ``[T, V]`` float32 array (e.g. prefill logits), in row order.

    Raises:
        ValueError: when ``a`` is not two-dimensional.
        NonFiniteError: see :func:`as_f4`.
    """
    arr = as_f4(a, name)
    if arr.ndim != 2:
        raise ValueError(f"{name}: per-row fingerprints need a [T, V] array, got shape {list(arr.shape)}")
    view = memoryview(arr).cast("B")
    width = arr.shape[1] * 4
    return [hashlib.sha256(view[i * width : (i + 1) * width]).hexdigest() for i in range(arr.shape[0])]
