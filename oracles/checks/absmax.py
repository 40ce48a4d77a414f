"""Activation absmax for an fp16 survey: per-layer maxima of |x| and their headroom. Pure numpy, no pytest.

A port that runs a model in float16 overflows where an activation passes the largest finite float16,
``65504`` (IEEE 754 binary16: (2 - 2^-10) * 2^15). The residual stream of decoder LLMs carries a few
*massive activations*, far larger than the rest and mostly at the first position and a few fixed
channels (Sun et al., "Massive Activations in Large Language Models", COLM 2024), so each layer's
maximum is kept at position 0 and over the rest separately, with the position and channel where it
is reached.

Headroom of a maximum ``a``: ``65504 / a`` (how many times larger it could grow before float16
overflows) and ``log2`` of that (bits of exponent range left); None for ``a == 0`` (no bound; strict
JSON holds no infinity).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

#: The largest finite IEEE 754 binary16 value.
FP16_MAX = 65504.0


def row_stats(x: Any) -> dict[str, Any]:
    """Absmax figures of one ``[T, D]`` activation: ``pos0`` (max |x| at position 0), ``rest`` (over
    positions >= 1; None when ``T == 1``), ``overall``, ``argmax_pos`` and ``argmax_ch`` (where the
    overall maximum is, first in C order). Floats are Python floats of the float32 values.

    Raises:
        ValueError: ``x`` is not 2-D, is empty, or holds a non-finite value (its index named).
    """
    a = np.abs(np.asarray(x, dtype=np.float32))
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"row_stats: expected a non-empty [T, D] array, got shape {list(a.shape)}")
    bad = ~np.isfinite(a)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"row_stats: {int(bad.sum())} non-finite values, first at position {i}, channel {j}")
    flat = int(a.argmax())
    return {"pos0": float(a[0].max()), "rest": float(a[1:].max()) if a.shape[0] > 1 else None,
            "overall": float(a.reshape(-1)[flat]), "argmax_pos": flat // a.shape[1], "argmax_ch": flat % a.shape[1]}


def layer_stats(layers: Any) -> list[dict[str, Any]]:
    """:func:`row_stats` of each row of a ``[L + 1, T, D]`` residual stream (row 0: the input of the
    first decoder layer; row ``i``: the output of layer ``i - 1``).

    Raises:
        ValueError: ``layers`` is not 3-D (or see :func:`row_stats`, the row named).
    """
    s = np.asarray(layers)
    if s.ndim != 3:
        raise ValueError(f"layer_stats: expected [L + 1, T, D], got shape {list(s.shape)}")
    out = []
    for i in range(s.shape[0]):
        try:
            out.append(row_stats(s[i]))
        except ValueError as exc:
            raise ValueError(f"residual stream row {i}: {exc}") from None
    return out


def headroom(value: float | None) -> dict[str, float | None]:
    """``{"ratio": 65504 / value, "bits": log2(ratio)}``; both None for None or 0 (module docstring).

    Raises:
        ValueError: a negative or non-finite value.
    """
    if value is None:
        return {"ratio": None, "bits": None}
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"headroom: {value!r} is not a finite absmax")
    if value == 0:
        return {"ratio": None, "bits": None}
    ratio = FP16_MAX / value
    return {"ratio": ratio, "bits": math.log2(ratio)}


def worst(values: Sequence[tuple[float | None, str]]) -> dict[str, Any] | None:
    """The largest of ``(value, run label)`` pairs (None values skipped) as ``{"max", "run"}``, the
    first run on a tie; None when no value is given."""
    best: tuple[float, str] | None = None
    for v, run in values:
        if v is not None and (best is None or v > best[0]):
            best = (float(v), run)
    return None if best is None else {"max": best[0], "run": best[1]}


__all__ = ["FP16_MAX", "headroom", "layer_stats", "row_stats", "worst"]
