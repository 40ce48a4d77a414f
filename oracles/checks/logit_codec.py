"""A 2-byte code for float32 logit rows, with its error measured, and the exact statistics a reader needs.

A row ``x`` (float32, ``V`` logits) is stored as one of:

``bf16``
    the high 16 bits of each float32, when every low 16 bits are zero (a bfloat16 engine's logits
    cast to float32): lossless, error 0.
``u16``
    ``code = rint((x - lo) / step)`` in ``0 .. 65535`` with ``lo = min(x)``, ``step = (max(x) - min(x)) /
    65535`` per row, decoded as ``float32(lo + code * step)`` (float64 arithmetic). No clamp: the whole
    row's range is coded, so the tail of a large vocabulary keeps its mass (a clamp 16 nats below the
    maximum, as llama-perplexity's ``--kl-divergence-base`` file has, moves it: ik_llama.cpp#325). At
    a row range of 60 logits the step is 9.2e-4, so the error is at most 4.6e-4 plus float32 rounding.
    No coarser step: one that still keeps every float32 bound between two receipts within a quarter of
    its threshold for a port equal to the reference saves 1.9 MB of make test's 40.3 MB of unit arrays,
    and turns decided verdicts near a threshold undecided (docs/measurements.md, stop 33).
``d16``
    a residual on another array of the same rows (a port's on the reference's): ``k = rint((x - b) /
    s)`` as int16, ``b`` the base's attached rows and ``s`` :data:`RESIDUAL_DIVISOR` times finer than
    the row's range / 65535, decoded on the base's *decoded* rows as ``float32(b' + k * s)``: its error
    is the base's plus ``s / 2``, and its difference from the decoded base is within ``s / 2`` of the
    attached difference (:func:`encode`). Used where ``s`` is no coarser than the row's range / 65535;
    the codes are small integers that deflate to about half a byte a logit where a port is close to the
    reference.
``r16``
    rows of one sequence coded on each other: row 0 as ``u16``; each later row ``t`` a residual ``k =
    rint((x_t - x'_{t-1}) / step_t)`` (int16) on the row before it as *decoded*, at the row's own ``u16``
    step, decoded as ``float32(x'_{t-1} + k * step_t)`` (its ``lo_t`` is not read); so each row's error is
    ``u16``'s. Chosen over ``u16`` for an array whose rows barely move from one to the next (a small model's decode steps:
    the draft twin's 64 "arith" steps take 9.3 bits a logit where ``u16`` takes 14.9, entropy of the
    byte planes), by the byte planes' order-0 entropy (:func:`plane_bits`), the figure deflate nears.

The error is never assumed: :func:`encode` decodes the codes exactly as :func:`decode` does and states
``max |decoded - x|`` (float64) as :attr:`Coded.error`, the bound readers hold figures to
(:mod:`oracles.checks.stored_bounds`). The statistics are exact, from the float32 rows: per row the argmax
(first maximum, as ``numpy.argmax``), the top-2 gap (:func:`oracles.checks.port.top2_gap`) and the sha256
of the row's little-endian float32 bytes (bit equality). Codes are kept as two byte planes ``[2, R, V]``
(high bytes, then low bytes) so deflate sees the low-entropy high bytes together. Pure numpy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The codecs :func:`decode` reads.
CODECS = ("bf16", "u16", "d16", "r16")
_LEVELS = 65535


@dataclass(frozen=True)
class Stats:
    """Exact per-row statistics of float32 rows ``[R, V]``: ``argmax`` int64 ``[R]``, ``gap`` float64
    ``[R]`` (largest minus second largest logit; 0 for one logit), ``sha`` uint8 ``[R, 32]`` (sha256 of
    each row's ``<f4`` bytes)."""

    argmax: np.ndarray
    gap: np.ndarray
    sha: np.ndarray

    def rows(self, n: int) -> "Stats":
        """The leading ``n`` rows."""
        return Stats(self.argmax[:n], self.gap[:n], self.sha[:n])


@dataclass(frozen=True)
class Coded:
    """One array's code: ``codec`` (:data:`CODECS`), ``planes`` uint8 ``[2, R, V]``, ``lo``/``step``
    float64 ``[R]`` (``u16``, ``d16``; empty for ``bf16``), ``shape`` the original shape (``[V]`` or
    ``[R, V]``), ``error`` the measured max |decoded - original| (logit units), ``stats`` exact,
    ``decoded`` the float32 ``[R, V]`` rows :func:`decode` gives (what the error was measured on)."""

    codec: str
    planes: np.ndarray
    lo: np.ndarray
    step: np.ndarray
    shape: tuple[int, ...]
    error: float
    stats: Stats
    decoded: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes of the codes and row constants, before any compression."""
        return int(self.planes.nbytes + self.lo.nbytes + self.step.nbytes)


def rows_of(a: Any, finite: bool = True) -> np.ndarray:
    """``a`` as C-contiguous little-endian float32 ``[R, V]`` (a ``[V]`` row is ``[1, V]``).

    Raises:
        ValueError: not 1-D or 2-D, no logit, or (``finite``) a value that is not finite (its row and column).
    """
    x = np.ascontiguousarray(np.asarray(a), dtype="<f4")
    if x.ndim not in (1, 2) or x.shape[-1] == 0:
        raise ValueError(f"logit rows must be [V] or [R, V] with V > 0, not shape {list(x.shape)}")
    x2 = x.reshape(-1, x.shape[-1])
    if not finite:
        return x2
    bad = ~np.isfinite(x2)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"logit rows hold {int(bad.sum())} non-finite values; first at row {row}, token {col}")
    return x2


def stats_of(x2: np.ndarray) -> Stats:
    """The exact :class:`Stats` of float32 rows ``[R, V]`` (as :func:`rows_of` returns them)."""
    if x2.shape[1] > 1:  # the two largest float32 values, subtracted in float64 (as top2_gap)
        part = np.partition(x2, -2, axis=-1)
        gap = part[:, -1].astype(np.float64) - part[:, -2]
    else:
        gap = np.zeros(x2.shape[0])
    sha = np.array([np.frombuffer(hashlib.sha256(r.tobytes()).digest(), np.uint8) for r in x2],
                   dtype=np.uint8).reshape(x2.shape[0], 32)
    return Stats(x2.argmax(-1).astype(np.int64), gap, sha)


def _planes(codes: np.ndarray) -> np.ndarray:
    """uint16 (or int16) codes ``[R, V]`` as byte planes ``[2, R, V]``: high bytes, then low."""
    u = codes.view(np.uint16)
    return np.stack([(u >> 8).astype(np.uint8), (u & 0xFF).astype(np.uint8)])


def _codes(planes: np.ndarray) -> np.ndarray:
    return (planes[0].astype(np.uint16) << 8) | planes[1].astype(np.uint16)


def _affine(x2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row ``lo = min`` and ``step = (max - min) / 65535`` (float64)."""
    lo = x2.min(-1).astype(np.float64)
    return lo, (x2.max(-1).astype(np.float64) - lo) / _LEVELS


def decode(codec: str, planes: np.ndarray, lo: np.ndarray, step: np.ndarray, shape: tuple[int, ...],
           base: np.ndarray | None = None) -> np.ndarray:
    """The float32 array (``shape``) a code stands for; ``base``: the decoded ``[R, V]`` float32 rows a
    ``d16`` code is a residual on.

    Raises:
        ValueError: an unknown codec, planes that are not ``[2, R, V]`` uint8 of ``shape``'s rows, row
            constants of another length, or a ``d16`` code without a base of its shape.
    """
    if codec not in CODECS:
        raise ValueError(f"codec {codec!r} is not one of {', '.join(CODECS)}")
    rows = 1 if len(shape) == 1 else shape[0]
    if planes.dtype != np.uint8 or planes.shape != (2, rows, shape[-1]):
        raise ValueError(f"codes have shape {list(planes.shape)} {planes.dtype}, not [2, {rows}, {shape[-1]}] uint8")
    codes = _codes(planes)
    if codec == "bf16":
        return (codes.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if lo.shape != (rows,) or step.shape != (rows,):
        raise ValueError(f"row constants lo {list(lo.shape)} and step {list(step.shape)} are not [{rows}]")
    if codec == "u16":
        value = lo[:, None] + codes.astype(np.float64) * step[:, None]
    elif codec == "r16":
        return _chain(codes, lo, step).reshape(shape)
    else:
        if base is None or base.shape != (rows, shape[-1]):
            raise ValueError(f"a d16 code needs base rows [{rows}, {shape[-1]}], not "
                             f"{None if base is None else list(base.shape)}")
        value = base.astype(np.float64) + codes.view(np.int16).astype(np.float64) * step[:, None]
    return value.astype(np.float32).reshape(shape)


def _chain(codes: np.ndarray, lo: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``r16``'s float32 rows from its uint16 codes ``[R, V]``: row 0 ``u16``, each later row on the one before."""
    out = np.empty(codes.shape, np.float32)
    if len(out):
        out[0] = lo[0] + codes[0].astype(np.float64) * step[0]
    k = codes.view(np.int16)
    for t in range(1, len(out)):
        out[t] = out[t - 1].astype(np.float64) + k[t].astype(np.float64) * step[t]
    return out


def plane_bits(planes: np.ndarray) -> float:
    """The order-0 entropy of byte planes ``[2, R, V]`` uint8, bits a logit: each plane's bytes counted
    alone, summed (what a Huffman code of each plane, as deflate's, comes near)."""
    bits = 0.0
    for plane in planes:
        p = np.bincount(plane.ravel(), minlength=256) / plane.size
        p = p[p > 0]
        bits -= float((p * np.log2(p)).sum())
    return bits


def _on_previous(x2: np.ndarray, lo: np.ndarray, step: np.ndarray, codes: np.ndarray) -> np.ndarray | None:
    """``r16``'s codes for rows ``x2`` (``u16``'s ``lo``, ``step``, ``codes``), or None where a residual
    does not fit int16 or a row has no range."""
    if x2.shape[0] < 2 or not (step > 0).all():
        return None
    out = codes.copy()
    prev = (lo[0] + codes[0].astype(np.float64) * step[0]).astype(np.float32)
    for t in range(1, x2.shape[0]):
        k = np.rint((x2[t] - prev.astype(np.float64)) / step[t])
        if np.abs(k).max() > 32767:
            return None
        out[t] = k.astype(np.int16).view(np.uint16)
        prev = (prev.astype(np.float64) + k * step[t]).astype(np.float32)
    return out


def _measured(x2: np.ndarray, codec: str, planes: np.ndarray, lo: np.ndarray, step: np.ndarray,
              base: np.ndarray | None, stats: Stats, shape: tuple[int, ...]) -> Coded:
    got = decode(codec, planes, lo, step, (x2.shape[0], x2.shape[1]), base)
    error = float(np.abs(got.astype(np.float64) - x2).max())
    return Coded(codec, planes, lo, step, shape, error, stats, got)


#: A ``d16`` residual's step is the row's range / 65535 divided by this (or coarser, where the residual
#: would not fit int16 at it): the difference from the base is then kept 8 times finer than the row
#: itself, so a port held against the reference it was coded on is held to ~6e-5 (a row range of 60
#: logits), while the codes still deflate to ~0.5 byte a logit (measured on make test's ports, 1.2e7
#: logits: 0.48 at a divisor of 1, 0.52 at 8, 0.60 at 16).
RESIDUAL_DIVISOR = 8


def encode(a: Any, base: tuple[np.ndarray, np.ndarray] | None = None) -> Coded:
    """The 2-byte code of float32 logits ``a`` (``[V]`` or ``[R, V]``): ``bf16`` when lossless, else
    ``d16`` on ``base`` when given and its step no coarser than the row's range / 65535, else ``r16``
    where its planes' entropy is below ``u16``'s, else ``u16``; its error measured by decoding (module
    docstring).

    Args:
        base: ``(attached, decoded)`` float32 rows ``[R, V]`` of the array to code a residual on: the
            residual is ``a - attached``, at step ``max(range / 65535 / RESIDUAL_DIVISOR, max|residual| /
            32767)`` per row, decoded on ``decoded``; so ``decoded(a) - decoded(base)`` is within half
            that step of ``a - attached`` (plus float32 rounding), whatever the base's own error.

    Raises:
        ValueError: as :func:`rows_of`.
    """
    x2 = rows_of(a)
    shape = tuple(np.shape(a))
    stats = stats_of(x2)
    bits = x2.view(np.uint32)
    empty = np.zeros(0)
    if not (bits & 0xFFFF).any():
        return Coded("bf16", _planes((bits >> 16).astype(np.uint16)), empty, empty, shape, 0.0, stats, x2)
    lo, step = _affine(x2)
    if base is not None and base[0].shape == x2.shape == base[1].shape:
        d = x2.astype(np.float64) - base[0]
        fine = np.maximum(step / RESIDUAL_DIVISOR, np.abs(d).max(-1) / 32767)
        if (fine <= step).all() and (fine > 0).all():
            k = np.clip(np.rint(d / fine[:, None]), -32767, 32767).astype(np.int16)
            return _measured(x2, "d16", _planes(k), np.zeros(len(step)), fine, base[1], stats, shape)
    safe = np.where(step > 0, step, 1.0)[:, None]
    codes = np.clip(np.rint((x2 - lo[:, None]) / safe), 0, _LEVELS).astype(np.uint16)
    planes = _planes(codes)
    chained = _on_previous(x2, lo, step, codes)
    if chained is not None:
        linked = _planes(chained)
        if plane_bits(linked) < plane_bits(planes):
            return _measured(x2, "r16", linked, lo, step, None, stats, shape)
    return _measured(x2, "u16", planes, lo, step, None, stats, shape)


__all__ = ["CODECS", "RESIDUAL_DIVISOR", "Coded", "Stats", "decode", "encode", "plane_bits",
           "rows_of", "stats_of"]
