"""Exact fingerprints of float32 arrays.

A fingerprint is ``{"shape": [...], "dtype": "<f4", "sha256": hex}`` over the little-endian float32
bytes of a C-contiguous copy, so two engines agree on a fingerprint only when they agree bit for bit.

Non-finite values are refused. For arrays of 4 MiB and more the finiteness check runs while
another thread hashes (hashlib and numpy reductions both release the GIL), so on two cores the
check costs almost nothing next to sha256 (bench/fingerprint_throughput.py).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Callable, TypedDict, TypeVar

import numpy as np

from oracles.errors import NonFiniteError

T = TypeVar("T")
#: Below this many bytes a thread costs more than the finiteness check it would hide.
THREAD_MIN_BYTES = 1 << 22


class Fingerprint(TypedDict):
    shape: list[int]
    dtype: str
    sha256: str


def _le_f4(a: Any) -> np.ndarray:
    """``a`` as a C-contiguous little-endian float32 array (a copy only when needed; 0-d stays 0-d)."""
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, refused by the check
        return np.asarray(a, dtype="<f4", order="C")


def _require_finite(arr: np.ndarray, name: str) -> None:
    # One BLAS pass, no temporary: the sum of squares is finite only when every value is (NaN and
    # +-inf propagate; squares cannot cancel). A non-finite sum may also be an overflow of huge finite
    # values, so the exact count below decides.
    flat = arr.reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.dot(flat, flat)):
            return
    bad = np.argwhere(~np.isfinite(arr))
    if len(bad) == 0:
        return  # the sum of squares overflowed; every value is finite
    first = tuple(int(i) for i in bad[0])
    raise NonFiniteError(
        f"{name}: {len(bad)} of {arr.size} values are not finite as float32; first at index {first} = "
        f"{float(arr[first])!r}"
    )


def _checked(arr: np.ndarray, name: str, digest: Callable[[memoryview], T]) -> T:
    """``digest`` of ``arr``'s bytes, after (or, for large arrays, while) refusing non-finite values."""
    view = arr.reshape(-1).data.cast("B")
    if arr.nbytes < THREAD_MIN_BYTES:
        _require_finite(arr, name)
        return digest(view)
    out: list[T] = []
    worker = threading.Thread(target=lambda: out.append(digest(view)), name="oracles-sha256", daemon=True)
    worker.start()
    try:
        _require_finite(arr, name)
    finally:
        worker.join()
    return out[0]


def as_f4(a: Any, name: str = "array") -> np.ndarray:
    """Return ``a`` as a C-contiguous little-endian float32 numpy array, refusing non-finite values.

    Args:
        a: anything ``numpy.asarray`` takes (numpy array, list, a torch CPU tensor via ``__array__``).
        name: what to call the array in an error message.

    Raises:
        NonFiniteError: when any value is NaN or +-inf; the message gives the count and the first index.
    """
    arr = _le_f4(a)
    _require_finite(arr, name)
    return arr


def fingerprint(a: Any, name: str = "array") -> Fingerprint:
    """Fingerprint of a whole array: shape, ``"<f4"`` and sha256 of its little-endian float32 bytes.

    Raises:
        NonFiniteError: see :func:`as_f4`.
    """
    arr = _le_f4(a)
    sha = _checked(arr, name, lambda view: hashlib.sha256(view).hexdigest())
    return {"shape": list(arr.shape), "dtype": "<f4", "sha256": sha}


def row_fingerprints(a: Any, name: str = "logits") -> list[str]:
    """sha256 of each row of a ``[T, V]`` float32 array (e.g. prefill logits), in row order.

    Raises:
        ValueError: when ``a`` is not two-dimensional.
        NonFiniteError: see :func:`as_f4`.
    """
    arr = _le_f4(a)
    if arr.ndim != 2:
        raise ValueError(f"{name}: per-row fingerprints need a [T, V] array, got shape {list(arr.shape)}")
    width = arr.shape[1] * 4

    def rows(view: memoryview) -> list[str]:
        return [hashlib.sha256(view[i * width : (i + 1) * width]).hexdigest() for i in range(arr.shape[0])]

    return _checked(arr, name, rows)
